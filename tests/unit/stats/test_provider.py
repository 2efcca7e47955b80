"""The stats provider on a fake runtime and fake cgroups over tmp_path directories: one
snapshot holds the node's cgroups, /proc readings and filesystems, and each ready pod
with its cgroup, process count, containers, logs and emptyDirs; `filesystems=False`
skips ImageFsInfo and every walk; a runtime error leaves the node readings and no pods."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from klet.cgroups import CgroupStats
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
from klet.stats import DirUsage, HostReader, StatsProvider
from klet.stats.testing import FakeCgroups, FakeStatsRuntime

UID = "1111-2222"


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


class World:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.root, self.logs, proc = tmp / "root", tmp / "logs", tmp / "proc"
        write(proc / "meminfo", "MemTotal:  2097152 kB\n")
        write(proc / "stat", "btime 1700000000\n")
        write(proc / "sys/kernel/pid_max", "4096\n")
        write(proc / "loadavg", "0.5 0.5 0.5 3/400 999\n")
        write(self.root / "pods" / UID / "volumes/kubernetes.io~empty-dir/scratch/blob", "y" * 9000)
        write(self.logs / f"ns_web_{UID}/app/0.log", "z" * 20_000)
        self.cgroups = FakeCgroups()
        self.cgroups.groups["/"] = CgroupStats(4000, 3000, 10**9, None)
        self.cgroups.groups[f"/kubepods/burstable/pod{UID}"] = CgroupStats(1000, 800, 10**8, None)
        self.cgroups.tasks[f"/kubepods/burstable/pod{UID}"] = 6
        self.runtime = FakeStatsRuntime()
        self.runtime.sandboxes = [
            Sandbox(SandboxID("sb1"), "web", "ns", UID, 0, SandboxState.READY, 77),
            Sandbox(SandboxID("sb2"), "old", "ns", "gone", 0, SandboxState.NOTREADY, 1),
        ]
        self.runtime.containers = [
            Container(
                ContainerID("c1"), SandboxID("sb1"), "app", 0, "busybox", "sha",
                ContainerState.RUNNING, 88, labels={L.POD_UID: UID, L.CONTAINER_NAME: "app"},
            ),
        ]  # fmt: skip
        self.runtime.stats = [
            ContainerStatsInfo(
                ContainerID("c1"), "app", 0, {L.POD_UID: UID, L.CONTAINER_NAME: "app"}, {},
                0, 5, None, 0, 700, 900, None, None, FilesystemUsageInfo(0, "", 4096, 4),
            ),
        ]  # fmt: skip
        self.runtime.image_fs = [FilesystemUsageInfo(0, "", 12345, 67)]
        self.provider = StatsProvider(
            self.runtime,
            HostReader(
                cgroups=self.cgroups,
                root_dir=self.root,
                cgroup_root="/",
                pod_logs_dir=self.logs,
                proc=proc,
            ),
            clock=lambda: 42,
        )


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


async def test_node_readings(world: World) -> None:
    snap = await world.provider.collect()
    node = snap.node
    assert snap.time_ns == 42 and snap.runtime_error is None
    assert node.root == CgroupStats(4000, 3000, 10**9, None)
    assert node.kubepods is None  # no /kubepods cgroup
    assert (node.memory_total, node.boot_ns) == (2 * 2**30, 1_700_000_000 * 10**9)
    assert (node.pid_max, node.tasks) == (4096, 400)
    assert node.rootfs is not None and node.rootfs.device == os.stat(world.root).st_dev
    # an image filesystem without a mountpoint is the root dir's; the container
    # filesystem is the image filesystem when the runtime names none
    assert node.image_fs is not None and node.image_fs.mountpoint == str(world.root)
    assert (node.image_fs.used_bytes, node.image_fs.inodes_used) == (12345, 67)
    assert node.container_fs == node.image_fs


async def test_separate_container_filesystem(world: World) -> None:
    world.runtime.container_fs = [FilesystemUsageInfo(0, str(world.logs), 5, 1)]
    node = (await world.provider.collect()).node
    assert node.container_fs is not None and node.container_fs.mountpoint == str(world.logs)
    assert node.container_fs.used_bytes == 5


async def test_pod_readings(world: World) -> None:
    [pod] = (await world.provider.collect()).pods  # ready sandboxes only
    assert (pod.uid, pod.namespace, pod.name, pod.start_ns) == (UID, "ns", "web", 77)
    assert pod.cgroup == CgroupStats(1000, 800, 10**8, None)
    assert pod.processes == 6  # no pids.current: its tasks counted
    [c] = pod.containers
    assert (c.id, c.name, c.running, c.start_ns) == ("c1", "app", True, 88)
    assert c.usage is not None and c.usage.memory_working_set_bytes == 700
    assert c.logs is not None and 20_000 <= c.logs.bytes < 20_000 + 16 * 1024
    assert pod.logs is not None and pod.logs.bytes > c.logs.bytes  # the pod dir itself too
    assert list(pod.volumes) == ["scratch"] and pod.volumes["scratch"].bytes >= 9000


async def test_running_containers_carry_their_cgroup(world: World) -> None:
    pod_cgroup = f"/kubepods/burstable/pod{UID}"
    world.cgroups.groups[f"{pod_cgroup}/cri-containerd-c1.scope"] = CgroupStats(9, 8, 7, None)
    world.cgroups.groups[f"{pod_cgroup}/other"] = CgroupStats(1, 1, 1, None)
    [pod] = (await world.provider.collect(filesystems=False)).pods
    assert pod.containers[0].cgroup == CgroupStats(9, 8, 7, None)


async def test_pod_without_cgroup_or_logs(world: World) -> None:
    world.cgroups.groups.pop(f"/kubepods/burstable/pod{UID}")
    (world.logs / f"ns_web_{UID}/app/0.log").unlink()
    (world.logs / f"ns_web_{UID}/app").rmdir()
    (world.logs / f"ns_web_{UID}").rmdir()
    [pod] = (await world.provider.collect()).pods
    assert (pod.cgroup, pod.processes, pod.logs) == (None, None, None)
    assert pod.containers[0].logs == DirUsage(0, 0)


async def test_cpu_and_memory_only(world: World) -> None:
    snap = await world.provider.collect(filesystems=False)
    assert world.runtime.calls == 3  # no ImageFsInfo
    assert (snap.node.rootfs, snap.node.image_fs, snap.node.container_fs) == (None, None, None)
    [pod] = snap.pods
    assert (pod.logs, dict(pod.volumes), pod.containers[0].logs) == (None, {}, None)
    assert pod.cgroup is not None and pod.containers[0].usage is not None


async def test_runtime_down_keeps_node_readings(world: World) -> None:
    world.runtime.error = RuntimeUnavailable("connection refused")
    snap = await world.provider.collect()
    assert snap.runtime_error == "connection refused"
    assert snap.pods == [] and snap.node.image_fs is None
    assert snap.node.root.memory_working_set_bytes == 3000 and snap.node.rootfs is not None
