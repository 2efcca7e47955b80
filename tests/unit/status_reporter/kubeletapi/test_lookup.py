"""Finding a request's pod and container: pods by namespace/name in the view, spec
containers of every kind, which container ID logs come from (upstream's rules and
messages for running, terminated, restarted, waiting and previous), the running
container and ready sandbox from CRI, and the /runningpods/ PodList shape."""

from __future__ import annotations

from typing import Any

import pytest
from klet.cri import labels as L
from klet.cri.types import Container, ContainerState, Sandbox, SandboxState
from klet.model.types import ContainerID, SandboxID
from klet.status_reporter.kubeletapi import lookup
from klet.testbed.fakes.kubeletapi import FakeRuntime


def pod_with(status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "web", "namespace": "ns", "uid": "u1"},
        "spec": {"containers": [{"name": "app"}], "initContainers": [{"name": "init"}]},
        "status": {"containerStatuses": [{"name": "app", **(status or {})}]},
    }


def test_find_pod_and_containers() -> None:
    pods = {"items": [pod_with(), {"metadata": {"name": "web", "namespace": "other"}}]}
    found = lookup.find_pod(pods, "ns", "web")
    assert found is not None and lookup.pod_uid(found) == "u1"
    assert lookup.find_pod(pods, "ns", "nope") is None
    assert lookup.has_container(found, "app") and lookup.has_container(found, "init")
    assert not lookup.has_container(found, "sidecar")


@pytest.mark.parametrize(
    ("status", "previous", "expected"),
    [
        ({"state": {"running": {}}, "containerID": "containerd://c2"}, False, "c2"),
        (
            {
                "state": {"running": {}},
                "containerID": "containerd://c2",
                "lastState": {"terminated": {"containerID": "containerd://c1"}},
            },
            True,
            "c1",
        ),
        ({"state": {"terminated": {"containerID": "containerd://c3"}}}, False, "c3"),
        (
            {
                "state": {"terminated": {}},
                "lastState": {"terminated": {"containerID": "containerd://c1"}},
            },
            False,
            "c1",
        ),
        (
            {
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"containerID": "containerd://c1"}},
            },
            False,
            "c1",
        ),
    ],
)
def test_log_container_id(status: dict[str, Any], previous: bool, expected: str) -> None:
    assert lookup.log_container_id(pod_with(status), "app", previous=previous) == expected


@pytest.mark.parametrize(
    ("status", "previous", "message"),
    [
        (
            {"state": {"running": {}}, "containerID": "c"},
            True,
            'previous terminated container "app" in pod "web" not found',
        ),
        ({"state": {"terminated": {}}}, False, 'container "app" in pod "web" is terminated'),
        (
            {"state": {"waiting": {"reason": "ErrImagePull"}}},
            False,
            'container "app" in pod "web" is waiting to start: image can\'t be pulled',
        ),
        (
            {"state": {"waiting": {"reason": "ContainerCreating"}}},
            False,
            'container "app" in pod "web" is waiting to start: ContainerCreating',
        ),
        ({}, False, 'container "app" in pod "web" is waiting to start - no logs yet'),
    ],
)
def test_log_container_id_errors(status: dict[str, Any], previous: bool, message: str) -> None:
    with pytest.raises(lookup.TargetError) as err:
        lookup.log_container_id(pod_with(status), "app", previous=previous)
    assert str(err.value) == message and err.value.status == 400


def test_log_container_id_of_a_container_without_status() -> None:
    with pytest.raises(lookup.TargetError, match="is not available"):
        lookup.log_container_id(pod_with(), "init", previous=False)


def container(
    cid: str,
    name: str,
    state: ContainerState,
    *,
    attempt: int = 0,
    uid: str = "u1",
    sandbox: str = "s1",
) -> Container:
    return Container(
        id=ContainerID(cid),
        sandbox_id=SandboxID(sandbox),
        name=name,
        attempt=attempt,
        image=f"img-{name}",
        image_ref="sha",
        state=state,
        created_at=attempt,
        labels={L.POD_UID: uid, L.CONTAINER_NAME: name, L.POD_NAME: "web", L.POD_NAMESPACE: "ns"},
    )


def sandbox(sid: str, uid: str, state: SandboxState, *, attempt: int = 0) -> Sandbox:
    return Sandbox(
        id=SandboxID(sid),
        name="web",
        namespace="ns",
        uid=uid,
        attempt=attempt,
        state=state,
        created_at=attempt,
        labels={L.POD_UID: uid},
    )


async def test_running_container_and_ready_sandbox() -> None:
    rt = FakeRuntime()
    rt.containers = [
        container("old", "app", ContainerState.EXITED, attempt=0),
        container("new", "app", ContainerState.RUNNING, attempt=1),
        container("other", "app", ContainerState.RUNNING, uid="u2"),
    ]
    rt.sandboxes = [
        sandbox("s0", "u1", SandboxState.NOTREADY),
        sandbox("s1", "u1", SandboxState.READY, attempt=1),
    ]
    assert await lookup.running_container(rt, "u1", "app") == "new"
    with pytest.raises(lookup.TargetError, match=r'container not found \("db"\)'):
        await lookup.running_container(rt, "u1", "db")
    assert await lookup.ready_sandbox(rt, "u1") == "s1"
    with pytest.raises(lookup.TargetError):
        await lookup.ready_sandbox(rt, "u9")


def test_running_pods() -> None:
    sandboxes = [
        sandbox("s1", "u1", SandboxState.READY),
        sandbox("s2", "u2", SandboxState.NOTREADY),
    ]
    containers = [
        container("a", "app", ContainerState.RUNNING),
        container("b", "side", ContainerState.EXITED),
        container("c", "late", ContainerState.RUNNING, uid="u2", sandbox="s2"),
    ]
    out = lookup.running_pods(sandboxes, containers)
    assert out["kind"] == "PodList" and out["apiVersion"] == "v1"
    assert out["items"] == [
        {
            "metadata": {"name": "web", "namespace": "ns", "uid": "u1", "creationTimestamp": None},
            "spec": {"containers": [{"name": "app", "image": "img-app", "resources": {}}]},
            "status": {},
        },
        {
            "metadata": {"name": "web", "namespace": "ns", "uid": "u2", "creationTimestamp": None},
            "spec": {"containers": [{"name": "late", "image": "img-late", "resources": {}}]},
            "status": {},
        },
    ]
