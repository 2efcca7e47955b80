"""SyncPod and KillPod: perform the computed actions through CRI.

The decisions are in actions.py; this module only carries them out, in upstream's
order (kill the old sandbox, kill unwanted containers, create the sandbox, pull, create
and start containers), records the events, and reports why containers still wait.
CRI errors for one container do not stop the others; the worker re-syncs later.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from klet.cgroups import CgroupFS
from klet.cri import CRIError
from klet.cri import labels as L
from klet.cri.types import ContainerState, SandboxConfig
from klet.model.types import JSON, SandboxID
from klet.syncloop import criconfig, envvars, podcgroups, podspec, resources
from klet.syncloop.actions import compute_pod_actions
from klet.syncloop.backoff import Backoff
from klet.syncloop.envvars import NodeFacts
from klet.syncloop.events import EventSink
from klet.syncloop.images import ImagePuller
from klet.syncloop.ports import RuntimeService
from klet.syncloop.runtime import PodRuntime
from klet.syncloop.runtimepod import RuntimePod, restart_count_of

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SyncSettings:
    pod_logs_dir: Path
    cgroups_per_qos: bool = True
    cpu_cfs_quota: bool = True
    """cpuCFSQuota: enforce CPU limits with CFS quota."""
    cpu_cfs_quota_period: float = 0.1
    """cpuCFSQuotaPeriod, seconds."""
    node: NodeFacts = field(default_factory=NodeFacts)


@dataclass
class SyncResult:
    waiting: dict[str, tuple[str, str]] = field(default_factory=dict)
    wake_at: float | None = None
    acted: bool = False


class PodSyncer:
    def __init__(
        self,
        *,
        cri: RuntimeService,
        runtime: PodRuntime,
        puller: ImagePuller,
        events: EventSink,
        cgroups: CgroupFS | None,
        settings: SyncSettings,
        backoff: Backoff,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.cri = cri
        self.runtime = runtime
        self.puller = puller
        self.events = events
        self.cgroups = cgroups
        self.settings = settings
        self.backoff = backoff
        self.clock = clock

    def _cgroup_parent(self, pod: JSON) -> str:
        return podspec.pod_cgroup_parent(pod) if self.settings.cgroups_per_qos else ""

    async def sync(self, pod: JSON, current: RuntimePod) -> SyncResult:
        now = self.clock()
        actions = compute_pod_actions(pod, current, self.backoff, now)
        result = SyncResult(waiting=dict(actions.waiting), wake_at=actions.wake_at)
        if actions.kill_pod:
            result.acted = True
            await self.kill_pod(pod, current, grace_override=None, remove=False)
            if not actions.create_sandbox:
                return result
        for cid, reason in actions.to_kill.items():
            result.acted = True
            self.events.emit(pod, "Normal", "Killing", reason)
            await self.cri.stop_container(cid, timeout_s=podspec.grace_period_s(pod))
        sandbox_cfg = criconfig.sandbox_config(
            pod,
            attempt=actions.sandbox_attempt,
            pod_logs_dir=str(self.settings.pod_logs_dir),
            cgroup_parent=self._cgroup_parent(pod),
        )
        sandbox_id: SandboxID | None
        pod_ip = ""
        if actions.create_sandbox:
            result.acted = True
            os.makedirs(sandbox_cfg.log_directory, mode=0o755, exist_ok=True)
            if self.cgroups is not None and self.settings.cgroups_per_qos:
                pod_res = resources.pod_resources(pod, podcgroups.node_limits(self.settings))
                problems = podcgroups.ensure_pod_cgroup(
                    sandbox_cfg.cgroup_parent, pod_res, root=self.cgroups.root
                )
                if problems:
                    log.warning(
                        "pod cgroup limits", extra={"pod": _name(pod), "problems": problems}
                    )
            try:
                sandbox_id = await self.cri.run_pod_sandbox(sandbox_cfg)
                pod_ip = (await self.cri.pod_sandbox_status(sandbox_id)).ip
            except CRIError as err:
                message = f"Failed to create pod sandbox: {err}"
                self.events.emit(pod, "Warning", "FailedCreatePodSandBox", message)
                log.warning("sandbox creation failed", extra={"pod": _name(pod), "error": str(err)})
                for c in podspec.containers(pod):
                    result.waiting.setdefault(c["name"], ("ContainerCreating", ""))
                result.wake_at = now + 5
                return result
        else:
            latest = current.latest_sandbox()
            sandbox_id = latest.id if latest else None
            pod_ip = latest.ip if latest else ""
        if sandbox_id is None or not actions.to_start:
            return result
        specs = {c["name"]: c for c in podspec.containers(pod)}
        for start in actions.to_start:
            result.acted = True
            waiting = await self._start(
                pod, specs[start.name], current, sandbox_id, sandbox_cfg, pod_ip
            )
            if waiting is not None:
                result.waiting[start.name] = waiting[0]
                if waiting[1] is not None:
                    result.wake_at = (
                        waiting[1] if result.wake_at is None else min(result.wake_at, waiting[1])
                    )
            elif start.backoff_key:
                self.backoff.next(start.backoff_key, now)
        return result

    async def _start(
        self,
        pod: JSON,
        container: JSON,
        current: RuntimePod,
        sandbox_id: SandboxID,
        sandbox_cfg: SandboxConfig,
        pod_ip: str,
    ) -> tuple[tuple[str, str], float | None] | None:
        name = container["name"]
        missing = envvars.unresolved(container)
        if missing:
            # Starting without variables the container asked for would be worse than not
            # starting it; upstream fails the same way when a reference cannot be read.
            message = (
                f"cannot build the environment of container {name}: {', '.join(missing)} "
                "use ConfigMap/Secret references, which klet does not resolve yet"
            )
            self.events.emit(
                pod,
                "Warning",
                "Failed",
                f"Error: {message}",
                field_path=f"spec.containers{{{name}}}",
            )
            return ("CreateContainerConfigError", message), None
        pulled = await self.puller.ensure(pod, container, sandbox_cfg)
        if pulled.image_ref is None:
            assert pulled.waiting is not None
            return pulled.waiting, pulled.wake_at
        last = current.latest(name)
        restart_count = restart_count_of(last) + 1 if last is not None else 0
        cfg = criconfig.container_config(
            pod,
            container,
            restart_count=restart_count,
            image=pulled.image_ref,
            pod_ips=(pod_ip,) if pod_ip else (),
            node=self.settings.node,
            limits=podcgroups.node_limits(self.settings),
        )
        os.makedirs(os.path.join(sandbox_cfg.log_directory, name), mode=0o755, exist_ok=True)
        field_path = f"spec.containers{{{name}}}"
        try:
            cid = await self.cri.create_container(sandbox_id, cfg, sandbox_cfg)
        except CRIError as err:
            message = f"Error: {err}"
            self.events.emit(pod, "Warning", "Failed", message, field_path=field_path)
            return ("CreateContainerError", message), self.clock() + 10
        self.events.emit(
            pod, "Normal", "Created", f"Created container: {name}", field_path=field_path
        )
        try:
            await self.cri.start_container(cid)
        except CRIError as err:
            message = f"Error: failed to start container {name!r}: {err}"
            self.events.emit(pod, "Warning", "Failed", message, field_path=field_path)
            return ("RunContainerError", message), self.clock() + 10
        self.events.emit(
            pod, "Normal", "Started", f"Started container {name}", field_path=field_path
        )
        return None

    async def kill_pod(
        self, pod: JSON | None, current: RuntimePod, *, grace_override: int | None, remove: bool
    ) -> None:
        """Stop every container (in parallel, each with the grace period), then the sandboxes.

        With `remove`, also remove the sandboxes (and so their containers) and the pod's
        cgroup: the pod is gone for good. Without it, the dead containers stay for
        their status and logs.
        """
        if pod is not None:
            grace = podspec.grace_period_s(pod, grace_override)
        else:
            # The spec is unknown (a pod removed while syncloop was down): use the grace
            # period recorded on its containers. Upstream kills such orphans with 1 s;
            # keeping the pod's own grace is the gentler choice for the same outcome.
            override = grace_override if grace_override is not None else recorded_grace(current)
            grace = podspec.grace_period_s({}, override)
        live = [c for c in current.containers if c.state != ContainerState.EXITED]
        for c in live:
            if pod is not None:
                self.events.emit(
                    pod,
                    "Normal",
                    "Killing",
                    f"Stopping container {c.name}",
                    field_path=f"spec.containers{{{c.name}}}",
                )
        results = await asyncio.gather(
            *(self.cri.stop_container(c.id, timeout_s=grace) for c in live), return_exceptions=True
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        for s in current.sandboxes:
            await self.cri.stop_pod_sandbox(s.id)
        if errors:
            raise errors[0]
        if remove:
            for s in current.sandboxes:
                await self.cri.remove_pod_sandbox(s.id)
            for c in current.containers:
                await self.cri.remove_container(c.id)
            self.runtime.forget(current)
            if self.cgroups is not None and pod is not None and self.settings.cgroups_per_qos:
                left = self.cgroups.remove(podspec.pod_cgroup_parent(pod))
                if left:
                    log.warning("pod cgroup not removed", extra={"pod": _name(pod), "left": left})


def recorded_grace(current: RuntimePod) -> int:
    """The largest terminationGracePeriodSeconds recorded on the pod's containers."""
    values = []
    for c in current.containers:
        try:
            values.append(int(c.annotations.get(L.POD_TERMINATION_GRACE_PERIOD, "")))
        except ValueError:
            continue
    return max(values, default=podspec.MINIMUM_GRACE_PERIOD_S)


def _name(pod: JSON) -> str:
    m = pod.get("metadata") or {}
    return f"{m.get('namespace', 'default')}/{m.get('name', '')}"
