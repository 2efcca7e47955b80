"""The topology manager's admit handler (klet.syncloop.topologymanager.manager) and the
device manager's hints (devicehints), on a fake two-node machine: devices that report
topology give hints from the free healthy devices, those without topology no
preference, held ones their own nodes; a pod whose GPU is on one node and NIC on the
other is refused by single-numa-node and restricted with upstream's reason and message
and admitted by best-effort, at container and at pod scope; an aligned pod is admitted
and its hint kept for the allocators, which get "no preference" under policy none;
an allocator's failure is upstream's unexpected admission error."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from klet.model.devices import Device
from klet.model.types import JSON
from klet.syncloop.topologymanager.devicehints import DeviceHints, device_hints
from klet.syncloop.topologymanager.hints import NUMAInfo, TopologyHint, mask_of
from klet.syncloop.topologymanager.manager import (
    NO_PREFERENCE,
    TOPOLOGY_AFFINITY_ERROR,
    TOPOLOGY_AFFINITY_MESSAGE,
    TopologyManager,
)

TWO = NUMAInfo((0, 1))


class Held:
    def __init__(self, ids: set[str]) -> None:
        self.ids = ids

    def devices(self) -> set[str]:
        return self.ids


class FakeDevices:
    """Listed devices and allocations, as the device manager keeps them."""

    def __init__(self, listed: dict[str, list[Device]]) -> None:
        self.listed = listed
        self._held: dict[tuple[str, str, str], Held] = {}

    def listed_devices(self) -> dict[str, list[Device]]:
        return self.listed

    @property
    def held(self) -> Mapping[tuple[str, str, str], Held]:
        return self._held


class RecordingAllocator:
    def __init__(self, fail: str | None = None) -> None:
        self.calls: list[tuple[str, TopologyHint]] = []
        self.fail = fail

    def allocate(self, pod: JSON, container: JSON, hint: TopologyHint) -> str | None:
        self.calls.append((str(container["name"]), hint))
        return self.fail


def gpu_pod(uid: str, **limits: int) -> JSON:
    return {
        "metadata": {"uid": uid, "name": uid, "namespace": "default"},
        "spec": {
            "containers": [
                {
                    "name": "app",
                    "resources": {
                        "limits": {k.replace("_", "/"): str(v) for k, v in limits.items()}
                    },
                }
            ]
        },
    }


def machine() -> FakeDevices:
    return FakeDevices(
        {
            "vendor/gpu": [Device("gpu0", "Healthy", (0,)), Device("gpu1", "Healthy", (0,))],
            "vendor/nic": [Device("nic1", "Healthy", (1,))],
            "vendor/plain": [Device("p0", "Healthy")],
        }
    )


def test_device_hints() -> None:
    devices = [Device("a", "Healthy", (0,)), Device("b", "Healthy", (1,))]
    assert device_hints((0, 1), devices, {"a", "b"}, 1) == [
        TopologyHint(1, True),
        TopologyHint(2, True),
        TopologyHint(3, False),
    ]
    assert device_hints((0, 1), devices, {"a", "b"}, 2) == [TopologyHint(3, True)]
    assert device_hints((0, 1), devices, {"b"}, 1) == [
        TopologyHint(2, True),
        TopologyHint(3, False),
    ]


def test_the_device_managers_hints() -> None:
    fake = machine()
    hints = DeviceHints(fake, (0, 1))
    p = gpu_pod("a", vendor_gpu=1, vendor_plain=1, vendor_nic=1)
    got = hints.topology_hints(p, p["spec"]["containers"][0]) or {}
    assert got["vendor/plain"] is None  # no topology: no preference
    assert list(got["vendor/nic"] or ()) == [TopologyHint(2, True), TopologyHint(3, False)]
    fake._held[("other", "app", "vendor/gpu")] = Held({"gpu0", "gpu1"})
    got = hints.topology_hints(p, p["spec"]["containers"][0]) or {}
    assert got["vendor/gpu"] == []  # none free
    fake._held = {("a", "app", "vendor/gpu"): Held({"gpu1"})}
    got = hints.topology_hints(p, p["spec"]["containers"][0]) or {}
    assert list(got["vendor/gpu"] or ()) == [TopologyHint(1, True), TopologyHint(3, False)]


@pytest.mark.parametrize("scope", ["container", "pod"])
def test_devices_that_cannot_align_are_refused(scope: str) -> None:
    p = gpu_pod("a", vendor_gpu=1, vendor_nic=1)  # GPU only on node 0, NIC only on node 1
    for policy in ("single-numa-node", "restricted"):
        allocator = RecordingAllocator()
        tm = TopologyManager(
            policy=policy,
            scope=scope,
            numa=TWO,
            providers=[DeviceHints(machine(), (0, 1))],
            allocators=[allocator],
        )
        assert tm.admit("a", p, []) == (TOPOLOGY_AFFINITY_ERROR, TOPOLOGY_AFFINITY_MESSAGE)
        assert TOPOLOGY_AFFINITY_MESSAGE == "Resources cannot be allocated with Topology locality"
        assert allocator.calls == []
    allocator = RecordingAllocator()
    tm = TopologyManager(
        policy="best-effort",
        scope=scope,
        numa=TWO,
        providers=[DeviceHints(machine(), (0, 1))],
        allocators=[allocator],
    )
    assert tm.admit("a", p, []) is None
    # upstream's best non-preferred hint: as narrow as the widest narrowest hint (one node)
    assert allocator.calls == [("app", TopologyHint(mask_of([0]), False))]


def test_an_aligned_pod_is_admitted_and_its_hint_kept() -> None:
    allocator = RecordingAllocator()
    tm = TopologyManager(
        policy="single-numa-node",
        scope="container",
        numa=TWO,
        providers=[DeviceHints(machine(), (0, 1))],
        allocators=[allocator],
    )
    p = gpu_pod("a", vendor_gpu=2, vendor_plain=1)
    assert tm.admit("a", p, []) is None
    assert tm.affinity("a", "app") == TopologyHint(mask_of([0]), True)
    assert allocator.calls == [("app", TopologyHint(1, True))]
    tm.release([])
    assert tm.affinity("a", "app") == NO_PREFERENCE


def test_policy_none_allocates_without_a_preference_and_failures_are_unexpected() -> None:
    allocator = RecordingAllocator()
    tm = TopologyManager(policy="none", scope="container", numa=TWO, allocators=[allocator])
    assert tm.admit("a", gpu_pod("a"), []) is None
    assert allocator.calls == [("app", NO_PREFERENCE)]
    failing = TopologyManager(
        policy="none",
        scope="container",
        numa=TWO,
        allocators=[RecordingAllocator("[memorymanager] no room")],
    )
    assert failing.admit("a", gpu_pod("a"), []) == (
        "UnexpectedAdmissionError",
        "Allocate failed due to [memorymanager] no room, which is unexpected",
    )
