"""Which CDI devices a container gets from its pod's prepared ResourceClaims.

As upstream's DRA manager GetResources (pkg/kubelet/cm/dra/manager.go, v1.34): for each
of the pod's `spec.resourceClaims` entries that the container names in
`resources.claims`, the claim's name is resolved (`resourceClaimName`, or for a
`resourceClaimTemplateName` the name the controller recorded in
`status.resourceClaimStatuses`; a recorded entry without a name means no claim was
needed and is skipped), and the prepared claim's CDI device IDs for the container's
request (all of them when it names none) are added, in the pod's claim order and then
the container's. They go to CRI `CDI_devices` (criconfig.Instance.dra_cdi_devices);
since 1.31 upstream no longer puts them in annotations as well.

A claim the container uses that is not prepared is an error (upstream's "internal
error: unable to get claim info"): creating the container without its devices would
run it on the wrong hardware. Pure: the prepared claims are an argument.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from klet.syncloop.dra.claiminfo import ClaimInfo


class ClaimResolutionError(ValueError):
    """The pod's claims cannot give the container its CDI devices; says which and why."""


def claim_name(pod: Mapping[str, Any], pod_claim: Mapping[str, Any]) -> str | None:
    """The ResourceClaim a `spec.resourceClaims` entry stands for (upstream's
    resourceclaim.Name); None when the template's claim was not needed."""
    meta = pod.get("metadata") or {}
    where = f"pod {meta.get('namespace', '')}/{meta.get('name', '')}"
    entry = pod_claim.get("name", "")
    if pod_claim.get("resourceClaimName"):
        return str(pod_claim["resourceClaimName"])
    if pod_claim.get("resourceClaimTemplateName"):
        for status in (pod.get("status") or {}).get("resourceClaimStatuses") or ():
            if status.get("name") == entry:
                name = status.get("resourceClaimName")
                return str(name) if name else None
        raise ClaimResolutionError(
            f"{where}: spec.resourceClaims[{entry!r}]: ResourceClaim not created yet "
            f"(no status.resourceClaimStatuses entry for it)"
        )
    raise ClaimResolutionError(
        f"{where}: spec.resourceClaims[{entry!r}] has neither resourceClaimName nor "
        f"resourceClaimTemplateName"
    )


def container_claim_infos(
    pod: Mapping[str, Any], container: Mapping[str, Any], prepared: Mapping[str, ClaimInfo]
) -> list[tuple[str, ClaimInfo]]:
    """(request, prepared claim) for each claim `container` names in `resources.claims`,
    in the pod's claim order and then the container's (upstream's GetContainerClaimInfos,
    which both the CDI devices and the PodResources API read); `prepared` is keyed by
    ClaimInfo.key (`<namespace>/<claim name>`). ClaimResolutionError naming a claim the
    container uses that is not prepared."""
    namespace = str((pod.get("metadata") or {}).get("namespace", ""))
    uses = (container.get("resources") or {}).get("claims") or ()
    found: list[tuple[str, ClaimInfo]] = []
    for pod_claim in (pod.get("spec") or {}).get("resourceClaims") or ():
        name = claim_name(pod, pod_claim)
        if name is None:
            continue
        for use in uses:
            if use.get("name") != pod_claim.get("name"):
                continue
            info = prepared.get(f"{namespace}/{name}")
            if info is None:
                raise ClaimResolutionError(
                    f"unable to get information for ResourceClaim {name}: container "
                    f"{container.get('name', '')!r} uses {namespace}/{name} "
                    f"(spec.resourceClaims[{pod_claim.get('name')!r}]), which is not "
                    f"prepared on this node"
                )
            found.append((str(use.get("request") or ""), info))
    return found


def container_cdi_devices(
    pod: Mapping[str, Any], container: Mapping[str, Any], prepared: Mapping[str, ClaimInfo]
) -> tuple[str, ...]:
    """The CDI device IDs for `container`; `prepared` is keyed by ClaimInfo.key
    (`<namespace>/<claim name>`)."""
    return tuple(
        device
        for request, info in container_claim_infos(pod, container, prepared)
        for device in info.cdi_devices(request)
    )
