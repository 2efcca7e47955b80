"""`StatsProvider.collect_cgroups` (the /metrics/cadvisor pass) on the fake runtime and
fake cgroups, /proc and /sys under tmp_path: the root, /kubepods and QoS cgroups, then
each ready pod's cgroup with its network (read from the first process of the pod's
tree) and each running container whose cgroup exists (found by its ID among the pod
cgroup's children, cgroupfs or systemd naming) with its labels, writable layer and
process count, open files and sockets and the first process's soft limits; the
root's filesystem inodes and the /proc/diskstats counters of its device; block devices
named from /sys; a runtime error leaves the node's cgroups."""

from __future__ import annotations

import os
from pathlib import Path

from klet.cgroups import CgroupStats
from klet.cgroups.detail import BlkioDevice, CgroupDetail
from klet.cri import labels as L
from klet.cri.errors import RuntimeUnavailable
from klet.cri.types import (
    Container,
    ContainerState,
    ContainerStatsInfo,
    FilesystemUsageInfo,
    Sandbox,
    SandboxState,
)
from klet.model.types import ContainerID, SandboxID
from klet.stats import HostReader, StatsProvider
from klet.stats.cadvisor import CgroupSeries, DiskStats, NetDev, OpenFiles
from klet.testbed.fakes.stats import FakeCgroups, FakeStatsRuntime

UID = "1111-2222"
POD = f"/kubepods/burstable/pod{UID}"
NET = "h1\nh2\n  eth0: 1000 10 0 0 0 0 0 0 2000 20 0 0 0 0 0 0\n"


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def container(cid: str, name: str, state: ContainerState = ContainerState.RUNNING) -> Container:
    return Container(
        ContainerID(cid), SandboxID("sb1"), name, 0, "docker.io/library/busybox:1.36", "sha256:1",
        state, 88 * 10**9, labels={L.POD_UID: UID, L.CONTAINER_NAME: name},
    )  # fmt: skip


def world(tmp: Path) -> tuple[StatsProvider, FakeCgroups, FakeStatsRuntime]:
    proc, sys = tmp / "proc", tmp / "sys"
    write(proc / "stat", "btime 1700000000\n")
    write(proc / "meminfo", "MemTotal: 1024 kB\nSwapTotal:  2048 kB\n")
    write(proc / "1/net/dev", "h1\nh2\n  ens3: 5 1 0 0 0 0 0 0 6 1 0 0 0 0 0 0\n")
    write(proc / "42/net/dev", NET)
    write(sys / "dev/block/8:0/uevent", "MAJOR=8\nMINOR=0\nDEVNAME=sda\n")
    for pid, targets in ((50, ("socket:[1]", "/dev/null")), (51, ("socket:[2]",)),
                         (60, ("/dev/null",))):  # fmt: skip
        (proc / str(pid) / "fd").mkdir(parents=True)
        for fd, target in enumerate(targets):
            (proc / str(pid) / "fd" / str(fd)).symlink_to(target)
    write(proc / "50/limits", "Max open files            1024                 4096    files\n")
    cg = FakeCgroups()
    for rel in ("/", "/kubepods", "/kubepods/burstable", POD, f"{POD}/sb1"):
        cg.groups[rel] = CgroupStats(None, None, None, None)
    cg.groups[f"{POD}/c1"] = CgroupStats(None, None, None, None)
    cg.groups[f"{POD}/cri-containerd-c2.scope"] = CgroupStats(None, None, None, None)
    cg.details["/"] = CgroupDetail(cpu_usage_ns=1, blkio={"8:0": BlkioDevice(1, 2, 3, 4)})
    cg.details[POD] = CgroupDetail(cpu_usage_ns=5, blkio_queued={"8:32": {"Total": 1}})
    cg.details[f"{POD}/c1"] = CgroupDetail(cpu_usage_ns=3, blkio={"8:16": BlkioDevice()})
    cg.pids[f"{POD}/sb1"] = [42]
    cg.pids[f"{POD}/c1"] = [50, 51]
    cg.pids[f"{POD}/cri-containerd-c2.scope"] = [60]
    rt = FakeStatsRuntime()
    rt.sandboxes = [
        Sandbox(SandboxID("sb1"), "web", "ns", UID, 0, SandboxState.READY, 77 * 10**9),
        Sandbox(SandboxID("sb2"), "old", "ns", "gone", 0, SandboxState.NOTREADY, 1),
        Sandbox(SandboxID("sb3"), "nocg", "ns", "nocg", 0, SandboxState.READY, 1),
    ]
    rt.containers = [
        container("c1", "app"),
        container("c2", "sidecar"),
        container("c3", "nocgroup"),  # its cgroup is gone already
        container("c4", "done", ContainerState.EXITED),
    ]
    rt.stats = [
        ContainerStatsInfo(
            ContainerID("c1"), "app", 0, {L.POD_UID: UID, L.CONTAINER_NAME: "app"}, {},
            0, 5, None, 0, 700, 900, None, None, FilesystemUsageInfo(0, "", 4096, 4),
        ),
    ]  # fmt: skip
    rt.image_fs = [FilesystemUsageInfo(0, str(tmp), 1, 1)]
    host = HostReader(
        cgroups=cg, root_dir=tmp, cgroup_root="/", pod_logs_dir=tmp, proc=proc, sys=sys
    )
    return StatsProvider(rt, host, clock=lambda: 42), cg, rt


async def test_series_of_a_node_with_one_pod(tmp_path: Path) -> None:
    provider, cg, _ = world(tmp_path)
    snap = await provider.collect_cgroups()
    assert snap.time_ns == 42 and snap.runtime_error is None
    by_id = {s.id: s for s in snap.cgroups}
    assert list(by_id) == [
        "/",
        "/kubepods",
        "/kubepods/burstable",
        POD,
        f"{POD}/c1",
        f"{POD}/cri-containerd-c2.scope",
    ]
    root = by_id["/"]
    assert (root.pod, root.container, root.start_s) == ("", "", 1_700_000_000.0)
    assert root.network == {"ens3": NetDev(5, 1, 0, 0, 6, 1, 0, 0)}
    # every device a cgroup's blkio tables name, named once for all series
    assert root.blkio_devices == {"8:0": "/dev/sda", "8:16": "8:16", "8:32": "8:32"}
    pod = by_id[POD]
    assert pod == CgroupSeries(
        id=POD,
        detail=CgroupDetail(cpu_usage_ns=5, blkio_queued={"8:32": {"Total": 1}}),
        pod="web",
        namespace="ns",
        start_s=77.0,
        processes=4,
        open_files=OpenFiles(4, 2),  # the pod's processes: 42 (no fd dir), 50, 51, 60
        network={"eth0": NetDev(1000, 10, 0, 0, 2000, 20, 0, 0)},
        blkio_devices=root.blkio_devices,
    )
    app = by_id[f"{POD}/c1"]
    assert (app.container, app.pod, app.namespace, app.image, app.name) == (
        "app",
        "web",
        "ns",
        "docker.io/library/busybox:1.36",
        "c1",
    )
    assert (app.start_s, app.processes, app.detail.cpu_usage_ns) == (88.0, 2, 3)
    assert app.fs is not None and app.fs.usage_bytes == 4096 and app.fs.limit_bytes
    assert app.network == {}  # the pod's series carries it
    # its processes' fds (50: 2, one a socket; 51: a socket) and its first one's limit
    assert (app.open_files, app.ulimits) == ((3, 2), {"max_open_files": 1024})
    sidecar = by_id[f"{POD}/cri-containerd-c2.scope"]
    assert (sidecar.container, sidecar.fs, sidecar.processes) == ("sidecar", None, 1)
    assert (sidecar.open_files, sidecar.ulimits) == ((1, 0), {})  # 60 has no limits file
    # the kubelet root's filesystem (tmp_path, also the image fs here) once, by device
    st = os.statvfs(tmp_path)
    dev = os.stat(tmp_path).st_dev
    assert list(root.inodes) == [f"{os.major(dev)}:{os.minor(dev)}"]
    assert next(iter(root.inodes.values())).total == st.f_files
    assert root.disks == {}  # no /proc/diskstats line for it


async def test_the_root_carries_its_filesystems_disk_statistics(tmp_path: Path) -> None:
    provider, _, _ = world(tmp_path)
    dev = os.stat(tmp_path).st_dev
    numbers = f"{os.major(dev)}:{os.minor(dev)}"
    write(
        tmp_path / "proc/diskstats",
        f"{os.major(dev)} {os.minor(dev)} vdz 1 2 3 4 5 6 7 8 9 10 11 0 0 0 0\n"
        f"{os.major(dev) + 1} 0 other 9 9 9 9 9 9 9 9 9 9 9\n",
    )
    snap = await provider.collect_cgroups()
    root = snap.cgroups[0]
    # the kubelet root's device (named by its numbers: no /sys entry here), once
    assert root.disks == {numbers: DiskStats(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11)}
    assert all(not s.disks for s in snap.cgroups[1:])


async def test_runtime_error_keeps_the_node(tmp_path: Path) -> None:
    provider, _, rt = world(tmp_path)
    rt.error = RuntimeUnavailable("down")
    snap = await provider.collect_cgroups()
    assert snap.runtime_error is not None and "down" in snap.runtime_error
    assert [s.id for s in snap.cgroups] == ["/", "/kubepods", "/kubepods/burstable"]
    assert snap.machine.memory_bytes == 1024 * 1024
    assert snap.machine.swap_bytes == 2048 * 1024  # /proc/meminfo's SwapTotal
