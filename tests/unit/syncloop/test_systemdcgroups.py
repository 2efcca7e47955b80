"""The systemd cgroup driver in syncloop, on a stateful fake systemd: CRI's cgroup parent
is the slice path; the node's slices (kubepods, burstable, besteffort) are started once
before the first pod's, and again after systemd forgot them; a pod's slice gets its
limits, an existing one only its limits again; removal stops the slice; a systemd error
is a problem reported, not an exception; wiring picks the driver from cgroupDriver; and
syncloop refuses to start when the runtime's cgroup driver differs, naming both."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

from klet.cgroups.systemd import SystemdUnavailable
from klet.syncloop.app import cgroup_driver_mismatch
from klet.syncloop.containers.podcgroups import CgroupfsPodCgroups, NodeCgroupLimits
from klet.syncloop.containers.systemdcgroups import SystemdPodCgroups
from klet.syncloop.model.resources import PodResources
from klet.syncloop.wiring import pod_cgroups
from klet.testbed.fakes.cgroups import FakeSystemd
from klet.testbed.fakes.cri import FakeRuntimeService

UID = "11111111-2222-3333-4444-555555555555"
UID_ = UID.replace("-", "_")
POD = f"/kubepods/burstable/pod{UID}"
UNIT = f"kubepods-burstable-pod{UID_}.slice"
RES = PodResources(cpu_shares=51, cpu_quota=None, cpu_period=100_000, memory_limit_bytes=128 << 20)
NODE_SLICES = ["kubepods.slice", "kubepods-burstable.slice", "kubepods-besteffort.slice"]


def test_cri_parent_is_the_slice_path() -> None:
    driver = SystemdPodCgroups(FakeSystemd(), cgroup_version=1)
    assert driver.cri_parent(POD) == (
        f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice"
    )
    assert driver.cri_parent(f"/kubepods/pod{UID}") == f"/kubepods.slice/kubepods-pod{UID_}.slice"


def test_node_slices_first_then_the_pod_with_its_limits() -> None:
    systemd = FakeSystemd()
    driver = SystemdPodCgroups(systemd, cgroup_version=1)
    assert asyncio.run(driver.ensure(POD, RES)) == (False, [])
    assert [u for op, u in systemd.calls if op == "ensure"] == [*NODE_SLICES, UNIT]
    props = systemd.units[UNIT]
    assert props["CPUShares"] == 51
    assert props["MemoryLimit"] == 128 << 20
    assert props["Wants"] == ["kubepods-burstable.slice"]
    assert systemd.units["kubepods.slice"]["Wants"] == ["-.slice"]


def test_existing_slice_is_updated_and_node_slices_not_redone() -> None:
    systemd = FakeSystemd()
    driver = SystemdPodCgroups(systemd, cgroup_version=1)

    async def twice() -> tuple[bool, list[str]]:
        await driver.ensure(POD, RES)
        systemd.calls.clear()
        return await driver.ensure(POD, dataclasses.replace(RES, memory_limit_bytes=256 << 20))

    assert asyncio.run(twice()) == (True, [])
    assert [u for op, u in systemd.calls if op == "ensure"] == [UNIT]
    assert systemd.units[UNIT]["MemoryLimit"] == 256 << 20


def test_concurrent_pods_start_the_node_slices_once() -> None:
    systemd = FakeSystemd()
    driver = SystemdPodCgroups(systemd, cgroup_version=2)
    pods = [f"/kubepods/besteffort/pod{i}" for i in range(5)]

    async def all_at_once() -> None:
        await asyncio.gather(*(driver.ensure(p, RES) for p in pods))

    asyncio.run(all_at_once())
    ensured = [u for op, u in systemd.calls if op == "ensure"]
    assert ensured[:3] == NODE_SLICES and len(ensured) == 3 + len(pods)


def test_node_slices_again_after_systemd_restarts() -> None:
    systemd = FakeSystemd()
    driver = SystemdPodCgroups(systemd, cgroup_version=1)

    async def across_restart() -> None:
        await driver.ensure(POD, RES)
        systemd.restart()
        systemd.calls.clear()
        await driver.ensure(POD, RES)

    asyncio.run(across_restart())
    assert [u for op, u in systemd.calls if op == "ensure"] == [*NODE_SLICES, UNIT]


def test_remove_stops_the_slice() -> None:
    systemd = FakeSystemd()
    driver = SystemdPodCgroups(systemd, cgroup_version=1)

    async def create_and_remove() -> list[str]:
        await driver.ensure(POD, RES)
        return await driver.remove(POD)

    assert asyncio.run(create_and_remove()) == []
    assert UNIT not in systemd.units and "kubepods.slice" in systemd.units


def test_systemd_errors_are_reported_problems() -> None:
    systemd = FakeSystemd()
    driver = SystemdPodCgroups(systemd, cgroup_version=1)
    systemd.fail_next = SystemdUnavailable("cannot connect to the system bus: gone")
    existed, problems = asyncio.run(driver.ensure(POD, RES))
    assert not existed
    assert problems == [f"{UNIT}: cannot connect to the system bus: gone"]
    systemd.fail_next = SystemdUnavailable("StopUnit: no answer in 30 s")
    assert asyncio.run(driver.remove(POD)) == [f"{UNIT}: StopUnit: no answer in 30 s"]


def test_a_cgroup_root_prefixes_the_node_slices() -> None:
    """cgroupRoot /n1: the node's slices are n1-kubepods.slice and its QoS slices (at
    /n1.slice/n1-kubepods.slice), the pod's under them."""
    systemd = FakeSystemd()
    driver = SystemdPodCgroups(systemd, cgroup_version=1, cgroup_root="/n1")
    pod = f"/n1/kubepods/burstable/pod{UID}"
    assert asyncio.run(driver.ensure(pod, RES)) == (False, [])
    assert [u for op, u in systemd.calls if op == "ensure"] == [
        "n1-kubepods.slice",
        "n1-kubepods-burstable.slice",
        "n1-kubepods-besteffort.slice",
        f"n1-kubepods-burstable-pod{UID_}.slice",
    ]
    assert systemd.units["n1-kubepods.slice"]["Wants"] == ["n1.slice"]
    assert driver.cri_parent(pod) == (
        "/n1.slice/n1-kubepods.slice/n1-kubepods-burstable.slice/"
        f"n1-kubepods-burstable-pod{UID_}.slice"
    )


def test_node_slices_carry_the_node_limits() -> None:
    """kubepods.slice gets the pods' CPU shares, memory and process limits, the
    besteffort slice the minimum shares, an existing slice the same as an update."""
    systemd = FakeSystemd()
    node = NodeCgroupLimits("/", cpu_shares=1536, memory_bytes=1 << 30, pids=4000)
    driver = SystemdPodCgroups(systemd, cgroup_version=1, node=node)
    asyncio.run(driver.ensure(POD, RES))
    assert systemd.units["kubepods.slice"]["CPUShares"] == 1536
    assert systemd.units["kubepods.slice"]["MemoryLimit"] == 1 << 30
    assert systemd.units["kubepods.slice"]["TasksMax"] == 4000
    assert systemd.units["kubepods-besteffort.slice"]["CPUShares"] == 2
    assert "CPUShares" not in systemd.units["kubepods-burstable.slice"]


def test_update_qos_sets_the_burstable_slice_shares() -> None:
    systemd = FakeSystemd()
    driver = SystemdPodCgroups(systemd, cgroup_version=1, cgroup_root="/n1")
    assert asyncio.run(driver.update_qos(300)) == []
    assert systemd.units["n1-kubepods-burstable.slice"]["CPUShares"] == 300


def test_update_qos_before_any_pod_starts_the_node_slices_first() -> None:
    # Starting kubepods-burstable.slice before kubepods.slice would leave kubepods.slice
    # a plain unit systemd loaded as the parent, without klet's limits (seen in CI).
    systemd = FakeSystemd()
    node = NodeCgroupLimits("/", cpu_shares=2048, memory_bytes=1 << 30, pids=4096)
    driver = SystemdPodCgroups(systemd, cgroup_version=1, node=node)
    assert asyncio.run(driver.update_qos(300)) == []
    ensured = [unit for op, unit in systemd.calls if op == "ensure"]
    assert ensured[0] == "kubepods.slice", ensured
    assert systemd.units["kubepods.slice"]["Transient"] is True
    assert systemd.units["kubepods.slice"]["MemoryLimit"] == 1 << 30
    assert systemd.units["kubepods-burstable.slice"]["CPUShares"] == 300


def test_wiring_picks_the_driver() -> None:
    node = NodeCgroupLimits("/", cpu_shares=2048, memory_bytes=1 << 30, pids=4096)
    assert isinstance(pod_cgroups("systemd", node), SystemdPodCgroups)
    cgroupfs = pod_cgroups("cgroupfs", node)
    assert isinstance(cgroupfs, CgroupfsPodCgroups)
    assert cgroupfs.cri_parent(POD) == POD


def test_runtime_driver_mismatch_names_both() -> None:
    cri = FakeRuntimeService()
    cri.cgroup_driver_name = "cgroupfs"
    problem = asyncio.run(cgroup_driver_mismatch(cri, "systemd"))
    assert problem.startswith(
        "cgroupDriver: klet's is 'systemd' but the container runtime's is 'cgroupfs'"
    )
    assert "SystemdCgroup = false" in problem
    assert asyncio.run(cgroup_driver_mismatch(cri, "cgroupfs")) == ""


def test_a_runtime_that_does_not_say_is_not_refused() -> None:
    cri = FakeRuntimeService()
    cri.cgroup_driver_name = ""
    assert asyncio.run(cgroup_driver_mismatch(cri, "systemd")) == ""


def test_hugetlb_limits_at_the_slice_path_in_pid1s_hugetlb_cgroup(tmp_path: Path) -> None:
    """systemd has no hugetlb property: on v1 the pod's limits go in the hugetlb hierarchy
    at the slice's path under PID 1's hugetlb cgroup (where runc puts the scopes), and
    the directory goes with the pod."""
    fs = tmp_path / "cgroup"
    (fs / "hugetlb").mkdir(parents=True)
    proc = tmp_path / "proc"
    (proc / "1").mkdir(parents=True)
    (proc / "1/cgroup").write_text(
        "12:hugetlb:/\n11:memory:/docker/abc\n1:name=systemd:/docker/abc/init.scope\n"
    )
    driver = SystemdPodCgroups(FakeSystemd(), cgroup_version=1, cgroup_fs=fs, proc=proc)
    res = PodResources(256, None, None, None, None, (("2MB", 4 << 20), ("1GB", 0)))
    assert asyncio.run(driver.ensure(POD, res)) == (False, [])
    d = fs / "hugetlb/kubepods.slice/kubepods-burstable.slice" / UNIT
    assert (d / "hugetlb.2MB.limit_in_bytes").read_text() == str(4 << 20)
    assert (d / "hugetlb.1GB.limit_in_bytes").read_text() == "0"
    for f in d.iterdir():  # the kernel's files go with the directory; these are plain
        f.unlink()
    assert asyncio.run(driver.remove(POD)) == []
    assert not d.exists()
    # No huge pages offered (or v2): nothing written.
    plain = PodResources(256, None, None, None)
    assert asyncio.run(driver.ensure(POD, plain)) == (False, [])
    assert not d.exists()
