"""Eviction signals from recorded host readings: the working set (usage − inactive_file)
of cgroup v1 and v2 memory.stat samples, including the v2 root that has no
memory.current; pid.available from pid_max and /proc/loadavg; statfs arithmetic; pod
usage assembled from cgroups, CRI stats, logs and emptyDirs; and the host adapter run
against a fake /proc, cgroup tree, root dir and runtime."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from klet.cgroups import CgroupFS
from klet.config.kubelet import KubeletConfiguration
from klet.config.settings import KletSettings, Settings
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
from klet.eviction.hostsignals import FsLayout, HostSignalSource
from klet.eviction.signals import (
    ContainerSample,
    Observation,
    PodUsage,
    Signal,
    available_observation,
    fs_observations,
    pid_observation,
    pod_usage,
)
from klet.model.types import ContainerID, SandboxID
from klet.stats import HostReader, StatsProvider
from klet.testbed.fakes.stats import FakeStatsRuntime

Mi = 2**20


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


V1_ROOT_STAT = """cache 1156206592
rss 300000000
inactive_file 135168
active_file 1000
total_cache 1156206592
total_rss 850000000
total_inactive_file 565522432
total_active_file 570957824
"""
V2_STAT = """anon 734003200
file 1073741824
kernel 12345
inactive_file 536870912
active_file 536870912
"""


@pytest.mark.parametrize(
    ("files", "rel", "usage", "working_set"),
    [
        # v1: hierarchical total_inactive_file, not the cgroup's own inactive_file
        (
            {"memory/memory.usage_in_bytes": "1530322944\n", "memory/memory.stat": V1_ROOT_STAT},
            "/",
            1530322944,
            1530322944 - 565522432,
        ),
        # v1 without total_* keys falls back to inactive_file
        (
            {
                "memory/kubepods/memory.usage_in_bytes": "1000\n",
                "memory/kubepods/memory.stat": "inactive_file 300\n",
            },
            "/kubepods",
            1000,
            700,
        ),
        # v1: inactive_file above usage clamps to zero
        (
            {
                "memory/kubepods/memory.usage_in_bytes": "100\n",
                "memory/kubepods/memory.stat": "total_inactive_file 300\n",
            },
            "/kubepods",
            100,
            0,
        ),
        # v2 pod cgroup
        (
            {
                "cgroup.controllers": "cpu memory pids\n",
                "kubepods/memory.current": "1610612736\n",
                "kubepods/memory.stat": V2_STAT,
            },
            "/kubepods",
            1610612736,
            1610612736 - 536870912,
        ),
        # v2 root: no memory.current, usage = MemTotal − MemFree from /proc/meminfo
        (
            {
                "cgroup.controllers": "cpu memory pids\n",
                "memory.stat": V2_STAT,
                "proc/meminfo": "MemTotal:  4194304 kB\nMemFree:  1048576 kB\nMemAvailable: 3 kB\n",
            },
            "/",
            3 * 2**30,
            3 * 2**30 - 536870912,
        ),
        # no memory files: unknown, not zero
        ({"memory/x": ""}, "/kubepods", None, None),
    ],
)
def test_working_set(
    tmp_path: Path, files: dict[str, str], rel: str, usage: int | None, working_set: int | None
) -> None:
    cg, proc = tmp_path / "cg", tmp_path / "cg" / "proc"
    for name, text in files.items():
        write(cg / name, text)
    stats = CgroupFS(cg, proc=proc).stats(rel)
    assert (stats.memory_usage_bytes, stats.memory_working_set_bytes) == (usage, working_set)


@pytest.mark.parametrize(
    ("pid_max", "tasks", "available"),
    [(32768, 164, 32604), (4194304, 70000, 4124304), (100, 150, 0)],
)
def test_pid_available(pid_max: int, tasks: int, available: int) -> None:
    assert pid_observation(pid_max, tasks, now=5.0) == Observation(available, pid_max, 5.0)


@pytest.mark.parametrize(
    ("capacity", "used", "available"),
    [(8 * Mi, 3 * Mi, 5 * Mi), (8 * Mi, 8 * Mi, 0), (8 * Mi, 9 * Mi, 0)],
)
def test_available_is_capacity_minus_use_never_negative(
    capacity: int, used: int, available: int
) -> None:
    assert available_observation(capacity, used, now=1.0) == Observation(available, capacity, 1.0)


def test_fs_observations() -> None:
    size, inodes = fs_observations(
        blocks=1000, bavail=250, frsize=4096, files=64, ffree=60, now=2.0
    )
    assert size == Observation(250 * 4096, 1000 * 4096, 2.0)
    assert inodes == Observation(60, 64, 2.0)
    # a filesystem without an inode table reports no inode signal
    _size, none = fs_observations(blocks=10, bavail=5, frsize=512, files=0, ffree=0, now=2.0)
    assert none is None


def test_pod_usage_sums_layers_logs_and_volumes() -> None:
    usage = pod_usage(
        uid="u1",
        namespace="ns",
        name="p",
        cgroup_working_set=70 * Mi,
        processes=12,
        containers={
            "app": ContainerSample(40 * Mi, 5 * Mi, 10, 1 * Mi, 2),
            "side": ContainerSample(20 * Mi, 3 * Mi, 4, 2 * Mi, 3),
        },
        volumes={"scratch": (7 * Mi, 5)},
        pod_logs=(4 * Mi, 7),
    )
    assert usage == PodUsage(
        uid="u1",
        namespace="ns",
        name="p",
        memory_working_set=70 * Mi,
        ephemeral_storage=8 * Mi + 4 * Mi + 7 * Mi,
        processes=12,
        containers={"app": 40 * Mi, "side": 20 * Mi},
        writable_layer=8 * Mi,
        logs=4 * Mi,
        volumes={"scratch": 7 * Mi},
        container_storage={"app": 6 * Mi, "side": 5 * Mi},
        inodes=14 + 7 + 5,
    )


def test_pod_usage_without_pod_cgroup_or_log_dir_sums_containers() -> None:
    usage = pod_usage(
        uid="u1",
        namespace="ns",
        name="p",
        cgroup_working_set=None,
        processes=0,
        containers={"a": ContainerSample(3, 0, 0, 10, 1), "b": ContainerSample(4, 0, 0, 20, 1)},
        volumes={},
    )
    assert (usage.memory_working_set, usage.logs, usage.ephemeral_storage, usage.inodes) == (
        7,
        30,
        30,
        2,
    )


# -- the host adapter on a fake host ------------------------------------------------------

UID = "1111-2222"


def sandbox(uid: str, name: str, state: SandboxState = SandboxState.READY) -> Sandbox:
    return Sandbox(SandboxID(f"sb-{uid}"), name, "ns", uid, 0, state, 0)


def cstats(uid: str, name: str, attempt: int, ws: int | None, layer: int) -> ContainerStatsInfo:
    return ContainerStatsInfo(
        id=ContainerID(f"c-{name}-{attempt}"),
        name=name,
        attempt=attempt,
        labels={L.POD_UID: uid, L.CONTAINER_NAME: name},
        annotations={},
        cpu_timestamp_ns=0,
        cpu_usage_core_ns=None,
        cpu_usage_nano_cores=None,
        memory_timestamp_ns=0,
        memory_working_set_bytes=ws,
        memory_usage_bytes=ws,
        memory_rss_bytes=None,
        memory_available_bytes=None,
        writable_layer=FilesystemUsageInfo(0, "/", layer, 3),
    )


@pytest.fixture
def host(tmp_path: Path) -> tuple[HostSignalSource, FakeStatsRuntime, Path]:
    cg, proc, root, logs = (tmp_path / n for n in ("cg", "proc", "root", "logs"))
    write(cg / "memory/memory.usage_in_bytes", str(900 * Mi))
    write(cg / "memory/memory.stat", f"total_inactive_file {100 * Mi}\n")
    write(cg / "memory/kubepods/memory.usage_in_bytes", str(300 * Mi))
    write(cg / "memory/kubepods/memory.stat", f"total_inactive_file {50 * Mi}\n")
    pod = f"kubepods/burstable/pod{UID}"
    write(cg / "memory" / pod / "memory.usage_in_bytes", str(120 * Mi))
    write(cg / "memory" / pod / "memory.stat", f"total_inactive_file {20 * Mi}\n")
    write(cg / "pids" / pod / "pids.current", "17\n")
    write(proc / "sys/kernel/pid_max", "4096\n")
    write(proc / "loadavg", "0.5 0.5 0.5 3/400 999\n")
    write(proc / "meminfo", "MemTotal:  2097152 kB\nMemFree:  1000 kB\n")
    write(root / "pods" / UID / "volumes/kubernetes.io~empty-dir/scratch/blob", "y" * 50_000)
    write(logs / f"ns_web_{UID}/app/0.log", "z" * 20_000)
    write(logs / f"ns_web_{UID}/app/1.log", "z" * 20_000)
    runtime = FakeStatsRuntime()
    runtime.sandboxes = [sandbox(UID, "web"), sandbox("dead", "gone", SandboxState.NOTREADY)]
    runtime.stats = [
        cstats(UID, "app", 0, 10 * Mi, 1 * Mi),  # an older attempt: ignored
        cstats(UID, "app", 1, 80 * Mi, 2 * Mi),
        cstats("other", "x", 0, 5 * Mi, 5 * Mi),
    ]
    runtime.image_fs = [FilesystemUsageInfo(0, str(root), 123, 4)]
    reader = HostReader(
        cgroups=CgroupFS(cg, proc=proc),
        root_dir=root,
        cgroup_root="/",
        pod_logs_dir=logs,
        proc=proc,
    )
    source = HostSignalSource(
        StatsProvider(runtime, reader, clock=lambda: 42 * 10**9),
        memory_capacity=2 * 2**30,
        allocatable_memory=1 * 2**30,
    )
    return source, runtime, tmp_path


async def test_host_observations(host: tuple[HostSignalSource, FakeStatsRuntime, Path]) -> None:
    source, _runtime, tmp_path = host
    observed, _pods = await source.observe()
    assert observed[Signal.MEMORY_AVAILABLE] == Observation(2 * 2**30 - 800 * Mi, 2 * 2**30, 42.0)
    assert observed[Signal.ALLOCATABLE_MEMORY_AVAILABLE] == Observation(
        2**30 - 250 * Mi, 2**30, 42.0
    )
    assert observed[Signal.PID_AVAILABLE] == Observation(4096 - 400, 4096, 42.0)
    st = os.statvfs(tmp_path / "root")
    nodefs = observed[Signal.NODEFS_AVAILABLE]
    assert nodefs.capacity == st.f_blocks * st.f_frsize
    assert observed[Signal.NODEFS_INODES_FREE].capacity == st.f_files
    # imagefs is the statfs of the mountpoint CRI named; containerfs the same (not split)
    assert observed[Signal.IMAGEFS_AVAILABLE].capacity == nodefs.capacity
    assert observed[Signal.CONTAINERFS_AVAILABLE] == observed[Signal.IMAGEFS_AVAILABLE]


async def test_host_pod_usage(host: tuple[HostSignalSource, FakeStatsRuntime, Path]) -> None:
    source, _runtime, tmp_path = host
    _observed, pods = await source.observe()
    assert list(pods) == [UID]  # ready sandboxes only
    usage = pods[UID]
    assert (usage.namespace, usage.name) == ("ns", "web")
    assert usage.memory_working_set == 100 * Mi  # the pod cgroup, not the container sum
    assert usage.processes == 17
    assert usage.containers == {"app": 80 * Mi}  # the latest attempt
    assert usage.writable_layer == 2 * Mi
    assert 40_000 <= usage.logs < 40_000 + 64 * 1024
    assert 50_000 <= usage.volumes["scratch"] < 50_000 + 16 * 1024
    assert usage.ephemeral_storage == usage.writable_layer + usage.logs + usage.volumes["scratch"]
    assert usage.container_storage["app"] >= 2 * Mi + 40_000


async def test_container_memory_falls_back_to_its_cgroup(
    host: tuple[HostSignalSource, FakeStatsRuntime, Path],
) -> None:
    """containerd 1.6's shim may report no metrics (a cgroup v1 controller listed for
    the process but not mounted): the running container's own cgroup gives its working
    set, as cAdvisor gives upstream's, so the eviction message can name the container."""
    source, runtime, tmp_path = host
    runtime.stats = [cstats(UID, "app", 1, None, 2 * Mi)]
    runtime.containers = [
        Container(
            ContainerID("c-app-1"),
            SandboxID(f"sb-{UID}"),
            "app",
            1,
            "img",
            "img",
            ContainerState.RUNNING,
            0,
            labels={L.POD_UID: UID, L.CONTAINER_NAME: "app"},
        )
    ]
    _observed, pods = await source.observe()
    assert pods[UID].containers == {"app": 0}  # no reading, no cgroup: nothing to show
    child = tmp_path / f"cg/memory/kubepods/burstable/pod{UID}/c-app-1"
    write(child / "memory.usage_in_bytes", str(70 * Mi))
    write(child / "memory.stat", f"total_inactive_file {5 * Mi}\n")
    _observed, pods = await source.observe()
    assert pods[UID].containers == {"app": 65 * Mi}
    assert pods[UID].writable_layer == 2 * Mi
    # The runtime's own reading, when it has one, comes first.
    runtime.stats = [cstats(UID, "app", 1, 80 * Mi, 2 * Mi)]
    _observed, pods = await source.observe()
    assert pods[UID].containers == {"app": 80 * Mi}


async def test_processes_fall_back_to_counting_tasks(
    host: tuple[HostSignalSource, FakeStatsRuntime, Path],
) -> None:
    source, _runtime, tmp_path = host
    pod = tmp_path / f"cg/pids/kubepods/burstable/pod{UID}"
    (pod / "pids.current").unlink()
    write(tmp_path / f"cg/memory/kubepods/burstable/pod{UID}/tasks", "1\n2\n")
    write(tmp_path / f"cg/memory/kubepods/burstable/pod{UID}/c1/tasks", "3\n4\n5\n")
    _observed, pods = await source.observe()
    assert pods[UID].processes == 5


async def test_runtime_down_keeps_node_signals_and_logs_once(
    host: tuple[HostSignalSource, FakeStatsRuntime, Path], caplog: pytest.LogCaptureFixture
) -> None:
    source, runtime, _tmp = host
    runtime.error = RuntimeUnavailable("connection refused")
    with caplog.at_level(logging.WARNING, logger="klet.eviction.hostsignals"):
        for _ in range(3):
            observed, pods = await source.observe()
    assert Signal.MEMORY_AVAILABLE in observed and Signal.NODEFS_AVAILABLE in observed
    assert Signal.IMAGEFS_AVAILABLE not in observed and pods == {}
    assert len([r for r in caplog.records if "runtime stats unavailable" in r.message]) == 1
    runtime.error = None
    observed, pods = await source.observe()
    assert Signal.IMAGEFS_AVAILABLE in observed and list(pods) == [UID]


async def test_fs_layout(host: tuple[HostSignalSource, FakeStatsRuntime, Path]) -> None:
    source, runtime, _tmp = host
    assert await source.fs_layout() == FsLayout(False, False)
    runtime.image_fs = [FilesystemUsageInfo(0, "/proc", None, None)]  # another device
    assert await source.fs_layout() == FsLayout(True, False)
    runtime.container_fs = [FilesystemUsageInfo(0, "/proc", None, None)]
    assert await source.fs_layout() == FsLayout(True, False)
    runtime.container_fs = [FilesystemUsageInfo(0, "/sys", None, None)]
    assert await source.fs_layout() == FsLayout(True, True)


async def test_split_container_fs_is_observed_on_its_own_mountpoint(
    host: tuple[HostSignalSource, FakeStatsRuntime, Path],
) -> None:
    source, runtime, tmp_path = host
    runtime.container_fs = [FilesystemUsageInfo(0, "/proc", None, None)]
    observed, _pods = await source.observe()
    proc, root = os.statvfs("/proc"), os.statvfs(tmp_path / "root")
    assert observed[Signal.CONTAINERFS_AVAILABLE].capacity == proc.f_blocks * proc.f_frsize
    assert observed[Signal.IMAGEFS_AVAILABLE].capacity == root.f_blocks * root.f_frsize


def test_from_settings_allocatable_is_capacity_minus_reservations(tmp_path: Path) -> None:
    write(tmp_path / "meminfo", "MemTotal:  2097152 kB\n")
    settings = Settings(
        kubelet=KubeletConfiguration(
            kube_reserved={"memory": "100Mi"}, system_reserved={"memory": "200Mi"}
        ),
        klet=KletSettings(service="eviction", node_name="n1", root_dir=tmp_path),
    )
    source = HostSignalSource.from_settings(settings, FakeStatsRuntime(), proc=tmp_path)
    assert source.memory_capacity == 2 * 2**30
    # the hard eviction threshold is not subtracted: the kubepods budget, as upstream
    assert source.allocatable_memory == 2 * 2**30 - 300 * Mi
