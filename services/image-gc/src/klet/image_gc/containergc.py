"""The container GC manager: one pass of upstream's container GC against a CRI runtime.

`ContainerGC.collect()` is the pass the service runs every minute (upstream's
GarbageCollect): list the runtime's sandboxes and containers and the pod log
directories, read which pods the sources want, let `containerselect.plan` decide, then
stop the containers in unknown state, remove the dead containers (oldest first), stop
and remove the inactive sandboxes, and remove the log directories of pods that are gone.
`ContainerGC.free()` is the same pass for node-level reclaim (upstream's
DeleteAllUnusedContainers): it also empties pods that terminated but are still desired,
and reports the bytes freed, from the writable-layer sizes CRI ContainerStats gives.
`ContainerGC.plan()` is the dry-run of `collect()`: the same listings and decisions,
with sizes, and nothing removed.

Ordering matters for safety: the runtime and the log directory are listed *before* the
desired set is read. syncloop creates a pod's sandbox and log directory only for a
pod that is already desired, so anything found in those listings whose pod is missing
from the later read really is unwanted, never a pod that was added in between.

Nothing is done while the sources are not ready (see containerselect). One pass runs at
a time: `collect` and `free` may be called concurrently (the periodic loop and the
GarbageCollector RPC) and then run one after the other.

The pod's directory under the root directory (volumes, etc-hosts, termination files) is
not removed here: syncloop removes it when it removes the pod, and its orphan clean-up
removes any left behind once no sandbox of the pod is left, which this pass brings
about. It unmounts what is mounted there first, which only syncloop's volume plugins
know how to do; two services tearing the same volumes down would race.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from klet.cri.errors import CRIError
from klet.cri.types import Container, ContainerStatsInfo, Sandbox
from klet.image_gc import containerselect
from klet.image_gc.containerselect import ContainerGCSettings, GCPlan
from klet.model.records import PodStatusRecord
from klet.model.types import ContainerID, SandboxID

log = logging.getLogger(__name__)

# Upstream stops a container in unknown state with its minimum grace period (seconds).
STOP_TIMEOUT_S = 2
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


class ContainerRuntime(Protocol):
    """The CRI calls container GC makes (`RuntimeClient` and `FakeRuntimeService` have them)."""

    async def list_pod_sandboxes(self) -> list[Sandbox]: ...

    async def list_containers(self) -> list[Container]: ...

    async def stop_container(self, container_id: ContainerID, *, timeout_s: int) -> None: ...

    async def remove_container(self, container_id: ContainerID) -> None: ...

    async def stop_pod_sandbox(self, sandbox_id: SandboxID) -> None: ...

    async def remove_pod_sandbox(self, sandbox_id: SandboxID) -> None: ...


class ContainerStatsReader(Protocol):
    """CRI ListContainerStats, for the writable-layer size of what is removed."""

    async def list_container_stats(self) -> list[ContainerStatsInfo]: ...


UIDs = Callable[[], Awaitable[set[str]]]


@dataclass(frozen=True)
class ContainerGCResult:
    """What one pass did; the service's metrics count from these."""

    sources_ready: bool
    """False: the pass did nothing because not every pod source is ready yet."""
    containers_removed: int = 0
    containers_stopped: int = 0
    """Containers in unknown state stopped before their removal."""
    sandboxes_removed: int = 0
    log_dirs_removed: int = 0
    bytes_freed: int = 0
    """Writable-layer bytes of the removed containers, as far as CRI reported them."""
    errors: int = 0
    """CRI calls or directory removals that failed (each logged); retried next pass."""
    duration_s: float = 0.0


def terminated_uids(status: Mapping[str, PodStatusRecord]) -> set[str]:
    """UIDs of the pods whose last status has a terminal phase (Succeeded, Failed)."""
    return {uid for uid, rec in status.items() if rec.status.get("phase") in TERMINAL_PHASES}


class ContainerGC:
    """Upstream's container GC (dead containers, sandboxes, pod log directories)."""

    def __init__(
        self,
        *,
        runtime: ContainerRuntime,
        settings: ContainerGCSettings,
        sources_ready: Callable[[], Awaitable[bool]],
        desired_uids: UIDs,
        pod_logs_dir: Path,
        clock: Callable[[], float] = time.time,
        stats: ContainerStatsReader | None = None,
        terminated_uids: UIDs | None = None,
        held_uids: UIDs | None = None,
    ) -> None:
        """`clock` gives seconds since the epoch (container ages); `stats`, when given,
        sizes what `free` removes; `terminated_uids` gives the desired pods that reached
        a terminal phase, which `free` empties too (without it, only deleted pods);
        `held_uids` the pods syncloop still holds, left to it (containerselect's
        `pod_removable`; without it, none)."""
        self.runtime = runtime
        self.settings = settings
        self._sources_ready = sources_ready
        self._desired_uids = desired_uids
        self._terminated_uids = terminated_uids
        self._held_uids = held_uids
        self.pod_logs_dir = pod_logs_dir
        self.clock = clock
        self.stats = stats
        self._lock = asyncio.Lock()

    async def collect(self) -> ContainerGCResult:
        """One container GC pass (upstream GarbageCollect)."""
        async with self._lock:
            return await self._pass(evict_terminated=False)

    async def free(self, bytes_to_free: int) -> tuple[int, int]:
        """Node-level reclaim (upstream DeleteAllUnusedContainers): one pass that also
        empties terminated pods. Returns (bytes freed, containers removed).

        As upstream, the pass removes every container the policy allows rather than
        stopping at `bytes_to_free`; the caller re-measures and goes on with images.
        Nothing is needed, and nothing done, when `bytes_to_free` is not positive."""
        if bytes_to_free <= 0:
            return 0, 0
        async with self._lock:
            result = await self._pass(evict_terminated=True)
        return result.bytes_freed, result.containers_removed

    async def _pass(self, *, evict_terminated: bool) -> ContainerGCResult:
        began = time.perf_counter()
        if not await self._sources_ready():
            log.debug("container GC skipped: not every pod source is ready")
            return ContainerGCResult(sources_ready=False)
        seen = await self._observe(evict_terminated=evict_terminated)
        decision, doomed = seen.decide(self.settings, now_s=self.clock())
        sizes = await self._sizes() if decision.containers and self.stats is not None else {}
        run = _Run(sizes)
        await self._remove_containers(decision, run)
        await self._remove_sandboxes(decision, run)
        for name in doomed:
            await self._remove_log_dir(name, run)
        result = ContainerGCResult(
            sources_ready=True,
            containers_removed=run.removed,
            containers_stopped=run.stopped,
            sandboxes_removed=run.sandboxes,
            log_dirs_removed=run.log_dirs,
            bytes_freed=run.bytes,
            errors=run.errors,
            duration_s=time.perf_counter() - began,
        )
        if run.removed or run.sandboxes or run.log_dirs or run.errors:
            log.info(
                "container GC pass",
                extra={
                    "containers": run.removed,
                    "stopped": run.stopped,
                    "sandboxes": run.sandboxes,
                    "log_dirs": run.log_dirs,
                    "bytes": run.bytes,
                    "errors": run.errors,
                    "reclaim": evict_terminated,
                },
            )
        return result

    async def plan(self) -> ContainerGCPlan:
        """What one pass (`collect`) would remove now, with the bytes each frees: the
        writable layers CRI reports and the log directories' file sizes. Nothing is
        removed; sandboxes have no size of their own here."""
        if not await self._sources_ready():
            return ContainerGCPlan(sources_ready=False)
        seen = await self._observe(evict_terminated=False)
        decision, doomed = seen.decide(self.settings, now_s=self.clock())
        sizes = await self._sizes() if decision.containers and self.stats is not None else {}
        log_bytes = await asyncio.to_thread(
            lambda: {name: _tree_bytes(self.pod_logs_dir / name) for name in doomed}
        )
        return ContainerGCPlan(True, decision, sizes, log_bytes)

    async def _observe(self, *, evict_terminated: bool) -> _Observed:
        # Listings first, the desired set last: see the module docstring.
        sandboxes = await self.runtime.list_pod_sandboxes()
        containers = await self.runtime.list_containers()
        log_dirs = await asyncio.to_thread(_subdir_names, self.pod_logs_dir)
        desired = await self._desired_uids()
        held = await self._held_uids() if self._held_uids is not None else set()
        terminated: set[str] = set()
        if evict_terminated and self._terminated_uids is not None:
            terminated = await self._terminated_uids()
        return _Observed(
            sandboxes, containers, log_dirs, desired, terminated, evict_terminated, held
        )

    async def _sizes(self) -> dict[str, int]:
        assert self.stats is not None
        try:
            stats = await self.stats.list_container_stats()
        except CRIError as err:
            log.warning("container sizes unknown", extra={"error": str(err)})
            return {}
        return {
            s.id: s.writable_layer.used_bytes
            for s in stats
            if s.writable_layer is not None and s.writable_layer.used_bytes is not None
        }

    async def _remove_containers(self, decision: GCPlan, run: _Run) -> None:
        unknown = {c.id for c in decision.to_stop}
        for c in decision.containers:
            who = {
                "container": c.id,
                "container_name": c.name,
                "uid": containerselect.pod_uid(c.labels),
            }
            if c.id in unknown:
                try:
                    await self.runtime.stop_container(c.id, timeout_s=STOP_TIMEOUT_S)
                except CRIError as err:
                    run.failed(c.sandbox_id)
                    log.warning(
                        "container in unknown state not stopped",
                        extra={**who, "error": str(err)},
                    )
                    continue
                run.stopped += 1
            try:
                await self.runtime.remove_container(c.id)
            except CRIError as err:
                run.failed(c.sandbox_id)
                log.warning("dead container not removed", extra={**who, "error": str(err)})
                continue
            run.removed += 1
            run.bytes += run.sizes.get(c.id, 0)
            log.debug("removed dead container", extra=who)

    async def _remove_sandboxes(self, decision: GCPlan, run: _Run) -> None:
        for s in decision.sandboxes:
            if s.id in run.kept_sandboxes:
                continue  # still holds a container that could not be removed
            who = {"sandbox": s.id, "uid": containerselect.pod_uid(s.labels)}
            try:
                # Normally already stopped; upstream stops first all the same.
                await self.runtime.stop_pod_sandbox(s.id)
                await self.runtime.remove_pod_sandbox(s.id)
            except CRIError as err:
                run.errors += 1
                log.warning("sandbox not removed", extra={**who, "error": str(err)})
                continue
            run.sandboxes += 1
            log.debug("removed sandbox", extra=who)

    async def _remove_log_dir(self, name: str, run: _Run) -> None:
        path = self.pod_logs_dir / name
        try:
            await asyncio.to_thread(shutil.rmtree, path)
        except FileNotFoundError:
            return
        except OSError as err:
            run.errors += 1
            log.warning(
                "pod log directory not removed", extra={"path": str(path), "error": str(err)}
            )
            return
        run.log_dirs += 1
        log.debug("removed pod log directory", extra={"path": str(path)})


@dataclass(frozen=True)
class ContainerGCPlan:
    """What `ContainerGC.plan` found: the pass's decision and the sizes it knows."""

    sources_ready: bool
    decision: GCPlan = GCPlan()
    container_bytes: Mapping[str, int] = field(default_factory=dict)
    """Writable-layer bytes by container ID (those CRI reported)."""
    log_dir_bytes: Mapping[str, int] = field(default_factory=dict)
    """The pod log directories the pass removes, by name, with their files' bytes."""


@dataclass(frozen=True)
class _Observed:
    """One pass's listings, in the order the module docstring explains."""

    sandboxes: list[Sandbox]
    containers: list[Container]
    log_dirs: list[str]
    desired: set[str]
    terminated: set[str]
    evict_terminated: bool
    held: set[str]

    def decide(self, settings: ContainerGCSettings, *, now_s: float) -> tuple[GCPlan, list[str]]:
        """containerselect's decisions: what goes, and which log directories."""
        decision = containerselect.plan(
            self.containers,
            self.sandboxes,
            settings=settings,
            desired=self.desired,
            sources_ready=True,
            now_s=now_s,
            terminated=self.terminated,
            evict_terminated=self.evict_terminated,
            held=self.held,
        )
        live = containerselect.live_pods(self.containers, self.sandboxes)
        doomed = containerselect.log_dirs_to_remove(
            self.log_dirs, desired=self.desired, live=live, sources_ready=True, held=self.held
        )
        return decision, doomed


def _tree_bytes(path: Path) -> int:
    """Bytes of the regular files under `path` (0 when it is gone)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            total += st.st_size
    return total


class _Run:
    """Counters of one pass."""

    def __init__(self, sizes: dict[str, int]) -> None:
        self.sizes = sizes
        self.removed = self.stopped = self.sandboxes = self.log_dirs = self.bytes = 0
        self.errors = 0
        self.kept_sandboxes: set[SandboxID] = set()

    def failed(self, sandbox_id: SandboxID) -> None:
        self.errors += 1
        self.kept_sandboxes.add(sandbox_id)


def _subdir_names(path: Path) -> list[str]:
    try:
        return [e.name for e in os.scandir(path) if e.is_dir(follow_symlinks=False)]
    except (FileNotFoundError, NotADirectoryError):
        return []
