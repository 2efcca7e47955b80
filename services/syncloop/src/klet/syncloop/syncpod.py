"""SyncPod and KillPod: perform the computed actions through CRI.

The decisions are in actions.py; this module only carries them out, in upstream's
order (kill the old sandbox, kill unwanted containers, create the sandbox, pull, create
and start containers), records the events, and reports why containers still wait.
CRI errors for one container do not stop the others; the worker re-syncs later.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from klet.cgroups import CgroupFS
from klet.cri import CRIError
from klet.cri import labels as L
from klet.cri.types import ContainerState, ContainerStatusInfo, SandboxConfig
from klet.model.types import JSON, SandboxID
from klet.syncloop import (
    criconfig,
    envvars,
    fields,
    kubeobjects,
    podcgroups,
    podspec,
    resources,
    security,
    termination,
)
from klet.syncloop.actions import StartAction, compute_pod_actions
from klet.syncloop.backoff import Backoff
from klet.syncloop.envvars import NodeFacts
from klet.syncloop.events import EventSink
from klet.syncloop.hooks import LifecycleHooks, container_spec, pod_ip_of
from klet.syncloop.images import ImagePuller
from klet.syncloop.kubeobjects import KubeObjects
from klet.syncloop.ports import RuntimeService
from klet.syncloop.proberesults import NO_PROBES, ProbeResults
from klet.syncloop.runtime import PodRuntime
from klet.syncloop.runtimepod import RuntimePod, restart_count_of
from klet.syncloop.security import SecuritySettings

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
    root_dir: Path | None = None
    """--root-dir; pods' termination-message files go under <root>/pods/<uid>. None: no files."""
    hook_timeout_s: float = 120.0
    """How long a postStart hook may run (runtimeRequestTimeout), seconds."""
    security: SecuritySettings = field(default_factory=SecuritySettings)
    """seccompDefault and where Localhost seccomp profiles live."""


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
        hooks: LifecycleHooks | None = None,
        objects: KubeObjects | None = None,
    ) -> None:
        self.cri = cri
        self.runtime = runtime
        self.puller = puller
        self.events = events
        self.cgroups = cgroups
        self.settings = settings
        self.backoff = backoff
        self.clock = clock
        self.objects = objects  # the apiserver's ConfigMaps and Secrets; None standalone
        self.hooks = hooks or LifecycleHooks(
            cri=cri,
            events=events,
            host_ip=next(iter(settings.node.host_ips), ""),
            post_start_timeout_s=settings.hook_timeout_s,
        )

    def _cgroup_parent(self, pod: JSON) -> str:
        return podspec.pod_cgroup_parent(pod) if self.settings.cgroups_per_qos else ""

    async def sync(
        self, pod: JSON, current: RuntimePod, *, probes: ProbeResults = NO_PROBES
    ) -> SyncResult:
        now = self.clock()
        actions = compute_pod_actions(pod, current, self.backoff, now, probes)
        result = SyncResult(waiting=dict(actions.waiting), wake_at=actions.wake_at)
        if actions.kill_pod:
            result.acted = True
            await self.kill_pod(pod, current, grace_override=None, remove=False)
            if not actions.create_sandbox:
                return result
        for cid, kill in actions.to_kill.items():
            result.acted = True
            path = podspec.field_path(pod, kill.name)
            self.events.emit(pod, "Normal", "Killing", kill.message, field_path=path)
            await self.hooks.kill_container(
                pod,
                container_spec(pod, kill.name),
                cid,
                grace_s=podspec.grace_period_s(pod, kill.grace_s),
                pod_ip=pod_ip_of(current),
            )
        if actions.purge_init:
            await self._purge_init_containers(pod, current)
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
            self._warn_ignored_fields(pod)
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
        if sandbox_id is None:
            return result
        inits = {c["name"]: c for c in podspec.init_containers(pod)}
        for start in actions.init_to_start:
            started = await self._start_one(
                pod, inits[start.name], start, current, sandbox_id, sandbox_cfg, pod_ip, result
            )
            if not started and not podspec.is_sidecar(inits[start.name]):
                return result  # initialization cannot go on past a plain init container
        specs = {c["name"]: c for c in podspec.containers(pod)}
        for start in actions.to_start:
            await self._start_one(
                pod, specs[start.name], start, current, sandbox_id, sandbox_cfg, pod_ip, result
            )
        return result

    async def _start_one(
        self,
        pod: JSON,
        container: JSON,
        start: StartAction,
        current: RuntimePod,
        sandbox_id: SandboxID,
        sandbox_cfg: SandboxConfig,
        pod_ip: str,
        result: SyncResult,
    ) -> bool:
        """Start one container, recording why it waits if it cannot; True if started."""
        result.acted = True
        waiting = await self._start(pod, container, current, sandbox_id, sandbox_cfg, pod_ip)
        if waiting is not None:
            result.waiting[start.name] = waiting[0]
            if waiting[1] is not None:
                result.wake_at = (
                    waiting[1] if result.wake_at is None else min(result.wake_at, waiting[1])
                )
            return False
        if start.backoff_key:
            self.backoff.next(start.backoff_key, self.clock())
        return True

    def _node_context(self) -> criconfig.NodeContext:
        return criconfig.NodeContext(
            facts=self.settings.node,
            limits=podcgroups.node_limits(self.settings),
            security=self.settings.security,
        )

    def _warn_ignored_fields(self, pod: JSON) -> None:
        """A Warning event per container that sets fields klet does not implement."""
        for c in podspec.init_containers(pod) + podspec.containers(pod):
            ignored = fields.ignored_in(c)
            if ignored:
                self.events.emit(
                    pod,
                    "Warning",
                    "FieldsIgnored",
                    f"klet ignores these fields of container {c['name']}: {', '.join(ignored)}",
                    field_path=podspec.field_path(pod, c["name"]),
                )

    async def _purge_init_containers(self, pod: JSON, current: RuntimePod) -> None:
        """Remove every instance of the init containers before a new sandbox starts.

        Initialization starts over in the new sandbox; an old instance that exited 0
        would otherwise count as done (upstream purgeInitContainers).
        """
        names = {c["name"] for c in podspec.init_containers(pod)}
        for c in current.containers:
            if c.name in names:
                try:
                    await self.cri.remove_container(c.id)
                except CRIError as err:
                    log.warning(
                        "init container not purged",
                        extra={"pod": _name(pod), "container": c.name, "error": str(err)},
                    )

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
        pulled = await self.puller.ensure(pod, container, sandbox_cfg)
        if pulled.image_ref is None:
            assert pulled.waiting is not None
            return pulled.waiting, pulled.wake_at
        last = current.latest(name)
        restart_count = restart_count_of(last) + 1 if last is not None else 0
        # The image's user: passed on as the user to run as, and checked by runAsNonRoot.
        image_user = security.image_user(await self.cri.image_status(pulled.image_ref))
        # ConfigMaps and Secrets the environment refers to (None: no apiserver).
        env_sources = await kubeobjects.env_sources(self.objects, pod, container)
        try:
            instance = criconfig.Instance(
                restart_count=restart_count,
                image=pulled.image_ref,
                pod_ips=(pod_ip,) if pod_ip else (),
                image_user=image_user,
                mounts=termination.mounts_for(self.settings.root_dir, pod, container),
                env_sources=env_sources,
            )
            cfg = criconfig.container_config(
                pod, container, instance=instance, node=self._node_context()
            )
        except envvars.EnvError as err:
            # upstream's pod worker retries a failed sync after about 10 s
            self.events.emit(
                pod, "Warning", "Failed", f"Error: {err}", field_path=podspec.field_path(pod, name)
            )
            return ("CreateContainerConfigError", str(err)), self.clock() + 10
        except security.SecurityConfigError as err:
            self.events.emit(
                pod, "Warning", "Failed", f"Error: {err}", field_path=podspec.field_path(pod, name)
            )
            return ("CreateContainerConfigError", str(err)), None
        os.makedirs(os.path.join(sandbox_cfg.log_directory, name), mode=0o755, exist_ok=True)
        field_path = podspec.field_path(pod, name)
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
        hook_failed = await self.hooks.post_start(
            pod, container, cid, pod_ip=pod_ip, grace_s=podspec.grace_period_s(pod)
        )
        if hook_failed is not None:
            if last is not None:  # a restart that ran: it counts for the back-off
                self.backoff.next(podspec.backoff_key(pod, container), self.clock())
            return hook_failed, None
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
                    field_path=podspec.field_path(pod, c.name),
                )
        errors: list[BaseException] = []
        deadline = self.clock() + grace
        # preStop hooks all run at once; each container's stop waits for its own hook.
        pre_stops = self.hooks.start_pre_stops(pod, live, grace_s=grace, pod_ip=pod_ip_of(current))
        for group in kill_order(pod, live):
            await pre_stops.wait(group)
            # Sidecars stop after the main containers, each with what is left of the grace.
            # grace minus the whole seconds used so far (upstream truncates the time used)
            budget = max(math.ceil(deadline - self.clock()), podspec.MINIMUM_GRACE_PERIOD_S)
            results = await asyncio.gather(
                *(self.cri.stop_container(c.id, timeout_s=budget) for c in group),
                return_exceptions=True,
            )
            errors += [r for r in results if isinstance(r, BaseException)]
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
            if self.settings.root_dir is not None:
                termination.remove_pod_files(self.settings.root_dir, current.uid)
            if self.cgroups is not None and pod is not None and self.settings.cgroups_per_qos:
                left = self.cgroups.remove(podspec.pod_cgroup_parent(pod))
                if left:
                    log.warning("pod cgroup not removed", extra={"pod": _name(pod), "left": left})


def kill_order(
    pod: JSON | None, live: list[ContainerStatusInfo]
) -> list[list[ContainerStatusInfo]]:
    """Groups of containers to stop one group after the other (upstream's order).

    Regular containers (and any the spec does not name) first, all at once; then the
    sidecars one at a time, last declared first, so a sidecar outlives what uses it.
    """
    sidecars = [c["name"] for c in podspec.init_containers(pod or {}) if podspec.is_sidecar(c)]
    first = [c for c in live if c.name not in sidecars]
    groups = [first] if first else []
    for name in reversed(sidecars):
        group = [c for c in live if c.name == name]
        if group:
            groups.append(group)
    return groups


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
