"""The long cgroup readings behind /metrics/cadvisor (klet.cgroups.detail) on v1 and v2
trees laid out under tmp_path: which file feeds which value and in which unit, "max",
-1 and v1's page-rounded 2^63 read as no limit, a missing controller gives None and
leaves the rest; the bytes per block I/O operation (v1: every operation the file names;
v2: io.stat's rbytes and wbytes as Read and Write); which v1 blkio files are read (runc's
order: BFQ debug, BFQ, CFQ, throttle recursive, throttle; the first that lists a device),
with merged, queued and service time only from BFQ debug or CFQ; the pure parsers (cpu.max,
cpu.weight → shares, blkio, io.stat) over a table of inputs; the child cgroups and the
processes of a cgroup tree."""

from __future__ import annotations

from pathlib import Path

import pytest
from klet.cgroups import CgroupFS
from klet.cgroups.detail import USER_HZ as HZ
from klet.cgroups.detail import (
    BlkioDevice,
    CgroupDetail,
    parse_blkio_ops,
    parse_blkio_v1,
    parse_cpu_max,
    parse_io_stat,
    parse_kv,
    weight_to_shares,
)

POD = "kubepods/burstable/podu1"
CTR = f"{POD}/c0ffee"


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def v1_tree(root: Path) -> None:
    write(root / "cpuacct" / CTR / "cpuacct.usage", "2500000000\n")
    write(root / "cpuacct" / CTR / "cpuacct.stat", f"user {3 * HZ}\nsystem {HZ}\n")
    write(root / "cpu" / CTR / "cpu.stat", "nr_periods 40\nnr_throttled 4\nthrottled_time 9000\n")
    write(root / "cpu" / CTR / "cpu.cfs_quota_us", "50000\n")
    write(root / "cpu" / CTR / "cpu.cfs_period_us", "100000\n")
    write(root / "cpu" / CTR / "cpu.shares", "512\n")
    mem = root / "memory" / CTR
    write(mem / "memory.usage_in_bytes", "10000\n")
    write(
        mem / "memory.stat",
        "cache 1\nrss 2\ntotal_cache 3000\ntotal_rss 5000\ntotal_mapped_file 700\n"
        "total_swap 11\ntotal_inactive_file 2000\ntotal_active_file 900\n"
        "pgfault 40\npgmajfault 4\ntotal_pgfault 90\n",
    )
    write(mem / "memory.max_usage_in_bytes", "12000\n")
    write(mem / "memory.failcnt", "3\n")
    write(mem / "memory.kmem.usage_in_bytes", "8192\n")
    write(mem / "memory.limit_in_bytes", "67108864\n")
    write(mem / "memory.soft_limit_in_bytes", "9223372036854771712\n")
    write(mem / "memory.memsw.limit_in_bytes", "134217728\n")
    write(mem / "memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    write(
        root / "blkio" / CTR / "blkio.throttle.io_service_bytes_recursive",
        "8:0 Read 4096\n8:0 Write 8192\n8:0 Sync 1\n8:0 Total 12288\nTotal 12288\n",
    )
    write(
        root / "blkio" / CTR / "blkio.throttle.io_serviced_recursive",
        "8:0 Read 1\n8:0 Write 2\nTotal 3\n",
    )
    write(root / "pids" / CTR / "pids.current", "7\n")
    write(root / "pids" / CTR / "pids.max", "max\n")


def test_v1_detail(tmp_path: Path) -> None:
    v1_tree(tmp_path)
    d = CgroupFS(tmp_path).detail("/" + CTR)
    assert d == CgroupDetail(
        cpu_usage_ns=2_500_000_000,
        cpu_user_ns=3_000_000_000,
        cpu_system_ns=1_000_000_000,
        cfs_periods=40,
        cfs_throttled_periods=4,
        cfs_throttled_ns=9000,
        cpu_quota_us=50000,
        cpu_period_us=100000,
        cpu_shares=512,
        memory_usage=10000,
        memory_working_set=8000,
        memory_rss=5000,
        memory_cache=3000,
        memory_mapped_file=700,
        memory_swap=11,
        memory_max_usage=12000,
        memory_limit=64 << 20,
        memory_reservation=None,  # 2^63 rounded to a page: none
        memory_swap_limit=64 << 20,  # memsw limit less the memory limit
        memory_failcnt=3,
        memory_kernel=8192,
        memory_active_file=900,
        memory_inactive_file=2000,
        memory_pgfault=40,  # the cgroup's own, as cAdvisor (not total_pgfault)
        memory_pgmajfault=4,
        oom_kills=2,
        blkio={"8:0": BlkioDevice(4096, 8192, 1, 2)},
        blkio_service_bytes={"8:0": {"Read": 4096, "Write": 8192, "Sync": 1, "Total": 12288}},
        threads=7,
        threads_max=None,
    )


def blkio_files(directory: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        write(directory / name, text)


THROTTLE = {
    "blkio.throttle.io_service_bytes_recursive": "8:0 Read 1\nTotal 1\n",
    "blkio.throttle.io_serviced_recursive": "8:0 Read 1\nTotal 1\n",
}
BFQ = {  # a device BFQ schedules: its counts, where the throttle files have none
    "blkio.bfq.io_service_bytes_recursive": "8:16 Read 4096\n8:16 Write 512\nTotal 4608\n",
    "blkio.bfq.io_serviced_recursive": "8:16 Read 2\n8:16 Write 1\nTotal 3\n",
    "blkio.throttle.io_service_bytes_recursive": "Total 0\n",
    "blkio.throttle.io_serviced_recursive": "Total 0\n",
}
DEBUG = {  # BFQ with CONFIG_BFQ_CGROUP_DEBUG: CFQ's set of files under blkio.bfq.
    **BFQ,
    "blkio.bfq.sectors_recursive": "8:16 9\nTotal 9\n",
    "blkio.bfq.io_merged_recursive": "8:16 Read 3\n8:16 Write 4\n8:16 Total 7\n",
    "blkio.bfq.io_queued_recursive": "8:16 Read 0\n8:16 Write 2\n8:16 Total 2\n",
    "blkio.bfq.io_service_time_recursive": "8:16 Read 1500\n8:16 Total 2500\n",
}
CFQ = {
    "blkio.sectors_recursive": "8:32 9\n",
    "blkio.io_service_bytes_recursive": "8:32 Read 10\n",
    "blkio.io_serviced_recursive": "8:32 Read 1\n",
    "blkio.io_merged_recursive": "8:32 Write 5\n",
    "blkio.io_queued_recursive": "8:32 Total 1\n",
    "blkio.io_service_time_recursive": "8:32 Write 70\n",
}


@pytest.mark.parametrize(
    ("files", "blkio", "merged", "queued", "service_time"),
    [
        (THROTTLE, {"8:0": BlkioDevice(1, 0, 1, 0)}, {}, {}, {}),
        (  # before 4.x kernels: the throttle files without _recursive
            {"blkio.throttle.io_service_bytes": "8:0 Write 3\n",
             "blkio.throttle.io_serviced": "8:0 Write 1\n"},
            {"8:0": BlkioDevice(0, 3, 0, 1)}, {}, {}, {},
        ),
        (BFQ, {"8:16": BlkioDevice(4096, 512, 2, 1)}, {}, {}, {}),
        (
            DEBUG,
            {"8:16": BlkioDevice(4096, 512, 2, 1)},
            {"8:16": {"Read": 3, "Write": 4, "Total": 7}},
            {"8:16": {"Read": 0, "Write": 2, "Total": 2}},
            {"8:16": {"Read": 1500, "Total": 2500}},
        ),
        (
            {**THROTTLE, **CFQ},
            {"8:32": BlkioDevice(10, 0, 1, 0)},
            {"8:32": {"Write": 5}}, {"8:32": {"Total": 1}}, {"8:32": {"Write": 70}},
        ),
        ({"blkio.bfq.io_serviced_recursive": "Total 0\n"}, {}, {}, {}, {}),  # none lists one
    ],
)  # fmt: skip
def test_v1_blkio_groups_in_runcs_order(
    tmp_path: Path,
    files: dict[str, str],
    blkio: dict[str, BlkioDevice],
    merged: dict[str, dict[str, int]],
    queued: dict[str, dict[str, int]],
    service_time: dict[str, dict[str, int]],
) -> None:
    blkio_files(tmp_path / "blkio" / CTR, files)
    d = CgroupFS(tmp_path).detail(CTR)
    assert (d.blkio, d.blkio_merged, d.blkio_queued) == (blkio, merged, queued)
    assert d.blkio_service_time == service_time
    assert set(d.blkio_service_bytes) == set(blkio)


def test_v1_without_quota_or_controllers(tmp_path: Path) -> None:
    write(tmp_path / "cpu" / POD / "cpu.cfs_quota_us", "-1\n")
    write(tmp_path / "memory" / POD / "memory.usage_in_bytes", "100\n")
    write(tmp_path / "memory" / POD / "memory.limit_in_bytes", "9223372036854771712\n")
    d = CgroupFS(tmp_path).detail(POD)
    assert d.cpu_quota_us is None and d.memory_limit is None
    assert d.memory_usage == 100 and d.memory_working_set == 100
    # no cpuacct, blkio or pids hierarchy: those readings are absent, not zero
    assert (d.cpu_usage_ns, d.threads, d.blkio, d.oom_kills) == (None, None, {}, None)


def v2_tree(root: Path) -> None:
    write(root / "cgroup.controllers", "cpu io memory pids\n")
    d = root / CTR
    write(
        d / "cpu.stat",
        "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n"
        "nr_periods 40\nnr_throttled 4\nthrottled_usec 9\n",
    )
    write(d / "cpu.max", "max 100000\n")
    write(d / "cpu.weight", "100\n")
    write(d / "memory.current", "10000\n")
    write(
        d / "memory.stat",
        "anon 5000\nfile 3000\nfile_mapped 700\ninactive_file 2500\nactive_file 400\n"
        "pgfault 70\npgmajfault 7\n",
    )
    write(d / "memory.swap.current", "0\n")
    write(d / "memory.peak", "15000\n")
    write(d / "memory.max", "max\n")
    write(d / "memory.low", "0\n")
    write(d / "memory.swap.max", "max\n")
    write(d / "memory.events", "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    write(d / "io.stat", "8:0 rbytes=4096 wbytes=8192 rios=1 wios=2 dbytes=0 dios=0\n")
    write(d / "pids.current", "3\n")
    write(d / "pids.max", "1024\n")
    write(d / "cgroup.procs", "42\n43\n")


def test_v2_detail(tmp_path: Path) -> None:
    v2_tree(tmp_path)
    d = CgroupFS(tmp_path).detail(CTR)
    assert d == CgroupDetail(
        cpu_usage_ns=2_500_000_000,
        cpu_user_ns=2_000_000_000,
        cpu_system_ns=500_000_000,
        cfs_periods=40,
        cfs_throttled_periods=4,
        cfs_throttled_ns=9000,
        cpu_quota_us=None,
        cpu_period_us=100000,
        cpu_shares=weight_to_shares(100),
        memory_usage=10000,
        memory_working_set=7500,
        memory_rss=5000,
        memory_cache=3000,
        memory_mapped_file=700,
        memory_swap=0,
        memory_max_usage=15000,
        memory_limit=None,
        memory_reservation=0,
        memory_swap_limit=None,
        memory_active_file=400,
        memory_inactive_file=2500,
        memory_pgfault=70,
        memory_pgmajfault=7,
        oom_kills=1,
        blkio={"8:0": BlkioDevice(4096, 8192, 1, 2)},
        blkio_service_bytes={"8:0": {"Read": 4096, "Write": 8192}},
        threads=3,
        threads_max=1024,
    )


def test_v2_root_memory_from_meminfo(tmp_path: Path) -> None:
    root, proc = tmp_path / "cg", tmp_path / "proc"
    write(root / "cgroup.controllers", "cpu memory\n")
    write(root / "memory.stat", "inactive_file 1024\n")
    write(proc / "meminfo", "MemTotal: 8 kB\nMemFree: 2 kB\n")
    d = CgroupFS(root, proc=proc).detail("/")
    assert (d.memory_usage, d.memory_working_set) == (6144, 5120)


def test_children_and_procs(tmp_path: Path) -> None:
    v2_tree(tmp_path)
    write(tmp_path / POD / "sandbox1" / "cgroup.procs", "7\n")
    write(tmp_path / POD / "cgroup.procs", "")
    fs = CgroupFS(tmp_path)
    assert fs.children(POD) == ["c0ffee", "sandbox1"]
    assert sorted(fs.procs(POD)) == [7, 42, 43]
    assert fs.procs(CTR) == [42, 43]
    assert fs.children("kubepods/none") == [] and fs.procs("kubepods/none") == []
    # v1: the memory hierarchy's tree
    v1 = tmp_path / "v1"
    write(v1 / "memory" / CTR / "cgroup.procs", "9\n")
    assert CgroupFS(v1).children(POD) == ["c0ffee"] and CgroupFS(v1).procs(POD) == [9]


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("50000 100000", (50000, 100000)),
        ("max 100000", (None, 100000)),
        ("max", (None, None)),
        ("", (None, None)),
    ],
)
def test_parse_cpu_max(text: str, want: tuple[int | None, int | None]) -> None:
    assert parse_cpu_max(text) == want


@pytest.mark.parametrize(("weight", "shares"), [(1, 2), (10000, 262144), (39, 998)])
def test_weight_to_shares(weight: int, shares: int) -> None:
    # The runtime writes weight = 1 + (shares - 2) * 9999 / 262142; this reads it back.
    assert weight_to_shares(weight) == shares


@pytest.mark.parametrize(
    ("service_bytes", "serviced", "want"),
    [
        ("", "", {}),
        (
            "8:0 Read 10\n8:0 Write 20\n8:16 Read 5\nTotal 35\n",
            "8:0 Read 1\n8:0 Write 2\n8:16 Async 9\n",
            {"8:0": BlkioDevice(10, 20, 1, 2), "8:16": BlkioDevice(5, 0, 0, 0)},
        ),
        ("garbage\n8:0 Read x\n", "", {}),
    ],
)
def test_parse_blkio_v1(service_bytes: str, serviced: str, want: dict[str, BlkioDevice]) -> None:
    assert parse_blkio_v1(service_bytes, serviced) == want


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("", {}),
        ("Total 0\n", {}),
        (
            "8:0 Read 10\n8:0 Write 20\n8:0 Discard 0\n8:16 Async 5\n8:16 Total 5\nTotal 35\n",
            {"8:0": {"Read": 10, "Write": 20, "Discard": 0}, "8:16": {"Async": 5, "Total": 5}},
        ),
        ("garbage\n8:0 Read x\n8:0 Read\n", {}),
    ],
)
def test_parse_blkio_ops(text: str, want: dict[str, dict[str, int]]) -> None:
    assert parse_blkio_ops(text) == want


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("", {}),
        ("8:0 rbytes=1 wbytes=2 rios=3 wios=4\n", {"8:0": BlkioDevice(1, 2, 3, 4)}),
        ("253:1 rbytes=7 dbytes=9\n", {"253:1": BlkioDevice(7, 0, 0, 0)}),
    ],
)
def test_parse_io_stat(text: str, want: dict[str, BlkioDevice]) -> None:
    assert parse_io_stat(text) == want


def test_parse_kv_skips_non_numbers() -> None:
    assert parse_kv("a 1\nb x\nc\n d 2\n") == {"a": 1}
