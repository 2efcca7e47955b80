"""Whether a pod may use a ResourceClaim read from the apiserver, and what to prepare
(klet.syncloop.dra.claims), as upstream's PrepareResources checks: a template's claim
must be controlled by the pod (a non-controller owner reference or another namespace is
refused with upstream's "pod is not owner"); every claim must list the pod's UID in
reservedFor (upstream's "is not allowed to use" naming pod and claim UIDs); an
unallocated claim is refused ("not allocated"); a usable claim's info names the claim
and one entry per driver of its allocation results, with no devices yet."""

from __future__ import annotations

from typing import Any

import pytest
from klet.syncloop.dra.claims import ClaimNotUsable, claim_to_prepare, is_for_pod

POD = {"metadata": {"name": "web", "namespace": "ns", "uid": "pod-uid"}}


def _claim(
    *,
    owner: dict[str, Any] | None = None,
    reserved: tuple[str, ...] = ("pod-uid",),
    results: tuple[str, ...] | None = ("gpu.example.com", "nic.example.com", "gpu.example.com"),
    namespace: str = "ns",
) -> dict[str, Any]:
    status: dict[str, Any] = {"reservedFor": [{"resource": "pods", "uid": u} for u in reserved]}
    if results is not None:
        status["allocation"] = {
            "devices": {"results": [{"request": "r", "driver": d} for d in results]}
        }
    meta: dict[str, Any] = {"name": "web-gpu", "namespace": namespace, "uid": "claim-uid"}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return {"metadata": meta, "status": status}


OWNED = {"kind": "Pod", "name": "web", "uid": "pod-uid", "controller": True}


def test_a_usable_claim_gives_its_info_with_one_entry_per_driver() -> None:
    info = claim_to_prepare(POD, from_template=True, claim=_claim(owner=OWNED))
    assert (info.claim_uid, info.claim_name, info.namespace) == ("claim-uid", "web-gpu", "ns")
    assert dict(info.driver_state) == {"gpu.example.com": (), "nic.example.com": ()}
    assert info.pod_uids == frozenset()
    # A claim named directly needs no owner.
    assert claim_to_prepare(POD, from_template=False, claim=_claim()).claim_uid == "claim-uid"


def test_a_template_claim_must_be_the_pods_own() -> None:
    assert not is_for_pod(POD, _claim(owner={**OWNED, "controller": False}))
    assert not is_for_pod(POD, _claim(owner=OWNED, namespace="other"))
    with pytest.raises(ClaimNotUsable, match=r"ns/web-gpu was not created for pod ns/web"):
        claim_to_prepare(POD, from_template=True, claim=_claim())


def test_the_claim_must_be_reserved_for_the_pod_and_allocated() -> None:
    with pytest.raises(
        ClaimNotUsable, match=r"pod web \(pod-uid\) is not allowed to use .*web-gpu \(claim-uid\)"
    ):
        claim_to_prepare(POD, from_template=False, claim=_claim(reserved=("other",)))
    with pytest.raises(ClaimNotUsable, match="web-gpu: not allocated"):
        claim_to_prepare(POD, from_template=False, claim=_claim(results=None))
