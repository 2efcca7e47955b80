"""The stats provider on a fake runtime and fake cgroups over tmp_path directories: one
snapshot holds the node's cgroups, /proc readings and filesystems, and each ready pod
with its cgroup, process count, containers, logs and emptyDirs, the node's network (the
host namespace's interfaces, the default route's interface) and a pod's (its own
namespace's, none on the host's network); `filesystems=False` skips ImageFsInfo, every
walk and the network; `pods` measures only the pods named (none: no CRI read of pods at
all, eviction's idle pass); a runtime error leaves the node readings and no pods."""

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
from klet.stats.cadvisor import NetDev
from klet.testbed.fakes.stats import FakeCgroups, FakeStatsRuntime

UID = "1111-2222"
NET = Path(__file__).parent / "fixtures" / "net"


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


async def test_the_node_alone_reads_no_pod(world: World) -> None:
    snap = await world.provider.collect(pods=())
    assert world.runtime.calls == 1  # ImageFsInfo only: no sandbox, container or stats list
    assert snap.pods == [] and snap.node.image_fs is not None
    assert snap.node.root.memory_working_set_bytes == 3000


async def test_only_the_pods_named_are_measured(world: World) -> None:
    world.runtime.sandboxes.append(
        Sandbox(SandboxID("sb3"), "db", "ns", "3333", 0, SandboxState.READY, 78)
    )
    assert [p.uid for p in (await world.provider.collect()).pods] == [UID, "3333"]
    assert [p.uid for p in (await world.provider.collect(pods={"3333"})).pods] == ["3333"]
    assert [p.uid for p in (await world.provider.collect(pods=[UID, "nope"])).pods] == [UID]


async def test_runtime_down_keeps_node_readings(world: World) -> None:
    world.runtime.error = RuntimeUnavailable("connection refused")
    snap = await world.provider.collect()
    assert snap.runtime_error == "connection refused"
    assert snap.pods == [] and snap.node.image_fs is None
    assert snap.node.root.memory_working_set_bytes == 3000 and snap.node.rootfs is not None


def net_fixtures(proc: Path) -> None:
    write(proc / "net/dev", (NET / "dev-host").read_text())
    write(proc / "net/route", (NET / "route-two-defaults").read_text())
    write(proc / "42/net/dev", (NET / "dev-pod").read_text())
    for pid, ns in (("self", "net:[4026531840]"), ("42", "net:[4026532211]")):
        (proc / pid / "ns").mkdir(parents=True)
        (proc / pid / "ns/net").symlink_to(ns)


async def test_network_of_the_node_and_of_a_pod(world: World) -> None:
    proc = world.tmp / "proc"
    net_fixtures(proc)
    world.cgroups.pids[f"/kubepods/burstable/pod{UID}"] = [42]
    snap = await world.provider.collect()
    assert snap.node.default_interface == "ens3"
    assert snap.node.network is not None
    assert snap.node.network["eth0"] == NetDev(1383529459, 65220, 0, 0, 5540222, 45004, 0, 0)
    assert "lo" not in snap.node.network and "vethe922dbc4" not in snap.node.network
    [pod] = snap.pods
    assert pod.network == {
        "eth0": NetDev(9048, 64, 1, 0, 3186, 33, 2, 0),
        "net1": NetDev(500, 5, 0, 0, 700, 7, 0, 0),
    }
    # the CPU-and-memory pass reads no network, as upstream's
    lean = await world.provider.collect(filesystems=False)
    assert lean.node.network is None and lean.pods[0].network is None


async def test_a_pod_on_the_hosts_network_has_none_of_its_own(world: World) -> None:
    proc = world.tmp / "proc"
    net_fixtures(proc)
    (proc / "42/ns/net").unlink()
    (proc / "42/ns/net").symlink_to("net:[4026531840]")  # the host's: this process's own
    world.cgroups.pids[f"/kubepods/burstable/pod{UID}"] = [42]
    [pod] = (await world.provider.collect()).pods
    assert pod.network is None
    world.cgroups.pids[f"/kubepods/burstable/pod{UID}"] = [43]  # gone: nothing to read
    [pod] = (await world.provider.collect()).pods
    assert pod.network is None
