"""The host adapter behind `SignalSource`: eviction signals from `klet.stats` snapshots.

The readings themselves come from `klet.stats.StatsProvider`, the same pass that serves
`/stats/summary`; what each signal means is in `klet.eviction.signals`. This module
only decides which readings feed which signal:

- memory.available: the root cgroup's working set against MemTotal;
  allocatableMemory.available: the `/kubepods` cgroup's working set against the node's
  allocatable memory (capacity − kubeReserved − systemReserved), absent without it;
- nodefs.*: statfs of the kubelet root directory's filesystem;
- imagefs.*: statfs of the mountpoint CRI ImageFsInfo names; containerfs.* the same
  unless the runtime reports separate container filesystems (then statfs of those);
- pid.available: /proc/sys/kernel/pid_max and /proc/loadavg.

Pods are the ready sandboxes. Each pod's memory and process count come from its pod
cgroup, its containers' memory and writable layers from CRI stats (the latest attempt
of each container name; a running container's memory from its own cgroup when the
runtime's reading has none, as the Summary API does), its logs from its log directory,
its emptyDirs from the disk-backed ones under its pod directory (sizes as `du`
measures them).

When the runtime cannot be reached the node-level signals it does not feed are still
observed; its error is logged once per distinct message, not once per pass.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

from klet.cgroups import CgroupFS
from klet.config.settings import Settings
from klet.eviction.signals import (
    ContainerSample,
    Observations,
    PodUsage,
    Signal,
    available_observation,
    fs_observations,
    pid_observation,
    pod_usage,
)
from klet.model.layout import pod_dir
from klet.model.node import reservation
from klet.model.podvalidation import UnsafePathComponent, checked_component
from klet.obs import OnceLogger
from klet.stats import FsUsage, HostReader, PodStats, Snapshot, StatsProvider, StatsRuntime
from klet.stats.model import ContainerStats, latest_attempts

__all__ = ["FsLayout", "HostSignalSource", "fs_layout", "pod_volumes_exist", "signals_of"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FsLayout:
    """Where the runtime keeps images and writable layers, relative to the root dir.

    dedicated_image_fs: the image filesystem is another device than the root dir's.
    split_container_fs: writable layers live on another device than the images.
    """

    dedicated_image_fs: bool
    split_container_fs: bool


def fs_layout(snap: Snapshot) -> FsLayout:
    """The layout of a snapshot's filesystems; without an answer from the runtime, one
    shared filesystem."""
    n = snap.node

    def device(fs: FsUsage | None) -> int | None:
        return fs.device if fs is not None else None

    root = device(n.rootfs)
    image = device(n.image_fs.fs) if n.image_fs is not None else root
    container = device(n.container_fs.fs) if n.container_fs is not None else image
    return FsLayout(
        dedicated_image_fs=image is not None and image != root,
        split_container_fs=container is not None and container != image,
    )


def _fs(obs: Observations, fs: FsUsage | None, size: Signal, inodes: Signal, now: float) -> None:
    if fs is None:
        return
    space, files = fs_observations(
        blocks=fs.blocks,
        bavail=fs.bavail,
        frsize=fs.frsize,
        files=fs.files,
        ffree=fs.ffree,
        now=now,
    )
    obs[size] = space
    if files is not None:
        obs[inodes] = files


def _container_working_set(c: ContainerStats) -> int:
    """The runtime's working set of the container, else its own cgroup's (what upstream
    reads through cAdvisor; containerd 1.6's shim gives no metrics on a cgroup v1 host
    with an unmounted controller), else 0."""
    if c.usage is not None and c.usage.memory_working_set_bytes is not None:
        return c.usage.memory_working_set_bytes
    if c.cgroup is not None and c.cgroup.memory_working_set_bytes is not None:
        return c.cgroup.memory_working_set_bytes
    return 0


def _pod_usage(pod: PodStats) -> PodUsage:
    containers: dict[str, ContainerSample] = {}
    for name, c in sorted(latest_attempts(pod).items()):
        s = c.usage
        layer = s.writable_layer if s is not None else None
        logs = c.logs
        containers[name] = ContainerSample(
            memory_working_set=_container_working_set(c),
            writable_layer=(layer.used_bytes or 0) if layer is not None else 0,
            writable_inodes=(layer.inodes_used or 0) if layer is not None else 0,
            logs=logs.bytes if logs is not None else 0,
            log_inodes=logs.inodes if logs is not None else 0,
        )
    return pod_usage(
        uid=pod.uid,
        namespace=pod.namespace,
        name=pod.name,
        cgroup_working_set=pod.cgroup.memory_working_set_bytes if pod.cgroup is not None else None,
        processes=pod.processes or 0,
        containers=containers,
        volumes={name: (u.bytes, u.inodes) for name, u in pod.volumes.items()},
        pod_logs=(pod.logs.bytes, pod.logs.inodes) if pod.logs is not None else None,
    )


def signals_of(
    snap: Snapshot, *, memory_capacity: int, allocatable_memory: int
) -> tuple[Observations, dict[str, PodUsage]]:
    """The eviction signals and per-pod usage (keyed by pod UID, the first ready
    sandbox of each) of one snapshot."""
    now = snap.time_ns / 1e9
    n = snap.node
    obs: Observations = {}
    if n.root.memory_working_set_bytes is not None and memory_capacity > 0:
        obs[Signal.MEMORY_AVAILABLE] = available_observation(
            memory_capacity, n.root.memory_working_set_bytes, now=now
        )
    if n.kubepods is not None:
        pods_ws = n.kubepods.memory_working_set_bytes
        if pods_ws is not None and allocatable_memory > 0:
            obs[Signal.ALLOCATABLE_MEMORY_AVAILABLE] = available_observation(
                allocatable_memory, pods_ws, now=now
            )
    _fs(obs, n.rootfs, Signal.NODEFS_AVAILABLE, Signal.NODEFS_INODES_FREE, now)
    if n.image_fs is not None:
        _fs(obs, n.image_fs.fs, Signal.IMAGEFS_AVAILABLE, Signal.IMAGEFS_INODES_FREE, now)
    if n.container_fs is not None:
        _fs(
            obs,
            n.container_fs.fs,
            Signal.CONTAINERFS_AVAILABLE,
            Signal.CONTAINERFS_INODES_FREE,
            now,
        )
    if n.pid_max is not None and n.tasks is not None:
        obs[Signal.PID_AVAILABLE] = pid_observation(n.pid_max, n.tasks, now=now)
    usage: dict[str, PodUsage] = {}
    for pod in snap.pods:
        if pod.uid not in usage:
            usage[pod.uid] = _pod_usage(pod)
    return obs, usage


class HostSignalSource:
    """Measures this host through a stats provider. `memory_capacity` and
    `allocatable_memory` are bytes (see `from_settings`)."""

    def __init__(
        self, stats: StatsProvider, *, memory_capacity: int, allocatable_memory: int
    ) -> None:
        self._stats = stats
        self._memory_capacity = memory_capacity
        self._allocatable_memory = allocatable_memory
        self._once = OnceLogger(log, level=logging.WARNING)

    @property
    def memory_capacity(self) -> int:
        """Node memory capacity, bytes: what memory.available is measured against."""
        return self._memory_capacity

    @property
    def allocatable_memory(self) -> int:
        """Bytes the kubepods cgroup may use: what allocatableMemory.available is against."""
        return self._allocatable_memory

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        runtime: StatsRuntime,
        *,
        cgroups: CgroupFS | None = None,
        proc: Path = Path("/proc"),
    ) -> HostSignalSource:
        """The source for the configured node: capacity from /proc/meminfo, allocatable
        memory = capacity − kubeReserved − systemReserved (what the kubepods cgroup may
        use, upstream's GetNodeAllocatableAbsolute)."""
        k = settings.kubelet
        host = HostReader(
            cgroups=cgroups if cgroups is not None else CgroupFS(proc=proc),
            root_dir=settings.klet.root_dir,
            pod_logs_dir=Path(k.pod_logs_dir),
            cgroup_root=k.cgroup_root or "/",
            proc=proc,
        )
        capacity = host.memory_total() or 0
        held = reservation(
            {"memory": capacity},
            kube_reserved=k.kube_reserved,
            system_reserved=k.system_reserved,
            eviction_hard={},
        )
        return cls(
            StatsProvider(runtime, host),
            memory_capacity=capacity,
            allocatable_memory=max(capacity - held.get("memory", 0), 0),
        )

    async def observe(
        self, *, pods: Collection[str] | None = None
    ) -> tuple[Observations, dict[str, PodUsage]]:
        snap = await self._collect(pods=pods)
        return signals_of(
            snap,
            memory_capacity=self._memory_capacity,
            allocatable_memory=self._allocatable_memory,
        )

    async def fs_layout(self) -> FsLayout:
        """Whether the runtime's image and container filesystems are devices of their
        own (decides how containerfs thresholds, ranking and reclaim follow nodefs or
        imagefs)."""
        return fs_layout(await self._collect(pods=()))

    async def _collect(self, *, pods: Collection[str] | None = None) -> Snapshot:
        snap = await self._stats.collect(pods=pods)
        if snap.runtime_error is None:
            self._once.clear("cri", "eviction: runtime stats available again")
        else:
            self._once.error(
                "cri",
                "eviction: runtime stats unavailable, observing without them",
                cause=snap.runtime_error,
                error=snap.runtime_error,
            )
        return snap


def pod_volumes_exist(root_dir: Path) -> Callable[[str], bool]:
    """Whether a pod's `<root-dir>/pods/<uid>/volumes` is still there: syncloop removes
    it once it has torn down every volume of the pod (emptyDirs included)."""

    def exist(uid: str) -> bool:
        try:
            name = checked_component(uid, what="pod UID")
        except UnsafePathComponent:
            return False  # no pod directory can have such a name
        return (pod_dir(root_dir, name) / "volumes").exists()

    return exist
