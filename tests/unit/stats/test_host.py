"""The host half of the stats provider on tmp_path trees: `du`-style directory usage,
statfs of missing paths, of host paths seen only under the host's root (a klet in a
pod), /proc readings, pod cgroup lookup by QoS class (a pod's cgroup found in use is
not probed for again while it stays in use: issue 42), the task-count fallback without
a pids controller, disk-backed emptyDirs, the open files and sockets of a cgroup's
processes and a process's soft limits (cAdvisor's process stats), and the machine facts'
error (machine_scrape_error)."""

from __future__ import annotations

import os
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from klet.cgroups import CgroupFS, CgroupStats
from klet.stats.host import HostReader, dir_usage, host_view, statfs
from klet.stats.model import DirUsage
from klet.testbed.fakes.stats import FakeCgroups


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_dir_usage_counts_allocated_blocks_and_hard_links_once(tmp_path: Path) -> None:
    d = tmp_path / "vol"
    (d / "sub").mkdir(parents=True)
    (d / "sub" / "data").write_bytes(b"x" * 100_000)
    os.link(d / "sub" / "data", d / "again")
    (d / "link").symlink_to("/etc")
    size, inodes, complete = dir_usage(d)
    assert complete
    assert inodes == 4  # vol, sub, data (= again), link
    assert size >= 100_000
    assert size < 200_000  # the hard link is not counted twice
    assert dir_usage(tmp_path / "missing") == (0, 0, True)


def test_dir_usage_that_could_not_read_everything_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = tmp_path / "vol"
    (d / "private").mkdir(parents=True)
    (d / "gone").write_bytes(b"x")
    (d / "kept").write_bytes(b"x")
    real_lstat, real_scandir = os.lstat, os.scandir

    def lstat(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        if str(path).endswith("gone"):
            raise FileNotFoundError(path)  # removed during the walk: not a gap
        return real_lstat(path, *args, **kwargs)

    monkeypatch.setattr(os, "lstat", lstat)
    counted = dir_usage(d)
    assert (counted.inodes, counted.complete) == (3, True)  # vol, private, kept

    def scandir(path: Any = ".") -> Any:
        if str(path).endswith("private"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    assert not dir_usage(d).complete  # a directory it may not list: a lower bound


def test_statfs_reads_the_nearest_existing_parent(tmp_path: Path) -> None:
    here = statfs(tmp_path / "not" / "yet")
    st = os.statvfs(tmp_path)
    assert here is not None
    assert (here.blocks, here.frsize, here.files) == (st.f_blocks, st.f_frsize, st.f_files)
    assert here.device == os.stat(tmp_path).st_dev


def test_a_host_path_missing_here_is_read_under_the_host_root(host_root: Path) -> None:
    # What CRI ImageFsInfo names: a path on the host that the klet's pod does not mount.
    missing = Path("/var/lib") / f"containerd-{uuid.uuid4().hex}" / "overlayfs"
    assert not missing.exists()
    (host_root / missing.relative_to("/")).mkdir(parents=True)
    seen = host_root / missing.relative_to("/")
    assert host_view(missing, host_root=host_root) == seen
    fs = statfs(missing, host_root=host_root)
    assert fs is not None
    assert fs.device == os.stat(host_root).st_dev != os.stat("/var/lib").st_dev
    assert fs.blocks == os.statvfs(host_root).f_blocks


def test_a_path_seen_here_is_not_looked_up_on_the_host(tmp_path: Path, host_root: Path) -> None:
    (host_root / tmp_path.relative_to("/")).mkdir(parents=True)
    assert host_view(tmp_path, host_root=host_root) == tmp_path
    fs = statfs(tmp_path, host_root=host_root)
    assert fs is not None and fs.device == os.stat(tmp_path).st_dev


def test_a_path_missing_on_both_sides_reads_the_nearest_parent(
    tmp_path: Path, host_root: Path
) -> None:
    fs = statfs(tmp_path / "not" / "yet", host_root=host_root)
    assert fs is not None and fs.device == os.stat(tmp_path).st_dev


@pytest.fixture
def reader(tmp_path: Path) -> HostReader:
    proc = tmp_path / "proc"
    write(proc / "meminfo", "MemTotal:  2097152 kB\nMemFree:  1000 kB\n")
    write(proc / "stat", "cpu 1 2 3\nbtime 1700000000\n")
    write(proc / "sys/kernel/pid_max", "4096\n")
    write(proc / "loadavg", "0.5 0.5 0.5 3/400 999\n")
    return HostReader(
        cgroups=FakeCgroups(),
        root_dir=tmp_path / "root",
        cgroup_root="/",
        pod_logs_dir=tmp_path / "logs",
        proc=proc,
    )


def test_proc_readings(reader: HostReader) -> None:
    assert reader.swap() is None  # the meminfo names no swap
    write(reader.proc / "meminfo", "MemTotal: 4 kB\nSwapTotal:  2048 kB\nSwapFree:  512 kB\n")
    swap = reader.swap()
    assert swap == (2048 * 1024, 512 * 1024) and swap is not None and swap.used == 1536 * 1024
    write(reader.proc / "meminfo", "MemTotal:  2097152 kB\nMemFree:  1000 kB\n")
    assert reader.memory_total() == 2 * 2**30
    assert reader.boot_ns() == 1_700_000_000 * 10**9
    assert (reader.pid_max(), reader.tasks()) == (4096, 400)


def test_missing_proc_files_read_as_unknown(tmp_path: Path) -> None:
    empty = HostReader(
        cgroups=FakeCgroups(),
        root_dir=tmp_path,
        cgroup_root="/",
        pod_logs_dir=tmp_path,
        proc=tmp_path / "none",
    )
    assert (empty.memory_total(), empty.boot_ns(), empty.pid_max(), empty.tasks()) == (
        None,
        None,
        None,
        None,
    )


def test_open_files_count_fds_and_sockets_of_readable_processes(reader: HostReader) -> None:
    fd = reader.proc / "7" / "fd"
    fd.mkdir(parents=True)
    for name, target in (("0", "/dev/null"), ("1", "socket:[1234]"), ("2", "socket:[99]"),
                         ("3", "pipe:[5]"), ("4", "anon_inode:[eventfd]")):  # fmt: skip
        (fd / name).symlink_to(target)
    fd8 = reader.proc / "8" / "fd"
    fd8.mkdir(parents=True)
    (fd8 / "0").symlink_to("socket:[7]")
    # pid 9 has no fd directory (gone, or not readable): skipped, as cAdvisor does
    assert reader.open_files([7, 8, 9]) == (6, 3)
    assert reader.open_files([9]) is None  # nothing read: absent, not 0
    assert reader.open_files([]) == (0, 0)  # no processes: none open


def test_ulimits_of_a_process(reader: HostReader) -> None:
    write(
        reader.proc / "7/limits",
        "Limit                     Soft Limit           Hard Limit           Units     \n"
        "Max processes             63536                63536                processes \n"
        "Max open files            1024                 524288               files     \n",
    )
    assert reader.ulimits(7) == {"max_open_files": 1024}
    assert reader.ulimits(8) == {}


def test_disk_stats_by_device_numbers(reader: HostReader) -> None:
    assert reader.disk_stats() == {}  # no /proc/diskstats: none
    write(
        reader.proc / "diskstats",
        " 254       0 vda 46 2 115 305 45 43 366 63 1 17 376 0 0 0 0 0 0\n"
        "   7       0 loop0 0 0 0 0\n",
    )
    assert reader.disk_stats() == {"254:0": (46, 2, 115, 305, 45, 43, 366, 63, 1, 17, 376)}


def test_machine_facts_and_their_error(reader: HostReader) -> None:
    write(reader.proc / "cpuinfo", "processor\t: 0\nphysical id\t: 0\ncore id\t: 0\n\n")
    facts = reader.machine()
    assert (facts.error, facts.memory_bytes, facts.physical_cores) == (None, 2 * 2**30, 1)
    # cadvisor_version_info's kernel and OS: uname's release, os-release's PRETTY_NAME
    assert facts.kernel_version == os.uname().release and facts.os_version
    (reader.proc / "cpuinfo").unlink()
    assert "cpuinfo" in (reader.machine().error or "")
    write(reader.proc / "cpuinfo", "processor\t: 0\n")  # arm64: no cores named, no error
    (reader.proc / "meminfo").write_text("MemFree: 1 kB\n")
    assert "MemTotal" in (reader.machine().error or "")


@pytest.mark.parametrize(
    "path", ["/kubepods/podU", "/kubepods/burstable/podU", "/kubepods/besteffort/podU"]
)
def test_pod_cgroup_under_each_qos_class(reader: HostReader, path: str) -> None:
    assert isinstance(reader.cgroups, FakeCgroups)
    reader.cgroups.groups[path] = CgroupStats(1, 1, 1, 1)
    assert reader.pod_cgroup("U") == path
    assert reader.pod_cgroup("V") is None


@pytest.mark.parametrize(
    ("pid1_cgroup", "path"),
    [
        # systemd as the host's PID 1: its slices at the root
        (
            "0::/init.scope\n",
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podU_1.slice",
        ),
        ("0::/init.scope\n", "/kubepods.slice/kubepods-podU_1.slice"),
        # systemd in a container sharing the host's cgroup view: under its own subtree
        (
            "9:name=systemd:/docker/abc/init.scope\n0::/docker/abc/init.scope\n",
            "/docker/abc/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podU_1.slice",
        ),
    ],
)
def test_pod_cgroup_as_a_systemd_slice(reader: HostReader, pid1_cgroup: str, path: str) -> None:
    assert isinstance(reader.cgroups, FakeCgroups)
    write(reader.proc / "1/cgroup", pid1_cgroup)
    reader.cgroups.groups[path] = CgroupStats(1, 1, 1, 1)
    kubepods = path[: path.index("/kubepods.slice") + len("/kubepods.slice")]
    reader.cgroups.groups[kubepods] = CgroupStats(7, 6, 5, 4)
    # what runc leaves at the root of the hierarchies systemd does not manage
    reader.cgroups.groups[path[path.index("/kubepods.slice") :]] = CgroupStats(
        None, None, None, None
    )
    assert reader.pod_cgroup("U-1") == path
    assert reader.pod_cgroup("V") is None
    assert reader.kubepods() == CgroupStats(7, 6, 5, 4)


def test_node_cgroups_in_either_form(reader: HostReader) -> None:
    assert isinstance(reader.cgroups, FakeCgroups)
    write(reader.proc / "1/cgroup", "0::/docker/abc/init.scope\n")
    assert reader.node_cgroups() == []
    reader.cgroups.groups["/kubepods"] = CgroupStats(1, 1, 1, 1)
    reader.cgroups.groups["/kubepods/burstable"] = CgroupStats(1, 1, 1, 1)
    assert reader.node_cgroups() == ["/kubepods", "/kubepods/burstable"]
    reader.cgroups.groups.clear()
    for rel in ("kubepods.slice", "kubepods.slice/kubepods-besteffort.slice"):
        reader.cgroups.groups[f"/docker/abc/{rel}"] = CgroupStats(1, 1, 1, 1)
    assert reader.node_cgroups() == [
        "/docker/abc/kubepods.slice",
        "/docker/abc/kubepods.slice/kubepods-besteffort.slice",
    ]


def test_a_cgroup_root_moves_every_pod_cgroup_reading(tmp_path: Path) -> None:
    """cgroupRoot /n1: kubepods, its QoS cgroups and pod cgroups are read under
    /n1/kubepods (or the slices /n1.slice/n1-kubepods.slice/...), never the host's
    /kubepods of another node."""
    cgroups = FakeCgroups()
    reader = HostReader(
        cgroups=cgroups,
        root_dir=tmp_path,
        cgroup_root="/n1",
        pod_logs_dir=tmp_path,
        proc=tmp_path / "proc",
    )
    for rel in ("/kubepods", "/kubepods/burstable", "/kubepods/burstable/podU"):
        cgroups.groups[rel] = CgroupStats(9, 9, 9, 9)
    assert (reader.kubepods(), reader.node_cgroups(), reader.pod_cgroup("U")) == (None, [], None)
    cgroups.groups["/n1/kubepods"] = CgroupStats(1, 2, 3, 4)
    cgroups.groups["/n1/kubepods/burstable"] = CgroupStats(1, 1, 1, 1)
    cgroups.groups["/n1/kubepods/burstable/podU"] = CgroupStats(1, 1, 1, 1)
    assert reader.kubepods() == CgroupStats(1, 2, 3, 4)
    assert reader.node_cgroups() == ["/n1/kubepods", "/n1/kubepods/burstable"]
    assert reader.pod_cgroup("U") == "/n1/kubepods/burstable/podU"
    cgroups.groups.clear()
    cgroups.groups["/n1.slice/n1-kubepods.slice/n1-kubepods-podV.slice"] = CgroupStats(1, 1, 1, 1)
    assert reader.pod_cgroup("V") == "/n1.slice/n1-kubepods.slice/n1-kubepods-podV.slice"


def test_kubepods_absent_is_none(reader: HostReader) -> None:
    assert isinstance(reader.cgroups, FakeCgroups)
    assert reader.kubepods() is None
    reader.cgroups.groups["/kubepods"] = CgroupStats(5, 4, 3, 2)
    assert reader.kubepods() == CgroupStats(5, 4, 3, 2)


@pytest.mark.parametrize("version", [1, 2])
def test_processes_fall_back_to_counting_tasks(tmp_path: Path, version: int) -> None:
    cg = tmp_path / "cg"
    if version == 2:
        write(cg / "cgroup.controllers", "memory\n")
        write(cg / "kubepods/podU/cgroup.threads", "1\n2\n")
        write(cg / "kubepods/podU/c1/cgroup.threads", "3\n\n")
    else:
        write(cg / "memory/kubepods/podU/tasks", "1\n2\n")
        write(cg / "memory/kubepods/podU/c1/tasks", "3\n")
    reader = HostReader(
        cgroups=CgroupFS(cg), root_dir=tmp_path, cgroup_root="/", pod_logs_dir=tmp_path
    )
    assert reader.processes("/kubepods/podU", CgroupStats(None, None, None, None)) == 3
    assert reader.processes("/kubepods/podU", CgroupStats(None, None, None, 9)) == 9


def test_empty_dirs_on_disk_only(reader: HostReader) -> None:
    base = reader.root_dir / "pods/U/volumes/kubernetes.io~empty-dir"
    write(base / "scratch/blob", "y" * 50_000)
    (base / "cache").mkdir()
    write(base / "stray-file", "not a volume")
    volumes = reader.empty_dirs("U")
    assert sorted(volumes) == ["cache", "scratch"]
    assert 50_000 <= volumes["scratch"].bytes < 50_000 + 16 * 1024
    assert volumes["cache"].inodes == 1
    assert reader.empty_dirs("gone") == {}


def test_pod_log_dir_name(reader: HostReader) -> None:
    assert reader.pod_log_dir("ns", "web", "U") == reader.pod_logs_dir / "ns_web_U"
    assert dir_usage(reader.pod_log_dir("ns", "web", "U")) == DirUsage(0, 0)


def test_a_live_slice_wins_over_an_empty_cgroupfs_leftover(tmp_path: Path) -> None:
    """A static pod's UID is the same on every run of its manifest: an empty cgroupfs
    directory a cgroupfs-driver run left behind must not hide the systemd driver's slice."""
    cg = tmp_path / "cg"
    (cg / "memory/kubepods/besteffort/podU").mkdir(parents=True)
    live = "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podU.slice"
    write(cg / "memory" / live / "cri-containerd-abc.scope/tasks", "7\n")
    proc = tmp_path / "proc"
    write(proc / "1/cgroup", "1:name=systemd:/init.scope\n")
    reader = HostReader(
        cgroups=CgroupFS(cg), root_dir=tmp_path, cgroup_root="/", pod_logs_dir=tmp_path, proc=proc
    )
    assert reader.pod_cgroup("U") == "/" + live
    # With no live one, the leftover is still what there is.
    (cg / "memory" / live / "cri-containerd-abc.scope/tasks").unlink()
    (cg / "memory" / live / "cri-containerd-abc.scope").rmdir()
    assert reader.pod_cgroup("U") == "/kubepods/besteffort/podU"


class CountingCgroups(CgroupFS):
    """CgroupFS counting the probes a lookup makes."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.calls: Counter[str] = Counter()

    def exists(self, rel: str) -> bool:
        self.calls["exists"] += 1
        return super().exists(rel)

    def children(self, rel: str) -> list[str]:
        self.calls["children"] += 1
        return super().children(rel)

    def task_count(self, rel: str) -> int:
        self.calls["task_count"] += 1
        return super().task_count(rel)


def test_a_pod_cgroup_in_use_is_not_probed_for_again(tmp_path: Path) -> None:
    cg = tmp_path / "cg"
    for controller in ("memory", "cpu", "pids"):
        (cg / controller / "kubepods/burstable/podU/cri-containerd-abc.scope").mkdir(parents=True)
    (cg / "memory/kubepods/besteffort/podV").mkdir(parents=True)  # empty: not in use
    proc = tmp_path / "proc"
    write(proc / "1/cgroup", "1:name=systemd:/init.scope\n")
    cgroups = CountingCgroups(cg)
    reader = HostReader(
        cgroups=cgroups, root_dir=tmp_path, cgroup_root="/", pod_logs_dir=tmp_path, proc=proc
    )
    assert reader.pod_cgroup("U") == "/kubepods/burstable/podU"
    assert cgroups.calls["exists"] >= 6  # three QoS classes, each in both drivers' forms
    for _ in range(3):
        cgroups.calls.clear()
        assert reader.pod_cgroup("U") == "/kubepods/burstable/podU"
        assert cgroups.calls == {"children": 1}
    # A cgroup found empty is looked for again each time: a live one may appear.
    for _ in range(2):
        cgroups.calls.clear()
        assert reader.pod_cgroup("V") == "/kubepods/besteffort/podV"
        assert cgroups.calls["exists"] >= 6
    # Once the pod's cgroup is no longer in use, every candidate is probed again.
    for controller in ("memory", "cpu", "pids"):
        (cg / controller / "kubepods/burstable/podU/cri-containerd-abc.scope").rmdir()
        (cg / controller / "kubepods/burstable/podU").rmdir()
    cgroups.calls.clear()
    assert reader.pod_cgroup("U") is None
    assert cgroups.calls["exists"] >= 6
