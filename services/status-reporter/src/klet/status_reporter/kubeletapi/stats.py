"""`/stats/summary`: the Summary API (stats/v1alpha1) rendered from a `klet.stats` snapshot.

A documented subset of upstream's shape, enough for metrics-server, `kubectl top` and
eviction-style consumers:

- `node`: nodeName, startTime (boot), cpu (usageCoreNanoSeconds, usageNanoCores) and
  memory (usageBytes, workingSetBytes, availableBytes = MemTotal - workingSet) of the
  root cgroup; fs = statfs of the kubelet root dir; runtime.imageFs/containerFs from
  CRI ImageFsInfo (used bytes and inodes) with capacity from statfs of its
  mountpoint; rlimit (maxpid, curproc); systemContainers holds "pods" (the /kubepods
  cgroup).
- `pods`: one per ready sandbox: podRef, startTime, cpu/memory of the pod cgroup,
  process_stats, and `containers`: each running container's cpu/memory from CRI
  ListContainerStats, or from its own cgroup when the runtime gave neither (containerd
  1.6 on a cgroup v1 host with an unmounted controller reports none), rootfs
  (writable layer usage on the image filesystem) and logs (the allocated size of its
  files under podLogsDir on the log filesystem); `volume`:
  the pod's disk-backed emptyDirs (usage as `du` counts it, capacity and free space of
  the root dir's filesystem, as upstream's du-based volume metrics; an emptyDir with a
  directory this process may not read gets no usage rather than a short count), then
  its CSI volumes with the usage their driver last gave (syncloop measures every
  volumeStatsAggPeriod), with `pvcRef` for a claim's volume.

PSI (the KubeletPSI gate): `psi: {full: {total, avg10, avg60, avg300}, some: {...}}` in
`cpu`, `memory` and `io: {time, psi}` of the node (/proc/pressure), the pods and the
containers (their cgroup v2 `*.pressure` files). Where the kernel gives none (a cgroup
v1 host's pods and containers, a kernel without PSI) the `psi` fields and `io` are absent,
not zeros. `total` is the kernel's microseconds, as upstream passes it on. `io` is left
out with `only_cpu_and_memory`, as upstream's.

Network (`network` of the node and of each pod, not with `only_cpu_and_memory`, as
upstream): rxBytes, rxErrors, txBytes, txErrors of the default interface inline, and
every interface in `interfaces` with the default first, without the loopback and the
host ends of links (lo, veth*, docker*: the interfaces cAdvisor ignores). The node's
are the host network namespace's (/proc/net/dev: status-reporter runs on the host
network in every deployment shape) and its default interface the one the default route
leaves by (/proc/net/route, else ipv6_route; upstream names `eth0` whatever the host's
is, and klet falls back to that on a host without a default route). A pod's are its
sandbox's network namespace's, read from /proc/<pid>/net/dev of a process in the pod's
cgroup (every process of the pod shares the sandbox's namespace), the reading
/metrics/cadvisor serves; its default is `eth0`, as upstream's. CRI's PodSandboxStats
network is not used: one reading for both pages, and no extra CRI call per pass. A pod
on the host's network (its namespace is this process's) has no `network`, as cAdvisor
gives such a sandbox none; nor has a pod without a pod cgroup (cgroupsPerQOS off), with
no process left, or whose processes this process cannot see (status-reporter outside
the host's PID namespace, as compose runs it).

Swap (`swap: {time, swapUsageBytes, swapAvailableBytes}`, with `only_cpu_and_memory`
too, as upstream): the node's from /proc/meminfo (used: SwapTotal - SwapFree; available:
SwapFree), a pod's and a container's from their cgroups as cAdvisor reads them for
upstream's Summary (klet.cgroups.CgroupStats: v1 total_swap against
memory.memsw.limit_in_bytes, v2 memory.swap.current against memory.swap.max), available
being the limit less the usage, left out under no limit; no `swap` where the cgroup
gave no usage (v1 without swap accounting), where upstream shows 0.

The numbers are the ones eviction decides on: both come from `klet.stats.StatsProvider`.
Left out: the usage of `medium: Memory` emptyDirs, configMap, secret, projected,
downward-API, local and hostPath volumes, ephemeral-storage, accelerators.
usageNanoCores comes from CRI when the runtime computes it, otherwise from the previous
sample of the same cgroup or container (so the first scrape has none, as upstream's first).
`only_cpu_and_memory=true` drops the filesystem parts, as upstream.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from klet.cgroups import CgroupStats
from klet.cri.errors import CRIError
from klet.model import timestamps
from klet.model.records import VolumeRecord
from klet.model.types import JSON
from klet.stats import (
    DirUsage,
    FsUsage,
    PodStats,
    Pressure,
    PSIData,
    PSIStats,
    RuntimeFs,
    Snapshot,
    StatsProvider,
    running_containers,
)
from klet.stats.cadvisor import NetDev
from klet.stats.model import SwapSpace


class VolumeSource(Protocol):
    """The pods' measured CSI volumes (status_reporter.volumes.VolumeView)."""

    def measured(self, pod_uid: str) -> list[VolumeRecord]: ...


@dataclass(frozen=True)
class CpuSample:
    time_ns: int
    usage_ns: int


def rfc3339(ns: int) -> str:
    """metav1.Time of a time in nanoseconds (the unit of CRI and cgroup samples)."""
    return timestamps.rfc3339(ns / 1e9)


def nano_cores(prev: CpuSample | None, cur: CpuSample) -> int | None:
    """Average cores used between two samples, in billionths of a core."""
    if prev is None or cur.time_ns <= prev.time_ns or cur.usage_ns < prev.usage_ns:
        return None
    return (cur.usage_ns - prev.usage_ns) * 1_000_000_000 // (cur.time_ns - prev.time_ns)


def _drop_none(d: JSON) -> JSON:
    return {k: v for k, v in d.items() if v is not None}


def fs_stats(
    fs: FsUsage | None,
    now_ns: int,
    *,
    used_bytes: int | None = None,
    inodes_used: int | None = None,
) -> JSON:
    """A statfs reading as FsStats; `used_*` replace the filesystem-wide usage."""
    if fs is None:
        return _drop_none(
            {"time": rfc3339(now_ns), "usedBytes": used_bytes, "inodesUsed": inodes_used}
        )
    return _drop_none(
        {
            "time": rfc3339(now_ns),
            "availableBytes": fs.available_bytes,
            "capacityBytes": fs.capacity_bytes,
            "usedBytes": used_bytes if used_bytes is not None else fs.used_bytes,
            "inodesFree": fs.ffree,
            "inodes": fs.files,
            "inodesUsed": inodes_used if inodes_used is not None else fs.inodes_used,
        }
    )


def _empty_dir_stats(name: str, usage: DirUsage, fs: FsUsage | None, now_ns: int) -> JSON:
    """A disk-backed emptyDir as a VolumeStats entry: its `du` usage on the root dir's
    filesystem; without usage when the walk could not read all of it."""
    if usage.complete:
        entry = fs_stats(fs, now_ns, used_bytes=usage.bytes, inodes_used=usage.inodes)
    else:
        entry = {
            k: v for k, v in fs_stats(fs, now_ns).items() if k not in ("usedBytes", "inodesUsed")
        }
    return {"name": name, **entry}


def ephemeral_storage(
    containers: list[JSON], empty_dirs: list[JSON], rootfs: FsUsage | None, now_ns: int
) -> JSON:
    """The pod's `ephemeral-storage` as upstream's calcEphemeralStorage sums it: the root
    filesystem's size and free space, and as used each container's writable layer with
    its logs (a container without a writable layer reading adds neither, as upstream)
    and the pod's disk-backed emptyDirs. Not added, as klet does not measure them: the
    pod's configMap, secret, downwardAPI and projected volumes, its etc-hosts file, and
    files directly in its log directory (upstream's pod log stats; the kubelet writes
    none there, only the containers' directories)."""
    used, inodes = 0, 0
    for c in containers:
        rootfs_entry = c.get("rootfs")
        if rootfs_entry is None:
            continue
        for part in (rootfs_entry, c.get("logs") or {}):
            used += part.get("usedBytes") or 0
            inodes += part.get("inodesUsed") or 0
    for volume in empty_dirs:
        used += volume.get("usedBytes") or 0
        inodes += volume.get("inodesUsed") or 0
    return fs_stats(rootfs, now_ns, used_bytes=used, inodes_used=inodes)


POD_INTERFACE = "eth0"
"""A pod's default interface: upstream's defaultNetworkInterfaceName, the name CNI
plugins give the pod's end of its link."""


def _interface(name: str, dev: NetDev) -> JSON:
    return {
        "name": name,
        "rxBytes": dev.rx_bytes,
        "rxErrors": dev.rx_errors,
        "txBytes": dev.tx_bytes,
        "txErrors": dev.tx_errors,
    }


def network_stats(devs: Mapping[str, NetDev], default: str | None, now_ns: int) -> JSON:
    """NetworkStats: the default interface's counters inline (only its `name`, empty,
    when there is no such interface, as upstream's zero InterfaceStats) and every
    interface in `interfaces`, the default first, then by name."""
    names = sorted(devs, key=lambda n: (n != default, n))
    inline: JSON = {"name": ""}
    if default is not None and default in devs:
        inline = _interface(default, devs[default])
    out: JSON = {"time": rfc3339(now_ns), **inline}
    if names:
        out["interfaces"] = [_interface(n, devs[n]) for n in names]
    return out


def swap_stats(usage: int | None, limit: int | None, now_ns: int) -> JSON | None:
    """SwapStats of a cgroup's swap usage and limit (None: unlimited); None without a
    usage."""
    if usage is None:
        return None
    available = None if limit is None else max(limit - usage, 0)
    return _drop_none(
        {"time": rfc3339(now_ns), "swapAvailableBytes": available, "swapUsageBytes": usage}
    )


def node_swap_stats(swap: SwapSpace | None, now_ns: int) -> JSON | None:
    """The node's SwapStats: the swap space used, and what is free of it."""
    if swap is None:
        return None
    return {
        "time": rfc3339(now_ns),
        "swapAvailableBytes": swap.free,
        "swapUsageBytes": swap.used,
    }


def _psi_data(d: PSIData) -> JSON:
    return {"total": d.total_us, "avg10": d.avg10, "avg60": d.avg60, "avg300": d.avg300}


def psi_stats(s: PSIStats) -> JSON:
    """One resource's PSI as the Summary API's PSIStats."""
    return {"full": _psi_data(s.full), "some": _psi_data(s.some)}


def with_psi(
    cpu: JSON | None, memory: JSON | None, pressure: Pressure | None
) -> tuple[JSON | None, JSON | None]:
    """`cpu` and `memory` with their `psi` where `pressure` has it."""
    if pressure is None:
        return cpu, memory
    if cpu is not None and pressure.cpu is not None:
        cpu = {**cpu, "psi": psi_stats(pressure.cpu)}
    if memory is not None and pressure.memory is not None:
        memory = {**memory, "psi": psi_stats(pressure.memory)}
    return cpu, memory


def io_stats(pressure: Pressure | None, now_ns: int) -> JSON | None:
    """IOStats: the time and the io PSI; None without one."""
    if pressure is None or pressure.io is None:
        return None
    return {"time": rfc3339(now_ns), "psi": psi_stats(pressure.io)}


def _runtime_fs(f: RuntimeFs, now_ns: int) -> JSON:
    return fs_stats(f.fs, now_ns, used_bytes=f.used_bytes, inodes_used=f.inodes_used)


class SummaryProvider:
    """Renders snapshots; remembers the previous CPU samples for usageNanoCores."""

    def __init__(
        self, *, node_name: str, stats: StatsProvider, volumes: VolumeSource | None = None
    ) -> None:
        self.node_name = node_name
        self._stats = stats
        self._volumes = volumes
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

    async def summary(self, *, only_cpu_and_memory: bool = False) -> JSON:
        """The Summary; raises CRIError when the runtime could not be read."""
        async with self._lock:
            snap = await self._stats.collect(filesystems=not only_cpu_and_memory)
            if snap.runtime_error is not None:
                raise CRIError(snap.runtime_error)
            return self._assemble(snap, only_cpu_and_memory)

    def _assemble(self, snap: Snapshot, only_cpu_and_memory: bool) -> JSON:
        now = snap.time_ns
        n = snap.node
        seen: dict[str, CpuSample] = {}
        cpu, memory = with_psi(
            self._cpu("node", now, n.root.cpu_usage_ns, seen),
            self._memory(now, n.root, capacity=n.memory_total),
            n.pressure,
        )
        node: JSON = {
            "nodeName": self.node_name,
            "startTime": rfc3339(n.boot_ns or now),
            "cpu": cpu,
            "memory": memory,
            "swap": node_swap_stats(n.swap, now),
        }
        if n.kubepods is not None:
            node["systemContainers"] = [
                _drop_none(
                    {
                        "name": "pods",
                        "startTime": node["startTime"],
                        "cpu": self._cpu("pods", now, n.kubepods.cpu_usage_ns, seen),
                        "memory": self._memory(now, n.kubepods),
                    }
                )
            ]
        if not only_cpu_and_memory:
            node["io"] = io_stats(n.pressure, now)
            node["fs"] = fs_stats(n.rootfs, now)
            runtime: JSON = {}
            if n.image_fs is not None:
                runtime["imageFs"] = _runtime_fs(n.image_fs, now)
            if n.container_fs is not None:
                runtime["containerFs"] = _runtime_fs(n.container_fs, now)
            node["runtime"] = runtime
            if n.network is not None:
                # The default route's interface; upstream's eth0 on a host without one.
                node["network"] = network_stats(
                    n.network, n.default_interface or POD_INTERFACE, now
                )
            node["rlimit"] = _drop_none(
                {"time": rfc3339(now), "maxpid": n.pid_max, "curproc": n.tasks}
            )
        pods = [
            self._pod(p, snap, seen, only_cpu_and_memory)
            for p in sorted(snap.pods, key=lambda p: (p.namespace, p.name))
        ]
        self._samples = seen
        return {"node": _drop_none(node), "pods": pods}

    def _pod(
        self, p: PodStats, snap: Snapshot, seen: dict[str, CpuSample], only_cpu_and_memory: bool
    ) -> JSON:
        now = snap.time_ns
        image_fs = snap.node.image_fs.fs if snap.node.image_fs is not None else snap.node.rootfs
        pod: JSON = {
            "podRef": {"name": p.name, "namespace": p.namespace, "uid": p.uid},
            "startTime": rfc3339(p.start_ns),
            "containers": [],
        }
        if p.cgroup is not None:
            pod["cpu"], pod["memory"] = with_psi(
                self._cpu(f"pod:{p.uid}", now, p.cgroup.cpu_usage_ns, seen),
                self._memory(now, p.cgroup),
                p.pressure,
            )
            pod["swap"] = swap_stats(p.cgroup.swap_usage_bytes, p.cgroup.swap_limit_bytes, now)
            if not only_cpu_and_memory:
                pod["io"] = io_stats(p.pressure, now)
        if p.processes is not None:
            pod["process_stats"] = {"process_count": p.processes}
        for c in running_containers(p):
            entry: JSON = {
                "name": c.name,
                "startTime": rfc3339(now if c.start_ns is None else c.start_ns),
            }
            st = c.usage
            if st is not None and (
                st.cpu_usage_core_ns is not None or st.memory_working_set_bytes is not None
            ):
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
            elif c.cgroup is not None:
                # The runtime gave no CPU or memory: the container's cgroup, as cAdvisor.
                entry["cpu"] = self._cpu(c.id, now, c.cgroup.cpu_usage_ns, seen)
                entry["memory"] = self._memory(now, c.cgroup)
            entry["cpu"], entry["memory"] = with_psi(
                entry.get("cpu"), entry.get("memory"), c.pressure
            )
            if c.cgroup is not None:
                entry["swap"] = swap_stats(
                    c.cgroup.swap_usage_bytes, c.cgroup.swap_limit_bytes, now
                )
            if not only_cpu_and_memory:
                entry["io"] = io_stats(c.pressure, now)
            if st is not None and not only_cpu_and_memory and st.writable_layer is not None:
                entry["rootfs"] = fs_stats(
                    image_fs,
                    now,
                    used_bytes=st.writable_layer.used_bytes,
                    inodes_used=st.writable_layer.inodes_used,
                )
            if not only_cpu_and_memory and c.logs is not None:
                entry["logs"] = fs_stats(
                    snap.node.logs_fs, now, used_bytes=c.logs.bytes, inodes_used=c.logs.inodes
                )
            pod["containers"].append(_drop_none(entry))
        if not only_cpu_and_memory and p.network is not None:
            pod["network"] = network_stats(p.network, POD_INTERFACE, now)
        if not only_cpu_and_memory:
            volumes = [
                _empty_dir_stats(name, usage, snap.node.rootfs, now)
                for name, usage in sorted(p.volumes.items())
            ]
            pod["ephemeral-storage"] = ephemeral_storage(
                pod["containers"], volumes, snap.node.rootfs, now
            )
            volumes += [
                {
                    "time": rfc3339(int(r.measured_at * 1e9)),
                    "name": r.volume,
                    **r.usage,
                    **({"pvcRef": {"name": r.claim, "namespace": r.namespace}} if r.claim else {}),
                }
                for r in (self._volumes.measured(p.uid) if self._volumes is not None else [])
            ]
            if volumes:
                pod["volume"] = volumes
        return _drop_none(pod)
