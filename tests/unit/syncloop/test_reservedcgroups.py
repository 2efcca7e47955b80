"""Enforcing systemReserved and kubeReserved on their cgroups (reservedcgroups.py): which
cgroups `enforceNodeAllocatable` names with which amounts, the files written on cgroup
v1 and v2 (only the reserved resources; CPU alone for the -compressible keys), nothing
created, the start refusal naming the field and the key, and the Node Events of success
and failure; over a cgroup tree in a temporary directory."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from klet.bus.eventqueue import EventQueue, node_reference
from klet.config.kubelet import KubeletConfiguration
from klet.model.records import EventRecord
from klet.syncloop.containers.reservedcgroups import (
    ENFORCED,
    FAILED,
    ReservedCgroup,
    ReservedCgroupFailed,
    SliceWriter,
    cgroupfs_writer,
    enforce_reserved,
    missing_reserved_cgroups,
    missing_reserved_slices,
    reserved_cgroups,
    run_enforcement,
    write_existing,
)

GI = 1024**3


def config(**changes: Any) -> KubeletConfiguration:
    base = {
        "enforce_node_allocatable": ("pods", "system-reserved", "kube-reserved"),
        "system_reserved_cgroup": "/system.slice",
        "kube_reserved_cgroup": "/klet-test/kube",
        "system_reserved": {"cpu": "500m", "memory": "1Gi", "pid": "1000"},
        "kube_reserved": {"memory": "256Mi", "ephemeral-storage": "1Gi"},
    }
    return dataclasses.replace(KubeletConfiguration(), **{**base, **changes})


def v1_tree(tmp_path: Path, *cgroups: str, hierarchies: tuple[str, ...] = ()) -> Path:
    """A cgroup v1 mount: the cpu, memory and pids hierarchies with `cgroups` in each
    (or only in `hierarchies` when given), each file holding a kernel-like default."""
    for h in ("cpu", "memory", "pids"):
        (tmp_path / h).mkdir()
        for name in cgroups:
            if hierarchies and h not in hierarchies:
                continue
            d = tmp_path / h / name.strip("/")
            d.mkdir(parents=True)
            defaults = {
                "cpu": {"cpu.shares": "1024"},
                "memory": {"memory.limit_in_bytes": "9223372036854771712"},
                "pids": {"pids.max": "max"},
            }[h]
            for file, text in defaults.items():
                (d / file).write_text(text + "\n")
    return tmp_path


def test_the_cgroups_and_amounts_enforceNodeAllocatable_names() -> None:
    system, kube = reserved_cgroups(config())
    assert (system.key, system.field, system.name) == (
        "system-reserved",
        "systemReservedCgroup",
        "/system.slice",
    )
    assert dict(system.amounts) == {"cpu": 500, "memory": GI, "pid": 1000}
    # ephemeral-storage is not a cgroup limit
    assert (kube.name, dict(kube.amounts)) == ("/klet-test/kube", {"memory": 256 * 1024**2})
    assert reserved_cgroups(config(enforce_node_allocatable=("pods",))) == ()


def test_compressible_keys_keep_the_cpu_alone() -> None:
    cfg = config(enforce_node_allocatable=("system-reserved-compressible",))
    (rc,) = reserved_cgroups(cfg)
    assert rc.compressible
    assert dict(rc.amounts) == {"cpu": 500}
    assert rc.files() == ({"cpu": {"cpu.shares": "512"}}, {"cpu.weight": "20"})
    assert rc.hierarchies() == ("cpu",)


def test_files_of_each_reserved_resource() -> None:
    (system, _) = reserved_cgroups(config())
    v1, v2 = system.files()
    assert v1 == {
        "cpu": {"cpu.shares": "512"},
        "memory": {"memory.limit_in_bytes": str(GI)},
        "pids": {"pids.max": "1000"},
    }
    assert v2 == {"cpu.weight": "20", "memory.max": str(GI), "pids.max": "1000"}
    nothing = ReservedCgroup(key="kube-reserved", field="kubeReservedCgroup", name="/k", amounts={})
    assert nothing.files() == ({}, {})


def test_v1_limits_written_on_the_existing_cgroup(tmp_path: Path) -> None:
    root = v1_tree(tmp_path, "/system.slice", "/klet-test/kube")
    (system, kube) = reserved_cgroups(config())
    assert write_existing(system, root) == []
    assert write_existing(kube, root) == []
    assert (root / "cpu/system.slice/cpu.shares").read_text() == "512"
    assert (root / "memory/system.slice/memory.limit_in_bytes").read_text() == str(GI)
    assert (root / "pids/system.slice/pids.max").read_text() == "1000"
    # only what is reserved: kubeReserved has no cpu nor pid
    assert (root / "memory/klet-test/kube/memory.limit_in_bytes").read_text() == str(256 * 1024**2)
    assert (root / "cpu/klet-test/kube/cpu.shares").read_text() == "1024\n"
    assert (root / "pids/klet-test/kube/pids.max").read_text() == "max\n"


def test_v2_limits_written_on_the_existing_cgroup(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpu memory pids\n")
    (tmp_path / "system.slice").mkdir()
    for file, text in (("cpu.weight", "100"), ("memory.max", "max"), ("pids.max", "max")):
        (tmp_path / "system.slice" / file).write_text(text + "\n")
    (system, _) = reserved_cgroups(config())
    assert write_existing(system, tmp_path) == []
    d = tmp_path / "system.slice"
    assert [(d / f).read_text() for f in ("cpu.weight", "memory.max", "pids.max")] == [
        "20",
        str(GI),
        "1000",
    ]


def test_a_missing_cgroup_is_never_created(tmp_path: Path) -> None:
    root = v1_tree(tmp_path)
    (system, _) = reserved_cgroups(config())
    assert write_existing(system, root) == ["/system.slice does not exist"]
    assert not any((root / h / "system.slice").exists() for h in ("cpu", "memory", "pids"))


def test_start_refusal_names_the_field_path_and_key(tmp_path: Path) -> None:
    root = v1_tree(tmp_path, "/klet-test/kube")
    assert missing_reserved_cgroups(reserved_cgroups(config()), root) == [
        "systemReservedCgroup: /system.slice does not exist "
        "(enforceNodeAllocatable has system-reserved)"
    ]


def test_a_cgroup_missing_from_one_hierarchy_is_refused_naming_it(tmp_path: Path) -> None:
    root = v1_tree(tmp_path, "/system.slice", hierarchies=("cpu", "memory"))
    cfg = config(enforce_node_allocatable=("system-reserved", "system-reserved-compressible"))
    # the compressible key only writes cpu, where the cgroup is: refused once
    assert missing_reserved_cgroups(reserved_cgroups(cfg), root) == [
        "systemReservedCgroup: /system.slice does not exist in the cgroup v1 pids hierarchy "
        "(enforceNodeAllocatable has system-reserved)"
    ]
    compressible = config(enforce_node_allocatable=("system-reserved-compressible",))
    assert missing_reserved_cgroups(reserved_cgroups(compressible), root) == []


def test_events_of_success_in_upstreams_order(tmp_path: Path) -> None:
    root = v1_tree(tmp_path, "/system.slice", "/klet-test/kube")
    cfg = config(
        enforce_node_allocatable=(
            "kube-reserved-compressible",
            "system-reserved",
            "kube-reserved",
        )
    )
    events: list[tuple[str, str, str]] = []
    assert (
        asyncio.run(
            enforce_reserved(
                reserved_cgroups(cfg), emit=lambda *e: events.append(e), write=cgroupfs_writer(root)
            )
        )
        == ""
    )
    assert events == [
        ("Normal", ENFORCED, "Updated limits on system reserved cgroup /system.slice"),
        ("Normal", ENFORCED, "Updated limits on kube reserved cgroup /klet-test/kube"),
        ("Normal", ENFORCED, "Updated limits on kube reserved cgroup /klet-test/kube"),
    ]
    assert ENFORCED == "NodeAllocatableEnforced"


def test_a_refused_write_is_a_warning_naming_the_cgroup_and_cause(tmp_path: Path) -> None:
    root = v1_tree(tmp_path, "/system.slice", "/klet-test/kube")
    # the kernel refuses a limit (EBUSY under usage): here a directory where the file is
    limit = root / "memory/system.slice/memory.limit_in_bytes"
    limit.unlink()
    limit.mkdir()
    events: list[tuple[str, str, str]] = []
    failure = asyncio.run(
        enforce_reserved(
            reserved_cgroups(config()),
            emit=lambda *e: events.append(e),
            write=cgroupfs_writer(root),
        )
    )
    assert failure.startswith(
        'Failed to enforce System Reserved Cgroup Limits on "/system.slice": '
        f"{limit}: Is a directory"
    )
    assert events == [("Warning", FAILED, failure)]  # and kube-reserved is not tried

    cfg = config(
        enforce_node_allocatable=("kube-reserved-compressible",), kube_reserved_cgroup="/x"
    )
    events.clear()
    failure = asyncio.run(
        enforce_reserved(
            reserved_cgroups(cfg), emit=lambda *e: events.append(e), write=cgroupfs_writer(root)
        )
    )
    assert events == [
        (
            "Warning",
            FAILED,
            'Failed to enforce Kube Reserved Compressible Cgroup Limits on "/x": /x does not exist',
        )
    ]


class Stream:
    def __init__(self) -> None:
        self.published: list[EventRecord] = []

    async def publish_many(self, records: Sequence[EventRecord]) -> list[str]:
        self.published.extend(records)
        return [str(len(self.published))] * len(records)


async def test_a_failure_ends_the_task_once_its_warning_is_on_the_bus(tmp_path: Path) -> None:
    root = v1_tree(tmp_path, "/klet-test/kube")
    stream = Stream()
    queue = EventQueue(stream, cap=10)
    publisher = asyncio.create_task(queue.run())
    node = node_reference("n1")
    try:
        with pytest.raises(ReservedCgroupFailed, match="/system.slice does not exist"):
            await asyncio.wait_for(
                run_enforcement(
                    reserved_cgroups(config()),
                    emit=lambda t, r, m: queue.emit(node, t, r, m),
                    events=queue,
                    root=root,
                ),
                2.0,
            )
    finally:
        publisher.cancel()
        await asyncio.gather(publisher, return_exceptions=True)
    assert [(r.type, r.reason, r.involved["kind"]) for r in stream.published] == [
        ("Warning", FAILED, "Node")
    ]


async def test_success_keeps_the_task_running(tmp_path: Path) -> None:
    root = v1_tree(tmp_path, "/system.slice", "/klet-test/kube")
    events: list[tuple[str, str, str]] = []
    task = asyncio.create_task(
        run_enforcement(
            reserved_cgroups(config()),
            emit=lambda *e: events.append(e),
            events=EventQueue(Stream(), cap=10),
            root=root,
        )
    )
    await asyncio.sleep(0.05)
    assert not task.done()
    assert [e[0] for e in events] == ["Normal", "Normal"]
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


class Units:
    """systemd as SliceWriter sees it: units by name with their active state."""

    def __init__(self, **states: str) -> None:
        self.states = states
        self.set: list[tuple[str, list[Any]]] = []

    async def unit_active_state(self, unit: str) -> str:
        return self.states.get(unit, "")

    async def set_properties(self, unit: str, properties: list[Any]) -> None:
        self.set.append((unit, properties))


def test_the_systemd_driver_sets_only_the_reserved_limits_on_the_unit() -> None:
    units = Units(**{"system.slice": "active", "kube.slice": "active"})
    cfg = config(kube_reserved_cgroup="/kube.slice")
    writer = SliceWriter(units, cgroup_version=1)
    events: list[tuple[str, str, str]] = []
    cgroups = reserved_cgroups(cfg)
    assert asyncio.run(missing_reserved_slices(cgroups, writer)) == []
    assert (
        asyncio.run(enforce_reserved(cgroups, emit=lambda *e: events.append(e), write=writer)) == ""
    )
    assert units.set == [
        (
            "system.slice",
            [("CPUShares", "t", 512), ("MemoryLimit", "t", GI), ("TasksMax", "t", 1000)],
        ),
        ("kube.slice", [("MemoryLimit", "t", 256 << 20)]),
    ]
    assert [e[1] for e in events] == [ENFORCED, ENFORCED]
    v2 = SliceWriter(units, cgroup_version=2)
    assert v2.properties(cgroups[0])[:2] == [("CPUWeight", "t", 20), ("MemoryMax", "t", GI)]


def test_the_systemd_driver_refuses_a_unit_that_is_not_active() -> None:
    units = Units(**{"system.slice": "inactive"})
    writer = SliceWriter(units, cgroup_version=1)
    assert asyncio.run(missing_reserved_slices(reserved_cgroups(config()), writer)) == [
        "systemReservedCgroup: /system.slice does not exist (systemd unit system.slice: "
        "inactive) (enforceNodeAllocatable has system-reserved)",
        "kubeReservedCgroup: /klet-test/kube does not exist (systemd unit kube: not loaded) "
        "(enforceNodeAllocatable has kube-reserved)",
    ]
    assert units.set == []
