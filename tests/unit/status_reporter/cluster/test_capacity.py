"""Node capacity and allocatable: canonical quantity spelling, and allocatable as
capacity minus kubeReserved, systemReserved and the hard eviction thresholds
(memory.available for memory, nodefs.available for ephemeral storage, percentages of
capacity), huge pages taken out of memory, never below zero."""

from __future__ import annotations

import pytest
from klet.status_reporter.cluster.capacity import (
    MachineInfo,
    allocatable,
    capacity,
    format_bytes,
    format_cpu,
    reservation,
)

GI = 1024**3
MI = 1024**2


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0"),
        (512, "512"),
        (1024, "1Ki"),
        (1536 * 1024, "1536Ki"),
        (16 * MI, "16Mi"),
        (8 * GI, "8Gi"),
        (1_000_000, "1000000"),
        (2**60, "1Ei"),
        (2**70, "1024Ei"),
    ],
)
def test_format_bytes(n: int, text: str) -> None:
    assert format_bytes(n) == text


@pytest.mark.parametrize(("millis", "text"), [(4000, "4"), (3900, "3900m"), (0, "0"), (50, "50m")])
def test_format_cpu(millis: int, text: str) -> None:
    assert format_cpu(millis) == text


MACHINE = MachineInfo(cpus=4, memory_bytes=8 * GI, ephemeral_storage_bytes=100 * GI)


def test_capacity() -> None:
    assert capacity(MACHINE, max_pods=110) == {
        "cpu": "4",
        "memory": "8Gi",
        "ephemeral-storage": "100Gi",
        "pods": "110",
    }


def test_capacity_lists_hugepages() -> None:
    machine = MachineInfo(
        cpus=2, memory_bytes=4 * GI, ephemeral_storage_bytes=GI, hugepages={2 * MI: 64 * MI, GI: 0}
    )
    cap = capacity(machine, max_pods=10)
    assert cap["hugepages-2Mi"] == "64Mi"
    assert cap["hugepages-1Gi"] == "0"


@pytest.mark.parametrize(
    ("kube", "system", "hard", "want"),
    [
        # Upstream defaults: memory.available 100Mi, nodefs.available 10%.
        (
            {},
            {},
            {"memory.available": "100Mi", "nodefs.available": "10%", "imagefs.available": "15%"},
            {"cpu": "4", "memory": "8092Mi", "ephemeral-storage": "90Gi"},
        ),
        # No thresholds, no reservations: allocatable is capacity.
        ({}, {}, {}, {"cpu": "4", "memory": "8Gi", "ephemeral-storage": "100Gi"}),
        # Both reservations add up; cpu in millicores.
        (
            {"cpu": "100m", "memory": "1Gi"},
            {"cpu": "0.5", "memory": "512Mi", "ephemeral-storage": "10Gi"},
            {},
            {"cpu": "3400m", "memory": "6656Mi", "ephemeral-storage": "90Gi"},
        ),
        # A percentage memory threshold is of memory capacity.
        ({}, {}, {"memory.available": "50%"}, {"cpu": "4", "memory": "4Gi"}),
        # Other signals and reservations (pid) do not touch allocatable.
        (
            {"pid": "1000"},
            {},
            {"pid.available": "10%", "nodefs.inodesFree": "5%"},
            {"cpu": "4", "memory": "8Gi", "ephemeral-storage": "100Gi", "pods": "110"},
        ),
        # Never below zero.
        ({"cpu": "8", "memory": "16Gi"}, {}, {}, {"cpu": "0", "memory": "0"}),
    ],
)
def test_allocatable(
    kube: dict[str, str], system: dict[str, str], hard: dict[str, str], want: dict[str, str]
) -> None:
    got = allocatable(
        MACHINE, max_pods=110, kube_reserved=kube, system_reserved=system, eviction_hard=hard
    )
    assert {k: got[k] for k in want} == want


def test_allocatable_memory_excludes_hugepages() -> None:
    machine = MachineInfo(
        cpus=1, memory_bytes=4 * GI, ephemeral_storage_bytes=GI, hugepages={2 * MI: GI}
    )
    got = allocatable(machine, max_pods=1, kube_reserved={}, system_reserved={}, eviction_hard={})
    assert got["memory"] == "3Gi"
    assert got["hugepages-2Mi"] == "1Gi"


def test_reservation_rejects_bad_quantity() -> None:
    with pytest.raises(ValueError):
        reservation(
            {"memory": GI}, kube_reserved={"memory": "lots"}, system_reserved={}, eviction_hard={}
        )
