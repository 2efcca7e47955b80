"""SyncPod and KillPod: perform the computed actions through CRI.

The decisions are in actions.py; this module only carries them out, in upstream's
order (kill the old sandbox, kill unwanted containers, prepare the pod's DRA claims,
create the sandbox, pull, create and start containers), records the events, and
reports why containers still wait.
CRI errors for one container do not stop the others; the worker re-syncs later.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from klet.cri import CRIError
from klet.cri.types import ContainerState, DNSConfig, SandboxConfig
from klet.model.flowcontrol import Backoff
from klet.model.types import JSON, SandboxID
from klet.syncloop.containers import criconfig, fields, podcgroups, termination
from klet.syncloop.containers.hooks import LifecycleHooks, container_spec
from klet.syncloop.containers.images import ImagePuller
from klet.syncloop.containers.podcgroups import PodCgroups
from klet.syncloop.containers.startcontainer import ContainerStarter
from klet.syncloop.containers.syncsettings import SyncSettings
from klet.syncloop.criprotocols import RuntimeService
from klet.syncloop.dra.manager import DRAPrepareError
from klet.syncloop.environment import dns, etchosts
from klet.syncloop.environment.kubeobjects import KubeObjects
from klet.syncloop.eventrecorder import EventSink
from klet.syncloop.model import podspec, resources, runtimepod
from klet.syncloop.model.runtimepod import RuntimePod, pod_ip_of
from klet.syncloop.pods import actions as actions_mod
from klet.syncloop.pods import runtimeclass
from klet.syncloop.pods.actions import PodActions, StartAction, compute_pod_actions
from klet.syncloop.pods.runtime import PodRuntime
from klet.syncloop.pods.runtimeclass import RuntimeClasses
from klet.syncloop.probing.proberesults import NO_PROBES, ProbeResults
from klet.syncloop.volumes.base import Block
from klet.syncloop.volumes.manager import VolumeManager

log = logging.getLogger(__name__)

QOS_RECHECK_S = 60.0
"""Seconds after which the burstable QoS cgroup's size is applied again even unchanged
(its files may have been changed behind klet's back)."""

VOLUME_RETRY_S = 5.0
"""How soon a pod whose volumes could not be set up is synced again, seconds."""


class PodClaims(Protocol):
    """The DRA claim manager as the pod path needs it (dra/manager.py); raises
    DRAPrepareError saying why."""

    async def prepare(self, pod: JSON) -> None: ...

    async def unprepare(self, pod_uid: str) -> None: ...


@dataclass
class SyncResult:
    waiting: dict[str, tuple[str, str]] = field(default_factory=dict)
    wake_at: float | None = None
    acted: bool = False
    started: bool = False
    """A sidecar started: the containers that wait for it need another sync. A main,
    ephemeral or plain init container's start sets nothing: nothing waits for it to
    have started (a plain init container's exit is a runtime event), and the status
    after the start is read in the same sync, so a second sync would only read CRI
    again to find nothing to do (issue 42: a third ListPodSandbox + ListContainers
    pair, PodSandboxStatus and ContainerStatus per pod start)."""
    failed: bool = False
    """A sandbox or container could not be made or started (upstream's SyncPod returns
    an error): the pod worker retries after its back-off."""


FAILED_START = frozenset(
    {"CreateContainerConfigError", "CreateContainerError", "RunContainerError"}
)
"""The waiting reasons of a container whose start failed, not one in a back-off
(CrashLoopBackOff, ImagePullBackOff), which upstream's SyncPod does not count as an error."""


class StartObserver(Protocol):
    """Told of sandbox and container starts and of pod cgroup operations (syncloop's
    metrics: kubelet_started_*_total, kubelet_cgroup_manager_duration_seconds)."""

    def pod_starting(self) -> None: ...

    def pod_failed(self) -> None: ...

    def container_starting(self, container_type: str) -> None: ...

    def container_failed(self, container_type: str, code: str) -> None: ...

    def cgroup_operation(self, operation: str, seconds: float) -> None: ...


class _NoObserver:
    def pod_starting(self) -> None:
        return None

    def pod_failed(self) -> None:
        return None

    def container_starting(self, container_type: str) -> None:
        return None

    def container_failed(self, container_type: str, code: str) -> None:
        return None

    def cgroup_operation(self, operation: str, seconds: float) -> None:
        return None


# upstream's container_type label values of kubelet_started_containers_total
CONTAINER, INIT_CONTAINER = "container", "init_container"
EPHEMERAL_CONTAINER = "ephemeral_container"


class PodSyncer:
    def __init__(
        self,
        *,
        cri: RuntimeService,
        runtime: PodRuntime,
        puller: ImagePuller,
        events: EventSink,
        cgroups: PodCgroups | None,
        settings: SyncSettings,
        backoff: Backoff,
        hooks: LifecycleHooks,
        clock: Callable[[], float] = time.time,
        objects: KubeObjects | None = None,
        volumes: VolumeManager | None = None,
        runtime_classes: RuntimeClasses | None = None,
        observer: StartObserver | None = None,
    ) -> None:
        self.cri = cri
        self.observer: StartObserver = observer or _NoObserver()
        self.runtime = runtime
        self.puller = puller
        self.events = events
        self.cgroups = cgroups
        self._qos_applied: tuple[int, float] | None = None  # (burstable shares, when)
        self.settings = settings
        self.backoff = backoff
        # The crash-loop back-off keys of every container started, by pod UID, so the
        # entries of a pod that is gone go with it (forget_pod).
        self._backoff_keys: dict[str, set[str]] = {}
        self.clock = clock
        self.objects = objects  # the apiserver's ConfigMaps and Secrets; None standalone
        self.volumes = volumes  # None: pods get no volumes (a syncer without a root dir)
        self.runtime_classes = runtime_classes  # None standalone (admission refuses them)
        self.hooks = hooks
        # Sandbox creations in flight, all pods together (see SyncSettings): a burst of
        # new pods queues here in arrival order instead of thrashing the runtime.
        self._sandbox_gate: AbstractAsyncContextManager[object] = (
            asyncio.Semaphore(settings.parallel_sandbox_creations)
            if settings.parallel_sandbox_creations > 0
            else nullcontext()
        )
        self.starter = ContainerStarter(
            cri=cri,
            puller=puller,
            events=events,
            hooks=self.hooks,
            settings=settings,
            backoff=backoff,
            clock=clock,
            objects=objects,
        )
        self.claims: PodClaims | None = None
        """The DRA claim manager (set by wiring; None: standalone or the gate off, and a
        pod with claims fails to prepare, naming why)."""

    def _cgroup_parent(self, pod: JSON) -> str:
        """What CRI gets as the cgroup parent: the pod cgroup in the driver's form."""
        if self.cgroups is None or not self.settings.cgroups_per_qos:
            return ""
        return self.cgroups.cri_parent(podspec.pod_cgroup_parent(pod, self.settings.cgroup_root))

    async def update_qos(self, active_pods: list[JSON]) -> None:
        """Size the burstable QoS cgroup for the active pods (upstream's UpdateQOSCgroups,
        which its SyncPod runs before a pod's cgroup). The same size applied less than
        QOS_RECHECK_S ago is not applied again: 110 pods re-adopted after a restart are
        110 syncs with one size, and each application reads the node's cgroup files."""
        if self.cgroups is None or not self.settings.cgroups_per_qos:
            return
        shares = resources.burstable_cpu_shares(active_pods)
        now = self.clock()
        if self._qos_applied is not None:
            applied, at = self._qos_applied
            if applied == shares and 0 <= now - at < QOS_RECHECK_S:
                return
        problems = await self.cgroups.update_qos(shares)
        if problems:
            self._qos_applied = None
            log.warning("QoS cgroup not updated", extra={"problems": problems})
        else:
            self._qos_applied = (shares, now)

    async def sync(
        self, pod: JSON, current: RuntimePod, *, probes: ProbeResults = NO_PROBES
    ) -> SyncResult:
        now = self.clock()
        actions = compute_pod_actions(pod, current, self.backoff, now, probes)
        result = SyncResult(waiting=dict(actions.waiting), wake_at=actions.wake_at)
        if acts(actions):
            # The pod's kept read would not show what this sync does (runtimecache.py).
            self.runtime.invalidate(current.uid)
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
        try:
            sandbox_cfg = criconfig.sandbox_config(
                pod,
                attempt=actions.sandbox_attempt,
                pod_logs_dir=str(self.settings.pod_logs_dir),
                cgroup_parent=self._cgroup_parent(pod),
                cluster_domain=self._cluster_domain(),
                dns_config=self._sandbox_dns(pod) if actions.create_sandbox else None,
            )
        except dns.PodDNSError as err:  # as upstream: the sandbox is not made
            return self._sandbox_failed(pod, result, err, now=now)
        # Volumes come before the sandbox, as upstream: a pod whose volume cannot be set
        # up gets no sandbox and waits in ContainerCreating.
        ready = await self._set_up_volumes(
            pod, actions, current, pod_ip=pod_ip_of(current), result=result
        )
        if ready is None:
            return result
        volumes, devices = ready
        sandbox_id: SandboxID | None
        pod_ip = ""
        if actions.create_sandbox:
            result.acted = True
            self._warn_ignored_fields(pod)
            os.makedirs(sandbox_cfg.log_directory, mode=0o755, exist_ok=True)
            if self.cgroups is not None and self.settings.cgroups_per_qos:
                pod_res = resources.pod_resources(pod, podcgroups.node_limits(self.settings))
                cpus = self.starter.cpus
                if cpus is not None and cpus.unlimited_quota(str(podspec.meta(pod).get("uid", ""))):
                    # DisableCPUQuotaWithExclusiveCPUs: no CFS quota on the pod's cgroup
                    pod_res = replace(pod_res, cpu_quota=-1)
                began = time.monotonic()
                existed, problems = await self.cgroups.ensure(
                    podspec.pod_cgroup_parent(pod, self.settings.cgroup_root), pod_res
                )
                self.observer.cgroup_operation(
                    "update" if existed else "create", time.monotonic() - began
                )
                if problems:
                    log.warning(
                        "pod cgroup limits", extra={"pod": _name(pod), "problems": problems}
                    )
            if (pod.get("spec") or {}).get("resourceClaims"):
                try:
                    await self.prepare_claims(pod)
                except DRAPrepareError as err:
                    return self._claims_failed(pod, result, err, now=now)
            self.observer.pod_starting()
            try:
                handler = await runtimeclass.runtime_handler(pod, self.runtime_classes)
            except runtimeclass.RuntimeClassError as err:
                self.observer.pod_failed()
                return self._sandbox_failed(pod, result, err, now=now)
            try:
                async with self._sandbox_gate:
                    sandbox_id = await self.cri.run_pod_sandbox(
                        sandbox_cfg, runtime_handler=handler
                    )
                    pod_ip = (await self.cri.pod_sandbox_status(sandbox_id)).ip
            except CRIError as err:
                self.observer.pod_failed()
                return self._sandbox_failed(pod, result, err, now=now)
        else:
            latest = current.latest_sandbox()
            sandbox_id = latest.id if latest else None
            pod_ip = latest.ip if latest else ""
        if sandbox_id is None:
            return result

        async def start_one(spec: JSON, start: StartAction, container_type: str) -> bool:
            self.observer.container_starting(container_type)
            started = await self._start_one(
                pod,
                spec,
                start,
                current,
                sandbox_id,
                sandbox_cfg,
                pod_ip,
                result,
                volumes=volumes,
                devices=devices,
            )
            if not started:
                reason = result.waiting.get(start.name, ("", ""))[0]
                self.observer.container_failed(container_type, reason or "Unknown")
            elif container_type == INIT_CONTAINER and podspec.is_sidecar(spec):
                result.started = True
            return started

        # Ephemeral containers first, as upstream: a debug container can look at a pod
        # whose initialization is stuck.
        ephemerals = {c["name"]: c for c in podspec.ephemeral_containers(pod)}
        for start in actions.ephemeral_to_start:
            await start_one(ephemerals[start.name], start, EPHEMERAL_CONTAINER)
        inits = {c["name"]: c for c in podspec.init_containers(pod)}
        for start in actions.init_to_start:
            started = await start_one(inits[start.name], start, INIT_CONTAINER)
            if not started and not podspec.is_sidecar(inits[start.name]):
                return result  # initialization cannot go on past a plain init container
        specs = {c["name"]: c for c in podspec.containers(pod)}
        for start in actions.to_start:
            await start_one(specs[start.name], start, CONTAINER)
        return result

    async def _set_up_volumes(
        self,
        pod: JSON,
        actions: PodActions,
        current: RuntimePod,
        *,
        pod_ip: str,
        result: SyncResult,
    ) -> tuple[dict[str, Path], dict[str, Block]] | None:
        """The pod's volumes by name (filesystems, raw block devices), set up (or
        refreshed) while it has containers to start or running; None when one failed: a
        FailedMount event per volume says why, the containers to start wait in
        ContainerCreating, and the pod is synced again soon. Running containers are left
        alone."""
        if self.volumes is None:
            return {}, {}
        if not (
            actions.init_to_start
            or actions.to_start
            or actions.ephemeral_to_start
            or current.running()
        ):
            return {}, {}
        outcome = await self.volumes.set_up(pod, pod_ip=pod_ip)
        if not outcome.failures:
            return outcome.paths, outcome.devices
        for name, cause in outcome.failures.items():
            message = f'MountVolume.SetUp failed for volume "{name}" : {cause}'
            self.events.emit(pod, "Warning", "FailedMount", message)
        log.info("pod volumes not ready", extra={"pod": _name(pod), "failures": outcome.failures})
        for start in [*actions.ephemeral_to_start, *actions.init_to_start, *actions.to_start]:
            result.waiting.setdefault(start.name, ("ContainerCreating", ""))
        retry = self.clock() + VOLUME_RETRY_S
        result.wake_at = retry if result.wake_at is None else min(result.wake_at, retry)
        return None

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
        *,
        volumes: dict[str, Path],
        devices: dict[str, Block],
    ) -> bool:
        """Start one container, recording why it waits if it cannot; True if started."""
        result.acted = True
        uid = str(podspec.meta(pod).get("uid", ""))
        self._backoff_keys.setdefault(uid, set()).add(podspec.backoff_key(pod, container))
        waiting = await self.starter.start(
            pod,
            container,
            current,
            sandbox_id,
            sandbox_cfg,
            pod_ip,
            volumes=volumes,
            devices=devices,
        )
        if waiting is not None:
            result.waiting[start.name] = waiting[0]
            if waiting[0][0] in FAILED_START:
                result.failed = True  # retried after the pod worker's back-off
            elif waiting[1] is not None:
                result.wake_at = (
                    waiting[1] if result.wake_at is None else min(result.wake_at, waiting[1])
                )
            return False
        if start.backoff_key:
            self.backoff.next(start.backoff_key, self.clock())
        return True

    async def prepare_claims(self, pod: JSON) -> None:
        """upstream's PrepareDynamicResources, run before each new sandbox: a running
        pod's claims are not prepared again (a restarted syncloop finds them in the
        checkpoint); DRAPrepareError when they cannot be."""
        if self.claims is None:
            raise DRAPrepareError(
                "DRA is off on this node (featureGates.DynamicResourceAllocation=false, or "
                "standalone: no API server to read the pod's ResourceClaims from)"
            )
        await self.claims.prepare(pod)

    async def unprepare_claims(self, uid: str) -> None:
        """upstream's UnprepareDynamicResources once the pod's containers have stopped;
        DRAPrepareError when a driver could not (the caller's sync is retried)."""
        if self.claims is not None:
            await self.claims.unprepare(uid)

    def _claims_failed(
        self, pod: JSON, result: SyncResult, err: DRAPrepareError, *, now: float
    ) -> SyncResult:
        """upstream's FailedPrepareDynamicResources: the Event, no sandbox, a retried sync."""
        log.warning("pod's claims not prepared", extra={"pod": _name(pod), "error": str(err)})
        message = f"Failed to prepare dynamic resources: {err}"
        return self._not_started(pod, result, "FailedPrepareDynamicResources", message, now=now)

    def _sandbox_failed(
        self, pod: JSON, result: SyncResult, err: Exception, *, now: float
    ) -> SyncResult:
        log.warning("sandbox creation failed", extra={"pod": _name(pod), "error": str(err)})
        message = f"Failed to create pod sandbox: {err}"
        return self._not_started(pod, result, "FailedCreatePodSandBox", message, now=now)

    def _not_started(
        self, pod: JSON, result: SyncResult, reason: str, message: str, *, now: float
    ) -> SyncResult:
        """No sandbox this sync: a Warning Event `reason`, the containers waiting in
        ContainerCreating, the sync retried in 5 s."""
        self.events.emit(pod, "Warning", reason, message)
        for c in podspec.containers(pod):
            result.waiting.setdefault(c["name"], ("ContainerCreating", ""))
        result.wake_at = now + 5
        result.failed = True
        return result

    def _cluster_domain(self) -> str:
        return self.settings.dns.cluster_domain if self.settings.dns else ""

    def _sandbox_dns(self, pod: JSON) -> DNSConfig | None:
        """The new sandbox's resolver configuration; its warnings become pod events.

        Raises `dns.PodDNSError` when the node's resolver file cannot be read."""
        if self.settings.dns is None:
            return None
        planned = dns.pod_dns(
            pod,
            settings=self.settings.dns,
            host=dns.load_host_config(self.settings.dns.resolv_conf),
            node_ips=self.settings.node.host_ips,
        )
        for reason, message in planned.warnings:
            self.events.emit(pod, "Warning", reason, message)
        return planned.config

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

    def forget_pod(self, uid: str) -> None:
        """The pod is gone: drop its containers' crash-loop back-off entries."""
        for key in self._backoff_keys.pop(uid, ()):
            self.backoff.reset(key)

    async def release_volumes(self, uid: str) -> bool:
        """Tear down a terminated pod's volumes (upstream SyncTerminatedPod); True once
        none is left (or the syncer sets up none), False to try again."""
        return self.volumes is None or not await self.volumes.tear_down(uid)

    async def kill_pod(
        self, pod: JSON | None, current: RuntimePod, *, grace_override: int | None, remove: bool
    ) -> None:
        """Stop every container (in parallel, each with the grace period), then the sandboxes.

        With `remove`, also remove the sandboxes (and so their containers) and the pod's
        cgroup: the pod is gone for good. Without it, the dead containers stay for
        their status and logs.
        """
        self.runtime.invalidate(current.uid)  # its kept read will not show the kill
        if pod is not None:
            grace = podspec.grace_period_s(pod, grace_override)
        else:
            # The spec is unknown (a pod removed while syncloop was down): use the grace
            # period recorded on its containers. Upstream kills such orphans with 1 s;
            # keeping the pod's own grace is the gentler choice for the same outcome.
            override = (
                grace_override if grace_override is not None else runtimepod.recorded_grace(current)
            )
            grace = podspec.grace_period_s({}, override)
        # A pod removed for good: its objects' exit and delete events concern nobody (the
        # worker forgets the pod after this); taken back if the kill fails (runtime.py).
        notes = self.runtime.exits
        objects = [*(c.id for c in current.containers), *(s.id for s in current.sandboxes)]
        removing = objects if remove else []
        for oid in removing:
            notes.expect_removal(oid)
        try:
            await self._kill(pod, current, grace=grace, remove=remove)
        except BaseException:
            for oid in removing:
                notes.stop_failed(oid)
            raise

    async def _kill(
        self, pod: JSON | None, current: RuntimePod, *, grace: int, remove: bool
    ) -> None:
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
        for group in actions_mod.kill_order(pod, live):
            await pre_stops.wait(group)
            # Sidecars stop after the main containers, each with what is left of the grace.
            # grace minus the whole seconds used so far (upstream truncates the time used)
            budget = max(math.ceil(deadline - self.clock()), podspec.MINIMUM_GRACE_PERIOD_S)
            results = await asyncio.gather(
                *(
                    self.hooks.stop(c.id, timeout_s=budget, started_at_ns=c.started_at)
                    for c in group
                ),
                return_exceptions=True,
            )
            errors += [r for r in results if isinstance(r, BaseException)]
        # StopPodSandbox and the removals are synchronous and the caller reads the pod
        # after them (or forgets it): their events need no confirmation (runtime.py).
        notes = self.runtime.exits
        for s in current.sandboxes:
            notes.expect_stop(s.id)
            try:
                await self.cri.stop_pod_sandbox(s.id)
            except BaseException:
                notes.stop_failed(s.id)
                raise
        if errors:
            raise errors[0]
        if remove:
            for s in current.sandboxes:
                await self.cri.remove_pod_sandbox(s.id)
            for c in current.containers:
                await self.cri.remove_container(c.id)
            self.runtime.forget(current)
            if self.volumes is not None:  # unmounted and removed before the pod directory
                await self.volumes.tear_down(current.uid)
            if self.settings.root_dir is not None:
                etchosts.remove_hosts_file(self.settings.root_dir, current.uid)
                termination.remove_pod_files(self.settings.root_dir, current.uid)
            if self.cgroups is not None and pod is not None and self.settings.cgroups_per_qos:
                left = await self.cgroups.remove(
                    podspec.pod_cgroup_parent(pod, self.settings.cgroup_root)
                )
                if left:
                    log.warning("pod cgroup not removed", extra={"pod": _name(pod), "left": left})


def acts(actions: PodActions) -> bool:
    """Whether carrying out `actions` changes anything in the runtime."""
    return bool(
        actions.kill_pod
        or actions.create_sandbox
        or actions.purge_init
        or actions.init_to_start
        or actions.to_start
        or actions.ephemeral_to_start
        or actions.to_kill
    )


def _name(pod: JSON) -> str:
    m = pod.get("metadata") or {}
    return f"{m.get('namespace', 'default')}/{m.get('name', '')}"
