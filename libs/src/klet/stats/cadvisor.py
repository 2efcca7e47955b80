"""`/metrics/cadvisor`: what one pass read of the node's cgroups, and the pure conversion
of it into cAdvisor's `container_*` and `machine_*` metric families.

Upstream's kubelet serves these from its embedded cAdvisor; klet reads the same kernel
files (klet.cgroups.detail) and the runtime's view (CRI) once per scrape
(`StatsProvider.collect_cgroups`) and converts here, without I/O. Series, as cAdvisor's:

- the root cgroup (`id="/"`), `/kubepods` and its QoS cgroups, with empty pod labels;
- each ready pod's cgroup, with `pod` and `namespace` set and `container=""` (the
  series the kubernetes-mixin's pod dashboards sum);
- each running container's cgroup, with `container` (the pod spec's name), `pod`,
  `namespace`, `image` (the image's name as the pod's status shows it, `with_images`;
  else as the runtime lists it), `name` (the container ID, as cAdvisor's containerd
  handler names it) and `id` (the cgroup path).

Every series carries the six labels `container id image name namespace pod`, empty where
they do not apply, as Prometheus needs one label set per family; the per-device,
per-interface and per-CPU families add `device`, `interface` or `cpu` (always "total":
per-CPU usage is off by default in cAdvisor too).

With the KubeletPSI gate, `container_pressure_{cpu,memory,io}_{waiting,stalled}_seconds_total`
(PSI's `some` and `full` totals) on the series whose cgroup has PSI: the root from
/proc/pressure, every other cgroup only on cgroup v2 (a v1 cgroup has no pressure
files, so those series are absent there, not 0).

Where klet differs: the pod's network counters sit on the pod cgroup's series (cAdvisor
puts them on the pause container's, which klet does not list: the dashboards sum by pod
either way); the writable layer's `container_fs_usage_bytes` is the runtime's count
(CRI ListContainerStats) and its limit the capacity of the filesystem the runtime keeps
it on; `container_memory_failcnt` (cgroup v1's memory.failcnt) keeps cAdvisor's name,
a counter without `_total` that prometheus-client cannot type as one, so its family is
untyped, and it is absent on cgroup v2, which has no such counter (cAdvisor shows 0
there), as is `container_memory_kernel_usage` (v1's memory.kmem.usage_in_bytes).

Process figures, as cAdvisor's process stats: `container_file_descriptors` and
`container_sockets` count the `/proc/<pid>/fd` entries (sockets: links to `socket:[...]`)
of the processes klet lists for `container_processes` (pod and container cgroups; a
process whose fd directory cannot be read is skipped, none readable leaves them absent);
`container_ulimits_soft{ulimit="max_open_files"}` is the container's first process's soft
limit from `/proc/<pid>/limits` (-1 unlimited), the one limit cAdvisor reads, on
container series only (cAdvisor's raw cgroups have no root process).
`container_fs_inodes_total`/`_free` sit on the root series, one per filesystem klet
measures (the kubelet root's and the runtime's image and container filesystems, each
device once), as cAdvisor's root cgroup carries its machine filesystems'; cAdvisor lists
every mounted block device, klet the node's own. `machine_scrape_error` is 1 and no
`machine_*` fact is served when the machine facts could not be read (/proc/meminfo or
/proc/cpuinfo), as cAdvisor's machine collector when its machine info fails.

Disks, as cAdvisor's root cgroup carries its filesystems' (`fs.go`'s /proc/diskstats
reading): on the root series, per device of those same filesystems, the
`container_fs_{sector_reads,sector_writes,reads_merged,writes_merged}_total`,
`container_fs_{read,write,io_time,io_time_weighted}_seconds_total` and
`container_fs_io_current` of /proc/diskstats, and its completed reads and writes in
`container_fs_{reads,writes}_total` (beside the cgroups' blkio counts; a device the
root cgroup's blkio already gave keeps that one series). A filesystem without disk
statistics (overlay, tmpfs) has none, where cAdvisor shows 0; cAdvisor matches only
sd*, vd*, xvd* and dm-* names, klet any device the kernel counts. The kernel counts
time in milliseconds: klet serves seconds, where cAdvisor divides the milliseconds by
10^9. On any cgroup, as cAdvisor, merged reads and writes, read, write and total
service time and the queued I/Os come from BFQ's debug blkio files
(CONFIG_BFQ_CGROUP_DEBUG) or CFQ's (kernels before 5.0), where the cgroup has them
(klet.cgroups.detail reads runc's order of blkio groups); cgroup v2's io.stat has none.
The sector counts and the weighted time are the root's disks' alone: cAdvisor's cgroup
sector series read an operation the sectors file does not name, so always 0.
`container_blkio_device_usage_total{device,major,minor,operation}` is every cgroup's
bytes per device and operation (v1's io_service_bytes lines: Read, Write, Sync, Async,
Discard, Total; v2's io.stat: Read, Write). `cadvisor_version_info` is 1 with the
kernel's release and os-release's PRETTY_NAME, and empty `dockerVersion`,
`cadvisorVersion` and `cadvisorRevision`, as upstream's kubelet (whose build stamps no
cAdvisor version) serves it.

No sample carries a timestamp: every value is read during the scrape, so the scrape's own
time is the sample time, and a timestamped series is not marked stale by Prometheus when
its container goes away.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from klet.cgroups.detail import CgroupDetail
from klet.stats.psi import Pressure, PSIStats
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    UnknownMetricFamily,
)
from prometheus_client.exposition import generate_latest

__all__ = [
    "CgroupSeries",
    "CgroupSnapshot",
    "DiskStats",
    "FsInodes",
    "MachineFacts",
    "NetDev",
    "OpenFiles",
    "WritableLayer",
    "cadvisor_families",
    "parse_cpuinfo",
    "parse_diskstats",
    "parse_limits",
    "parse_net_dev",
    "parse_swap_total",
    "pod_images",
    "render",
    "with_images",
]

LABELS = ("container", "id", "image", "name", "namespace", "pod")
# Interfaces cAdvisor leaves out of a container's network stats: the loopback and the
# host ends of container links and bridges.
_IGNORED_INTERFACES = ("lo", "veth", "docker")


class NetDev(NamedTuple):
    """One interface's counters from /proc/<pid>/net/dev."""

    rx_bytes: int
    rx_packets: int
    rx_errors: int
    rx_dropped: int
    tx_bytes: int
    tx_packets: int
    tx_errors: int
    tx_dropped: int


@dataclass(frozen=True)
class WritableLayer:
    """A container's writable layer: bytes used (the runtime's count) on the filesystem
    `device` of `limit_bytes` capacity."""

    device: str
    usage_bytes: int
    limit_bytes: int | None


class FsInodes(NamedTuple):
    """A filesystem's inodes (statfs f_files and f_ffree)."""

    total: int
    free: int


class DiskStats(NamedTuple):
    """One block device's counters from /proc/diskstats (times in milliseconds)."""

    reads: int
    reads_merged: int
    sectors_read: int
    read_ms: int
    writes: int
    writes_merged: int
    sectors_written: int
    write_ms: int
    io_in_progress: int
    io_ms: int
    weighted_io_ms: int


class OpenFiles(NamedTuple):
    """Open file descriptors of a cgroup's processes, and how many are sockets."""

    fds: int
    sockets: int


@dataclass(frozen=True)
class CgroupSeries:
    """One cgroup's readings and the labels its series carry (`id`: the cgroup path)."""

    id: str
    detail: CgroupDetail
    container: str = ""
    pod: str = ""
    namespace: str = ""
    image: str = ""
    name: str = ""
    start_s: float | None = None
    """When it started (container: created; pod: its sandbox created; root: boot)."""
    processes: int | None = None
    open_files: OpenFiles | None = None
    """fds and sockets of the processes counted in `processes`; None when unread."""
    ulimits: Mapping[str, int] = field(default_factory=dict)
    """ulimit name → soft limit (-1 unlimited) of the container's first process."""
    inodes: Mapping[str, FsInodes] = field(default_factory=dict)
    """device → inodes of the node's filesystems (the root series only)."""
    disks: Mapping[str, DiskStats] = field(default_factory=dict)
    """device → /proc/diskstats counters of the node's filesystems' devices (the root
    series only)."""
    network: Mapping[str, NetDev] = field(default_factory=dict)
    fs: WritableLayer | None = None
    blkio_devices: Mapping[str, str] = field(default_factory=dict)
    """"major:minor" → device name (/dev/sda); a device without one keeps its numbers."""
    pressure: Pressure | None = None
    """PSI (KubeletPSI): the root's from /proc/pressure, others' from their cgroup v2
    `*.pressure` files; None where there is none (cgroup v1)."""

    def labels(self) -> list[str]:
        return [self.container, self.id, self.image, self.name, self.namespace, self.pod]


@dataclass(frozen=True)
class MachineFacts:
    """The machine_* values and their labels."""

    cpu_cores: int
    physical_cores: int | None
    sockets: int | None
    memory_bytes: int | None
    boot_id: str = ""
    swap_bytes: int | None = None
    """/proc/meminfo's SwapTotal (cAdvisor's SwapCapacity); None when unread."""
    machine_id: str = ""
    system_uuid: str = ""
    kernel_version: str = ""
    """uname's release (cadvisor_version_info's kernelVersion)."""
    os_version: str = ""
    """os-release's PRETTY_NAME, "Linux" without one (its osVersion)."""
    error: str | None = None
    """Why the facts could not be read (cAdvisor's machine info failing): then no
    machine_* fact is served and machine_scrape_error is 1."""


@dataclass(frozen=True)
class CgroupSnapshot:
    """One pass: the cgroups read at `time_ns`; `runtime_error` when CRI could not be
    read (the node's cgroups are still there, pods and containers are not)."""

    time_ns: int
    machine: MachineFacts
    cgroups: Sequence[CgroupSeries] = ()
    runtime_error: str | None = None


# -- pure parsers ------------------------------------------------------------------------


def parse_net_dev(text: str) -> dict[str, NetDev]:
    """/proc/<pid>/net/dev → interface → counters, without the interfaces cAdvisor
    ignores (lo, veth*, docker*)."""
    out: dict[str, NetDev] = {}
    for line in text.splitlines()[2:]:
        name, sep, rest = line.partition(":")
        name = name.strip()
        values = rest.split()
        if not sep or len(values) < 16 or name.startswith(_IGNORED_INTERFACES):
            continue
        if not all(v.isdigit() for v in values[:12]):
            continue
        v = [int(x) for x in values[:12]]
        # receive: bytes packets errs drop fifo frame compressed multicast; transmit: ...
        out[name] = NetDev(v[0], v[1], v[2], v[3], v[8], v[9], v[10], v[11])
    return out


def parse_diskstats(text: str) -> dict[str, DiskStats]:
    """/proc/diskstats → "major:minor" → its first eleven counters; a line with fewer
    (or not numbers) is skipped."""
    out: dict[str, DiskStats] = {}
    for line in text.splitlines():
        words = line.split()
        if len(words) < 14 or not all(w.isdigit() for w in (*words[:2], *words[3:14])):
            continue
        out[f"{words[0]}:{words[1]}"] = DiskStats(*(int(w) for w in words[3:14]))
    return out


def parse_swap_total(meminfo: str) -> int | None:
    """/proc/meminfo's SwapTotal in bytes (the file gives kB), or None."""
    for line in meminfo.splitlines():
        name, _, rest = line.partition(":")
        if name == "SwapTotal":
            value = rest.split()
            return int(value[0]) * 1024 if value and value[0].isdigit() else None
    return None


def parse_limits(text: str) -> dict[str, int]:
    """/proc/<pid>/limits → {"max_open_files": soft limit}, the one line cAdvisor reads;
    "unlimited" is -1; {} when the line is missing or does not parse."""
    for line in text.splitlines():
        if not line.startswith("Max open files"):
            continue
        fields = line[len("Max open files") :].split()
        if len(fields) != 3:
            return {}
        soft = fields[0]
        if soft == "unlimited":
            return {"max_open_files": -1}
        try:
            return {"max_open_files": int(soft)}
        except ValueError:
            return {}
    return {}


def parse_cpuinfo(text: str) -> tuple[int | None, int | None]:
    """(physical cores, sockets) of /proc/cpuinfo: distinct (physical id, core id) pairs
    and distinct physical ids; (None, None) when it names neither (some arm64 kernels)."""
    cores: set[tuple[str, str]] = set()
    sockets: set[str] = set()
    phys = core = None
    for line in [*text.splitlines(), ""]:
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "physical id":
            phys = value
        elif key == "core id":
            core = value
        elif not key:
            if phys is not None:
                sockets.add(phys)
                if core is not None:
                    cores.add((phys, core))
            phys = core = None
    return (len(cores) or None, len(sockets) or None)


def pod_images(pod_list: Mapping[str, object]) -> dict[tuple[str, str, str], str]:
    """(namespace, pod, container) → image of a v1 PodList: the status's image (what
    the runtime reported, as `kubectl get pod` shows it), else the spec's."""
    out: dict[tuple[str, str, str], str] = {}
    items = pod_list.get("items")
    for pod in items if isinstance(items, list) else []:
        meta, spec, status = (pod.get(k) or {} for k in ("metadata", "spec", "status"))
        ns, name = meta.get("namespace", "default"), meta.get("name", "")
        for key in ("initContainers", "containers"):
            for c in spec.get(key) or []:
                if c.get("image"):
                    out[(ns, name, c.get("name", ""))] = c["image"]
        for key in ("initContainerStatuses", "containerStatuses"):
            for c in status.get(key) or []:
                if c.get("image"):
                    out[(ns, name, c.get("name", ""))] = c["image"]
    return out


def with_images(
    snapshot: CgroupSnapshot, images: Mapping[tuple[str, str, str], str]
) -> CgroupSnapshot:
    """The snapshot with each container's `image` label from `images` where it has
    one. The runtime lists a container's image as the ID klet created it from
    (sha256:...); cAdvisor shows the image's name, which the pod's status has."""
    return dataclasses.replace(
        snapshot,
        cgroups=[
            dataclasses.replace(c, image=images.get((c.namespace, c.pod, c.container), c.image))
            if c.container
            else c
            for c in snapshot.cgroups
        ],
    )


# -- the conversion ----------------------------------------------------------------------

_NS = 1e-9
Getter = Callable[[CgroupDetail], int | None]


def _if_quota(d: CgroupDetail, value: int | None) -> int | None:
    """CFS counters only for a cgroup with a quota, as cAdvisor serves them."""
    return value if d.cpu_quota_us is not None else None


# (name, help, getter, scale); counters end in _total, the rest are gauges, but for
# cAdvisor's counters named without _total (_UNSUFFIXED_COUNTERS: served untyped).
_SCALARS: tuple[tuple[str, str, Getter, float], ...] = (
    (
        "container_cpu_user_seconds_total",
        "Cumulative user cpu time consumed in seconds.",
        lambda d: d.cpu_user_ns,
        _NS,
    ),
    (
        "container_cpu_system_seconds_total",
        "Cumulative system cpu time consumed in seconds.",
        lambda d: d.cpu_system_ns,
        _NS,
    ),
    (
        "container_cpu_cfs_periods_total",
        "Number of elapsed enforcement period intervals.",
        lambda d: _if_quota(d, d.cfs_periods),
        1.0,
    ),
    (
        "container_cpu_cfs_throttled_periods_total",
        "Number of throttled period intervals.",
        lambda d: _if_quota(d, d.cfs_throttled_periods),
        1.0,
    ),
    (
        "container_cpu_cfs_throttled_seconds_total",
        "Total time duration the container has been throttled.",
        lambda d: _if_quota(d, d.cfs_throttled_ns),
        _NS,
    ),
    (
        "container_memory_usage_bytes",
        "Current memory usage in bytes, including all memory regardless of when it was accessed",
        lambda d: d.memory_usage,
        1.0,
    ),
    (
        "container_memory_working_set_bytes",
        "Current working set in bytes.",
        lambda d: d.memory_working_set,
        1.0,
    ),
    ("container_memory_rss", "Size of RSS in bytes.", lambda d: d.memory_rss, 1.0),
    (
        "container_memory_cache",
        "Number of bytes of page cache memory.",
        lambda d: d.memory_cache,
        1.0,
    ),
    (
        "container_memory_mapped_file",
        "Size of memory mapped files in bytes.",
        lambda d: d.memory_mapped_file,
        1.0,
    ),
    ("container_memory_swap", "Container swap usage in bytes.", lambda d: d.memory_swap, 1.0),
    (
        "container_memory_failcnt",
        "Number of memory usage hits limits",
        lambda d: d.memory_failcnt,
        1.0,
    ),
    (
        "container_memory_kernel_usage",
        "Size of kernel memory allocated in bytes.",
        lambda d: d.memory_kernel,
        1.0,
    ),
    (
        "container_memory_total_active_file_bytes",
        "Current total active file in bytes.",
        lambda d: d.memory_active_file,
        1.0,
    ),
    (
        "container_memory_total_inactive_file_bytes",
        "Current total inactive file in bytes.",
        lambda d: d.memory_inactive_file,
        1.0,
    ),
    (
        "container_memory_max_usage_bytes",
        "Maximum memory usage recorded in bytes",
        lambda d: d.memory_max_usage,
        1.0,
    ),
    (
        "container_oom_events_total",
        "Count of out of memory events observed for the container",
        lambda d: d.oom_kills,
        1.0,
    ),
    (
        "container_spec_memory_limit_bytes",
        "Memory limit for the container.",
        lambda d: d.memory_limit or 0,
        1.0,
    ),
    (
        "container_spec_memory_reservation_limit_bytes",
        "Memory reservation limit for the container.",
        lambda d: d.memory_reservation or 0,
        1.0,
    ),
    (
        "container_spec_memory_swap_limit_bytes",
        "Memory swap limit for the container.",
        lambda d: d.memory_swap_limit or 0,
        1.0,
    ),
    # cAdvisor emits quota and period only when set.
    ("container_spec_cpu_quota", "CPU quota of the container.", lambda d: d.cpu_quota_us, 1.0),
    (
        "container_spec_cpu_period",
        "CPU period of the container.",
        lambda d: d.cpu_period_us if d.cpu_quota_us is not None else None,
        1.0,
    ),
    ("container_spec_cpu_shares", "CPU share of the container.", lambda d: d.cpu_shares, 1.0),
    (
        "container_threads",
        "Number of threads running inside the container",
        lambda d: d.threads,
        1.0,
    ),
    (
        "container_threads_max",
        "Maximum number of threads allowed inside the container, infinity if value is zero",
        lambda d: d.threads_max or 0,
        1.0,
    ),
)

_NETWORK: tuple[tuple[str, str, int], ...] = (
    ("container_network_receive_bytes_total", "Cumulative count of bytes received", 0),
    ("container_network_receive_packets_total", "Cumulative count of packets received", 1),
    (
        "container_network_receive_errors_total",
        "Cumulative count of errors encountered while receiving",
        2,
    ),
    (
        "container_network_receive_packets_dropped_total",
        "Cumulative count of packets dropped while receiving",
        3,
    ),
    ("container_network_transmit_bytes_total", "Cumulative count of bytes transmitted", 4),
    ("container_network_transmit_packets_total", "Cumulative count of packets transmitted", 5),
    (
        "container_network_transmit_errors_total",
        "Cumulative count of errors encountered while transmitting",
        6,
    ),
    (
        "container_network_transmit_packets_dropped_total",
        "Cumulative count of packets dropped while transmitting",
        7,
    ),
)

_BLKIO: tuple[tuple[str, str, int], ...] = (
    ("container_fs_reads_bytes_total", "Cumulative count of bytes read", 0),
    ("container_fs_writes_bytes_total", "Cumulative count of bytes written", 1),
    ("container_fs_reads_total", "Cumulative count of reads completed", 2),
    ("container_fs_writes_total", "Cumulative count of writes completed", 3),
)

# container_fs_{reads,writes}_total also count the root's disks' completed I/Os.
_DISK_COUNTS = {"container_fs_reads_total": "reads", "container_fs_writes_total": "writes"}

# The root series' per-device disk statistics: (name, help, DiskStats field, scale). The
# kernel counts time in milliseconds; served in seconds (cAdvisor divides the same
# milliseconds by 10^9).
_MS = 1e-3
_DISKS: tuple[tuple[str, str, str, float], ...] = (
    ("container_fs_sector_reads_total", "Cumulative count of sector reads completed",
     "sectors_read", 1.0),
    ("container_fs_reads_merged_total", "Cumulative count of reads merged", "reads_merged", 1.0),
    ("container_fs_read_seconds_total", "Cumulative count of seconds spent reading",
     "read_ms", _MS),
    ("container_fs_sector_writes_total", "Cumulative count of sector writes completed",
     "sectors_written", 1.0),
    ("container_fs_writes_merged_total", "Cumulative count of writes merged",
     "writes_merged", 1.0),
    ("container_fs_write_seconds_total", "Cumulative count of seconds spent writing",
     "write_ms", _MS),
    ("container_fs_io_current", "Number of I/Os currently in progress", "io_in_progress", 1.0),
    ("container_fs_io_time_seconds_total", "Cumulative count of seconds spent doing I/Os",
     "io_ms", _MS),
    ("container_fs_io_time_weighted_seconds_total", "Cumulative weighted I/O time in seconds",
     "weighted_io_ms", _MS),
)  # fmt: skip

# The same families on any cgroup whose blkio files count them (BFQ's debug or CFQ's):
# name → (CgroupDetail table, operation, scale), as cAdvisor's ioValues reads them.
_CGROUP_IO: dict[str, tuple[str, str, float]] = {
    "container_fs_reads_merged_total": ("blkio_merged", "Read", 1.0),
    "container_fs_writes_merged_total": ("blkio_merged", "Write", 1.0),
    "container_fs_read_seconds_total": ("blkio_service_time", "Read", _NS),
    "container_fs_write_seconds_total": ("blkio_service_time", "Write", _NS),
    "container_fs_io_current": ("blkio_queued", "Total", 1.0),
    "container_fs_io_time_seconds_total": ("blkio_service_time", "Total", _NS),
}


# cAdvisor's pressure families: (name part, PSI line, help) per resource.
_PRESSURE = (
    (
        "stalled",
        "full",
        "Total time duration no tasks in the container could make progress due to "
        "{resource} congestion.",
    ),
    (
        "waiting",
        "some",
        "Total time duration tasks in the container have waited due to {resource} congestion.",
    ),
)
_PRESSURE_NAMES = {"cpu": "CPU", "memory": "memory", "io": "IO"}


_UNSUFFIXED_COUNTERS = frozenset(("container_memory_failcnt",))


def _family(name: str, doc: str, labels: Sequence[str]) -> Metric:
    if name in _UNSUFFIXED_COUNTERS:
        return UnknownMetricFamily(name, doc, labels=list(labels))
    if name.endswith("_total"):
        return CounterMetricFamily(name, doc, labels=list(labels))
    return GaugeMetricFamily(name, doc, labels=list(labels))


def _add(family: Metric, labels: list[str], value: float) -> None:
    family.add_metric(labels, value)  # type: ignore[attr-defined]


def _machine(m: MachineFacts) -> list[Metric]:
    names = ("boot_id", "machine_id", "system_uuid")
    values = [m.boot_id, m.machine_id, m.system_uuid]
    error = GaugeMetricFamily(
        "machine_scrape_error",
        "1 if there was an error while getting machine metrics, 0 otherwise.",
    )
    error.add_metric([], 0.0 if m.error is None else 1.0)
    if m.error is not None:
        return [error]
    out: list[Metric] = [error]
    for name, doc, value in (
        ("machine_cpu_cores", "Number of logical CPU cores.", m.cpu_cores),
        ("machine_cpu_physical_cores", "Number of physical CPU cores.", m.physical_cores),
        ("machine_cpu_sockets", "Number of CPU sockets.", m.sockets),
        ("machine_memory_bytes", "Amount of memory installed on the machine.", m.memory_bytes),
        ("machine_swap_bytes", "Amount of swap memory available on the machine.", m.swap_bytes),
    ):
        if value is not None:
            family = GaugeMetricFamily(name, doc, labels=list(names))
            family.add_metric(values, float(value))
            out.append(family)
    return out


def _version_info(m: MachineFacts) -> Metric:
    """cadvisor_version_info as upstream's kubelet serves it: its embedded cAdvisor's
    GetVersionInfo gives the kernel and OS, no docker version, and the kubelet's build
    stamps no cAdvisor version or revision, so those three labels are empty there too."""
    family = GaugeMetricFamily(
        "cadvisor_version_info",
        "A metric with a constant '1' value labeled by kernel version, OS version, docker "
        "version, cadvisor version & cadvisor revision.",
        labels=[
            "kernelVersion",
            "osVersion",
            "dockerVersion",
            "cadvisorVersion",
            "cadvisorRevision",
        ],
    )
    family.add_metric([m.kernel_version, m.os_version, "", "", ""], 1.0)
    return family


def cadvisor_families(snapshot: CgroupSnapshot) -> list[Metric]:
    """The metric families of one snapshot, families in a fixed order and series in the
    snapshot's order. A value the cgroup did not give is left out, not served as 0."""
    cgroups = snapshot.cgroups
    now_s = snapshot.time_ns / 1e9
    out: list[Metric] = [_version_info(snapshot.machine)]

    cpu = _family(
        "container_cpu_usage_seconds_total",
        "Cumulative cpu time consumed in seconds.",
        (*LABELS, "cpu"),
    )
    for c in cgroups:
        if c.detail.cpu_usage_ns is not None:
            _add(cpu, [*c.labels(), "total"], c.detail.cpu_usage_ns * _NS)
    out.append(cpu)

    for name, doc, get, scale in _SCALARS:
        family = _family(name, doc, LABELS)
        for c in cgroups:
            value = get(c.detail)
            if value is not None:
                _add(family, c.labels(), value * scale)
        out.append(family)

    # cAdvisor gives memory.stat's one count as both scopes (the cgroup's own in v1)
    failures = _family(
        "container_memory_failures_total",
        "Cumulative count of memory allocation failures.",
        (*LABELS, "failure_type", "scope"),
    )
    for c in cgroups:
        for kind, count in (
            ("pgfault", c.detail.memory_pgfault),
            ("pgmajfault", c.detail.memory_pgmajfault),
        ):
            if count is not None:
                for scope in ("container", "hierarchy"):
                    _add(failures, [*c.labels(), kind, scope], float(count))
    out.append(failures)

    for name, doc, index in _BLKIO:
        family = _family(name, doc, (*LABELS, "device"))
        disk_field = _DISK_COUNTS.get(name)
        for c in cgroups:
            devices = set()
            for dev, io in sorted(c.detail.blkio.items()):
                device = c.blkio_devices.get(dev, dev)
                devices.add(device)
                _add(family, [*c.labels(), device], float(io[index]))
            # the root's filesystems' devices, as cAdvisor adds them; a device its cgroup
            # already gave keeps that one series
            if disk_field is not None:
                for device, disk in sorted(c.disks.items()):
                    if device not in devices:
                        _add(family, [*c.labels(), device], float(getattr(disk, disk_field)))
        out.append(family)

    for name, doc, disk_field, scale in _DISKS:
        family = _family(name, doc, (*LABELS, "device"))
        table = _CGROUP_IO.get(name)
        for c in cgroups:
            devices = set()
            if table is not None:
                attr, op, op_scale = table
                for dev, ops in sorted(getattr(c.detail, attr).items()):
                    if op in ops:
                        device = c.blkio_devices.get(dev, dev)
                        devices.add(device)
                        _add(family, [*c.labels(), device], ops[op] * op_scale)
            for device, disk in sorted(c.disks.items()):
                if device not in devices:
                    _add(family, [*c.labels(), device], getattr(disk, disk_field) * scale)
        out.append(family)

    usage_by_op = _family(
        "container_blkio_device_usage_total",
        "Blkio Device bytes usage",
        (*LABELS, "device", "major", "minor", "operation"),
    )
    for c in cgroups:
        for dev, ops in sorted(c.detail.blkio_service_bytes.items()):
            major, _, minor = dev.partition(":")
            for op, value in sorted(ops.items()):
                labels = [*c.labels(), c.blkio_devices.get(dev, dev), major, minor, op]
                _add(usage_by_op, labels, float(value))
    out.append(usage_by_op)

    usage = _family(
        "container_fs_usage_bytes",
        "Number of bytes that are consumed by the container on this filesystem.",
        (*LABELS, "device"),
    )
    limit = _family(
        "container_fs_limit_bytes",
        "Number of bytes that can be consumed by the container on this filesystem.",
        (*LABELS, "device"),
    )
    for c in cgroups:
        if c.fs is not None:
            _add(usage, [*c.labels(), c.fs.device], float(c.fs.usage_bytes))
            if c.fs.limit_bytes is not None:
                _add(limit, [*c.labels(), c.fs.device], float(c.fs.limit_bytes))
    out += [usage, limit]

    for name, doc, index in (
        ("container_fs_inodes_free", "Number of available Inodes", 1),
        ("container_fs_inodes_total", "Number of Inodes", 0),
    ):
        family = _family(name, doc, (*LABELS, "device"))
        for c in cgroups:
            for device, inodes in sorted(c.inodes.items()):
                _add(family, [*c.labels(), device], float(inodes[index]))
        out.append(family)

    for name, doc, index in _NETWORK:
        family = _family(name, doc, (*LABELS, "interface"))
        for c in cgroups:
            for iface, counters in sorted(c.network.items()):
                _add(family, [*c.labels(), iface], float(counters[index]))
        out.append(family)

    processes = _family(
        "container_processes", "Number of processes running inside the container.", LABELS
    )
    start = _family(
        "container_start_time_seconds",
        "Start time of the container since unix epoch in seconds.",
        LABELS,
    )
    seen = _family("container_last_seen", "Last time a container was seen by the exporter", LABELS)
    for c in cgroups:
        if c.processes is not None:
            _add(processes, c.labels(), float(c.processes))
        if c.start_s is not None:
            _add(start, c.labels(), c.start_s)
        _add(seen, c.labels(), now_s)
    out += [processes, start, seen]

    fds = _family(
        "container_file_descriptors", "Number of open file descriptors for the container.", LABELS
    )
    sockets = _family("container_sockets", "Number of open sockets for the container.", LABELS)
    ulimits = _family(
        "container_ulimits_soft",
        "Soft ulimit values for the container root process. Unlimited if -1, except priority "
        "and nice",
        (*LABELS, "ulimit"),
    )
    for c in cgroups:
        if c.open_files is not None:
            _add(fds, c.labels(), float(c.open_files.fds))
            _add(sockets, c.labels(), float(c.open_files.sockets))
        for ulimit, soft in sorted(c.ulimits.items()):
            _add(ulimits, [*c.labels(), ulimit], float(soft))
    out += [fds, sockets, ulimits]

    for resource in ("cpu", "memory", "io"):
        for kind, line, doc in _PRESSURE:
            family = _family(
                f"container_pressure_{resource}_{kind}_seconds_total",
                doc.format(resource=_PRESSURE_NAMES[resource]),
                LABELS,
            )
            for c in cgroups:
                stats: PSIStats | None = (
                    None if c.pressure is None else getattr(c.pressure, resource)
                )
                if stats is not None:
                    _add(family, c.labels(), getattr(stats, line).total_us / 1e6)
            out.append(family)

    error = GaugeMetricFamily(
        "container_scrape_error",
        "1 if there was an error while getting container metrics, 0 otherwise",
    )
    error.add_metric([], 1.0 if snapshot.runtime_error else 0.0)
    out.append(error)
    return [*out, *_machine(snapshot.machine)]


class _Families:
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


def render(snapshot: CgroupSnapshot) -> bytes:
    """The snapshot in the Prometheus text format (prometheus-client's exposition)."""
    return generate_latest(_Families(cadvisor_families(snapshot)))
