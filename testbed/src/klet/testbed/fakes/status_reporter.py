"""Stateful fakes of the interfaces this service consumes, for unit tests; the bus's
are shared by all services, in `klet.testbed.fakes.bus`.

Cluster mode's fakes: `FakeApiServer` is a small in-memory apiserver behind the `Kube`
protocol (objects by path, UIDs and resourceVersions, AlreadyExists/Conflict, UID
preconditions on status patches and deletes, graceful deletion, merge and an
approximation of strategic merge patches, a `down` switch and one-shot error
injection, a call log); `FakeRuntime` answers the CRI calls the node status makes.

mypy checks the fakes against the consumers' protocols at the bottom of this module.
Integration and cluster tests use the real Redis, containerd and kube-apiserver.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

from klet.cri import RuntimeUnavailable
from klet.cri.types import ImageInfo, RuntimeCondition, RuntimeVersion
from klet.kube import Conflict, Invalid, KubeError, NotFound, Unavailable
from klet.model.pod import API_SOURCE, CONFIG_HASH, CONFIG_SEEN, CONFIG_SOURCE
from klet.model.records import (
    DesiredPod,
    PodStatusRecord,
)
from klet.model.types import JSON, ImageRef, pod_uid
from klet.status_reporter.cluster.kubeapi import Kube
from klet.status_reporter.cluster.nodeobserver import RuntimeService

# -- the apiserver ------------------------------------------------------------------------

_COLLECTIONS = frozenset({"nodes", "pods", "leases", "events"})


def _merge(target: Any, patch: Any, *, strategic: bool) -> Any:
    """RFC 7386 merge; `strategic` adds the two strategic-merge rules the code relies
    on: `conditions` lists merge by type, `$patch: replace` in a list replaces it."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif strategic and isinstance(value, list) and key == "conditions":
            merged = {c.get("type"): c for c in out.get(key) or []}
            for c in value:
                merged[c.get("type")] = {**merged.get(c.get("type"), {}), **c}
            out[key] = list(merged.values())
        elif strategic and isinstance(value, list):
            out[key] = [copy.deepcopy(v) for v in value if v != {"$patch": "replace"}]
        else:
            out[key] = _merge(out.get(key), value, strategic=strategic)
    return out


class FakeApiServer:
    """An in-memory apiserver behind `Kube` (see the module docstring)."""

    def __init__(self) -> None:
        self.objects: dict[str, JSON] = {}
        self.calls: list[tuple[str, str]] = []
        self.down = False
        self._failures: list[tuple[str, str, KubeError]] = []
        self._rv = itertools.count(1)
        self._uid = itertools.count(1)
        self.now = "2025-01-01T00:00:00Z"

    # -- test controls ----------------------------------------------------------------

    def fail_next(self, method: str, path_part: str, error: KubeError) -> None:
        """Make the next `method` call whose path contains `path_part` raise `error`."""
        self._failures.append((method, path_part, error))

    def put(self, path: str, obj: JSON) -> JSON:
        """Store an object as another client would have created it (admin, controller)."""
        body = copy.deepcopy(obj)
        meta = body.setdefault("metadata", {})
        meta.setdefault("uid", f"uid-{next(self._uid)}")
        meta["resourceVersion"] = str(next(self._rv))
        self.objects[path] = body
        return copy.deepcopy(body)

    def mark_deleted(self, path: str) -> None:
        """A graceful delete by someone else: the deletionTimestamp is set."""
        self.objects[path]["metadata"]["deletionTimestamp"] = self.now
        self.objects[path]["metadata"]["resourceVersion"] = str(next(self._rv))

    def get_object(self, path: str) -> JSON | None:
        obj = self.objects.get(path)
        return copy.deepcopy(obj) if obj is not None else None

    def count(self, method: str, path_part: str = "") -> int:
        return sum(1 for m, p in self.calls if m == method and path_part in p)

    # -- Kube -------------------------------------------------------------------------

    def _enter(self, method: str, path: str) -> None:
        self.calls.append((method, path))
        if self.down:
            raise Unavailable(f"{method} {path}: connection refused")
        for i, (m, part, error) in enumerate(self._failures):
            if m == method and part in path:
                del self._failures[i]
                raise error

    def _find(self, path: str) -> JSON:
        obj = self.objects.get(path)
        if obj is None:
            raise NotFound(f"{path} not found", status=404, reason="NotFound")
        return obj

    async def get(self, path: str, **params: Any) -> Any:
        self._enter("GET", path)
        if path in self.objects:
            return copy.deepcopy(self.objects[path])
        last = path.rsplit("/", 1)[-1]
        if last not in _COLLECTIONS:
            raise NotFound(f"{path} not found", status=404, reason="NotFound")
        items = [
            copy.deepcopy(obj)
            for key, obj in sorted(self.objects.items())
            if key.rsplit("/", 2)[-2] == last
            and (key.startswith(path + "/") or path == "/api/v1/pods")
        ]
        selector = params.get("fieldSelector")
        if selector:
            field, _, value = str(selector).partition("=")
            assert field == "spec.nodeName", f"unsupported field selector {selector}"
            items = [i for i in items if (i.get("spec") or {}).get("nodeName") == value]
        return {"kind": "List", "items": items}

    async def create(self, path: str, body: JSON) -> Any:
        self._enter("POST", path)
        name = body["metadata"]["name"]
        key = f"{path}/{name}"
        if key in self.objects:
            raise Conflict(f"{key} already exists", status=409, reason="AlreadyExists")
        obj = copy.deepcopy(body)
        meta = obj["metadata"]
        meta["uid"] = f"uid-{next(self._uid)}"
        meta["resourceVersion"] = str(next(self._rv))
        meta["creationTimestamp"] = self.now
        if path.endswith("/pods"):
            obj["status"] = {"phase": "Pending"}
        self.objects[key] = obj
        return copy.deepcopy(obj)

    async def replace(self, path: str, body: JSON) -> Any:
        self._enter("PUT", path)
        stored = self._find(path)
        rv = (body.get("metadata") or {}).get("resourceVersion")
        if rv and rv != stored["metadata"]["resourceVersion"]:
            raise Conflict(f"{path}: the object has been modified", status=409, reason="Conflict")
        obj = copy.deepcopy(body)
        obj["metadata"]["uid"] = stored["metadata"]["uid"]
        obj["metadata"]["resourceVersion"] = str(next(self._rv))
        self.objects[path] = obj
        return copy.deepcopy(obj)

    async def patch(self, path: str, body: Any, *, kind: str = "strategic") -> Any:
        self._enter("PATCH", path)
        status_only = path.endswith("/status")
        key = path[: -len("/status")] if status_only else path
        stored = self._find(key)
        want_uid = ((body or {}).get("metadata") or {}).get("uid")
        if want_uid and want_uid != stored["metadata"]["uid"]:
            raise Invalid(f"{path}: metadata.uid: field is immutable", status=422, reason="Invalid")
        if status_only:
            body = {"status": body.get("status", {})}
        merged = _merge(stored, body, strategic=kind == "strategic")
        merged["metadata"]["resourceVersion"] = str(next(self._rv))
        self.objects[key] = merged
        return copy.deepcopy(merged)

    async def delete(self, path: str, body: JSON | None = None) -> Any:
        self._enter("DELETE", path)
        stored = self._find(path)
        options = body or {}
        want_uid = (options.get("preconditions") or {}).get("uid")
        if want_uid and want_uid != stored["metadata"]["uid"]:
            raise Conflict(f"{path}: precondition failed: UID", status=409, reason="Conflict")
        if options.get("gracePeriodSeconds") == 0:
            del self.objects[path]
        else:
            self.mark_deleted(path)
        return {"kind": "Status", "status": "Success"}


# -- the runtime ----------------------------------------------------------------------------


class FakeRuntime:
    """The CRI calls of the node status: a ready containerd with a few images."""

    def __init__(self) -> None:
        self.down = False
        self.conditions = {"RuntimeReady": (True, "", ""), "NetworkReady": (True, "", "")}
        self.name = "containerd"
        self.runtime_version = "v2.0.0"
        self.images: list[ImageInfo] = []

    def add_image(self, tag: str, size: int, *, digest: str = "") -> None:
        self.images.append(
            ImageInfo(
                id=ImageRef(f"sha256:{len(self.images):064d}"),
                repo_tags=(tag,),
                repo_digests=(digest,) if digest else (),
                size=size,
            )
        )

    def _check(self, call: str) -> None:
        if self.down:
            raise RuntimeUnavailable(f"{call}: UNAVAILABLE: connection refused", code="UNAVAILABLE")

    async def version(self) -> RuntimeVersion:
        self._check("Version")
        return RuntimeVersion(self.name, self.runtime_version, "v1")

    async def status(self) -> list[RuntimeCondition]:
        self._check("Status")
        return [RuntimeCondition(t, ok, r, m) for t, (ok, r, m) in self.conditions.items()]

    async def list_images(self) -> list[ImageInfo]:
        self._check("ListImages")
        return list(self.images)


def _conforms(kube: FakeApiServer, runtime: FakeRuntime) -> tuple[Kube, RuntimeService]:
    # Never called: makes mypy prove the fakes satisfy the consumers' protocols.
    return kube, runtime


# -- record builders (shared by unit and integration tests) ---------------------------


def make_pod(name: str, *, namespace: str = "default", uid: str | None = None) -> JSON:
    """A small v1 Pod as pod-source would store it (one container, no status)."""
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"name": name, "namespace": namespace, "uid": uid or f"uid-{name}"},
        "spec": {"containers": [{"name": "app", "image": "busybox"}]},
    }


def desired_record(pod: JSON, *, seen_at: float = 1.0) -> DesiredPod:
    return DesiredPod(uid=pod_uid(pod), pod=pod, source="file", hash="h", seen_at=seen_at)


def status_record(
    pod: JSON,
    *,
    version: int,
    epoch: float = 1.0,
    phase: str = "Running",
    status: JSON | None = None,
    terminated: bool = False,
) -> PodStatusRecord:
    """The status syncloop would write for `pod`; `status` overrides the whole PodStatus."""
    meta = pod["metadata"]
    return PodStatusRecord(
        uid=pod_uid(pod),
        namespace=meta["namespace"],
        name=meta["name"],
        version=version,
        epoch=epoch,
        status=status if status is not None else {"phase": phase},
        updated_at=float(version),
        terminated=terminated,
    )


def make_static_pod(
    name: str, *, node: str = "node1", namespace: str = "default", uid: str | None = None
) -> JSON:
    """A static pod as pod-source stores it: node-suffixed name, config annotations."""
    pod = make_pod(f"{name}-{node}", namespace=namespace, uid=uid or f"static-{name}")
    pod["metadata"]["annotations"] = {
        CONFIG_HASH: pod["metadata"]["uid"],
        CONFIG_SOURCE: "file",
        CONFIG_SEEN: "2025-01-01T00:00:00Z",
    }
    pod["spec"]["nodeName"] = node
    return pod


def make_api_pod(name: str, *, node: str = "node1", namespace: str = "default") -> JSON:
    """A pod as pod-source stores an apiserver pod (config.source annotation added)."""
    pod = make_pod(name, namespace=namespace)
    pod["metadata"]["annotations"] = {CONFIG_SOURCE: API_SOURCE}
    pod["spec"]["nodeName"] = node
    return pod
