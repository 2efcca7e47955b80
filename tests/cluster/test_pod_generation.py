"""status.observedGeneration through a real apiserver (PodObservedGenerationTracking, on
in v1.34): a pod klet runs reports the generation it was created with on its status and
on every condition the kubelet owns; a spec update (activeDeadlineSeconds) bumps the
generation, and klet reports the new one on the status and the conditions while their
transition times stay. A pod the node rejects at admission (more CPU than it has) is
Failed with observedGeneration 1, as upstream's e2e "pod rejected by kubelet" spec
wants. 499 spec updates in a row (upstream e2e's "issue 500 podspec updates") converge
on observedGeneration 500 within its 30 s. A static pod's mirror carries none (the
static pod has no generation), as upstream's."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from klet.devstack import DevStack
from klet.testbed.cluster import ControlPlane
from kubernetes import client as kclient
from kubernetes import config as kconfig

from tests.harness.clusternode import cluster_node, wait_node_ready
from tests.harness.node import KletNode
from tests.harness.waiting import wait_for

NODE = "kletgen1"
IMAGE = "registry.klet.test/busybox:1.36"
KUBELET_CONDITIONS = {
    "PodReadyToStartContainers",
    "Initialized",
    "Ready",
    "ContainersReady",
    "PodScheduled",
}


@pytest.fixture(scope="module")
def node(
    control_plane: ControlPlane, devstack: DevStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KletNode]:
    base = tmp_path_factory.mktemp("gennode")
    with cluster_node(control_plane, devstack, base, name=NODE) as kletnode:
        yield kletnode


def get_pod(cp: ControlPlane, name: str) -> dict[str, Any] | None:
    r = cp.kubectl("get", "pod", name, "-o", "json")
    if r.returncode != 0:
        return None
    pod: dict[str, Any] = json.loads(r.stdout)
    return pod


def reported(cp: ControlPlane, name: str, generation: int) -> dict[str, Any] | None:
    """The pod once it runs and its status and kubelet-owned conditions say `generation`."""
    pod = get_pod(cp, name)
    if pod is None or pod["metadata"].get("generation") != generation:
        return None
    status = pod.get("status") or {}
    if status.get("phase") != "Running" or status.get("observedGeneration") != generation:
        return None
    conditions = {c["type"]: c for c in status.get("conditions") or []}
    if not KUBELET_CONDITIONS <= conditions.keys():
        return None
    if any(conditions[t].get("observedGeneration") != generation for t in KUBELET_CONDITIONS):
        return None
    return pod


def test_observed_generation_follows_a_spec_update(
    node: KletNode, control_plane: ControlPlane
) -> None:
    cp = control_plane
    wait_node_ready(cp, NODE)
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "gen", "namespace": "default"},
        "spec": {
            "nodeName": NODE,
            "terminationGracePeriodSeconds": 2,
            "activeDeadlineSeconds": 3600,
            "containers": [{"name": "main", "image": IMAGE, "command": ["sleep", "100000"]}],
        },
    }
    r = cp.kubectl("create", "-f", "-", input=json.dumps(manifest))
    assert r.returncode == 0, r.stderr
    first = wait_for(
        lambda: reported(cp, "gen", 1),
        timeout_s=60,
        what="the pod Running with observedGeneration 1",
    )
    before = {c["type"]: c["lastTransitionTime"] for c in first["status"]["conditions"]}

    r = cp.kubectl(
        "patch", "pod", "gen", "--type=merge", "-p", '{"spec":{"activeDeadlineSeconds":1800}}'
    )
    assert r.returncode == 0, r.stderr
    second = wait_for(
        lambda: reported(cp, "gen", 2),
        timeout_s=30,
        what="observedGeneration 2 on the status and every kubelet condition",
    )
    after = {c["type"]: c["lastTransitionTime"] for c in second["status"]["conditions"]}
    assert {t: after[t] for t in KUBELET_CONDITIONS} == {t: before[t] for t in KUBELET_CONDITIONS}
    container = second["status"]["containerStatuses"][0]
    assert container["restartCount"] == 0 and "running" in container["state"]


def test_mirror_pod_has_no_observed_generation(node: KletNode, control_plane: ControlPlane) -> None:
    cp = control_plane
    wait_node_ready(cp, NODE)
    static = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "genstatic", "namespace": "default"},
        "spec": {
            "terminationGracePeriodSeconds": 2,
            "containers": [{"name": "main", "image": IMAGE, "command": ["sleep", "100000"]}],
        },
    }
    (node.manifests / "genstatic.json").write_text(json.dumps(static))  # type: ignore[attr-defined]

    def running_mirror() -> dict[str, Any] | None:
        pod = get_pod(cp, f"genstatic-{NODE}")
        status = (pod or {}).get("status") or {}
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in status.get("conditions") or []
        )
        return pod if status.get("phase") == "Running" and ready else None

    mirror = wait_for(running_mirror, timeout_s=60, what="the mirror pod Running and Ready")
    assert "observedGeneration" not in mirror["status"]
    assert not any("observedGeneration" in c for c in mirror["status"]["conditions"])


def test_rejected_pod_reports_its_generation(node: KletNode, control_plane: ControlPlane) -> None:
    cp = control_plane
    wait_node_ready(cp, NODE)
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "gen-out-of-cpu", "namespace": "default"},
        "spec": {
            "nodeName": NODE,
            "containers": [
                {
                    "name": "main",
                    "image": IMAGE,
                    "command": ["sleep", "100000"],
                    "resources": {"requests": {"cpu": "1000000"}},
                }
            ],
        },
    }
    r = cp.kubectl("create", "-f", "-", input=json.dumps(manifest))
    assert r.returncode == 0, r.stderr

    def rejected() -> dict[str, Any] | None:
        pod = get_pod(cp, "gen-out-of-cpu")
        status = (pod or {}).get("status") or {}
        return pod if status.get("phase") == "Failed" else None

    pod = wait_for(rejected, timeout_s=30, what="the pod rejected (Failed)")
    assert pod["status"]["reason"] == "OutOfcpu"
    assert pod["metadata"]["generation"] == 1
    assert pod["status"]["observedGeneration"] == 1


def test_many_updates_converge(node: KletNode, control_plane: ControlPlane) -> None:
    cp = control_plane
    wait_node_ready(cp, NODE)
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "gen-many", "namespace": "default"},
        "spec": {
            "nodeName": NODE,
            "terminationGracePeriodSeconds": 2,
            "activeDeadlineSeconds": 5000,
            "containers": [{"name": "main", "image": IMAGE, "command": ["sleep", "100000"]}],
        },
    }
    r = cp.kubectl("create", "-f", "-", input=json.dumps(manifest))
    assert r.returncode == 0, r.stderr
    wait_for(lambda: reported(cp, "gen-many", 1), timeout_s=60, what="the pod Running")
    api = kclient.CoreV1Api(kconfig.new_client_from_config(str(cp.admin_kubeconfig)))
    try:
        for i in range(499):
            api.patch_namespaced_pod(
                "gen-many", "default", {"spec": {"activeDeadlineSeconds": 4999 - i}}
            )
    finally:
        api.api_client.close()
    pod = wait_for(
        lambda: reported(cp, "gen-many", 500),
        timeout_s=30,
        what="observedGeneration 500 after 499 updates",
    )
    assert pod["spec"]["activeDeadlineSeconds"] == 4501
