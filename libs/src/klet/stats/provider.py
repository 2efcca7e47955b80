"""The stats provider: one pass over the runtime and the host, giving a `Snapshot`.

Both `/stats/summary` (status-reporter) and the eviction signals (eviction) are built
from `StatsProvider.collect()`, as upstream's Summary API and eviction manager share one
stats provider, so the two report the same numbers. One pass makes up to four CRI reads
(ListPodSandboxes, ListContainers, ListContainerStats, ImageFsInfo) and then reads the
host in a worker thread (`klet.stats.host`), so the event loop never blocks on the
filesystem. `filesystems=False` skips ImageFsInfo, statfs and the directory walks (the
CPU-and-memory pass `/metrics/resource` and `only_cpu_and_memory` need). `pods` names
the pod UIDs to measure: eviction's pass measures the node alone (no pod, so none of
the three pod reads) unless a threshold is met or a pod has a local storage limit
(issue 42: every pod's cgroups, processes and log directories read every 10 s were 90%
of an idle node's eviction CPU, and nothing used them).

When the runtime cannot be read the snapshot carries its error and the node readings
still, without pods: eviction keeps observing memory, nodefs and PIDs, and the Summary
API answers with the error. The provider keeps no state between passes; rates (CPU
nano-cores) are the consumer's to compute from consecutive snapshots.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Protocol

from klet.cri.errors import CRIError
from klet.cri.types import Container, ContainerStatsInfo, FilesystemUsageInfo, Sandbox
from klet.model.types import SandboxID
from klet.stats.cadvisor import (
    CgroupSeries,
    CgroupSnapshot,
    DiskStats,
    FsInodes,
    OpenFiles,
    WritableLayer,
)
from klet.stats.host import HostReader, dir_usage, statfs
from klet.stats.model import (
    ContainerStats,
    FsUsage,
    NodeStats,
    PodStats,
    RuntimeFs,
    Snapshot,
    plan_pods,
)

__all__ = ["StatsProvider", "StatsRuntime"]


class StatsRuntime(Protocol):
    """The CRI reads a pass makes (`klet.cri.RuntimeClient` provides them)."""

    async def list_pod_sandboxes(
        self, *, label_selector: dict[str, str] | None = None
    ) -> list[Sandbox]: ...

    async def list_containers(
        self, *, sandbox_id: SandboxID | None = None, label_selector: dict[str, str] | None = None
    ) -> list[Container]: ...

    async def list_container_stats(self) -> list[ContainerStatsInfo]: ...

    async def image_fs_info(
        self,
    ) -> tuple[list[FilesystemUsageInfo], list[FilesystemUsageInfo]]: ...


@dataclasses.dataclass(frozen=True)
class _RuntimeReadings:
    sandboxes: list[Sandbox]
    containers: list[Container]
    stats: list[ContainerStatsInfo]
    image_fs: list[FilesystemUsageInfo]
    container_fs: list[FilesystemUsageInfo]
    error: str | None = None


class StatsProvider:
    """Collects snapshots of this node; `clock` (nanoseconds) stamps each one."""

    def __init__(
        self,
        runtime: StatsRuntime,
        host: HostReader,
        *,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self._runtime = runtime
        self.host = host
        self._clock = clock

    async def collect(
        self, *, filesystems: bool = True, pods: Collection[str] | None = None
    ) -> Snapshot:
        """The node and its pods; `pods` (UIDs) limits the pods measured to those
        (None: every ready sandbox; empty: none, and no CRI read of pods at all)."""
        readings = await self._read_runtime(filesystems=filesystems, pods=pods)
        if pods is not None:
            wanted = set(pods)
            readings = dataclasses.replace(
                readings, sandboxes=[s for s in readings.sandboxes if s.uid in wanted]
            )
        return await asyncio.to_thread(self._measure, readings, filesystems, self._clock())

    async def _read_runtime(
        self, *, filesystems: bool, pods: Collection[str] | None = None
    ) -> _RuntimeReadings:
        try:
            images, writable = await self._runtime.image_fs_info() if filesystems else ([], [])
            if pods is not None and not pods:
                return _RuntimeReadings([], [], [], images, writable)
            sandboxes = await self._runtime.list_pod_sandboxes()
            containers = await self._runtime.list_containers()
            stats = await self._runtime.list_container_stats()
        except CRIError as err:
            return _RuntimeReadings([], [], [], [], [], error=str(err))
        return _RuntimeReadings(sandboxes, containers, stats, images, writable)

    async def collect_cgroups(self) -> CgroupSnapshot:
        """The long form of every node, pod and container cgroup, for /metrics/cadvisor:
        the same CRI reads as `collect` (ImageFsInfo for the writable layers' device),
        then the cgroups (klet.cgroups.detail) in a worker thread."""
        readings = await self._read_runtime(filesystems=True)
        return await asyncio.to_thread(self._measure_cgroups, readings, self._clock())

    # -- in the worker thread ---------------------------------------------------------

    def _measure_cgroups(self, cri: _RuntimeReadings, now_ns: int) -> CgroupSnapshot:
        host = self.host
        cg = host.cgroups
        boot_ns = host.boot_ns()
        inodes, disks = self._node_disks(self._node_filesystems(cri))
        series = [
            CgroupSeries(
                id="/",
                detail=cg.detail("/"),
                start_s=None if boot_ns is None else boot_ns / 1e9,
                network=host.net_dev(1),
                pressure=host.node_pressure(),
                inodes=inodes,
                disks=disks,
            )
        ]
        for rel in host.node_cgroups():
            series.append(
                CgroupSeries(id=rel, detail=cg.detail(rel), pressure=host.cgroup_pressure(rel))
            )
        layer_fs = self._layer_fs(cri)
        for sandbox, containers in plan_pods(cri.sandboxes, cri.containers, cri.stats):
            series += self._pod_cgroups(sandbox, containers, layer_fs)
        devices = {
            dev
            for s in series
            for table in (s.detail.blkio, s.detail.blkio_service_bytes, s.detail.blkio_merged,
                          s.detail.blkio_queued, s.detail.blkio_service_time)
            for dev in table
        }  # fmt: skip
        names = {dev: host.block_device(dev) for dev in devices}
        return CgroupSnapshot(
            time_ns=now_ns,
            machine=host.machine(),
            cgroups=[dataclasses.replace(s, blkio_devices=names) for s in series],
            runtime_error=cri.error,
        )

    def _measure(self, cri: _RuntimeReadings, filesystems: bool, now_ns: int) -> Snapshot:
        host = self.host
        node = NodeStats(
            root=host.cgroups.stats("/"),
            kubepods=host.kubepods(),
            memory_total=host.memory_total(),
            boot_ns=host.boot_ns(),
            pid_max=host.pid_max(),
            tasks=host.tasks(),
            pressure=host.node_pressure(),
            swap=host.swap(),
        )
        if filesystems:
            image_fs = self._runtime_fs(cri.image_fs[0], host.root_dir) if cri.image_fs else None
            container_fs = image_fs
            if cri.container_fs and image_fs is not None:
                container_fs = self._runtime_fs(cri.container_fs[0], Path(image_fs.mountpoint))
            node = dataclasses.replace(
                node,
                rootfs=statfs(host.root_dir),
                logs_fs=statfs(host.pod_logs_dir),
                image_fs=image_fs,
                container_fs=container_fs,
                network=host.host_net_dev(),
                default_interface=host.default_interface(),
            )
        pods = [
            self._pod(sandbox, containers, filesystems)
            for sandbox, containers in plan_pods(cri.sandboxes, cri.containers, cri.stats)
        ]
        return Snapshot(time_ns=now_ns, node=node, pods=pods, runtime_error=cri.error)

    def _node_filesystems(self, cri: _RuntimeReadings) -> dict[str, tuple[str, FsUsage]]:
        """device name → ("major:minor", statfs) of the kubelet root's filesystem and the
        runtime's image and container filesystems, each device once (the root series')."""
        paths = [self.host.root_dir] + [
            Path(info.mountpoint) for info in (*cri.image_fs, *cri.container_fs) if info.mountpoint
        ]
        out: dict[str, tuple[str, FsUsage]] = {}
        seen: set[int] = set()
        for path in paths:
            fs = statfs(path)
            if fs is None or fs.device in seen:
                continue
            seen.add(fs.device)
            numbers = f"{os.major(fs.device)}:{os.minor(fs.device)}"
            out[self.host.block_device(numbers)] = (numbers, fs)
        return out

    def _node_disks(
        self, filesystems: dict[str, tuple[str, FsUsage]]
    ) -> tuple[dict[str, FsInodes], dict[str, DiskStats]]:
        """The root series' inodes and /proc/diskstats counters of those filesystems, by
        device (a device the kernel keeps no disk statistics for, as an overlay or a
        tmpfs, has none)."""
        counters = self.host.disk_stats() if filesystems else {}
        inodes = {name: FsInodes(fs.files, fs.ffree) for name, (_, fs) in filesystems.items()}
        disks = {
            name: counters[numbers]
            for name, (numbers, _) in filesystems.items()
            if numbers in counters
        }
        return inodes, disks

    def _layer_fs(self, cri: _RuntimeReadings) -> tuple[str, int | None]:
        """(device, capacity) of the filesystem holding the writable layers: the
        runtime's container filesystem, else its image filesystem."""
        infos = cri.container_fs or cri.image_fs
        if not infos:
            return "", None
        info = infos[0]
        fs = statfs(Path(info.mountpoint) if info.mountpoint else self.host.root_dir)
        if fs is None:
            return "", None
        return self.host.block_device(f"{os.major(fs.device)}:{os.minor(fs.device)}"), (
            fs.capacity_bytes
        )

    def _pod_cgroups(
        self, sandbox: Sandbox, containers: list[ContainerStats], layer_fs: tuple[str, int | None]
    ) -> list[CgroupSeries]:
        """The pod's cgroup and its running containers' (none without a pod cgroup)."""
        cg = self.host.cgroups
        rel = self.host.pod_cgroup(sandbox.uid)
        if rel is None:
            return []
        pids = cg.procs(rel)
        pod, namespace = sandbox.name, sandbox.namespace
        files: dict[int, OpenFiles | None] = {}  # per process, for the pod and its containers
        out = [
            CgroupSeries(
                id=rel,
                detail=cg.detail(rel),
                pod=pod,
                namespace=namespace,
                start_s=sandbox.created_at / 1e9,
                processes=len(pids),
                open_files=self.host.open_files(pids, seen=files),
                # Every process of a pod shares the sandbox's network namespace.
                network=self.host.net_dev(pids[0]) if pids else {},
                pressure=self.host.cgroup_pressure(rel),
            )
        ]
        children = cg.children(rel)
        for c in containers:
            child = _container_cgroup(children, c)
            if child is None:
                continue
            crel = f"{rel}/{child}"
            layer = c.usage.writable_layer if c.usage is not None else None
            used = layer.used_bytes if layer is not None else None
            cpids = cg.procs(crel)
            out.append(
                CgroupSeries(
                    id=crel,
                    detail=cg.detail(crel),
                    container=c.name,
                    pod=pod,
                    namespace=namespace,
                    image=c.image,
                    name=c.id,
                    start_s=None if c.start_ns is None else c.start_ns / 1e9,
                    processes=len(cpids),
                    open_files=self.host.open_files(cpids, seen=files),
                    # the cgroup's own processes come first: its init, as a rule
                    ulimits=self.host.ulimits(cpids[0]) if cpids else {},
                    fs=None if used is None else WritableLayer(layer_fs[0], used, layer_fs[1]),
                    pressure=self.host.cgroup_pressure(crel),
                )
            )
        return out

    @staticmethod
    def _runtime_fs(info: FilesystemUsageInfo, default: Path) -> RuntimeFs:
        mountpoint = info.mountpoint or str(default)
        return RuntimeFs(
            mountpoint=mountpoint,
            used_bytes=info.used_bytes,
            inodes_used=info.inodes_used,
            fs=statfs(Path(mountpoint)),
        )

    def _pod(
        self, sandbox: Sandbox, containers: list[ContainerStats], filesystems: bool
    ) -> PodStats:
        host = self.host
        rel = host.pod_cgroup(sandbox.uid)
        cgroup, processes, pressure = None, None, None
        if rel is not None:
            cgroup = host.cgroups.stats(rel)
            processes = host.processes(rel, cgroup)
            pressure = host.cgroup_pressure(rel)
            children = host.cgroups.children(rel)
            containers = [
                c
                if (child := _container_cgroup(children, c)) is None
                else dataclasses.replace(
                    c,
                    cgroup=host.cgroups.stats(f"{rel}/{child}"),
                    pressure=host.cgroup_pressure(f"{rel}/{child}"),
                )
                for c in containers
            ]
        pod = PodStats(
            uid=sandbox.uid,
            namespace=sandbox.namespace,
            name=sandbox.name,
            start_ns=sandbox.created_at,
            cgroup=cgroup,
            processes=processes,
            containers=containers,
            pressure=pressure,
        )
        if not filesystems:
            return pod
        log_dir = host.pod_log_dir(sandbox.namespace, sandbox.name, sandbox.uid)
        # Every process of a pod shares the sandbox's network namespace.
        pids = host.cgroups.procs(rel) if rel is not None else []
        return dataclasses.replace(
            pod,
            network=host.own_network(pids[0]) if pids else None,
            containers=[
                dataclasses.replace(c, logs=dir_usage(log_dir / c.name)) for c in containers
            ],
            logs=dir_usage(log_dir) if log_dir.exists() else None,
            volumes=host.empty_dirs(sandbox.uid),
        )


def _container_cgroup(children: list[str], c: ContainerStats) -> str | None:
    """The name of a running container's cgroup among its pod cgroup's ``children``:
    cgroupfs names it by the container ID, systemd ``cri-containerd-<ID>.scope``."""
    if not c.running:
        return None
    return next((n for n in children if c.id in n), None)
