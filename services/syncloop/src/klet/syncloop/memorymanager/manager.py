"""The memory manager: the policy's state, its file, hints, allocation, cpuset.mems.

syncloop owns it because syncloop admits pods and creates containers. At admission the
topology manager asks it for hints and then to allocate each container on the merged
hint (`allocate`); the state is written to `<root-dir>/memory_manager_state` before the
answer is given, so a container is never created on NUMA nodes the file does not
record. Container creation reads the container's NUMA nodes (`cpuset_mems`) into the
CRI config's cpuset_mems (upstream's PreCreateContainer).

The `None` policy keeps nothing and writes the file with its name and an empty machine
state, as upstream does. After a restart the file is read back and checked against the
machine (the policy's `start`, upstream's validateState): re-admitted pods find their
blocks and keep them. A file that does not verify or was written for another policy
stops syncloop at start with upstream's message: the node must be drained and the file
deleted, as upstream.

The leader's root task (`run`) frees the blocks of pods that are no longer active once
every source is ready (a restarted syncloop does not yet know every pod).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Protocol

from klet.config.kubelet import KubeletConfiguration
from klet.model.node import reservation
from klet.model.types import JSON
from klet.syncloop.memorymanager import state as statefile
from klet.syncloop.memorymanager.numa import SYS_NODE, Machine, NUMAError, discover
from klet.syncloop.memorymanager.policy import (
    AllocationError,
    MemoryManagerError,
    StaticPolicy,
    container_numa_nodes,
    pinned,
    reserved_per_node,
)
from klet.syncloop.memorymanager.state import MemoryState, StateError
from klet.syncloop.topologymanager.hints import ProviderHints, TopologyHint

log = logging.getLogger(__name__)

NONE, STATIC = "None", "Static"


class MemoryObserver(Protocol):
    """Upstream's kubelet_memory_manager_pinning_* series (klet.syncloop.metrics)."""

    def pinning(self, *, failed: bool) -> None: ...


class _NoObserver:
    def pinning(self, *, failed: bool) -> None:
        pass


class MemoryManager:
    def __init__(
        self,
        policy: StaticPolicy | None,
        root_dir: Path,
        *,
        observer: MemoryObserver | None = None,
    ) -> None:
        self.policy = policy
        self.observer: MemoryObserver = observer or _NoObserver()
        self.path = root_dir / statefile.STATE_FILE
        self.state = MemoryState(policy=self.policy_name)
        self.loaded = False

    @property
    def policy_name(self) -> str:
        return STATIC if self.policy is not None else NONE

    # -- the file --------------------------------------------------------------------

    def _read(self) -> MemoryState:
        try:
            blob = self.path.read_bytes()
        except FileNotFoundError:
            blob = None
        except OSError as err:
            raise MemoryManagerError(f"reading {self.path}: {err.strerror}") from err
        try:
            state = statefile.decode(blob) if blob is not None else MemoryState(self.policy_name)
            if state.policy != self.policy_name:
                raise StateError(
                    f"[memorymanager] configured policy {self.policy_name!r} differs from "
                    f"state checkpoint policy {state.policy!r}"
                )
            if self.policy is not None:
                state = self.policy.start(state)
        except (StateError, MemoryManagerError) as err:
            raise MemoryManagerError(
                f"could not restore state from checkpoint: {err}, please drain this node and "
                f"delete the memory manager checkpoint file {json.dumps(str(self.path))} "
                "before restarting Kubelet"
            ) from err
        return state

    def check(self) -> None:
        """What `load` checks, keeping and writing nothing (syncloop's start)."""
        self._read()

    def load(self) -> None:
        """Read the state file back (a missing one starts from the machine), check it
        and write it; raises MemoryManagerError with upstream's message."""
        self.state = self._read()
        self.save()
        self.loaded = True
        log.info("memory manager started", extra={"policy": self.policy_name})

    def save(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(statefile.encode(self.state))
        os.replace(tmp, self.path)

    def _ensure(self) -> None:
        if not self.loaded:
            self.load()

    # -- hint provider (topologymanager.manager.HintProvider) ------------------------

    def topology_hints(self, pod: JSON, container: JSON) -> ProviderHints | None:
        if self.policy is None:
            return None
        self._ensure()
        return self.policy.hints(self.state, pod, container)

    def pod_topology_hints(self, pod: JSON) -> ProviderHints | None:
        if self.policy is None:
            return None
        self._ensure()
        return self.policy.pod_hints(self.state, pod)

    def allocate(self, pod: JSON, container: JSON, hint: TopologyHint) -> str | None:
        """Place the container's memory on the hint; None, or the error's message."""
        if self.policy is None:
            return None
        self._ensure()
        try:
            state = self.policy.allocate(self.state, pod, container, hint)
        except AllocationError as err:
            self.observer.pinning(failed=True)
            return str(err)
        if pinned(pod):  # upstream counts every Guaranteed container's Allocate
            self.observer.pinning(failed=False)
        if state is not self.state:
            self.state = state
            self.save()
        return None

    # -- container creation ----------------------------------------------------------

    def cpuset_mems(self, uid: str, name: str) -> str:
        """The container's cpuset.mems (`0` or `0,1`), "" when it has no blocks."""
        if self.policy is None:
            return ""
        self._ensure()
        return ",".join(str(n) for n in container_numa_nodes(self.state, uid, name))

    # -- release ---------------------------------------------------------------------

    def release(self, active: Mapping[str, JSON]) -> None:
        """Free the blocks of containers no active pod has (upstream's removeStaleState)."""
        if self.policy is None:
            return
        self._ensure()
        keep = {
            (uid, str(c.get("name")))
            for uid, pod in active.items()
            for c in [
                *((pod.get("spec") or {}).get("initContainers") or ()),
                *((pod.get("spec") or {}).get("containers") or ()),
            ]
        }
        state = self.state
        for uid, containers in sorted((state.entries or {}).items()):
            for name in sorted(containers):
                if (uid, name) not in keep:
                    state = self.policy.remove(state, uid, name)
        if state is not self.state:
            gone = sorted({u for u in self.state.entries or {} if u not in (state.entries or {})})
            self.state = state
            self.save()
            log.info("memory blocks released", extra={"pods": gone})


RELEASE_PERIOD_S = 10.0
"""How often the blocks of finished pods are freed (upstream frees them at the next
admission; a period also frees them when no pod comes)."""


async def run(
    manager: MemoryManager,
    *,
    active: Callable[[], Mapping[str, JSON] | None],
    forget: Callable[[Iterable[str]], None] | None = None,
    period_s: float = RELEASE_PERIOD_S,
) -> None:
    """The leader's root task: read the file, then every period release the blocks of
    pods that are not active (and `forget` their topology hints), once every source is
    ready (`active` gives None until then)."""
    manager.load()
    while True:
        pods = active()
        if pods is not None:
            manager.release(pods)
            if forget is not None:
                forget(pods)
        await asyncio.sleep(period_s)


def node_memory_reservation(cfg: KubeletConfiguration, capacity_memory: int) -> dict[str, int]:
    """What Node Allocatable keeps back per memory type (kube- and system-reserved and
    the hard eviction threshold), which reservedMemory must add up to."""
    held = reservation(
        {"memory": capacity_memory},
        kube_reserved=cfg.kube_reserved,
        system_reserved=cfg.system_reserved,
        eviction_hard=cfg.eviction_hard,
    )
    return {k: v for k, v in held.items() if k == "memory" or k.startswith("hugepages-")}


def create_manager(
    cfg: KubeletConfiguration,
    root_dir: Path,
    *,
    sys_node: Path = SYS_NODE,
    machine: Machine | None = None,
    observer: MemoryObserver | None = None,
) -> MemoryManager:
    """The manager memoryManagerPolicy asks for; raises MemoryManagerError naming the
    field (upstream's kubelet does not start either)."""
    if cfg.memory_manager_policy in ("", NONE):
        return MemoryManager(None, root_dir, observer=observer)
    try:
        machine = machine or discover(sys_node)
    except NUMAError as err:
        raise MemoryManagerError(f"memoryManagerPolicy: Static: {err}") from err
    if not cfg.reserved_memory:
        raise MemoryManagerError(
            "memoryManagerPolicy: Static: [memorymanager] you should specify the system "
            "reserved memory (reservedMemory)"
        )
    capacity = sum(n.memory for n in machine.nodes)
    try:
        reserved = reserved_per_node(
            cfg.reserved_memory, machine.nodes, node_memory_reservation(cfg, capacity)
        )
    except ValueError as err:
        raise MemoryManagerError(str(err)) from err
    return MemoryManager(StaticPolicy(machine.nodes, reserved), root_dir, observer=observer)
