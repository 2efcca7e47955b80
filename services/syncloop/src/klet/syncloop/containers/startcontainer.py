"""Starting one container: what SyncPod does for each container it starts.

Pull the image (with credentials), learn the image's user, resolve the environment's
ConfigMap/Secret references, build the mounts (volumes, the termination-message file,
the managed /etc/hosts), the CRI config, then CreateContainer, StartContainer and the
postStart hook. Any step that fails leaves the container waiting with upstream's
reason (ErrImagePull, CreateContainerConfigError, CreateContainerError,
RunContainerError, PostStartHookError) and the event upstream records.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from klet.cri import CRIError
from klet.cri.types import ContainerConfig, LinuxResources, Mount, SandboxConfig
from klet.model.flowcontrol import Backoff
from klet.model.layout import pod_dir
from klet.model.podvalidation import checked_component
from klet.model.types import JSON, SandboxID
from klet.syncloop.containers import criconfig, podcgroups, security, termination
from klet.syncloop.containers.hooks import LifecycleHooks
from klet.syncloop.containers.images import ImagePuller
from klet.syncloop.containers.syncsettings import SyncSettings
from klet.syncloop.criprotocols import RuntimeService
from klet.syncloop.devices.allocation import AllocationError, DeviceRunOptions
from klet.syncloop.dra.cdi import ClaimResolutionError
from klet.syncloop.dra.manager import DRAPrepareError
from klet.syncloop.environment import envvars, etchosts, kubeobjects
from klet.syncloop.environment.kubeobjects import KubeObjects
from klet.syncloop.eventrecorder import EventSink
from klet.syncloop.model import podspec
from klet.syncloop.model.runtimepod import RuntimePod, restart_count_of
from klet.syncloop.volumes import mounts as volmounts
from klet.syncloop.volumes.base import Block
from klet.syncloop.volumes.subpath import Binder, KernelBinder, SubPathMounter


class DeviceAllocator(Protocol):
    """The device manager as container start needs it (devices/manager.py)."""

    async def container_options(self, pod: JSON, container: JSON) -> DeviceRunOptions | None: ...


class ClaimDevices(Protocol):
    """The DRA claim manager as container start needs it (dra/manager.py): the CDI
    devices of the prepared claims the container uses."""

    def cdi_devices(self, pod: JSON, container: JSON) -> tuple[str, ...]: ...


class MemoryNodes(Protocol):
    """The memory manager as container start needs it (memorymanager/manager.py)."""

    def cpuset_mems(self, uid: str, name: str) -> str: ...


class CPUSets(Protocol):
    """The CPU manager as container start needs it (cpumanager/manager.py)."""

    def cpuset_of(self, pod: JSON, container: JSON) -> str: ...

    def unlimited_quota(self, uid: str, name: str | None = None) -> bool: ...


class ContainerStarter:
    def __init__(
        self,
        *,
        cri: RuntimeService,
        puller: ImagePuller,
        events: EventSink,
        hooks: LifecycleHooks,
        settings: SyncSettings,
        backoff: Backoff,
        clock: Callable[[], float] = time.time,
        objects: KubeObjects | None = None,
        binder: Binder | None = None,
    ) -> None:
        self.cri = cri
        self.puller = puller
        self.events = events
        self.hooks = hooks
        self.settings = settings
        self.backoff = backoff
        self.clock = clock
        self.objects = objects  # the apiserver's ConfigMaps and Secrets; None standalone
        self.binder: Binder = binder or KernelBinder()  # subPath bind mounts
        self.devices: DeviceAllocator | None = None
        """The device manager (set by wiring; None: no device plugins)."""
        self.cpus: CPUSets | None = None
        """The CPU manager (set by wiring; None: no cpuset is set)."""
        self.memory: MemoryNodes | None = None
        """The memory manager (set by wiring; None: no cpuset.mems is set)."""
        self.claims: ClaimDevices | None = None
        """The DRA claim manager (set by wiring; None: no container uses a claim)."""

    def _subpaths(self, pod: JSON) -> SubPathMounter | None:
        """The pod's subPath mounter (None without a root dir: no pod directory)."""
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        if self.settings.root_dir is None or not uid:
            return None
        return SubPathMounter(pod_dir(self.settings.root_dir, uid), self.binder)

    def _hosts_mount(
        self, pod: JSON, container: JSON, pod_ip: str, sandbox_id: SandboxID
    ) -> tuple[Mount, ...]:
        """The managed /etc/hosts mount (none without a root dir); raises HostsFileError."""
        if self.settings.root_dir is None:
            return ()
        return etchosts.hosts_mount(
            self.settings.root_dir,
            pod,
            container,
            sandbox_id=sandbox_id,
            pod_ip=pod_ip,
            node_ips=self.settings.node.host_ips,
            cluster_domain=self.settings.dns.cluster_domain if self.settings.dns else "",
        )

    def _node_context(self) -> criconfig.NodeContext:
        return criconfig.NodeContext(
            facts=self.settings.node,
            limits=podcgroups.node_limits(self.settings),
            security=self.settings.security,
        )

    async def start(
        self,
        pod: JSON,
        container: JSON,
        current: RuntimePod,
        sandbox_id: SandboxID,
        sandbox_cfg: SandboxConfig,
        pod_ip: str,
        *,
        volumes: dict[str, Path],
        devices: Mapping[str, Block] | None = None,
    ) -> tuple[tuple[str, str], float | None] | None:
        """Pull, build the config, create, start, run postStart.

        None when the container runs; else ((reason, message), when to retry or None)
        for the waiting state the status shows.
        """
        name = container["name"]
        pulled = await self.puller.ensure(pod, container, sandbox_cfg)
        if pulled.image_ref is None:
            assert pulled.waiting is not None
            return pulled.waiting, pulled.wake_at
        last = current.latest(name)
        restart_count = restart_count_of(last) + 1 if last is not None else 0
        target = str(container.get("targetContainerName") or "")
        target_last = current.latest(target) if target else None
        if target and target_last is None:
            message = f"target container {target!r} of ephemeral container {name!r} not found"
            return ("CreateContainerConfigError", message), self.clock() + 10
        # The image's user: passed on as the user to run as, and checked by runAsNonRoot;
        # from the ImageStatus the pull step read, else asked now.
        info = pulled.info
        if info is None:
            info = await self.cri.image_status(pulled.image_ref)
        image_user = security.image_user(info)
        # ConfigMaps and Secrets the environment refers to (None: no apiserver).
        env_sources = await kubeobjects.env_sources(self.objects, pod, container)
        # What status.podIP(s) say: the sandbox's address, or for a host-network pod the
        # node's, as upstream's SyncPod hands the reported pod IPs to the runtime manager.
        pod_ips = etchosts.reported_pod_ips(
            pod, pod_ip=pod_ip, node_ips=self.settings.node.host_ips
        )
        allocated = None
        if self.devices is not None:
            try:
                allocated = await self.devices.container_options(pod, container)
            except AllocationError as err:
                # upstream: GetResources fails generateContainerConfig
                message = f"Error: {err}"
                self.events.emit(
                    pod, "Warning", "Failed", message, field_path=podspec.field_path(pod, name)
                )
                return ("CreateContainerConfigError", message), self.clock() + 10
        cdi_devices: tuple[str, ...] = ()
        if self.claims is not None:
            try:
                cdi_devices = self.claims.cdi_devices(pod, container)
            except (ClaimResolutionError, DRAPrepareError) as err:
                # upstream: GetResources fails generateContainerConfig
                message = f"Error: {err}"
                self.events.emit(
                    pod, "Warning", "Failed", message, field_path=podspec.field_path(pod, name)
                )
                return ("CreateContainerConfigError", message), self.clock() + 10
        try:
            # volumeMounts first (subPathExpr expands with the container's environment)
            volume_mounts = volmounts.container_mounts(
                pod,
                container,
                volumes=volumes,
                env=envvars.container_env(
                    pod,
                    container,
                    pod_ips=pod_ips,
                    node=self.settings.node,
                    sources=env_sources,
                ),
                subpaths=self._subpaths(pod),
                devices=devices,
            )
            volume_devices = volmounts.container_devices(
                container, devices=devices or {}, volumes=volumes
            )
            instance = criconfig.Instance(
                restart_count=restart_count,
                image=pulled.image_ref,
                pod_ips=pod_ips,
                image_user=image_user,
                mounts=volume_mounts
                + termination.mounts_for(self.settings.root_dir, pod, container)
                + self._hosts_mount(pod, container, pod_ip, sandbox_id),
                devices=volume_devices,
                env_sources=env_sources,
                pid_target=target_last.id if target_last is not None else "",
                allocated=allocated,
                dra_cdi_devices=cdi_devices,
            )
            cfg = criconfig.container_config(
                pod, container, instance=instance, node=self._node_context()
            )
            if self.cpus is not None:
                cfg = _with_cpuset(cfg, pod, container, self.cpus)
            if self.memory is not None:
                cfg = _with_mems(cfg, pod, container, self.memory)
        except (envvars.EnvError, etchosts.HostsFileError, volmounts.MountConfigError) as err:
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
        log_dir = os.path.join(
            sandbox_cfg.log_directory, checked_component(name, what="container name")
        )
        os.makedirs(log_dir, mode=0o755, exist_ok=True)
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


def _with_cpuset(
    cfg: ContainerConfig, pod: JSON, container: JSON, cpus: CPUSets
) -> ContainerConfig:
    """The CPU manager's cpuset in the CRI config (upstream's PreCreateContainer), and no
    CFS quota for a container with exclusive CPUs (DisableCPUQuotaWithExclusiveCPUs)."""
    cpuset = cpus.cpuset_of(pod, container)
    if not cpuset:
        return cfg
    resources = replace(cfg.resources or LinuxResources(), cpuset_cpus=cpuset)
    uid = str((pod.get("metadata") or {}).get("uid") or "")
    if cpus.unlimited_quota(uid, str(container.get("name") or "")):
        resources = replace(resources, cpu_quota=-1)
    return replace(cfg, resources=resources)


def _with_mems(
    cfg: ContainerConfig, pod: JSON, container: JSON, memory: MemoryNodes
) -> ContainerConfig:
    """The memory manager's NUMA nodes as the CRI cpuset_mems (upstream's
    PreCreateContainer); unchanged for a container without memory blocks."""
    uid = str((pod.get("metadata") or {}).get("uid") or "")
    mems = memory.cpuset_mems(uid, str(container.get("name") or ""))
    if not mems:
        return cfg
    return replace(cfg, resources=replace(cfg.resources or LinuxResources(), cpuset_mems=mems))
