"""The apiserver calls of cluster mode, over `klet.kube.KubeClient` (the adapter layer).

`Kube` is the part of KubeClient this service uses: raw JSON by path. `KubeApi` names
the calls (nodes, leases, pods, events) so managers never build a URL, and retries an
`Unavailable` answer through one named tenacity policy (`RetryPolicy`, built from
settings; tests set it to one attempt), each attempt numbered
(`klet.kube.observing.attempt`) so the client counts attempts 2..n in
rest_client_request_retries_total, as client-go counts its own retries. Other errors
(`NotFound`, `Conflict`, `Invalid`, `Forbidden`, `Gone`) are answers, not outages, and
go to the caller at once.

Bodies and results are plain dicts: the same JSON the apiserver speaks.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from klet.kube import Unavailable
from klet.kube.observing import attempt as numbered
from klet.model.types import JSON
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

T = TypeVar("T")

LEASE_NAMESPACE = "kube-node-lease"


class Kube(Protocol):
    """The raw apiserver client (klet.kube.KubeClient, or testing.FakeApiServer)."""

    async def get(self, path: str, **params: Any) -> Any: ...

    async def create(self, path: str, body: JSON) -> Any: ...

    async def replace(self, path: str, body: JSON) -> Any: ...

    async def patch(self, path: str, body: Any, *, kind: str = "strategic") -> Any: ...

    async def delete(self, path: str, body: JSON | None = None) -> Any: ...


@dataclass(frozen=True)
class RetryPolicy:
    """Retries of an `Unavailable` apiserver answer inside one call."""

    attempts: int = 3
    initial_s: float = 0.2
    max_s: float = 2.0


NO_RETRY = RetryPolicy(attempts=1)


def delete_options(uid: str) -> JSON:
    """Delete now (grace 0), but only the object with this UID (not a successor)."""
    return {
        "kind": "DeleteOptions",
        "apiVersion": "v1",
        "gracePeriodSeconds": 0,
        "preconditions": {"uid": uid},
    }


class KubeApi:
    """Named apiserver calls with the Unavailable retry policy."""

    def __init__(self, kube: Kube, *, retry: RetryPolicy = RetryPolicy()) -> None:
        self.kube = kube
        self.retry = retry

    async def _call(self, call: Callable[[], Awaitable[T]]) -> T:
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(Unavailable),
            stop=stop_after_attempt(max(1, self.retry.attempts)),
            wait=wait_exponential(multiplier=self.retry.initial_s, max=self.retry.max_s),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt, numbered(attempt.retry_state.attempt_number):
                return await call()
        raise AssertionError("unreachable")  # pragma: no cover

    # -- nodes ---------------------------------------------------------------------------

    async def get_node(self, name: str, *, cached: bool = False) -> JSON:
        """GET the Node; `cached` lets the apiserver answer from its watch cache."""
        params = {"resourceVersion": "0"} if cached else {}
        result: JSON = await self._call(lambda: self.kube.get(f"/api/v1/nodes/{name}", **params))
        return result

    async def create_node(self, node: JSON) -> JSON:
        result: JSON = await self._call(lambda: self.kube.create("/api/v1/nodes", node))
        return result

    async def patch_node(self, name: str, patch: JSON) -> JSON:
        """Merge patch of the Node object (metadata reconciliation)."""
        result: JSON = await self._call(
            lambda: self.kube.patch(f"/api/v1/nodes/{name}", patch, kind="merge")
        )
        return result

    async def patch_node_status(self, name: str, patch: JSON) -> JSON:
        """Strategic merge patch of nodes/<name>/status."""
        result: JSON = await self._call(
            lambda: self.kube.patch(f"/api/v1/nodes/{name}/status", patch, kind="strategic")
        )
        return result

    # -- leases --------------------------------------------------------------------------

    @staticmethod
    def _lease_path(name: str) -> str:
        return f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases/{name}"

    async def get_lease(self, name: str) -> JSON:
        result: JSON = await self._call(lambda: self.kube.get(self._lease_path(name)))
        return result

    async def create_lease(self, lease: JSON) -> JSON:
        path = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases"
        result: JSON = await self._call(lambda: self.kube.create(path, lease))
        return result

    async def replace_lease(self, lease: JSON) -> JSON:
        path = self._lease_path(lease["metadata"]["name"])
        result: JSON = await self._call(lambda: self.kube.replace(path, lease))
        return result

    # -- pods ----------------------------------------------------------------------------

    @staticmethod
    def _pod_path(namespace: str, name: str) -> str:
        return f"/api/v1/namespaces/{namespace}/pods/{name}"

    async def get_pod(self, namespace: str, name: str) -> JSON:
        result: JSON = await self._call(lambda: self.kube.get(self._pod_path(namespace, name)))
        return result

    async def list_node_pods(self, node_name: str) -> list[JSON]:
        """Every pod bound to `node_name`, in all namespaces."""
        result: JSON = await self._call(
            lambda: self.kube.get("/api/v1/pods", fieldSelector=f"spec.nodeName={node_name}")
        )
        return list(result.get("items") or [])

    async def create_pod(self, pod: JSON) -> JSON:
        namespace = pod["metadata"]["namespace"]
        result: JSON = await self._call(
            lambda: self.kube.create(f"/api/v1/namespaces/{namespace}/pods", pod)
        )
        return result

    async def patch_pod_status(self, namespace: str, name: str, patch: JSON) -> JSON:
        """Merge patch of pods/<name>/status (the caller puts the UID precondition in)."""
        path = self._pod_path(namespace, name) + "/status"
        result: JSON = await self._call(lambda: self.kube.patch(path, patch, kind="merge"))
        return result

    async def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        """DELETE with grace 0 and a UID precondition."""
        path = self._pod_path(namespace, name)
        await self._call(lambda: self.kube.delete(path, delete_options(uid)))

    # -- events --------------------------------------------------------------------------

    async def create_event(self, event: JSON) -> JSON:
        namespace = event["metadata"]["namespace"]
        result: JSON = await self._call(
            lambda: self.kube.create(f"/api/v1/namespaces/{namespace}/events", event)
        )
        return result

    async def patch_event(self, namespace: str, name: str, patch: JSON) -> JSON:
        path = f"/api/v1/namespaces/{namespace}/events/{name}"
        result: JSON = await self._call(lambda: self.kube.patch(path, patch, kind="strategic"))
        return result
