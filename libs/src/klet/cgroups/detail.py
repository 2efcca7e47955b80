"""Everything one cgroup's files say about it, for `/metrics/cadvisor`: CPU time and
throttling, memory (usage, working set, RSS, cache, swap, limits, OOM kills), the CPU
limits, block I/O per device and task counts.

`CgroupStats` (fs.py) is the four readings /stats/summary and eviction need; this is
the long form, read only when a scrape asks for it. Each file gives None when it cannot
be read, so a host without a controller (no blkio, no pids) still yields the rest.
Counters are the kernel's own cumulative counters, never differences between reads,
so they only go back when the cgroup is re-created.

Which file feeds which value, as cAdvisor reads them (v1 under
`<controller>/<cgroup>`; v2 under `<cgroup>`):

- cpu usage: v1 cpuacct.usage (ns); v2 cpu.stat usage_usec. User and system: v1
  cpuacct.stat (USER_HZ ticks); v2 cpu.stat user_usec, system_usec.
- CFS periods, throttled periods and time: cpu.stat nr_periods, nr_throttled, and v1
  throttled_time (ns) / v2 throttled_usec.
- quota, period, shares: v1 cpu.cfs_quota_us (-1: none), cpu.cfs_period_us,
  cpu.shares; v2 cpu.max ("max 100000": no quota), cpu.weight turned back into shares.
- memory usage: v1 memory.usage_in_bytes; v2 memory.current (the root has none:
  MemTotal - MemFree). Working set: usage - (total_)inactive_file.
- rss, cache, mapped file, swap: v1 memory.stat total_rss, total_cache,
  total_mapped_file, total_swap; v2 memory.stat anon, file, file_mapped and
  memory.swap.current. Peak: v1 memory.max_usage_in_bytes; v2 memory.peak.
- limit, reservation, swap limit: v1 memory.limit_in_bytes, soft_limit_in_bytes,
  memsw.limit_in_bytes minus the limit; v2 memory.max, memory.low, memory.swap.max.
- OOM kills: v1 memory.oom_control oom_kill; v2 memory.events oom_kill.
- block I/O per device (bytes and operations read and written): v1 io_service_bytes
  and io_serviced of the first group of blkio files that lists a device, in runc's
  order: BFQ's debug files (blkio.bfq.*_recursive with sectors_recursive), BFQ's
  (blkio.bfq.io_service{d,_bytes}_recursive: a device BFQ schedules, where the throttle
  files count nothing without a throttle limit), CFQ's (blkio.*_recursive, kernels
  before 5.0), the throttle layer's (blkio.throttle.*_recursive, then without
  _recursive); v2 io.stat rbytes, wbytes, rios, wios. The bytes per operation as the
  file names them (`blkio_service_bytes`, container_blkio_device_usage_total): v1 every
  line of io_service_bytes (Read, Write, Sync, Async, Discard, Total), v2 rbytes and
  wbytes as Read and Write, the two runc maps io.stat's bytes to. The BFQ debug and CFQ
  groups also give io_merged, io_queued and io_service_time (ns) per operation
  (`blkio_merged`, `blkio_queued`, `blkio_service_time`); the others and v2 none.
- threads and their limit: pids.current, pids.max.

An unlimited limit is None ("max", -1, or v1's page-rounded 2^63).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

__all__ = [
    "BlkioDevice",
    "CgroupDetail",
    "io_stat_ops",
    "lists_devices",
    "parse_blkio_ops",
    "parse_blkio_v1",
    "parse_cpu_max",
    "parse_io_stat",
    "parse_kv",
    "read_detail_v1",
    "read_detail_v2",
    "weight_to_shares",
]

# Anything at or above this is "no limit" (v1 writes 2^63 rounded down to a page).
_UNLIMITED = 1 << 62
USER_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class BlkioDevice(NamedTuple):
    """One block device's cumulative I/O in a cgroup."""

    read_bytes: int = 0
    write_bytes: int = 0
    reads: int = 0
    writes: int = 0


@dataclass(frozen=True)
class CgroupDetail:
    """One cgroup's readings (units: nanoseconds, bytes, microseconds for CFS
    quota/period as the files give them). None: not readable or, for limits, none set."""

    cpu_usage_ns: int | None = None
    cpu_user_ns: int | None = None
    cpu_system_ns: int | None = None
    cfs_periods: int | None = None
    cfs_throttled_periods: int | None = None
    cfs_throttled_ns: int | None = None
    cpu_quota_us: int | None = None
    cpu_period_us: int | None = None
    cpu_shares: int | None = None
    memory_usage: int | None = None
    memory_working_set: int | None = None
    memory_rss: int | None = None
    memory_cache: int | None = None
    memory_mapped_file: int | None = None
    memory_swap: int | None = None
    memory_max_usage: int | None = None
    memory_limit: int | None = None
    memory_reservation: int | None = None
    memory_swap_limit: int | None = None
    memory_failcnt: int | None = None
    """v1's memory.failcnt (usage hit the limit); v2 has no such counter."""
    memory_kernel: int | None = None
    """v1's memory.kmem.usage_in_bytes; v2's runc-based readers give none either."""
    memory_active_file: int | None = None
    memory_inactive_file: int | None = None
    memory_pgfault: int | None = None
    memory_pgmajfault: int | None = None
    """memory.stat's page fault counts (v1: the cgroup's own, as cAdvisor reads them)."""
    oom_kills: int | None = None
    blkio: Mapping[str, BlkioDevice] = field(default_factory=dict)
    """"major:minor" → its I/O."""
    blkio_service_bytes: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    """"major:minor" → operation (Read, Write, ...) → bytes, as the cgroup counts them."""
    blkio_merged: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    blkio_queued: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    blkio_service_time: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    """"major:minor" → operation → merged requests, queued requests, service time (ns):
    only from BFQ's debug or CFQ's blkio files."""
    threads: int | None = None
    threads_max: int | None = None


# -- pure parsers ------------------------------------------------------------------------


def parse_kv(text: str) -> dict[str, int]:
    """`key value` lines (memory.stat, cpu.stat, memory.events) → integers."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        value = value.strip()
        if value.isdigit():
            out[key] = int(value)
    return out


def _limit(value: int | None) -> int | None:
    return None if value is None or value < 0 or value >= _UNLIMITED else value


def parse_cpu_max(text: str) -> tuple[int | None, int | None]:
    """v2 cpu.max ("50000 100000", "max 100000") → (quota or None, period)."""
    parts = text.split()
    if len(parts) != 2 or not parts[1].isdigit():
        return None, None
    quota = int(parts[0]) if parts[0].isdigit() else None
    return quota, int(parts[1])


def weight_to_shares(weight: int) -> int:
    """v2 cpu.weight (1..10000) → the v1 cpu.shares (2..262144) it stands for: the
    inverse of the runtime's shares → weight mapping, so a pod's requests read back."""
    return 2 + ((weight - 1) * 262142) // 9999


def parse_blkio_v1(service_bytes: str, serviced: str) -> dict[str, BlkioDevice]:
    """blkio.throttle.io_service_bytes(_recursive) and io_serviced(_recursive) lines
    ("8:0 Read 4096"; a final "Total N" line) → device → BlkioDevice."""
    acc: dict[str, dict[str, int]] = {}
    for text, suffix in ((service_bytes, "bytes"), (serviced, "ops")):
        for line in text.splitlines():
            parts = line.split()
            if len(parts) != 3 or ":" not in parts[0] or not parts[2].isdigit():
                continue
            op = parts[1].lower()
            if op in ("read", "write"):
                acc.setdefault(parts[0], {})[f"{op}_{suffix}"] = int(parts[2])
    return {
        dev: BlkioDevice(
            read_bytes=v.get("read_bytes", 0),
            write_bytes=v.get("write_bytes", 0),
            reads=v.get("read_ops", 0),
            writes=v.get("write_ops", 0),
        )
        for dev, v in acc.items()
    }


def parse_blkio_ops(service_bytes: str) -> dict[str, dict[str, int]]:
    """A v1 blkio file of per-operation lines, as io_service_bytes(_recursive) ("8:0
    Read 4096", the final "Total N" line skipped) → device → operation → value,
    operations named as the file names them."""
    out: dict[str, dict[str, int]] = {}
    for line in service_bytes.splitlines():
        parts = line.split()
        if len(parts) == 3 and ":" in parts[0] and parts[2].isdigit():
            out.setdefault(parts[0], {})[parts[1]] = int(parts[2])
    return out


def lists_devices(text: str) -> bool:
    """Whether a blkio file has a line for a device (not only "Total N")."""
    return any(":" in line.split(maxsplit=1)[0] for line in text.splitlines() if line.strip())


def io_stat_ops(devices: Mapping[str, BlkioDevice]) -> dict[str, dict[str, int]]:
    """v2's bytes per operation: io.stat's rbytes and wbytes as Read and Write."""
    return {dev: {"Read": io.read_bytes, "Write": io.write_bytes} for dev, io in devices.items()}


def parse_io_stat(text: str) -> dict[str, BlkioDevice]:
    """v2 io.stat ("8:0 rbytes=4096 wbytes=0 rios=1 wios=0 dbytes=0 dios=0")."""
    out: dict[str, BlkioDevice] = {}
    for line in text.splitlines():
        dev, *pairs = line.split()
        if ":" not in dev:
            continue
        values: dict[str, int] = {}
        for pair in pairs:
            key, _, value = pair.partition("=")
            if value.isdigit():
                values[key] = int(value)
        out[dev] = BlkioDevice(
            read_bytes=values.get("rbytes", 0),
            write_bytes=values.get("wbytes", 0),
            reads=values.get("rios", 0),
            writes=values.get("wios", 0),
        )
    return out


# -- readers -----------------------------------------------------------------------------


# Paths are strings here: a scrape reads some thousands of these files, and building
# pathlib objects for each cost about as much as the reads.
def _text(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _int(path: str) -> int | None:
    text = _text(path)
    if text is None:
        return None
    word = text.strip().split("\n", 1)[0].strip()
    if word == "max":
        return None
    try:
        return int(word)
    except ValueError:
        return None


def _kv(path: str) -> dict[str, int]:
    return parse_kv(_text(path) or "")


def _minus(a: int | None, b: int | None) -> int | None:
    return None if a is None else max(a - (b or 0), 0)


# runc's v1 blkio groups, in its order (opencontainers/cgroups fs/blkio.go): the first
# whose first file lists a device is read whole.
_BLKIO_GROUPS: tuple[dict[str, str], ...] = (
    {  # BFQ with CONFIG_BFQ_CGROUP_DEBUG
        "sectors": "blkio.bfq.sectors_recursive",
        "service_time": "blkio.bfq.io_service_time_recursive",
        "merged": "blkio.bfq.io_merged_recursive",
        "queued": "blkio.bfq.io_queued_recursive",
        "serviced": "blkio.bfq.io_serviced_recursive",
        "service_bytes": "blkio.bfq.io_service_bytes_recursive",
    },
    {
        "serviced": "blkio.bfq.io_serviced_recursive",
        "service_bytes": "blkio.bfq.io_service_bytes_recursive",
    },
    {  # CFQ
        "sectors": "blkio.sectors_recursive",
        "service_time": "blkio.io_service_time_recursive",
        "merged": "blkio.io_merged_recursive",
        "queued": "blkio.io_queued_recursive",
        "serviced": "blkio.io_serviced_recursive",
        "service_bytes": "blkio.io_service_bytes_recursive",
    },
    {
        "serviced": "blkio.throttle.io_serviced_recursive",
        "service_bytes": "blkio.throttle.io_service_bytes_recursive",
    },
    {"serviced": "blkio.throttle.io_serviced", "service_bytes": "blkio.throttle.io_service_bytes"},
)


def _blkio_v1(directory: str) -> dict[str, str]:
    """The texts of the first blkio group (runc's order) whose first file lists a
    device, by kind; {} when none does."""
    for group in _BLKIO_GROUPS:
        names = iter(group.items())
        first_kind, first_name = next(names)
        first = _text(f"{directory}/{first_name}") or ""
        if not lists_devices(first):
            continue
        return {first_kind: first, **{k: _text(f"{directory}/{n}") or "" for k, n in names}}
    return {}


def read_detail_v1(root: Path, rel: str) -> CgroupDetail:
    """A v1 cgroup `rel` (relative, no leading "/") under the hierarchies at `root`."""
    cpu, acct, mem, pids, blkio = (
        os.path.join(root, c, rel) for c in ("cpu", "cpuacct", "memory", "pids", "blkio")
    )
    cpu_stat = _kv(f"{cpu}/cpu.stat")
    ticks = _kv(f"{acct}/cpuacct.stat")
    stat = _kv(f"{mem}/memory.stat")
    usage = _int(f"{mem}/memory.usage_in_bytes")
    limit = _limit(_int(f"{mem}/memory.limit_in_bytes"))
    memsw = _limit(_int(f"{mem}/memory.memsw.limit_in_bytes"))
    io = _blkio_v1(blkio)
    service_bytes = io.get("service_bytes", "")
    return CgroupDetail(
        cpu_usage_ns=_int(f"{acct}/cpuacct.usage"),
        cpu_user_ns=_ticks_ns(ticks.get("user")),
        cpu_system_ns=_ticks_ns(ticks.get("system")),
        cfs_periods=cpu_stat.get("nr_periods"),
        cfs_throttled_periods=cpu_stat.get("nr_throttled"),
        cfs_throttled_ns=cpu_stat.get("throttled_time"),
        cpu_quota_us=_limit(_int(f"{cpu}/cpu.cfs_quota_us")),
        cpu_period_us=_int(f"{cpu}/cpu.cfs_period_us"),
        cpu_shares=_int(f"{cpu}/cpu.shares"),
        memory_usage=usage,
        memory_working_set=_minus(usage, stat.get("total_inactive_file")),
        memory_rss=stat.get("total_rss"),
        memory_cache=stat.get("total_cache"),
        memory_mapped_file=stat.get("total_mapped_file"),
        memory_swap=stat.get("total_swap"),
        memory_max_usage=_int(f"{mem}/memory.max_usage_in_bytes"),
        memory_limit=limit,
        memory_reservation=_limit(_int(f"{mem}/memory.soft_limit_in_bytes")),
        memory_swap_limit=None if memsw is None or limit is None else max(memsw - limit, 0),
        memory_failcnt=_int(f"{mem}/memory.failcnt"),
        memory_kernel=_int(f"{mem}/memory.kmem.usage_in_bytes"),
        memory_active_file=stat.get("total_active_file"),
        memory_inactive_file=stat.get("total_inactive_file"),
        memory_pgfault=stat.get("pgfault"),
        memory_pgmajfault=stat.get("pgmajfault"),
        oom_kills=_kv(f"{mem}/memory.oom_control").get("oom_kill"),
        blkio=parse_blkio_v1(service_bytes, io.get("serviced", "")),
        blkio_service_bytes=parse_blkio_ops(service_bytes),
        blkio_merged=parse_blkio_ops(io.get("merged", "")),
        blkio_queued=parse_blkio_ops(io.get("queued", "")),
        blkio_service_time=parse_blkio_ops(io.get("service_time", "")),
        threads=_int(f"{pids}/pids.current"),
        threads_max=_int(f"{pids}/pids.max"),
    )


def _ticks_ns(ticks: int | None) -> int | None:
    return None if ticks is None else ticks * 1_000_000_000 // USER_HZ


def _usec_ns(usec: int | None) -> int | None:
    return None if usec is None else usec * 1000


def read_detail_v2(root: Path, rel: str, *, root_usage: int | None = None) -> CgroupDetail:
    """A v2 cgroup `rel` under the unified hierarchy at `root`; `root_usage` stands in
    for memory.current, which the root cgroup lacks."""
    d = os.path.join(root, rel)
    cpu_stat = _kv(f"{d}/cpu.stat")
    stat = _kv(f"{d}/memory.stat")
    usage = _int(f"{d}/memory.current")
    if usage is None:
        usage = root_usage
    quota, period = parse_cpu_max(_text(f"{d}/cpu.max") or "")
    weight = _int(f"{d}/cpu.weight")
    io = parse_io_stat(_text(f"{d}/io.stat") or "")
    return CgroupDetail(
        cpu_usage_ns=_usec_ns(cpu_stat.get("usage_usec")),
        cpu_user_ns=_usec_ns(cpu_stat.get("user_usec")),
        cpu_system_ns=_usec_ns(cpu_stat.get("system_usec")),
        cfs_periods=cpu_stat.get("nr_periods"),
        cfs_throttled_periods=cpu_stat.get("nr_throttled"),
        cfs_throttled_ns=_usec_ns(cpu_stat.get("throttled_usec")),
        cpu_quota_us=quota,
        cpu_period_us=period,
        cpu_shares=None if weight is None else weight_to_shares(weight),
        memory_usage=usage,
        memory_working_set=_minus(usage, stat.get("inactive_file")),
        memory_rss=stat.get("anon"),
        memory_cache=stat.get("file"),
        memory_mapped_file=stat.get("file_mapped"),
        memory_swap=_int(f"{d}/memory.swap.current"),
        memory_max_usage=_int(f"{d}/memory.peak"),
        memory_limit=_limit(_int(f"{d}/memory.max")),
        memory_reservation=_limit(_int(f"{d}/memory.low")),
        memory_swap_limit=_limit(_int(f"{d}/memory.swap.max")),
        memory_active_file=stat.get("active_file"),
        memory_inactive_file=stat.get("inactive_file"),
        memory_pgfault=stat.get("pgfault"),
        memory_pgmajfault=stat.get("pgmajfault"),
        oom_kills=_kv(f"{d}/memory.events").get("oom_kill"),
        blkio=io,
        blkio_service_bytes=io_stat_ops(io),
        threads=_int(f"{d}/pids.current"),
        threads_max=_int(f"{d}/pids.max"),
    )
