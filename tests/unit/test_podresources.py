"""The PodResources API's answers as values (klet.model.podresources): which containers
a pod's answer names (sidecars, then regular containers; run-to-completion init
containers left out), devices one per entry and NUMA node (no topology for NO_NUMA),
allocatable devices the healthy ones only, Get's lookup by namespace and name, and
upstream's token bucket (burst 10 at start, 100 per second refill, capped at 10)."""

from __future__ import annotations

import pytest
from klet.model.devices import Device
from klet.model.podresources import (
    NO_NUMA,
    ContainerDevices,
    ContainerResources,
    PodResources,
    TokenBucket,
    allocatable_devices,
    find_pod,
    held_devices,
    listed_containers,
    pod_not_found,
    pod_resources,
)
from klet.model.types import JSON

FOO = "example.com/foo"
BAR = "example.com/bar"

POD: JSON = {
    "metadata": {"name": "web", "namespace": "ns1", "uid": "u1"},
    "spec": {
        "initContainers": [
            {"name": "setup"},
            {"name": "proxy", "restartPolicy": "Always"},
        ],
        "containers": [{"name": "main"}, {"name": "side"}],
    },
}


def test_listed_containers_are_sidecars_then_regular_ones() -> None:
    assert listed_containers(POD) == ["proxy", "main", "side"]
    assert listed_containers({"spec": {}}) == []


def test_held_devices_one_entry_per_device_and_numa_node() -> None:
    held = {
        FOO: {NO_NUMA: ["foo-1", "foo-0"]},
        BAR: {0: ["bar-0"], 1: ["bar-0", "bar-1"]},
    }
    assert held_devices(held) == (
        ContainerDevices(BAR, "bar-0", 0),
        ContainerDevices(BAR, "bar-0", 1),
        ContainerDevices(BAR, "bar-1", 1),
        ContainerDevices(FOO, "foo-0", None),
        ContainerDevices(FOO, "foo-1", None),
    )
    assert held_devices({FOO: {NO_NUMA: None}}) == ()


def test_allocatable_devices_are_the_healthy_ones() -> None:
    listed = {
        FOO: [Device("foo-0", "Healthy"), Device("foo-1", "Unhealthy")],
        BAR: [Device("bar-0", "Healthy", (0, 1))],
    }
    assert allocatable_devices(listed) == (
        ContainerDevices(BAR, "bar-0", 0),
        ContainerDevices(BAR, "bar-0", 1),
        ContainerDevices(FOO, "foo-0", None),
    )
    assert allocatable_devices({FOO: [Device("foo-1", "Unhealthy")]}) == ()


def test_pod_resources_gives_each_listed_container_its_devices_and_cpus() -> None:
    asked: list[tuple[str, str]] = []

    def devices_of(uid: str, name: str) -> dict[str, dict[int, list[str]]]:
        asked.append((uid, name))
        return {FOO: {NO_NUMA: ["foo-0"]}} if name == "main" else {}

    def cpus_of(uid: str, name: str) -> list[int]:
        return [3, 1] if name == "side" else []

    assert pod_resources(POD, devices_of=devices_of, cpus_of=cpus_of) == PodResources(
        name="web",
        namespace="ns1",
        containers=(
            ContainerResources("proxy"),
            ContainerResources("main", devices=(ContainerDevices(FOO, "foo-0"),)),
            ContainerResources("side", cpu_ids=(1, 3)),
        ),
    )
    assert asked == [("u1", "proxy"), ("u1", "main"), ("u1", "side")]


def test_find_pod_by_namespace_and_name() -> None:
    other: JSON = {"metadata": {"name": "web", "namespace": "ns2"}}
    assert find_pod([other, POD], "ns1", "web") is POD
    assert find_pod([other, POD], "ns3", "web") is None
    assert pod_not_found("ns3", "web") == "pod web in namespace ns3 not found"


def test_token_bucket_burst_then_refill_at_qps() -> None:
    bucket = TokenBucket()  # upstream's 100 qps, burst 10
    assert [bucket.allow(5.0) for _ in range(11)] == [True] * 10 + [False]
    assert not bucket.allow(5.004)  # 0.4 of a token
    assert bucket.allow(5.0125)  # 1.25 tokens after 12.5 ms
    assert not bucket.allow(5.0125)
    # A long pause fills the bucket to its burst, never beyond.
    assert [bucket.allow(60.0) for _ in range(11)] == [True] * 10 + [False]


@pytest.mark.parametrize(("qps", "burst"), [(1.0, 1), (2.0, 3)])
def test_token_bucket_takes_its_settings(qps: float, burst: int) -> None:
    bucket = TokenBucket(qps=qps, burst=burst)
    assert sum(bucket.allow(0.0) for _ in range(10)) == burst
    assert sum(bucket.allow(1.0) for _ in range(10)) == int(qps)
