"""Deleting the node's ResourceSlices in the apiserver (the slice wiper's `SliceApi`,
dra/slices.py), as upstream's kubelet does: one DELETE of the resourceslices
collection (resource.k8s.io/v1) with the field selector `spec.nodeName=<node>` and,
for one driver, `spec.driver=<driver>`; the Node authorizer lets a node delete its own
slices that way. Nothing to delete (404) is done; any other apiserver error is a
`SliceDeleteError` carrying its words, which the wiper retries.
"""

from __future__ import annotations

from typing import Any, Protocol

from klet.kube import KubeError
from klet.kube import NotFound as KubeNotFound

PATH = "/apis/resource.k8s.io/v1/resourceslices"


class SliceDeleteError(Exception):
    """The apiserver did not delete the slices; says why."""


class Kube(Protocol):
    """The part of `klet.kube.KubeClient` used here."""

    async def request(
        self, method: str, path: str, *, params: Any = None, body: Any = None
    ) -> Any: ...


def field_selector(node: str, driver: str) -> str:
    """The node's slices, of `driver` or (for "") of every driver."""
    selector = f"spec.nodeName={node}"
    return f"{selector},spec.driver={driver}" if driver else selector


class ApiSlices:
    def __init__(self, kube: Kube) -> None:
        self.kube = kube

    async def delete_slices(self, node: str, driver: str) -> None:
        try:
            await self.kube.request(
                "DELETE", PATH, params={"fieldSelector": field_selector(node, driver)}
            )
        except KubeNotFound:
            return
        except KubeError as err:
            raise SliceDeleteError(str(err)) from err
