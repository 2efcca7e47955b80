"""What one stats pass measured, and the pure arithmetic that shapes raw readings into it.

A `Snapshot` is the node and its ready pods at one instant, in the units the kernel and
the runtime report (bytes, inodes, nanoseconds). It is the one collection that both
consumers read, as upstream's stats provider feeds both the Summary API and the
eviction manager: status-reporter renders it as `/stats/summary`, eviction derives its
signals and per-pod usage from it. Which readings go where:

- node: the root cgroup (cpu, memory, working set), the `/kubepods` cgroup, MemTotal,
  boot time, pid_max and the task count of /proc/loadavg, swap (/proc/meminfo's
  SwapTotal and SwapFree); statfs of the kubelet root
  dir (nodefs), of the pod log dir, and of the runtime's image and container
  filesystems (CRI ImageFsInfo's mountpoints; the container filesystem is the image
  filesystem unless the runtime names one of its own);
- node network: the interfaces of the host's network namespace (/proc/net/dev: the
  services run on the host network) and the one the default route leaves by
  (/proc/net/route, else /proc/net/ipv6_route);
- pods: one per ready sandbox, its pod cgroup (cpu, memory, process count), its
  containers (below), its log directory and its disk-backed emptyDirs, and the
  interfaces of its network namespace (/proc/<pid>/net/dev of a process of its cgroup;
  none for a pod on the host's network);
- containers: every container of the pod that CRI reports stats for or lists as
  running, with its CRI stats, whether it runs, and its log directory's usage.

Consumers pick from the containers what they need (`running_containers`,
`latest_attempts`); this module does no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from klet.cgroups import CgroupStats
from klet.cri import labels as L
from klet.cri.types import Container, ContainerState, ContainerStatsInfo, Sandbox, SandboxState
from klet.stats.cadvisor import NetDev
from klet.stats.psi import Pressure

__all__ = [
    "ContainerStats",
    "DirUsage",
    "FsUsage",
    "NodeStats",
    "PodStats",
    "RuntimeFs",
    "Snapshot",
    "SwapSpace",
    "latest_attempts",
    "parse_btime",
    "parse_loadavg_tasks",
    "parse_swap_space",
    "plan_pods",
    "running_containers",
]


class DirUsage(NamedTuple):
    """Bytes allocated and inodes used under a directory, itself included (as `du`).

    `complete` is False when some entry under it could not be read (a directory of
    another owner that a process without CAP_DAC_READ_SEARCH may not list): the counts
    are then a lower bound, which a reader must not report as the usage."""

    bytes: int
    inodes: int
    complete: bool = True


class SwapSpace(NamedTuple):
    """The node's swap (/proc/meminfo SwapTotal, SwapFree), in bytes."""

    total: int
    free: int

    @property
    def used(self) -> int:
        return max(self.total - self.free, 0)


@dataclass(frozen=True)
class FsUsage:
    """A statfs result: blocks of `frsize` bytes, inodes, and the filesystem's device
    (st_dev of the path, which tells whether two paths share a filesystem)."""

    blocks: int
    bfree: int
    bavail: int
    frsize: int
    files: int
    ffree: int
    device: int

    @property
    def capacity_bytes(self) -> int:
        return self.blocks * self.frsize

    @property
    def available_bytes(self) -> int:
        """Free to unprivileged users (bavail), as upstream's availableBytes."""
        return self.bavail * self.frsize

    @property
    def used_bytes(self) -> int:
        return (self.blocks - self.bfree) * self.frsize

    @property
    def inodes_used(self) -> int:
        return self.files - self.ffree


@dataclass(frozen=True)
class RuntimeFs:
    """A runtime filesystem as CRI ImageFsInfo names it: the runtime's own count of what
    it uses there, and statfs of its mountpoint (None when that failed)."""

    mountpoint: str
    used_bytes: int | None
    inodes_used: int | None
    fs: FsUsage | None


@dataclass(frozen=True)
class ContainerStats:
    """One CRI container of a pod.

    name: the pod spec's container name (the CRI label, else the CRI name).
    start_ns: when the runtime created it; None when it is known from stats only.
    usage: the runtime's ListContainerStats reading; None when it gave none.
    logs: its log directory `<pod log dir>/<name>/`; None when filesystems were skipped.
    image: the image as the runtime lists the container ("" when known from stats only).
    cgroup: its own cgroup's CPU and memory (running containers under a pod cgroup),
      read as upstream's kubelet reads them through cAdvisor; the summary takes them when
      the runtime's reading lacks them (containerd 1.6's shim reports no metrics at all on
      a cgroup v1 host where a controller listed in /proc/<pid>/cgroup is not mounted).
    pressure: its cgroup's PSI (KubeletPSI, cgroup v2 only); None where there is none.
    """

    id: str
    name: str
    attempt: int
    running: bool
    start_ns: int | None = None
    usage: ContainerStatsInfo | None = None
    logs: DirUsage | None = None
    image: str = ""
    cgroup: CgroupStats | None = None
    pressure: Pressure | None = None


@dataclass(frozen=True)
class PodStats:
    """One ready sandbox and what its pod uses.

    cgroup: the pod cgroup's stats; None when the pod has none (cgroupsPerQOS off).
    processes: tasks in the pod cgroup (pids.current, else a count of its tasks files);
      None without a pod cgroup.
    logs: the pod's whole log directory (it also holds the logs of containers no longer
      running); None when it does not exist or filesystems were skipped.
    volumes: disk-backed emptyDir name → its usage (a mounted one is a `medium: Memory`
      tmpfs, which is memory, not disk, and is left out).
    pressure: the pod cgroup's PSI (KubeletPSI, cgroup v2 only); None where there is none.
    """

    uid: str
    namespace: str
    name: str
    start_ns: int
    cgroup: CgroupStats | None
    processes: int | None
    containers: Sequence[ContainerStats] = ()
    logs: DirUsage | None = None
    volumes: Mapping[str, DirUsage] = field(default_factory=dict)
    pressure: Pressure | None = None
    network: Mapping[str, NetDev] | None = None
    """Interface → counters of the pod's own network namespace; None when it has none of
    its own (host network), it has no process to read it through, or filesystems were
    skipped (the CPU-and-memory pass reads no network, as upstream's)."""


@dataclass(frozen=True)
class NodeStats:
    """The node. `kubepods` is None when that cgroup does not exist; the filesystem
    fields are None when statfs failed or filesystems were skipped; `container_fs` is
    the image filesystem unless the runtime reports a separate one; `pressure` is
    /proc/pressure's PSI (KubeletPSI), None where the kernel has none."""

    root: CgroupStats
    kubepods: CgroupStats | None
    memory_total: int | None
    boot_ns: int | None
    pid_max: int | None
    tasks: int | None
    rootfs: FsUsage | None = None
    logs_fs: FsUsage | None = None
    image_fs: RuntimeFs | None = None
    container_fs: RuntimeFs | None = None
    pressure: Pressure | None = None
    swap: SwapSpace | None = None
    """/proc/meminfo's swap; None when it gives none."""
    network: Mapping[str, NetDev] | None = None
    """Interface → counters of the host's network namespace; None when filesystems were
    skipped."""
    default_interface: str | None = None
    """The interface of the default route (None: the host has none)."""


@dataclass(frozen=True)
class Snapshot:
    """One stats pass taken at `time_ns`. `runtime_error` is the runtime's error when it
    could not be read: the node readings are still there, pods and runtime filesystems
    are not."""

    time_ns: int
    node: NodeStats
    pods: Sequence[PodStats] = ()
    runtime_error: str | None = None


# -- pure arithmetic ---------------------------------------------------------------------


def parse_loadavg_tasks(text: str) -> int | None:
    """The task count of /proc/loadavg ("0.1 0.2 0.3 2/164 999" → 164)."""
    parts = text.split()
    if len(parts) < 4:
        return None
    _, sep, total = parts[3].partition("/")
    return int(total) if sep and total.isdigit() else None


def parse_swap_space(meminfo: str) -> SwapSpace | None:
    """/proc/meminfo's SwapTotal and SwapFree (kB) in bytes; None without both."""
    found: dict[str, int] = {}
    for line in meminfo.splitlines():
        name, _, rest = line.partition(":")
        value = rest.split()
        if name in ("SwapTotal", "SwapFree") and value and value[0].isdigit():
            found[name] = int(value[0]) * 1024
    if "SwapTotal" not in found or "SwapFree" not in found:
        return None
    return SwapSpace(found["SwapTotal"], found["SwapFree"])


def parse_btime(text: str) -> int | None:
    """Boot time of /proc/stat's `btime` line, in nanoseconds since the epoch."""
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "btime" and value.strip().isdigit():
            return int(value.strip()) * 1_000_000_000
    return None


def _container_name(labels: Mapping[str, str], fallback: str) -> str:
    return labels.get(L.CONTAINER_NAME, fallback)


def plan_pods(
    sandboxes: Iterable[Sandbox],
    containers: Iterable[Container],
    stats: Iterable[ContainerStatsInfo],
) -> list[tuple[Sandbox, list[ContainerStats]]]:
    """The ready sandboxes, in the runtime's order, each with its containers: those the
    runtime lists as running in it, and those whose stats carry its pod UID, joined by
    container ID. Log usage is left for the reader to fill in."""
    by_id = {str(s.id): s for s in stats}
    running = [c for c in containers if c.state == ContainerState.RUNNING]
    out: list[tuple[Sandbox, list[ContainerStats]]] = []
    for sandbox in sandboxes:
        if sandbox.state != SandboxState.READY:
            continue
        mine: dict[str, ContainerStats] = {}
        for c in running:
            if c.sandbox_id == sandbox.id:
                mine[str(c.id)] = ContainerStats(
                    id=str(c.id),
                    name=_container_name(c.labels, c.name),
                    attempt=c.attempt,
                    running=True,
                    start_ns=c.created_at,
                    usage=by_id.get(str(c.id)),
                    image=c.image,
                )
        for s in by_id.values():
            if str(s.id) not in mine and s.labels.get(L.POD_UID) == sandbox.uid:
                mine[str(s.id)] = ContainerStats(
                    id=str(s.id),
                    name=_container_name(s.labels, s.name),
                    attempt=s.attempt,
                    running=False,
                    usage=s,
                )
        out.append((sandbox, sorted(mine.values(), key=lambda c: (c.name, c.attempt, c.id))))
    return out


def running_containers(pod: PodStats) -> list[ContainerStats]:
    """The containers the runtime lists as running, by name (what the Summary shows)."""
    return [c for c in pod.containers if c.running]


def latest_attempts(pod: PodStats) -> dict[str, ContainerStats]:
    """Container name → its latest attempt among those with stats (what the pod is
    charged for: an earlier attempt's writable layer is the runtime's to remove)."""
    out: dict[str, ContainerStats] = {}
    for c in pod.containers:
        if c.usage is None:
            continue
        if c.name not in out or c.attempt > out[c.name].attempt:
            out[c.name] = c
    return out


# Route flags (linux/route.h): a usable route is up and not a reject (unreachable) one.
_RTF_UP = 0x0001
_RTF_REJECT = 0x0200


def parse_default_route(ipv4: str, ipv6: str = "") -> str | None:
    """The interface of the default route, from /proc/net/route (`ipv4`) or, on a host
    without an IPv4 one, /proc/net/ipv6_route; the lowest metric wins; None when neither
    has a usable default route."""
    best: tuple[int, str] | None = None
    for line in ipv4.splitlines()[1:]:
        f = line.split()
        if len(f) < 8:
            continue
        try:
            flags, metric = int(f[3], 16), int(f[6])
        except ValueError:
            continue
        usable = flags & _RTF_UP and not flags & _RTF_REJECT
        if f[1] == "00000000" and f[7] == "00000000" and usable:
            if best is None or metric < best[0]:
                best = (metric, f[0])
    if best is not None:
        return best[1]
    for line in ipv6.splitlines():
        f = line.split()
        if len(f) < 10:
            continue
        try:
            prefix, metric, flags = int(f[1], 16), int(f[5], 16), int(f[8], 16)
        except ValueError:
            continue
        usable = flags & _RTF_UP and not flags & _RTF_REJECT
        if f[0] == "0" * 32 and prefix == 0 and usable and f[9] != "lo":
            if best is None or metric < best[0]:
                best = (metric, f[9])
    return None if best is None else best[1]
