"""RuntimeClass on a klet node, against the real apiserver and containerd.

A pod whose RuntimeClass names the dev stack's second runtime handler (`test-handler`:
runc with a state directory of its own) runs under it: its containers are in that
handler's state directory, a default pod's are not. The apiserver's RuntimeClass
admission copies the class's overhead into the pod, and the pod cgroup's memory limit
counts it. A pod naming a RuntimeClass that does
not exist, or one whose handler the runtime does not have, stays Pending with
FailedCreatePodSandBox Events naming the cause, and a pod beside it runs.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from klet.devstack import DevStack
from klet.devstack.containerd import TEST_HANDLER
from klet.testbed.cluster import ControlPlane

from tests.harness.clusternode import cluster_node
from tests.harness.node import KletNode
from tests.harness.pods import runtime_containers
from tests.harness.waiting import wait_for

NODE = "kletrtclass1"
IMAGE = "registry.klet.test/busybox:1.36"
MI = 1024 * 1024


def runtime_class(name: str, handler: str, **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {"name": name},
        "handler": handler,
        **extra,
    }


def pod(name: str, runtime_class_name: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeName": NODE,
        "terminationGracePeriodSeconds": 1,
        "containers": [
            {
                "name": "main",
                "image": IMAGE,
                "command": ["sleep", "3600"],
                "resources": {"limits": {"cpu": "100m", "memory": "32Mi"}},
            }
        ],
    }
    if runtime_class_name:
        spec["runtimeClassName"] = runtime_class_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    }


@pytest.fixture(scope="module")
def node(
    control_plane: ControlPlane, devstack: DevStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KletNode]:
    base = tmp_path_factory.mktemp("rtclassnode")
    control_plane.apply(
        [
            runtime_class("klet-alt", TEST_HANDLER, overhead={"podFixed": {"memory": "8Mi"}}),
            runtime_class("klet-nohandler", "no-such-handler"),
        ]
    )
    with cluster_node(control_plane, devstack, base, name=NODE) as kletnode:
        yield kletnode
    control_plane.kubectl("delete", "runtimeclass", "klet-alt", "klet-nohandler")


def get_pod(cp: ControlPlane, name: str) -> dict[str, Any] | None:
    res = cp.kubectl("get", "pod", name, "-o", "json")
    return json.loads(res.stdout) if res.returncode == 0 else None


def running(cp: ControlPlane, name: str) -> dict[str, Any] | None:
    p = get_pod(cp, name)
    return p if p and p["status"].get("phase") == "Running" else None


def sandbox_failures(cp: ControlPlane, name: str) -> list[str]:
    res = cp.kubectl(
        "get",
        "events",
        "-n",
        "default",
        f"--field-selector=involvedObject.name={name},reason=FailedCreatePodSandBox",
        "-o",
        "json",
    )
    return [e["message"] for e in json.loads(res.stdout or "{}").get("items", [])]


def handler_containers(devstack: DevStack) -> set[str]:
    """The containers runc runs under the second handler's state directory."""
    assert devstack.containerd is not None
    root = devstack.containerd.test_handler_root / "k8s.io"
    out = subprocess.run(
        ["runc", "--root", str(root), "list", "-q"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return set(out.split())


def pod_memory_limit(pod_uid: str) -> int:
    """memory.limit_in_bytes of the pod's cgroup (cgroup v1, cgroupfs driver)."""
    found = list(Path("/sys/fs/cgroup/memory").glob(f"**/pod{pod_uid}/memory.limit_in_bytes"))
    assert len(found) == 1, found
    return int(found[0].read_text())


def test_a_pod_runs_under_its_runtime_class_handler(
    node: KletNode, control_plane: ControlPlane, devstack: DevStack
) -> None:
    control_plane.apply([pod("rc-alt", "klet-alt"), pod("rc-default", None)])
    p = wait_for(lambda: running(control_plane, "rc-alt"), timeout_s=90, what="rc-alt Running")
    wait_for(lambda: running(control_plane, "rc-default"), timeout_s=90, what="rc-default Running")
    assert p["spec"]["overhead"] == {"memory": "8Mi"}  # RuntimeClass admission
    under_handler = handler_containers(devstack)
    alt_pod = set(runtime_containers(devstack, "rc-alt"))
    default_pod = set(runtime_containers(devstack, "rc-default"))
    assert alt_pod and alt_pod <= under_handler
    assert default_pod and not (default_pod & under_handler)  # the default handler's
    # The pod cgroup's limit is the container's 32Mi plus the class's 8Mi overhead.
    assert pod_memory_limit(p["metadata"]["uid"]) == 40 * MI


@pytest.mark.parametrize(
    ("name", "class_name", "cause"),
    [
        ("rc-missing", "klet-missing", 'runtimeclasses.node.k8s.io "klet-missing" not found'),
        ("rc-nohandler", "klet-nohandler", "no-such-handler"),
    ],
)
def test_a_pod_whose_runtime_class_cannot_run_waits_with_events(
    node: KletNode, control_plane: ControlPlane, name: str, class_name: str, cause: str
) -> None:
    # The apiserver's RuntimeClass admission refuses a pod naming a missing class, so
    # that one comes as a static pod (its mirror pod carries the Events).
    if class_name == "klet-missing":
        manifest = pod(name, class_name)
        del manifest["spec"]["nodeName"]
        (node.manifests / f"{name}.json").write_text(json.dumps(manifest))  # type: ignore[attr-defined]
        name = f"{name}-{NODE}"
    else:
        control_plane.apply([pod(name, class_name)])
    messages = wait_for(
        lambda: [m for m in sandbox_failures(control_plane, name) if cause in m],
        timeout_s=90,
        what=f"a FailedCreatePodSandBox Event naming {cause}",
    )
    assert messages[0].startswith("Failed to create pod sandbox: ")
    # The node's own view: the apiserver refuses the static pod's mirror (its class is
    # missing), so only the node has its status.
    p = node.pods().get(name) if class_name == "klet-missing" else get_pod(control_plane, name)
    assert p is not None and p["status"].get("phase") == "Pending"
    waiting = p["status"]["containerStatuses"][0]["state"]["waiting"]
    assert waiting["reason"] == "ContainerCreating"
    if class_name == "klet-missing":
        (node.manifests / "rc-missing.json").unlink()  # type: ignore[attr-defined]
    else:
        control_plane.kubectl("delete", "pod", name, "--wait=false")
