"""The host adapter behind `SignalSource`: cgroups, statfs, /proc and CRI stats.

One `observe()` makes three CRI reads (ImageFsInfo, ListPodSandboxes,
ListContainerStats) and then reads the host in a worker thread (cgroup files, statfs,
/proc, and a walk of the log and emptyDir directories), so the event loop never blocks
on the filesystem. What each signal means is in `klet.eviction.signals`; this module
only decides where to read it:

- memory.available: the root cgroup's working set against MemTotal;
  allocatableMemory.available: the `/kubepods` cgroup's working set against the node's
  allocatable memory (capacity − kubeReserved − systemReserved), absent without it;
- nodefs.*: statfs of the kubelet root directory's filesystem;
- imagefs.*: statfs of the mountpoint CRI ImageFsInfo names; containerfs.* the same
  unless the runtime reports separate container filesystems (then statfs of those);
- pid.available: /proc/sys/kernel/pid_max and /proc/loadavg.

Pods are the ready sandboxes. Each pod's memory and process count come from its pod
cgroup (`/kubepods[/<qos>]/pod<uid>`, the paths syncloop creates), its containers'
memory and writable layers from CRI stats (the latest attempt of each container name),
its logs from `<podLogsDir>/<ns>_<name>_<uid>/`, its emptyDirs from
`<root-dir>/pods/<uid>/volumes/kubernetes.io~empty-dir/` (a mounted one is a `medium:
Memory` tmpfs and is not disk). Sizes are allocated blocks, each inode counted once,
as `du` measures.

When the runtime cannot be reached the node-level signals it does not feed are still
observed; its error is logged once per distinct message, not once per pass.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from klet.cgroups import CgroupFS
from klet.cgroups.machine import parse_meminfo
from klet.config.settings import Settings
from klet.cri import labels as L
from klet.cri.errors import CRIError
from klet.cri.types import ContainerStatsInfo, FilesystemUsageInfo, Sandbox, SandboxState
from klet.eviction.signals import (
    ContainerSample,
    Observation,
    Observations,
    PodUsage,
    Signal,
    available_observation,
    fs_observations,
    parse_loadavg_tasks,
    pid_observation,
    pod_usage,
)
from klet.model.node import reservation
from klet.model.podvalidation import UnsafePathComponent, checked_component
from klet.obs import OnceLogger

__all__ = ["FsLayout", "HostSignalSource", "StatsRuntime", "dir_usage", "pod_volumes_exist"]

log = logging.getLogger(__name__)

POD_CGROUPS = (
    "/kubepods/pod{uid}",
    "/kubepods/burstable/pod{uid}",
    "/kubepods/besteffort/pod{uid}",
)
KUBEPODS = "/kubepods"
EMPTY_DIR = "kubernetes.io~empty-dir"


class StatsRuntime(Protocol):
    """The CRI reads the adapter makes (`klet.cri.RuntimeClient` provides them)."""

    async def list_pod_sandboxes(
        self, *, label_selector: dict[str, str] | None = None
    ) -> list[Sandbox]: ...

    async def list_container_stats(self) -> list[ContainerStatsInfo]: ...

    async def image_fs_info(
        self,
    ) -> tuple[list[FilesystemUsageInfo], list[FilesystemUsageInfo]]: ...


@dataclass(frozen=True)
class FsLayout:
    """Where the runtime keeps images and writable layers, relative to the root dir.

    dedicated_image_fs: the image filesystem is another device than the root dir's.
    split_container_fs: writable layers live on another device than the images.
    """

    dedicated_image_fs: bool
    split_container_fs: bool


def dir_usage(path: Path) -> tuple[int, int]:
    """(bytes allocated, inodes) under `path`, itself included; symlinks not followed,
    hard links counted once; (0, 0) when it does not exist."""
    seen: set[tuple[int, int]] = set()
    size = 0

    def count(p: str) -> None:
        nonlocal size
        try:
            st = os.lstat(p)
        except OSError:
            return
        key = (st.st_dev, st.st_ino)
        if key not in seen:
            seen.add(key)
            size += st.st_blocks * 512

    if not path.exists():
        return 0, 0
    count(str(path))
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            count(os.path.join(root, name))
    return size, len(seen)


def _existing(path: Path) -> Path:
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return probe


def _device(path: str | Path) -> int | None:
    try:
        return os.stat(_existing(Path(path))).st_dev
    except OSError:
        return None


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


@dataclass(frozen=True)
class _CriReadings:
    image_fs: list[FilesystemUsageInfo]
    container_fs: list[FilesystemUsageInfo]
    sandboxes: list[Sandbox]
    stats: list[ContainerStatsInfo]


class HostSignalSource:
    """Measures this host. `memory_capacity` and `allocatable_memory` are bytes (see
    `from_settings`); `proc` and `clock` are parameters so tests can vary them."""

    def __init__(
        self,
        runtime: StatsRuntime,
        *,
        cgroups: CgroupFS,
        root_dir: Path,
        pod_logs_dir: Path,
        memory_capacity: int,
        allocatable_memory: int,
        proc: Path = Path("/proc"),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._runtime = runtime
        self._cgroups = cgroups
        self._root_dir = root_dir
        self._pod_logs_dir = pod_logs_dir
        self._memory_capacity = memory_capacity
        self._allocatable_memory = allocatable_memory
        self._proc = proc
        self._clock = clock
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
        capacity = parse_meminfo(_read(proc / "meminfo") or "")
        held = reservation(
            {"memory": capacity},
            kube_reserved=k.kube_reserved,
            system_reserved=k.system_reserved,
            eviction_hard={},
        )
        return cls(
            runtime,
            cgroups=cgroups if cgroups is not None else CgroupFS(proc=proc),
            root_dir=settings.klet.root_dir,
            pod_logs_dir=Path(k.pod_logs_dir),
            memory_capacity=capacity,
            allocatable_memory=max(capacity - held.get("memory", 0), 0),
            proc=proc,
        )

    async def observe(self) -> tuple[Observations, dict[str, PodUsage]]:
        cri = await self._read_cri()
        return await asyncio.to_thread(self._measure, cri, self._clock())

    async def fs_layout(self) -> FsLayout:
        """Whether the runtime's image and container filesystems are devices of their
        own (decides how containerfs thresholds, ranking and reclaim follow nodefs or
        imagefs). Without an answer from the runtime: one shared filesystem."""
        cri = await self._read_cri()
        root = _device(self._root_dir)
        image = _device(cri.image_fs[0].mountpoint) if cri.image_fs else root
        container = _device(cri.container_fs[0].mountpoint) if cri.container_fs else image
        return FsLayout(
            dedicated_image_fs=image is not None and image != root,
            split_container_fs=container is not None and container != image,
        )

    async def _read_cri(self) -> _CriReadings:
        try:
            images, containers = await self._runtime.image_fs_info()
            sandboxes = await self._runtime.list_pod_sandboxes()
            stats = await self._runtime.list_container_stats()
        except CRIError as err:
            self._once.error(
                "cri",
                "eviction: runtime stats unavailable, observing without them",
                cause=str(err),
                error=str(err),
            )
            return _CriReadings([], [], [], [])
        self._once.clear("cri", "eviction: runtime stats available again")
        return _CriReadings(images, containers, sandboxes, stats)

    # -- in the worker thread ---------------------------------------------------------

    def _measure(self, cri: _CriReadings, now: float) -> tuple[Observations, dict[str, PodUsage]]:
        obs: Observations = {}
        root = self._cgroups.stats("/")
        if root.memory_working_set_bytes is not None and self._memory_capacity > 0:
            obs[Signal.MEMORY_AVAILABLE] = available_observation(
                self._memory_capacity, root.memory_working_set_bytes, now=now
            )
        if self._cgroups.exists(KUBEPODS):
            pods_ws = self._cgroups.stats(KUBEPODS).memory_working_set_bytes
            if pods_ws is not None and self._allocatable_memory > 0:
                obs[Signal.ALLOCATABLE_MEMORY_AVAILABLE] = available_observation(
                    self._allocatable_memory, pods_ws, now=now
                )
        self._statfs(obs, self._root_dir, Signal.NODEFS_AVAILABLE, Signal.NODEFS_INODES_FREE, now)
        if cri.image_fs:
            image_path = Path(cri.image_fs[0].mountpoint or self._root_dir)
            self._statfs(obs, image_path, Signal.IMAGEFS_AVAILABLE, Signal.IMAGEFS_INODES_FREE, now)
            container_path = (
                Path(cri.container_fs[0].mountpoint or image_path)
                if cri.container_fs
                else image_path
            )
            self._statfs(
                obs,
                container_path,
                Signal.CONTAINERFS_AVAILABLE,
                Signal.CONTAINERFS_INODES_FREE,
                now,
            )
        pid = self._pid(now)
        if pid is not None:
            obs[Signal.PID_AVAILABLE] = pid
        return obs, self._pods(cri)

    @staticmethod
    def _statfs(obs: Observations, path: Path, size: Signal, inodes: Signal, now: float) -> None:
        try:
            st = os.statvfs(_existing(path))
        except OSError as err:
            log.debug("eviction: statfs failed", extra={"path": str(path), "error": str(err)})
            return
        space, files = fs_observations(
            blocks=st.f_blocks,
            bavail=st.f_bavail,
            frsize=st.f_frsize,
            files=st.f_files,
            ffree=st.f_ffree,
            now=now,
        )
        obs[size] = space
        if files is not None:
            obs[inodes] = files

    def _pid(self, now: float) -> Observation | None:
        text = _read(self._proc / "sys/kernel/pid_max")
        if text is None or not text.strip().isdigit():
            return None
        tasks = parse_loadavg_tasks(_read(self._proc / "loadavg") or "")
        if tasks is None:
            return None
        return pid_observation(int(text.strip()), tasks, now=now)

    def _pod_cgroup(self, uid: str) -> str | None:
        for template in POD_CGROUPS:
            rel = template.format(uid=uid)
            if self._cgroups.exists(rel):
                return rel
        return None

    def _tasks(self, rel: str) -> int:
        """Tasks in the cgroup and its children when pids.current cannot be read."""
        hierarchy = "" if self._cgroups.version == 2 else "memory"
        name = "cgroup.threads" if self._cgroups.version == 2 else "tasks"
        total = 0
        base = self._cgroups.root / hierarchy / rel.strip("/")
        for root, _dirs, files in os.walk(base):
            if name in files:
                text = _read(Path(root) / name) or ""
                total += sum(1 for line in text.splitlines() if line.strip())
        return total

    def _pods(self, cri: _CriReadings) -> dict[str, PodUsage]:
        latest: dict[tuple[str, str], ContainerStatsInfo] = {}
        for s in cri.stats:
            key = (s.labels.get(L.POD_UID, ""), s.labels.get(L.CONTAINER_NAME, s.name))
            if key not in latest or s.attempt > latest[key].attempt:
                latest[key] = s
        out: dict[str, PodUsage] = {}
        for sandbox in cri.sandboxes:
            if sandbox.state != SandboxState.READY or sandbox.uid in out:
                continue
            out[sandbox.uid] = self._pod(sandbox, latest)
        return out

    def _pod(self, sandbox: Sandbox, latest: dict[tuple[str, str], ContainerStatsInfo]) -> PodUsage:
        uid = sandbox.uid
        log_dir = self._pod_logs_dir / f"{sandbox.namespace}_{sandbox.name}_{uid}"
        containers: dict[str, ContainerSample] = {}
        for (pod_uid, name), s in sorted(latest.items()):
            if pod_uid != uid:
                continue
            layer = s.writable_layer
            logs, log_inodes = dir_usage(log_dir / name)
            containers[name] = ContainerSample(
                memory_working_set=s.memory_working_set_bytes or 0,
                writable_layer=(layer.used_bytes or 0) if layer is not None else 0,
                writable_inodes=(layer.inodes_used or 0) if layer is not None else 0,
                logs=logs,
                log_inodes=log_inodes,
            )
        volumes: dict[str, tuple[int, int]] = {}
        empty_dirs = self._root_dir / "pods" / uid / "volumes" / EMPTY_DIR
        try:
            entries = sorted(empty_dirs.iterdir())
        except OSError:
            entries = []
        for entry in entries:
            if entry.is_dir() and not os.path.ismount(entry):
                volumes[entry.name] = dir_usage(entry)
        rel = self._pod_cgroup(uid)
        working_set: int | None = None
        processes = 0
        if rel is not None:
            cg = self._cgroups.stats(rel)
            working_set = cg.memory_working_set_bytes
            processes = cg.pids if cg.pids is not None else self._tasks(rel)
        return pod_usage(
            uid=uid,
            namespace=sandbox.namespace,
            name=sandbox.name,
            cgroup_working_set=working_set,
            processes=processes,
            containers=containers,
            volumes=volumes,
            pod_logs=dir_usage(log_dir) if log_dir.exists() else None,
        )


def pod_volumes_exist(root_dir: Path) -> Callable[[str], bool]:
    """Whether a pod's `<root-dir>/pods/<uid>/volumes` is still there: syncloop removes
    it once it has torn down every volume of the pod (emptyDirs included)."""

    def exist(uid: str) -> bool:
        try:
            name = checked_component(uid, what="pod UID")
        except UnsafePathComponent:
            return False  # no pod directory can have such a name
        return (root_dir / "pods" / name / "volumes").exists()

    return exist
