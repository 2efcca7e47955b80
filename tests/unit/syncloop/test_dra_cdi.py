"""A container's CDI devices from its pod's prepared claims (klet.syncloop.dra.cdi) and
their way into the CRI config (criconfig.Instance.dra_cdi_devices).

As upstream's DRA GetResources: only the pod claims the container names in
resources.claims count; a claim by resourceClaimName, or by template through
status.resourceClaimStatuses (an entry without a name skipped, no entry an error
naming the pod claim); the request's devices (all when the container names no request);
a used claim that is not prepared is an error naming it. In the CRI config the DRA
devices come before the device plugins' CDI devices, on the wire as CDI_devices, and
no CDI annotation is added (upstream dropped them in 1.31)."""

from __future__ import annotations

import pytest
from klet.cri.client import _container_pb
from klet.model.dra import PreparedDevice
from klet.syncloop.containers import criconfig
from klet.syncloop.devices.allocation import DeviceRunOptions
from klet.syncloop.dra.cdi import ClaimResolutionError, claim_name, container_cdi_devices
from klet.syncloop.dra.claiminfo import ClaimInfo

GPU = ClaimInfo(
    claim_uid="u-gpu",
    claim_name="gpu",
    namespace="ns",
    driver_state={
        "gpu.example.com": (
            PreparedDevice("pool", "g0", ("big",), ("gpu.example.com/gpu=g0",)),
            PreparedDevice("pool", "g1", ("small",), ("gpu.example.com/gpu=g1",)),
        )
    },
)
NIC = ClaimInfo(
    claim_uid="u-nic",
    claim_name="pod-nic-x7",
    namespace="ns",
    driver_state={"nic.example.com": (PreparedDevice("p", "n0", (), ("nic.example.com/nic=n0",)),)},
)
PREPARED = {GPU.key: GPU, NIC.key: NIC}


def _pod(*, statuses: list[dict[str, str]] | None = None) -> dict[str, object]:
    return {
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {
            "resourceClaims": [
                {"name": "accel", "resourceClaimName": "gpu"},
                {"name": "net", "resourceClaimTemplateName": "nic-template"},
            ]
        },
        "status": {
            "resourceClaimStatuses": statuses
            if statuses is not None
            else [{"name": "net", "resourceClaimName": "pod-nic-x7"}]
        },
    }


def _container(*claims: dict[str, str]) -> dict[str, object]:
    return {"name": "main", "resources": {"claims": list(claims)}}


def test_the_container_gets_the_devices_of_the_claims_it_names() -> None:
    pod = _pod()
    assert container_cdi_devices(pod, _container({"name": "accel"}), PREPARED) == (
        "gpu.example.com/gpu=g0",
        "gpu.example.com/gpu=g1",
    )
    assert container_cdi_devices(
        pod, _container({"name": "accel", "request": "small"}), PREPARED
    ) == ("gpu.example.com/gpu=g1",)
    # The pod's claim order, not the container's.
    assert container_cdi_devices(
        pod, _container({"name": "net"}, {"name": "accel", "request": "big"}), PREPARED
    ) == ("gpu.example.com/gpu=g0", "nic.example.com/nic=n0")
    assert container_cdi_devices(pod, {"name": "sidecar"}, PREPARED) == ()


def test_a_template_claim_is_found_through_the_pod_status() -> None:
    assert claim_name(_pod(), {"name": "net", "resourceClaimTemplateName": "t"}) == "pod-nic-x7"
    unneeded = _pod(statuses=[{"name": "net"}])
    assert claim_name(unneeded, {"name": "net", "resourceClaimTemplateName": "t"}) is None
    assert container_cdi_devices(unneeded, _container({"name": "net"}), PREPARED) == ()
    with pytest.raises(ClaimResolutionError, match=r"pod ns/p: spec.resourceClaims\['net'\]"):
        container_cdi_devices(_pod(statuses=[]), _container({"name": "accel"}), PREPARED)
    with pytest.raises(ClaimResolutionError, match="neither resourceClaimName"):
        claim_name(_pod(), {"name": "odd"})


def test_a_used_claim_that_is_not_prepared_is_an_error_naming_it() -> None:
    with pytest.raises(ClaimResolutionError, match="ns/gpu .*'accel'.* not prepared"):
        container_cdi_devices(_pod(), _container({"name": "accel"}), {NIC.key: NIC})


def test_dra_devices_go_to_cri_before_the_device_plugins() -> None:
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u"}, "spec": {}}
    cfg = criconfig.container_config(
        pod,
        {"name": "main"},
        instance=criconfig.Instance(
            restart_count=0,
            image="sha256:img",
            allocated=DeviceRunOptions(cdi_devices=("example.com/foo=d1",)),
            dra_cdi_devices=("gpu.example.com/gpu=g0",),
        ),
        node=criconfig.NodeContext(),
    )
    assert cfg.cdi_devices == ("gpu.example.com/gpu=g0", "example.com/foo=d1")
    assert [d.name for d in _container_pb(cfg).CDI_devices] == list(cfg.cdi_devices)
    assert not any("cdi" in key for key in cfg.annotations)
