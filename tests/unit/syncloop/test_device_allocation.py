"""Device plugin decisions (klet.syncloop.devices.allocation): which resources are a
device plugin's, what a pod holds at its peak (init containers' devices reused, sidecars
kept), admission's verdict in upstream's words, and which device IDs a container gets."""

from __future__ import annotations

from typing import Any

import pytest
from klet.syncloop.devices.allocation import (
    AllocationError,
    ResourceCount,
    container_devices,
    devices_verdict,
    is_device_resource,
    pick_devices,
    pod_devices,
)


def c(name: str, **limits: Any) -> dict[str, Any]:
    return {
        "name": name,
        "resources": {
            "limits": {
                k.replace("_com_", ".com/").replace("_io_", ".io/"): v for k, v in limits.items()
            }
        },
    }


def pod(*containers: dict[str, Any], init: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    return {
        "metadata": {"uid": "u"},
        "spec": {"containers": list(containers), "initContainers": list(init)},
    }


@pytest.mark.parametrize(
    ("name", "device"),
    [
        ("example.com/foo", True),
        ("nvidia.com/gpu", True),
        ("cpu", False),
        ("hugepages-2Mi", False),
        ("kubernetes.io/foo", False),
        ("node.kubernetes.io/x", False),
        ("requests.example.com/foo", False),
    ],
)
def test_device_resource_names(name: str, device: bool) -> None:
    assert is_device_resource(name) is device


def test_container_devices_from_limits_only() -> None:
    container = {
        "name": "a",
        "resources": {
            "limits": {"example.com/foo": "2", "cpu": "1"},
            "requests": {"example.com/bar": "1"},
        },
    }
    assert container_devices(container) == {"example.com/foo": 2}
    assert container_devices({"name": "b"}) == {}


def test_pod_peak_reuses_init_devices_and_keeps_sidecars() -> None:
    init = (
        c("init", example_com_foo=3),
        {**c("sidecar", example_com_foo=1), "restartPolicy": "Always"},
        c("late-init", example_com_foo=2),
    )
    p = pod(c("a", example_com_foo=1), c("b", example_com_foo=1, example_com_bar=1), init=init)
    # init alone 3; the later init with the sidecar 1+2; the regular ones 2 + sidecar 1.
    assert pod_devices(p) == {"example.com/bar": 1, "example.com/foo": 3}
    assert pod_devices(pod(c("a", cpu="1"))) == {}


FOO = "example.com/foo"


def test_admission_counts_healthy_minus_what_admitted_pods_need() -> None:
    counts = {FOO: ResourceCount(registered=True, healthy=2)}
    one = pod(c("a", example_com_foo=1))
    two = pod(c("a", example_com_foo=2))
    assert devices_verdict(one, others=[one], counts=counts) is None
    assert devices_verdict(two, others=[one], counts=counts) == (
        "UnexpectedAdmissionError",
        "Allocate failed due to requested number of devices unavailable for example.com/foo. "
        "Requested: 2, Available: 1, which is unexpected",
    )
    # a resource no plugin ever served is not the device manager's
    assert devices_verdict(pod(c("a", other_io_x=5)), others=[], counts=counts) is None


def test_admission_of_unregistered_and_unhealthy_resources() -> None:
    one = pod(c("a", example_com_foo=1))
    assert devices_verdict(one, others=[], counts={FOO: ResourceCount(False, 0)}) == (
        "UnexpectedAdmissionError",
        "Allocate failed due to cannot allocate unregistered device example.com/foo, "
        "which is unexpected",
    )
    assert devices_verdict(one, others=[], counts={FOO: ResourceCount(True, 0)}) == (
        "UnexpectedAdmissionError",
        "Allocate failed due to no healthy devices present; cannot allocate unhealthy devices "
        "example.com/foo, which is unexpected",
    )


def test_pick_reusable_then_preferred_then_in_plugin_order() -> None:
    healthy = ["d0", "d1", "d2", "d3"]
    assert pick_devices(FOO, 2, healthy=healthy, in_use={"d0"}) == ["d1", "d2"]
    assert pick_devices(FOO, 2, healthy=healthy, in_use=set(), preferred=["d3", "d9"]) == [
        "d3",
        "d0",
    ]
    assert pick_devices(
        FOO, 2, healthy=healthy, in_use={"d1"}, reusable=["d2"], preferred=["d3"]
    ) == [
        "d2",
        "d3",
    ]
    # a reusable device that turned unhealthy is not given again
    assert pick_devices(FOO, 1, healthy=healthy, in_use=set(), reusable=["gone"]) == ["d0"]
    assert pick_devices(FOO, 0, healthy=healthy, in_use=set()) == []


def test_pick_refuses_when_too_few_are_free() -> None:
    with pytest.raises(
        AllocationError,
        match=r"devices unavailable for example.com/foo. Requested: 2, Available: 1",
    ):
        pick_devices(FOO, 2, healthy=["d0", "d1"], in_use={"d0"})
