"""The systemd cgroup driver's pure parts: cgroupfs names to slice units and cgroup paths
as upstream names them (`-` in a part becomes `_`, parents implied by the name), the
properties a transient slice starts with on v1 and v2 (accounting, Wants= on the parent,
limits, quota per second rounded up to 10 ms, infinity for no limit), PID 1 checks from
a /proc fixture, and the runtime's driver read from containerd's CRI configuration."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from klet.cgroups.slices import (
    INFINITY,
    SliceLimits,
    SliceNameError,
    cgroup_path,
    expand,
    limit_properties,
    parent_unit,
    parts_of,
    quota_per_sec_us,
    slice_properties,
    unit_name,
    unit_of_path,
)
from klet.cgroups.systemd import Systemd, pid1_cgroup_prefix, pid1_is_systemd, preflight
from klet.cri.client import cgroup_driver_of_cri_config

UID = "6a1f0c2e-3b4d-4e5f-8a9b-0c1d2e3f4a5b"
UID_ = UID.replace("-", "_")


@pytest.mark.parametrize(
    ("cgroupfs", "unit", "path"),
    [
        ("/kubepods", "kubepods.slice", "/kubepods.slice"),
        (
            "/kubepods/burstable",
            "kubepods-burstable.slice",
            "/kubepods.slice/kubepods-burstable.slice",
        ),
        (
            f"/kubepods/burstable/pod{UID}",
            f"kubepods-burstable-pod{UID_}.slice",
            f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice",
        ),
        (
            f"/kubepods/besteffort/pod{UID}",
            f"kubepods-besteffort-pod{UID_}.slice",
            f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice",
        ),
        (
            f"/kubepods/pod{UID}",
            f"kubepods-pod{UID_}.slice",
            f"/kubepods.slice/kubepods-pod{UID_}.slice",
        ),
        ("/", "-.slice", "/"),
    ],
)
def test_names_as_upstream(cgroupfs: str, unit: str, path: str) -> None:
    assert unit_name(parts_of(cgroupfs)) == unit
    assert expand(unit) == path
    assert cgroup_path(cgroupfs) == path
    assert unit_of_path(path) == unit


@pytest.mark.parametrize(
    "bad", ["kubepods", "a--b.slice", "-a.slice", "a-.slice", "a/b.slice", ".slice"]
)
def test_expand_refuses_what_is_not_a_slice(bad: str) -> None:
    with pytest.raises(SliceNameError):
        expand(bad)


def test_unit_name_refuses_empty_part() -> None:
    with pytest.raises(SliceNameError):
        unit_name(("kubepods", ""))


@pytest.mark.parametrize(
    ("unit", "parent"),
    [
        ("kubepods.slice", "-.slice"),
        ("kubepods-burstable.slice", "kubepods.slice"),
        (f"kubepods-burstable-pod{UID_}.slice", "kubepods-burstable.slice"),
    ],
)
def test_parent_unit(unit: str, parent: str) -> None:
    assert parent_unit(unit) == parent


@pytest.mark.parametrize(
    ("quota", "period", "per_sec"),
    [
        (10_000, 100_000, 100_000),  # 100m
        (150_000, 100_000, 1_500_000),  # 1.5 CPUs
        (1_000, 100_000, 10_000),  # 10m: exactly 1 %
        (500, 100_000, 10_000),  # 5m rounds up to 1 %
        (10_001, 100_000, 110_000),  # just above 100m rounds up a step
        (5_000, 50_000, 100_000),  # another period
    ],
)
def test_quota_per_second_rounds_up_to_10ms(quota: int, period: int, per_sec: int) -> None:
    assert quota_per_sec_us(quota, period) == per_sec


def as_dict(props: list[tuple[str, str, object]]) -> dict[str, tuple[str, object]]:
    return {name: (sig, value) for name, sig, value in props}


def test_guaranteed_pod_slice_v1() -> None:
    unit = f"kubepods-pod{UID_}.slice"
    limits = SliceLimits(
        cpu_shares=102, cpu_quota_us=10_000, cpu_period_us=100_000, memory_limit_bytes=64 << 20
    )
    props = as_dict(slice_properties(unit, limits, cgroup_version=1))
    assert props == {
        "Description": ("s", f"klet {unit}"),
        "Wants": ("as", ["kubepods.slice"]),
        "DefaultDependencies": ("b", False),
        "MemoryAccounting": ("b", True),
        "CPUAccounting": ("b", True),
        "TasksAccounting": ("b", True),
        "BlockIOAccounting": ("b", True),
        "CPUShares": ("t", 102),
        "CPUQuotaPeriodUSec": ("t", 100_000),
        "CPUQuotaPerSecUSec": ("t", 100_000),
        "MemoryLimit": ("t", 64 << 20),
        "TasksMax": ("t", INFINITY),
    }


def test_v2_uses_weight_and_memory_max() -> None:
    limits = SliceLimits(cpu_shares=1024, memory_limit_bytes=1 << 30, pids_limit=100)
    props = as_dict(limit_properties(limits, cgroup_version=2))
    assert props["CPUWeight"] == ("t", 39)
    assert props["MemoryMax"] == ("t", 1 << 30)
    assert props["TasksMax"] == ("t", 100)
    assert "CPUShares" not in props and "MemoryLimit" not in props
    assert "IOAccounting" in as_dict(slice_properties("a.slice", limits, cgroup_version=2))


def test_no_limits_is_infinity() -> None:
    props = as_dict(limit_properties(SliceLimits(), cgroup_version=1))
    assert props == {
        "CPUQuotaPerSecUSec": ("t", INFINITY),
        "MemoryLimit": ("t", INFINITY),
        "TasksMax": ("t", INFINITY),
    }


def test_zero_quota_and_pids_limit_mean_unlimited() -> None:
    limits = SliceLimits(cpu_shares=2, cpu_quota_us=0, memory_limit_bytes=0, pids_limit=-1)
    props = as_dict(limit_properties(limits, cgroup_version=1))
    assert props["CPUQuotaPerSecUSec"] == ("t", INFINITY)
    assert props["MemoryLimit"] == ("t", INFINITY)
    assert props["TasksMax"] == ("t", INFINITY)
    assert props["CPUShares"] == ("t", 2)


def fake_proc(tmp_path: Path, comm: str, cgroup: str) -> Path:
    (tmp_path / "1").mkdir()
    (tmp_path / "1/comm").write_text(comm + "\n")
    (tmp_path / "1/cgroup").write_text(cgroup)
    return tmp_path


def test_pid1_in_a_container(tmp_path: Path) -> None:
    proc = fake_proc(
        tmp_path,
        "systemd",
        "9:name=systemd:/docker/abc/init.scope\n4:memory:/docker/abc/init.scope\n"
        "0::/docker/abc/init.scope\n",
    )
    assert pid1_is_systemd(proc)
    assert pid1_cgroup_prefix(proc) == "/docker/abc"


def test_pid1_on_a_host(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, "systemd", "0::/init.scope\n")
    assert pid1_cgroup_prefix(proc) == "/"


def test_preflight_names_pid1(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, "tini", "0::/\n")
    assert not pid1_is_systemd(proc)
    problem = asyncio.run(preflight(Systemd(), proc=proc))
    assert problem == "PID 1 is not systemd (it is 'tini')"


def test_preflight_names_an_unreachable_bus(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, "systemd", "0::/init.scope\n")
    missing = tmp_path / "no-bus"
    systemd = Systemd(bus_address=f"unix:path={missing}", timeout_s=2.0)
    problem = asyncio.run(preflight(systemd, proc=proc))
    assert problem.startswith(
        "systemd's D-Bus API is unreachable: cannot connect to the system bus"
    )


def cri_config(options: object, default: str = "runc") -> str:
    return json.dumps(
        {
            "containerd": {
                "defaultRuntimeName": default,
                "runtimes": {"runc": {"runtimeType": "io.containerd.runc.v2", "options": options}},
            }
        }
    )


@pytest.mark.parametrize(
    ("text", "driver"),
    [
        (cri_config({"SystemdCgroup": True, "Root": "/x"}), "systemd"),
        (cri_config({"SystemdCgroup": False}), "cgroupfs"),
        (cri_config({}), "cgroupfs"),
        (cri_config(None), "cgroupfs"),
        (cri_config({"SystemdCgroup": True}, default="crun"), ""),  # default runtime unknown
        ("", ""),
        ("not json", ""),
        (json.dumps({"sandboxImage": "pause"}), ""),
    ],
)
def test_cgroup_driver_of_cri_config(text: str, driver: str) -> None:
    assert cgroup_driver_of_cri_config(text) == driver
