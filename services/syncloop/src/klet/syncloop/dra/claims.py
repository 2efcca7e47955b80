"""May this pod use this ResourceClaim, and what must be prepared for it.

Upstream's DRA manager (pkg/kubelet/cm/dra/manager.go, v1.34 PrepareResources) checks
each claim it read from the apiserver before it calls any driver: a claim made from the
pod's template must be controlled by the pod (resourceclaim.IsForPod: same namespace and
an owner reference with `controller: true` and the pod's UID), every claim must list the
pod's UID in `status.reservedFor` (the scheduler reserved it for this pod), and it must
be allocated; the drivers to call are those of its allocation results
(newClaimInfoFromClaim). `claim_to_prepare` is those checks as a pure function over the
claim's JSON, giving the claim info to cache (no devices yet: the drivers' answers add
them) or an error worded as upstream's. The apiserver read and the driver calls are the
caller's (manager.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from klet.syncloop.dra.claiminfo import ClaimInfo


class ClaimNotUsable(ValueError):
    """The pod may not use the claim, or it is not ready to be prepared; says why."""


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def is_for_pod(pod: Mapping[str, Any], claim: Mapping[str, Any]) -> bool:
    """The claim is the pod's own (made from its template): same namespace, controlled
    by the pod."""
    pod_meta, claim_meta = _meta(pod), _meta(claim)
    if claim_meta.get("namespace") != pod_meta.get("namespace"):
        return False
    return any(
        ref.get("controller") is True and ref.get("uid") == pod_meta.get("uid")
        for ref in claim_meta.get("ownerReferences") or ()
    )


def is_reserved_for_pod(pod: Mapping[str, Any], claim: Mapping[str, Any]) -> bool:
    uid = _meta(pod).get("uid")
    return any(r.get("uid") == uid for r in (claim.get("status") or {}).get("reservedFor") or ())


def claim_to_prepare(
    pod: Mapping[str, Any], *, from_template: bool, claim: Mapping[str, Any]
) -> ClaimInfo:
    """The claim info to cache for `claim`, which the pod names (`from_template`: through a
    resourceClaimTemplateName, so it must be the pod's own); its drivers are the keys
    of `driver_state`, each with no devices yet. ClaimNotUsable otherwise."""
    pod_meta, claim_meta = _meta(pod), _meta(claim)
    pod_ref = f"{pod_meta.get('namespace', '')}/{pod_meta.get('name', '')}"
    claim_ref = f"{claim_meta.get('namespace', '')}/{claim_meta.get('name', '')}"
    if from_template and not is_for_pod(pod, claim):
        raise ClaimNotUsable(
            f"ResourceClaim {claim_ref} was not created for pod {pod_ref} (pod is not owner)"
        )
    if not is_reserved_for_pod(pod, claim):
        raise ClaimNotUsable(
            f"pod {pod_meta.get('name', '')} ({pod_meta.get('uid', '')}) is not allowed to "
            f"use ResourceClaim {claim_meta.get('name', '')} ({claim_meta.get('uid', '')})"
        )
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise ClaimNotUsable(f"ResourceClaim {claim_meta.get('name', '')}: not allocated")
    results = (allocation.get("devices") or {}).get("results") or ()
    return ClaimInfo(
        claim_uid=str(claim_meta.get("uid", "")),
        claim_name=str(claim_meta.get("name", "")),
        namespace=str(claim_meta.get("namespace", "")),
        driver_state={str(r.get("driver", "")): () for r in results},
    )
