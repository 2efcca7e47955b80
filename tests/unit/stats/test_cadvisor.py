"""The pure conversion of a cgroup snapshot into cAdvisor's families
(klet.stats.cadvisor): every series carries the six cAdvisor labels (empty where they
do not apply) plus `cpu`, `device` or `interface`; values in cAdvisor's units (seconds,
bytes); absent readings are left out rather than served as 0, unlimited limits are 0,
the CFS series only appear with a quota; network per interface; machine_* facts;
container_scrape_error follows the runtime, machine_scrape_error the machine facts; the
process figures (fds, sockets, the first process's soft limits) and the root's
filesystem inodes and per-device disk statistics (/proc/diskstats, times in seconds);
block I/O bytes per device and operation; cadvisor_version_info; the text rendering
parses back with each family's TYPE; the /proc parsers (net/dev without
lo/veth, cpuinfo cores and sockets, limits); and containers' image
names taken from the pod view's PodList."""

from __future__ import annotations

import pytest
from klet.cgroups.detail import BlkioDevice, CgroupDetail
from klet.stats.cadvisor import (
    CgroupSeries,
    CgroupSnapshot,
    DiskStats,
    FsInodes,
    MachineFacts,
    NetDev,
    OpenFiles,
    WritableLayer,
    cadvisor_families,
    parse_cpuinfo,
    parse_diskstats,
    parse_limits,
    parse_net_dev,
    parse_swap_total,
    pod_images,
    render,
    with_images,
)
from prometheus_client.parser import text_string_to_metric_families

MACHINE = MachineFacts(
    cpu_cores=4,
    physical_cores=2,
    sockets=1,
    memory_bytes=8 << 30,
    boot_id="b",
    machine_id="m",
    swap_bytes=0,
    kernel_version="6.1.0-18-amd64",
    os_version="Debian GNU/Linux 12 (bookworm)",
)
ROOT = CgroupSeries(
    id="/",
    detail=CgroupDetail(
        cpu_usage_ns=10**10,
        memory_usage=5000,
        # the root cgroup's own count of /dev/vdb wins over the disk's
        blkio={"254:16": BlkioDevice(1, 2, 3, 4)},
    ),
    start_s=100.0,
    inodes={"/dev/vda1": FsInodes(6_000_000, 5_500_000), "/dev/vdb": FsInodes(100, 90)},
    disks={
        "/dev/vda1": DiskStats(46, 2, 115, 305, 45, 43, 366, 63, 1, 17_250, 376),
        "/dev/vdb": DiskStats(7, 0, 8, 9, 10, 0, 11, 12, 0, 13, 14),
    },
    blkio_devices={"254:16": "/dev/vdb"},
)
POD = CgroupSeries(
    id="/kubepods/burstable/podu1",
    pod="web",
    namespace="ns",
    detail=CgroupDetail(cpu_usage_ns=3 * 10**9, memory_working_set=700),
    processes=3,
    open_files=OpenFiles(12, 2),
    network={"eth0": NetDev(100, 2, 0, 1, 200, 4, 0, 0)},
)
CTR = CgroupSeries(
    id="/kubepods/burstable/podu1/abc",
    container="app",
    pod="web",
    namespace="ns",
    image="docker.io/library/busybox:1.36",
    name="abc",
    start_s=123.5,
    processes=1,
    open_files=OpenFiles(5, 1),
    ulimits={"max_open_files": 1024},
    detail=CgroupDetail(
        cpu_usage_ns=2_500_000_000,
        cpu_user_ns=2_000_000_000,
        cfs_periods=10,
        cfs_throttled_periods=1,
        cfs_throttled_ns=500_000_000,
        cpu_quota_us=50000,
        cpu_period_us=100000,
        cpu_shares=512,
        memory_working_set=600,
        memory_rss=400,
        memory_cache=100,
        memory_limit=64 << 20,
        memory_failcnt=5,
        memory_kernel=4096,
        memory_active_file=30,
        memory_inactive_file=20,
        memory_pgfault=90,
        memory_pgmajfault=9,
        blkio={"8:0": BlkioDevice(4096, 8192, 1, 2)},
        blkio_service_bytes={"8:0": {"Read": 4096, "Write": 8192, "Total": 12288}},
        # BFQ's debug files (or CFQ's) count these
        blkio_merged={"8:0": {"Read": 3, "Write": 4}},
        blkio_queued={"8:0": {"Total": 2}},
        blkio_service_time={"8:0": {"Read": 1_500_000_000, "Total": 2_500_000_000}},
    ),
    fs=WritableLayer("/dev/vda1", 4096, 10**9),
    blkio_devices={"8:0": "/dev/sda"},
)
SNAP = CgroupSnapshot(time_ns=1_700_000_000 * 10**9, machine=MACHINE, cgroups=[ROOT, POD, CTR])


def samples(snapshot: CgroupSnapshot) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in cadvisor_families(snapshot):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def key(series: CgroupSeries, **extra: str) -> tuple[tuple[str, str], ...]:
    labels = {
        "container": series.container,
        "id": series.id,
        "image": series.image,
        "name": series.name,
        "namespace": series.namespace,
        "pod": series.pod,
        **extra,
    }
    return tuple(sorted(labels.items()))


S = samples(SNAP)


@pytest.mark.parametrize(
    ("metric", "series", "extra", "value"),
    [
        ("container_cpu_usage_seconds_total", ROOT, {"cpu": "total"}, 10.0),
        ("container_cpu_usage_seconds_total", POD, {"cpu": "total"}, 3.0),
        ("container_cpu_usage_seconds_total", CTR, {"cpu": "total"}, 2.5),
        ("container_cpu_user_seconds_total", CTR, {}, 2.0),
        ("container_cpu_cfs_periods_total", CTR, {}, 10.0),
        ("container_cpu_cfs_throttled_periods_total", CTR, {}, 1.0),
        ("container_cpu_cfs_throttled_seconds_total", CTR, {}, 0.5),
        ("container_spec_cpu_quota", CTR, {}, 50000.0),
        ("container_spec_cpu_period", CTR, {}, 100000.0),
        ("container_spec_cpu_shares", CTR, {}, 512.0),
        ("container_memory_usage_bytes", ROOT, {}, 5000.0),
        ("container_memory_working_set_bytes", POD, {}, 700.0),
        ("container_memory_working_set_bytes", CTR, {}, 600.0),
        ("container_memory_rss", CTR, {}, 400.0),
        ("container_memory_cache", CTR, {}, 100.0),
        ("container_memory_failcnt", CTR, {}, 5.0),
        ("container_memory_total_active_file_bytes", CTR, {}, 30.0),
        ("container_memory_kernel_usage", CTR, {}, 4096.0),
        ("container_memory_total_inactive_file_bytes", CTR, {}, 20.0),
        (
            "container_memory_failures_total",
            CTR,
            {"failure_type": "pgfault", "scope": "container"},
            90.0,
        ),
        (
            "container_memory_failures_total",
            CTR,
            {"failure_type": "pgfault", "scope": "hierarchy"},
            90.0,
        ),
        (
            "container_memory_failures_total",
            CTR,
            {"failure_type": "pgmajfault", "scope": "container"},
            9.0,
        ),
        (
            "container_memory_failures_total",
            CTR,
            {"failure_type": "pgmajfault", "scope": "hierarchy"},
            9.0,
        ),
        ("container_spec_memory_limit_bytes", CTR, {}, float(64 << 20)),
        ("container_spec_memory_limit_bytes", POD, {}, 0.0),  # unlimited
        ("container_fs_reads_bytes_total", CTR, {"device": "/dev/sda"}, 4096.0),
        ("container_fs_writes_bytes_total", CTR, {"device": "/dev/sda"}, 8192.0),
        ("container_fs_reads_total", CTR, {"device": "/dev/sda"}, 1.0),
        ("container_fs_writes_total", CTR, {"device": "/dev/sda"}, 2.0),
        ("container_fs_usage_bytes", CTR, {"device": "/dev/vda1"}, 4096.0),
        ("container_fs_limit_bytes", CTR, {"device": "/dev/vda1"}, 1e9),
        ("container_network_receive_bytes_total", POD, {"interface": "eth0"}, 100.0),
        ("container_network_receive_packets_total", POD, {"interface": "eth0"}, 2.0),
        ("container_network_receive_packets_dropped_total", POD, {"interface": "eth0"}, 1.0),
        ("container_network_receive_errors_total", POD, {"interface": "eth0"}, 0.0),
        ("container_network_transmit_bytes_total", POD, {"interface": "eth0"}, 200.0),
        ("container_network_transmit_packets_total", POD, {"interface": "eth0"}, 4.0),
        ("container_processes", POD, {}, 3.0),
        ("container_file_descriptors", POD, {}, 12.0),
        ("container_file_descriptors", CTR, {}, 5.0),
        ("container_sockets", POD, {}, 2.0),
        ("container_sockets", CTR, {}, 1.0),
        ("container_ulimits_soft", CTR, {"ulimit": "max_open_files"}, 1024.0),
        ("container_fs_inodes_total", ROOT, {"device": "/dev/vda1"}, 6e6),
        ("container_fs_inodes_free", ROOT, {"device": "/dev/vda1"}, 5.5e6),
        ("container_fs_inodes_total", ROOT, {"device": "/dev/vdb"}, 100.0),
        ("container_fs_inodes_free", ROOT, {"device": "/dev/vdb"}, 90.0),
        # the root's filesystems' disks, from /proc/diskstats (times: ms → s)
        ("container_fs_reads_total", ROOT, {"device": "/dev/vda1"}, 46.0),
        ("container_fs_reads_total", ROOT, {"device": "/dev/vdb"}, 3.0),  # the cgroup's
        ("container_fs_writes_total", ROOT, {"device": "/dev/vda1"}, 45.0),
        ("container_fs_reads_merged_total", ROOT, {"device": "/dev/vda1"}, 2.0),
        ("container_fs_sector_reads_total", ROOT, {"device": "/dev/vda1"}, 115.0),
        ("container_fs_read_seconds_total", ROOT, {"device": "/dev/vda1"}, 0.305),
        ("container_fs_writes_merged_total", ROOT, {"device": "/dev/vda1"}, 43.0),
        ("container_fs_sector_writes_total", ROOT, {"device": "/dev/vda1"}, 366.0),
        ("container_fs_write_seconds_total", ROOT, {"device": "/dev/vda1"}, 0.063),
        ("container_fs_io_current", ROOT, {"device": "/dev/vda1"}, 1.0),
        ("container_fs_io_time_seconds_total", ROOT, {"device": "/dev/vda1"}, 17.25),
        ("container_fs_io_time_weighted_seconds_total", ROOT, {"device": "/dev/vda1"}, 0.376),
        ("container_fs_io_current", ROOT, {"device": "/dev/vdb"}, 0.0),
        # a cgroup's, from its BFQ-debug/CFQ blkio files (service time in ns)
        ("container_fs_reads_merged_total", CTR, {"device": "/dev/sda"}, 3.0),
        ("container_fs_writes_merged_total", CTR, {"device": "/dev/sda"}, 4.0),
        ("container_fs_read_seconds_total", CTR, {"device": "/dev/sda"}, 1.5),
        ("container_fs_io_time_seconds_total", CTR, {"device": "/dev/sda"}, 2.5),
        ("container_fs_io_current", CTR, {"device": "/dev/sda"}, 2.0),
        (
            "container_blkio_device_usage_total",
            CTR,
            {"device": "/dev/sda", "major": "8", "minor": "0", "operation": "Read"},
            4096.0,
        ),
        (
            "container_blkio_device_usage_total",
            CTR,
            {"device": "/dev/sda", "major": "8", "minor": "0", "operation": "Total"},
            12288.0,
        ),
        ("container_start_time_seconds", CTR, {}, 123.5),
        ("container_start_time_seconds", ROOT, {}, 100.0),
        ("container_last_seen", CTR, {}, 1_700_000_000.0),
        ("container_last_seen", ROOT, {}, 1_700_000_000.0),
    ],
)
def test_series(metric: str, series: CgroupSeries, extra: dict[str, str], value: float) -> None:
    assert S[metric][key(series, **extra)] == value


@pytest.mark.parametrize(
    ("metric", "series"),
    [
        # no quota: no CFS series, no period (as cAdvisor)
        ("container_cpu_cfs_periods_total", POD),
        ("container_spec_cpu_period", POD),
        ("container_spec_cpu_quota", ROOT),
        # readings the cgroup did not give are absent, not 0
        ("container_memory_rss", ROOT),
        ("container_cpu_user_seconds_total", POD),
        ("container_processes", ROOT),
        ("container_start_time_seconds", POD),
        ("container_memory_failcnt", POD),  # no memory.failcnt read (cgroup v2)
        ("container_memory_total_active_file_bytes", POD),  # not read: absent, not 0
        ("container_memory_kernel_usage", POD),  # no kmem file (cgroup v2)
        ("container_file_descriptors", ROOT),  # processes not read there
        ("container_sockets", ROOT),
    ],
)
def test_absent(metric: str, series: CgroupSeries) -> None:
    assert key(series) not in S.get(metric, {})


def test_network_and_fs_only_where_read() -> None:
    # the sectors and weighted time are the root's filesystems' alone; one series a device
    for name in ("container_fs_sector_writes_total", "container_fs_io_time_weighted_seconds_total"):
        assert sorted(dict(k)["device"] for k in S[name]) == ["/dev/vda1", "/dev/vdb"]
        assert {dict(k)["id"] for k in S[name]} == {ROOT.id}
    # a cgroup's only for an operation its files name: no write time, nothing queued by op
    assert {dict(k)["id"] for k in S["container_fs_write_seconds_total"]} == {ROOT.id}
    assert {dict(k)["id"] for k in S["container_fs_io_current"]} == {ROOT.id, CTR.id}
    assert sorted((dict(k)["id"], dict(k)["device"]) for k in S["container_fs_reads_total"]) == [
        ("/", "/dev/vda1"), ("/", "/dev/vdb"), (CTR.id, "/dev/sda"),
    ]  # fmt: skip
    # bytes by operation where the cgroup gave them: three operations of one device
    assert [dict(k)["operation"] for k in S["container_blkio_device_usage_total"]] == [
        "Read", "Total", "Write"
    ]  # fmt: skip
    assert {dict(k)["id"] for k in S["container_network_receive_bytes_total"]} == {POD.id}
    assert {dict(k)["id"] for k in S["container_fs_usage_bytes"]} == {CTR.id}
    assert {dict(k)["id"] for k in S["container_fs_inodes_free"]} == {ROOT.id}
    # the soft limits of a container's first process: none on pod or node cgroups
    assert {dict(k)["id"] for k in S["container_ulimits_soft"]} == {CTR.id}


def test_version_info_names_kernel_and_os() -> None:
    want = {
        "cadvisorRevision": "",  # upstream's kubelet build stamps none either
        "cadvisorVersion": "",
        "dockerVersion": "",
        "kernelVersion": "6.1.0-18-amd64",
        "osVersion": "Debian GNU/Linux 12 (bookworm)",
    }
    assert S["cadvisor_version_info"] == {tuple(sorted(want.items())): 1.0}
    # served when the machine facts failed too: it is the container collector's
    broken = MachineFacts(4, 2, 1, None, kernel_version="6.1", error="no MemTotal")
    got = samples(CgroupSnapshot(time_ns=0, machine=broken))
    assert [dict(k)["kernelVersion"] for k in got["cadvisor_version_info"]] == ["6.1"]


def test_parse_diskstats() -> None:
    text = (
        " 254       0 vda 46 2 115 305 45 43 366 63 1 17 376 0 0 0 0 0 0\n"
        " 254       1 vda1 1 2 3 4 5 6 7 8 9 10 11\n"  # a 4.18 kernel's eleven counters
        "   7       0 loop0 0 0 0\n"  # too short
        "   x       0 sdz 1 2 3 4 5 6 7 8 9 10 11\n"
    )
    assert parse_diskstats(text) == {
        "254:0": DiskStats(46, 2, 115, 305, 45, 43, 366, 63, 1, 17, 376),
        "254:1": DiskStats(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11),
    }


def test_machine_and_scrape_error() -> None:
    machine = (("boot_id", "b"), ("machine_id", "m"), ("system_uuid", ""))
    assert S["machine_cpu_cores"] == {machine: 4.0}
    assert S["machine_cpu_physical_cores"] == {machine: 2.0}
    assert S["machine_memory_bytes"] == {machine: float(8 << 30)}
    assert S["machine_swap_bytes"] == {machine: 0.0}  # no swap: 0, served
    assert S["container_scrape_error"] == {(): 0.0}
    failed = CgroupSnapshot(time_ns=0, machine=MachineFacts(2, None, None, None), runtime_error="x")
    got = samples(failed)
    assert got["container_scrape_error"] == {(): 1.0}
    assert "machine_cpu_physical_cores" not in got and "machine_cpu_cores" in got
    assert "machine_swap_bytes" not in got  # SwapTotal not read
    assert S["machine_scrape_error"] == {(): 0.0} == got["machine_scrape_error"]


def test_machine_facts_unread_are_a_machine_scrape_error() -> None:
    broken = MachineFacts(4, 2, 1, None, error="no MemTotal in /proc/meminfo")
    got = samples(CgroupSnapshot(time_ns=0, machine=broken, cgroups=[ROOT]))
    assert got["machine_scrape_error"] == {(): 1.0}
    assert not [name for name in got if name.startswith("machine_") and "error" not in name]
    assert got["container_scrape_error"] == {(): 0.0}  # the containers' pass is apart


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (
            "Limit                     Soft Limit           Hard Limit           Units\n"
            "Max cpu time              unlimited            unlimited            seconds\n"
            "Max open files            1048576              1048576              files\n",
            {"max_open_files": 1048576},
        ),
        ("Max open files            unlimited            unlimited            files\n",
         {"max_open_files": -1}),
        ("Max open files            many                 4                    files\n", {}),
        ("Max open files            4\n", {}),
        ("", {}),
    ],
)  # fmt: skip
def test_parse_limits(text: str, want: dict[str, int]) -> None:
    assert parse_limits(text) == want


def test_parse_swap_total() -> None:
    assert parse_swap_total("MemTotal: 1 kB\nSwapTotal:     4096 kB\n") == 4096 * 1024
    assert parse_swap_total("SwapTotal:        0 kB\n") == 0
    assert parse_swap_total("MemTotal: 1 kB\n") is None


def test_render_parses_back_with_types() -> None:
    text = render(SNAP).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["container_cpu_usage_seconds"].type == "counter"
    assert families["container_memory_working_set_bytes"].type == "gauge"
    for name in (
        "container_fs_io_time_seconds",
        "container_fs_sector_reads",
        "container_blkio_device_usage",
        "container_fs_write_seconds",
    ):
        assert families[name].type == "counter"
    assert families["container_fs_io_current"].type == "gauge"
    assert families["cadvisor_version_info"].type == "gauge"
    # cAdvisor's counter without _total keeps its name, untyped
    assert families["container_memory_failcnt"].type == "unknown"
    assert "container_memory_failcnt{" in text and "container_memory_failcnt_total" not in text
    assert "container_cpu_usage_seconds_total{" in text
    assert "_created" not in text
    # no timestamps: every value is read at the scrape
    for f in families.values():
        assert all(s.timestamp is None for s in f.samples)


NET_DEV = """\
Inter-|   Receive                                                |  Transmit
 face |bytes packets errs drop fifo frame compressed multicast|bytes packets errs drop ...
    lo:     500       5    0    0    0     0    0    0     500       5    0    0    0    0    0    0
  eth0: 1000 10 1 2 0 0 0 0 2000 20 3 4 0 0 0 0
vethab12:  9 9 9 9 0 0 0 0 9 9 9 9 0 0 0 0
docker0:  9 9 9 9 0 0 0 0 9 9 9 9 0 0 0 0
  tunl0: 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0
"""


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (
            NET_DEV,
            {
                "eth0": NetDev(1000, 10, 1, 2, 2000, 20, 3, 4),
                "tunl0": NetDev(0, 0, 0, 0, 0, 0, 0, 0),
            },
        ),
        ("", {}),
        ("h1\nh2\n  eth0: 1 2 3\n", {}),
    ],
)
def test_parse_net_dev(text: str, want: dict[str, NetDev]) -> None:
    assert parse_net_dev(text) == want


CPUINFO_2x2 = "".join(
    f"processor\t: {i}\nphysical id\t: {i // 2}\ncore id\t\t: {i % 2}\n\n" for i in range(4)
)
CPUINFO_HT = "".join(
    f"processor\t: {i}\nphysical id\t: 0\ncore id\t\t: {i % 2}\n\n" for i in range(4)
)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (CPUINFO_2x2, (4, 2)),
        (CPUINFO_HT, (2, 1)),  # two threads per core
        ("processor\t: 0\nBogoMIPS\t: 50\n", (None, None)),  # arm64 names neither
    ],
)
def test_parse_cpuinfo(text: str, want: tuple[int | None, int | None]) -> None:
    assert parse_cpuinfo(text) == want


PODS = {
    "kind": "PodList",
    "items": [
        {
            "metadata": {"name": "web", "namespace": "ns"},
            "spec": {
                "initContainers": [{"name": "init", "image": "busybox"}],
                "containers": [
                    {"name": "app", "image": "busybox:1.36"},
                    {"name": "side", "image": "nginx"},
                ],
            },
            "status": {
                "containerStatuses": [
                    {"name": "app", "image": "docker.io/library/busybox:1.36"},
                    {"name": "side"},  # no image reported yet: the spec's
                ]
            },
        },
        {"metadata": {"name": "bare"}},
    ],
}


def test_pod_images() -> None:
    assert pod_images(PODS) == {
        ("ns", "web", "init"): "busybox",
        ("ns", "web", "app"): "docker.io/library/busybox:1.36",
        ("ns", "web", "side"): "nginx",
    }
    assert pod_images({}) == {}


def test_with_images_names_containers_only() -> None:
    runtime_id = CgroupSeries(
        id="/x/c", detail=CgroupDetail(), container="app", pod="web", namespace="ns",
        image="sha256:abc",
    )  # fmt: skip
    other = CgroupSeries(id="/y/c", detail=CgroupDetail(), container="app", pod="db", image="i")
    snap = CgroupSnapshot(time_ns=0, machine=MACHINE, cgroups=[ROOT, POD, runtime_id, other])
    got = with_images(snap, pod_images(PODS))
    assert [c.image for c in got.cgroups] == ["", "", "docker.io/library/busybox:1.36", "i"]
