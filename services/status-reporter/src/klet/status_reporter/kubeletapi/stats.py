"""`/stats/summary`: the Summary API (stats/v1alpha1) from cgroups, statvfs and CRI.

A documented subset of upstream's shape, enough for metrics-server, `kubectl top` and
eviction-style consumers:

- `node`: nodeName, startTime (boot), cpu (usageCoreNanoSeconds, usageNanoCores) and
  memory (usageBytes, workingSetBytes, availableBytes = MemTotal - workingSet) of the
  root cgroup; fs = statvfs of the kubelet root dir; runtime.imageFs/containerFs from
  CRI ImageFsInfo (used bytes and inodes) with capacity from statvfs of its
  mountpoint; rlimit (maxpid, curproc); systemContainers holds "pods" (the /kubepods
  cgroup).
- `pods`: one per ready sandbox: podRef, startTime, cpu/memory of the pod cgroup
  (`/kubepods/<qos>/pod<uid>`, `/kubepods/pod<uid>` for Guaranteed), process_stats,
  and `containers`: each running container's cpu/memory from CRI ListContainerStats,
  rootfs (writable layer usage on the image filesystem) and logs (the size of its
  files under podLogsDir on the root filesystem).

Left out: network, volumes, ephemeral-storage, accelerators, swap, PSI. usageNanoCores
comes from CRI when the runtime computes it, otherwise from the previous sample of the
same cgroup or container (so the first scrape has none, as upstream's first).
`only_cpu_and_memory=true` drops the filesystem parts, as upstream.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from klet.cgroups import CgroupStats
from klet.cri import labels as L
from klet.cri.types import (
    Container,
    ContainerState,
    ContainerStatsInfo,
    FilesystemUsageInfo,
    Sandbox,
    SandboxState,
)
from klet.model.types import JSON, SandboxID

POD_CGROUP_PARENTS = (
    "/kubepods/pod{uid}",
    "/kubepods/burstable/pod{uid}",
    "/kubepods/besteffort/pod{uid}",
)


class CgroupReader(Protocol):
    def stats(self, rel: str) -> CgroupStats: ...

    def exists(self, rel: str) -> bool: ...


class StatsRuntime(Protocol):
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


@dataclass(frozen=True)
class CpuSample:
    time_ns: int
    usage_ns: int


def rfc3339(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def nano_cores(prev: CpuSample | None, cur: CpuSample) -> int | None:
    """Average cores used between two samples, in billionths of a core."""
    if prev is None or cur.time_ns <= prev.time_ns or cur.usage_ns < prev.usage_ns:
        return None
    return (cur.usage_ns - prev.usage_ns) * 1_000_000_000 // (cur.time_ns - prev.time_ns)


def _drop_none(d: JSON) -> JSON:
    return {k: v for k, v in d.items() if v is not None}


def fs_stats(
    path: str, now_ns: int, *, used_bytes: int | None = None, inodes_used: int | None = None
) -> JSON:
    """statvfs of `path` as FsStats; `used_*` replace the filesystem-wide usage."""
    try:
        st = os.statvfs(path)
    except OSError:
        return _drop_none(
            {"time": rfc3339(now_ns), "usedBytes": used_bytes, "inodesUsed": inodes_used}
        )
    return _drop_none(
        {
            "time": rfc3339(now_ns),
            "availableBytes": st.f_bavail * st.f_frsize,
            "capacityBytes": st.f_blocks * st.f_frsize,
            "usedBytes": used_bytes
            if used_bytes is not None
            else (st.f_blocks - st.f_bfree) * st.f_frsize,
            "inodesFree": st.f_ffree,
            "inodes": st.f_files,
            "inodesUsed": inodes_used if inodes_used is not None else st.f_files - st.f_ffree,
        }
    )


def _dir_usage(path: Path) -> tuple[int, int]:
    """(bytes, inodes) of the files under `path`."""
    size, count = 0, 0
    for root, dirs, files in os.walk(path):
        count += len(dirs)
        for name in files:
            try:
                size += os.lstat(os.path.join(root, name)).st_size
                count += 1
            except OSError:
                pass
    return size, count


class SummaryProvider:
    """Builds the summary; remembers the previous CPU samples for usageNanoCores."""

    def __init__(
        self,
        *,
        node_name: str,
        runtime: StatsRuntime,
        cgroups: CgroupReader,
        root_dir: Path,
        pod_logs_dir: Path,
        proc: Path = Path("/proc"),
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.node_name = node_name
        self._runtime = runtime
        self._cgroups = cgroups
        self._root_dir = root_dir
        self._pod_logs_dir = pod_logs_dir
        self._proc = proc
        self._clock = clock
        self._samples: dict[str, CpuSample] = {}
        self._lock = asyncio.Lock()

    def _cpu(
        self,
        key: str,
        now_ns: int,
        usage_ns: int | None,
        seen: dict[str, CpuSample],
        given: int | None = None,
    ) -> JSON | None:
        if usage_ns is None:
            return None
        sample = CpuSample(now_ns, usage_ns)
        seen[key] = sample
        cores = given if given is not None else nano_cores(self._samples.get(key), sample)
        return _drop_none(
            {"time": rfc3339(now_ns), "usageNanoCores": cores, "usageCoreNanoSeconds": usage_ns}
        )

    @staticmethod
    def _memory(now_ns: int, s: CgroupStats, *, capacity: int | None = None) -> JSON:
        available = None
        if capacity is not None and s.memory_working_set_bytes is not None:
            available = max(capacity - s.memory_working_set_bytes, 0)
        return _drop_none(
            {
                "time": rfc3339(now_ns),
                "availableBytes": available,
                "usageBytes": s.memory_usage_bytes,
                "workingSetBytes": s.memory_working_set_bytes,
            }
        )

    def _pod_cgroup(self, uid: str) -> str | None:
        for template in POD_CGROUP_PARENTS:
            rel = template.format(uid=uid)
            if self._cgroups.exists(rel):
                return rel
        return None

    def _meminfo_total(self) -> int | None:
        try:
            for line in (self._proc / "meminfo").read_text().splitlines():
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            pass
        return None

    def _boot_ns(self) -> int | None:
        try:
            for line in (self._proc / "stat").read_text().splitlines():
                if line.startswith("btime "):
                    return int(line.split()[1]) * 1_000_000_000
        except (OSError, ValueError):
            pass
        return None

    def _rlimit(self, now_ns: int) -> JSON:
        out: JSON = {"time": rfc3339(now_ns)}
        try:
            out["maxpid"] = int((self._proc / "sys/kernel/pid_max").read_text())
            out["curproc"] = int((self._proc / "loadavg").read_text().split()[3].split("/")[1])
        except (OSError, ValueError, IndexError):
            pass
        return out

    async def summary(self, *, only_cpu_and_memory: bool = False) -> JSON:
        async with self._lock:
            sandboxes = await self._runtime.list_pod_sandboxes()
            containers = await self._runtime.list_containers()
            stats = {str(s.id): s for s in await self._runtime.list_container_stats()}
            fs_info = ([], []) if only_cpu_and_memory else await self._runtime.image_fs_info()
            return await asyncio.to_thread(
                self._assemble, sandboxes, containers, stats, fs_info, only_cpu_and_memory
            )

    def _assemble(
        self,
        sandboxes: list[Sandbox],
        containers: list[Container],
        stats: dict[str, ContainerStatsInfo],
        fs_info: tuple[list[FilesystemUsageInfo], list[FilesystemUsageInfo]],
        only_cpu_and_memory: bool,
    ) -> JSON:
        now = self._clock()
        seen: dict[str, CpuSample] = {}
        root = self._cgroups.stats("/")
        node: JSON = {
            "nodeName": self.node_name,
            "startTime": rfc3339(self._boot_ns() or now),
            "cpu": self._cpu("node", now, root.cpu_usage_ns, seen),
            "memory": self._memory(now, root, capacity=self._meminfo_total()),
        }
        if self._cgroups.exists("/kubepods"):
            kubepods = self._cgroups.stats("/kubepods")
            node["systemContainers"] = [
                _drop_none(
                    {
                        "name": "pods",
                        "startTime": node["startTime"],
                        "cpu": self._cpu("pods", now, kubepods.cpu_usage_ns, seen),
                        "memory": self._memory(now, kubepods),
                    }
                )
            ]
        if not only_cpu_and_memory:
            node["fs"] = fs_stats(str(self._root_dir), now)
            images, writable = fs_info
            runtime: JSON = {}
            if images:
                runtime["imageFs"] = self._fs_usage(images[0], now)
            if writable:
                runtime["containerFs"] = self._fs_usage(writable[0], now)
            elif images:
                runtime["containerFs"] = runtime["imageFs"]
            node["runtime"] = runtime
            node["rlimit"] = self._rlimit(now)
        image_fs_path = fs_info[0][0].mountpoint if fs_info[0] else str(self._root_dir)
        by_sandbox: dict[str, list[Container]] = {}
        for c in containers:
            if c.state == ContainerState.RUNNING:
                by_sandbox.setdefault(c.sandbox_id, []).append(c)
        pods = []
        for s in sorted(sandboxes, key=lambda s: (s.namespace, s.name)):
            if s.state != SandboxState.READY:
                continue
            pods.append(
                self._pod(
                    s,
                    by_sandbox.get(s.id, []),
                    stats,
                    now,
                    seen,
                    only_cpu_and_memory,
                    image_fs_path,
                )
            )
        self._samples = seen
        return {"node": _drop_none(node), "pods": pods}

    def _fs_usage(self, f: FilesystemUsageInfo, now: int) -> JSON:
        return fs_stats(
            f.mountpoint or str(self._root_dir),
            now,
            used_bytes=f.used_bytes,
            inodes_used=f.inodes_used,
        )

    def _pod(
        self,
        s: Sandbox,
        containers: list[Container],
        stats: dict[str, ContainerStatsInfo],
        now: int,
        seen: dict[str, CpuSample],
        only_cpu_and_memory: bool,
        image_fs_path: str,
    ) -> JSON:
        pod: JSON = {
            "podRef": {"name": s.name, "namespace": s.namespace, "uid": s.uid},
            "startTime": rfc3339(s.created_at),
            "containers": [],
        }
        rel = self._pod_cgroup(s.uid)
        if rel is not None:
            cg = self._cgroups.stats(rel)
            pod["cpu"] = self._cpu(f"pod:{s.uid}", now, cg.cpu_usage_ns, seen)
            pod["memory"] = self._memory(now, cg)
            if cg.pids is not None:
                pod["process_stats"] = {"process_count": cg.pids}
        log_dir = self._pod_logs_dir / f"{s.namespace}_{s.name}_{s.uid}"
        for c in sorted(containers, key=lambda c: c.name):
            st = stats.get(c.id)
            entry: JSON = {"name": c.name, "startTime": rfc3339(c.created_at)}
            if st is not None:
                ts = st.cpu_timestamp_ns or now
                entry["cpu"] = self._cpu(
                    c.id, ts, st.cpu_usage_core_ns, seen, st.cpu_usage_nano_cores
                )
                entry["memory"] = _drop_none(
                    {
                        "time": rfc3339(st.memory_timestamp_ns or now),
                        "availableBytes": st.memory_available_bytes,
                        "usageBytes": st.memory_usage_bytes,
                        "workingSetBytes": st.memory_working_set_bytes,
                        "rssBytes": st.memory_rss_bytes,
                    }
                )
                if not only_cpu_and_memory and st.writable_layer is not None:
                    entry["rootfs"] = fs_stats(
                        image_fs_path,
                        now,
                        used_bytes=st.writable_layer.used_bytes,
                        inodes_used=st.writable_layer.inodes_used,
                    )
            if not only_cpu_and_memory:
                used, inodes = _dir_usage(log_dir / c.labels.get(L.CONTAINER_NAME, c.name))
                entry["logs"] = fs_stats(
                    str(self._pod_logs_dir), now, used_bytes=used, inodes_used=inodes
                )
            pod["containers"].append(_drop_none(entry))
        return _drop_none(pod)
