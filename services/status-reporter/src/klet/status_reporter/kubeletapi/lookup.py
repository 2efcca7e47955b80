"""Finding a request's pod and container: in the pod view first, then in the runtime.

As upstream, a pod the node does not know (not in the pod view) is a 404 even when the
runtime still has its sandbox. Which container a request means:

- exec/attach: the pod's running container of that name (the highest attempt), straight
  from CRI (upstream asks its runtime cache; we have none, CRI is the truth);
- portForward: the pod's ready sandbox;
- containerLogs: the container ID the pod's status names (`previous`: the last
  terminated one), by upstream's rules in `log_container_id`, whose messages are the
  user-visible 400 bodies.
"""

from __future__ import annotations

from typing import Any, Protocol

from klet.cri import labels as L
from klet.cri.types import Container, ContainerState, Sandbox, SandboxState
from klet.model.types import JSON, ContainerID, SandboxID


class TargetError(Exception):
    """A request names something that is not there; `status` is the HTTP status."""

    def __init__(self, message: str, *, status: int = 404) -> None:
        super().__init__(message)
        self.status = status


class RuntimeLister(Protocol):
    async def list_pod_sandboxes(
        self, *, label_selector: dict[str, str] | None = None
    ) -> list[Sandbox]: ...

    async def list_containers(
        self, *, sandbox_id: SandboxID | None = None, label_selector: dict[str, str] | None = None
    ) -> list[Container]: ...


def find_pod(pod_list: JSON, namespace: str, name: str) -> JSON | None:
    for pod in pod_list.get("items", ()):
        meta = pod.get("metadata", {})
        if meta.get("name") == name and meta.get("namespace", "default") == namespace:
            return dict(pod)
    return None


def pod_uid(pod: JSON) -> str:
    return str(pod.get("metadata", {}).get("uid", ""))


def has_container(pod: JSON, name: str) -> bool:
    spec = pod.get("spec", {})
    return any(
        c.get("name") == name
        for key in ("containers", "initContainers", "ephemeralContainers")
        for c in spec.get(key) or ()
    )


def container_status(pod: JSON, name: str) -> JSON | None:
    status = pod.get("status", {})
    for key in ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses"):
        for c in status.get(key) or ():
            if c.get("name") == name:
                return dict(c)
    return None


def strip_runtime(container_id: str) -> ContainerID:
    """`containerd://abc` → `abc`."""
    return ContainerID(container_id.split("://", 1)[-1])


def _terminated_id(state: Any) -> str:
    terminated = (state or {}).get("terminated") or {}
    return str(terminated.get("containerID", ""))


def log_container_id(pod: JSON, name: str, *, previous: bool) -> ContainerID:
    """The container whose log to read. Raises TargetError (400) as upstream does."""
    pod_name = pod.get("metadata", {}).get("name", "")
    status = container_status(pod, name)
    if status is None:
        raise TargetError(f'container "{name}" in pod "{pod_name}" is not available', status=400)
    state = status.get("state") or {}
    last_id = _terminated_id(status.get("lastState"))
    if previous:
        if not last_id:
            raise TargetError(
                f'previous terminated container "{name}" in pod "{pod_name}" not found', status=400
            )
        return strip_runtime(last_id)
    if state.get("running") is not None and status.get("containerID"):
        return strip_runtime(str(status["containerID"]))
    if state.get("terminated") is not None:
        cid = _terminated_id(state) or last_id
        if not cid:
            raise TargetError(f'container "{name}" in pod "{pod_name}" is terminated', status=400)
        return strip_runtime(cid)
    if last_id:
        return strip_runtime(last_id)
    waiting = state.get("waiting")
    if waiting is not None:
        reason = waiting.get("reason", "")
        detail = {
            "ErrImagePull": "image can't be pulled",
            "ImagePullBackOff": "trying and failing to pull image",
        }.get(reason, reason)
        raise TargetError(
            f'container "{name}" in pod "{pod_name}" is waiting to start: {detail}', status=400
        )
    raise TargetError(
        f'container "{name}" in pod "{pod_name}" is waiting to start - no logs yet', status=400
    )


def restart_count(pod: JSON, name: str) -> int:
    status = container_status(pod, name) or {}
    return int(status.get("restartCount", 0) or 0)


async def running_container(runtime: RuntimeLister, uid: str, name: str) -> ContainerID:
    """The pod's running container `name`. Raises TargetError."""
    found = await runtime.list_containers(label_selector={L.POD_UID: uid, L.CONTAINER_NAME: name})
    running = [c for c in found if c.state == ContainerState.RUNNING]
    if not running:
        raise TargetError(f'container not found ("{name}")')
    return max(running, key=lambda c: (c.attempt, c.created_at)).id


async def ready_sandbox(runtime: RuntimeLister, uid: str) -> SandboxID:
    """The pod's ready sandbox. Raises TargetError."""
    found = await runtime.list_pod_sandboxes(label_selector={L.POD_UID: uid})
    ready = [s for s in found if s.state == SandboxState.READY]
    if not ready:
        raise TargetError("pod not found")
    return max(ready, key=lambda s: (s.attempt, s.created_at)).id


def running_pods(sandboxes: list[Sandbox], containers: list[Container]) -> JSON:
    """The PodList of `/runningpods/`: pods as the runtime sees them (upstream's
    ToAPIPod: name, namespace, UID and each running container's name and image)."""
    pods: dict[str, JSON] = {}

    def pod_of(uid: str, name: str, namespace: str) -> JSON:
        if uid not in pods:
            pods[uid] = {
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "uid": uid,
                    "creationTimestamp": None,
                },
                "spec": {"containers": []},
                "status": {},
            }
        return pods[uid]

    by_sandbox: dict[str, Sandbox] = {}
    for s in sandboxes:
        by_sandbox[s.id] = s
        if s.state == SandboxState.READY:
            pod_of(s.uid, s.name, s.namespace)
    for c in sorted(containers, key=lambda c: (c.created_at, c.name)):
        if c.state != ContainerState.RUNNING:
            continue
        uid = c.labels.get(L.POD_UID) or (
            by_sandbox[c.sandbox_id].uid if c.sandbox_id in by_sandbox else ""
        )
        if not uid:
            continue
        pod = pod_of(uid, c.labels.get(L.POD_NAME, ""), c.labels.get(L.POD_NAMESPACE, ""))
        pod["spec"]["containers"].append({"name": c.name, "image": c.image, "resources": {}})
    return {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": list(pods.values())}
