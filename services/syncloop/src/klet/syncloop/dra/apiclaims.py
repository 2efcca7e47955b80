"""The pod's ResourceClaims as the apiserver has them now (resource.k8s.io/v1).

The claim manager's `ClaimSource` over klet.kube's client. Nothing is cached: upstream's
PrepareResources reads each claim afresh (the scheduler reserves it for the pod and the
allocation is written just before the pod is bound, and a claim of the same name may
have been deleted and made again since), so unlike ConfigMaps a read that is seconds old
would be wrong. The Node authorizer lets the node GET a claim a pod bound to it uses.

A missing claim and an apiserver that does not answer are both a `ClaimReadError` (a
LookupError, what the manager turns into a failed, retried prepare) carrying the
apiserver's words: the pod must wait either way, never be killed.
"""

from __future__ import annotations

from typing import Any, Protocol
from urllib.parse import quote

from klet.kube import KubeError
from klet.model.types import JSON

API = "/apis/resource.k8s.io/v1"


class ClaimReadError(LookupError):
    """The claim could not be read: absent, forbidden or the apiserver down; says which."""


class Kube(Protocol):
    """The part of `klet.kube.KubeClient` used here."""

    async def get(self, path: str, **params: Any) -> Any: ...


def claim_path(namespace: str, name: str) -> str:
    return f"{API}/namespaces/{quote(namespace, safe='')}/resourceclaims/{quote(name, safe='')}"


class ApiClaims:
    """`ClaimSource` (dra/manager.py) over the apiserver."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube

    async def resource_claim(self, namespace: str, name: str) -> JSON:
        try:
            claim = await self.kube.get(claim_path(namespace, name))
        except KubeError as err:
            raise ClaimReadError(str(err)) from err
        if not isinstance(claim, dict):
            raise ClaimReadError(
                f"GET {claim_path(namespace, name)}: the answer is {type(claim).__name__}, "
                "not a ResourceClaim"
            )
        return claim
