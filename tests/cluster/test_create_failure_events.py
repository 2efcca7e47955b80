"""A pod from the apiserver whose container cannot be created (a Bidirectional mount of
a host directory that is not a shared mount; containerd refuses the CreateContainer),
on a klet node with a real kube-apiserver (issue 37: klet retried about 12 times a
second and posted thousands of separate `Failed` Events).

Measured here: the CreateContainer calls, counted by syncloop's own
kubelet_runtime_operations_total{operation_type="create_container"}, are at most what
the pod worker's back-off allows over the time the test runs (the node's own status
patches come back as RECONCILE changes, which no longer re-sync the pod); and since
containerd's message names a new container ID each time, the apiserver holds nine
`Failed` Events and then one "(combined from similar events)" Event whose count rises,
not one Event per attempt.

The node runs with `--pod-worker-backoff-period 2s` (klet's own flag; upstream's fixed
10 s is the default, tests/unit/test_config_flags.py): the eleven attempts the Events need
take about 30 s instead of two minutes, and the bound is the same rule, attempts <= the
time taken / the period + 1, which the hot loop of issue 37 (about 12 a second) breaks
at any period."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from klet.devstack import DevStack
from klet.testbed.cluster import ControlPlane

from tests.harness.clusternode import cluster_node, wait_node_ready
from tests.harness.node import KletNode
from tests.harness.waiting import wait_for

pytestmark = pytest.mark.timeout(240)  # eleven failed attempts 2-3 s apart come first

NODE = "kletcreatefail1"
IMAGE = "registry.klet.test/busybox:1.36"
BACKOFF_S = 2.0
"""The node's --pod-worker-backoff-period: a failed sync is retried after it..."""
BACKOFF_MAX_S = 1.5 * BACKOFF_S
"""...and up to half of it again (upstream's jitter factor)."""
COMBINED = "(combined from similar events): "


def pod(host_dir: Path) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "unmountable", "namespace": "default"},
        "spec": {
            "nodeName": NODE,
            "containers": [
                {
                    "name": "main",
                    "image": IMAGE,
                    "command": ["sleep", "100000"],
                    "securityContext": {"privileged": True},
                    "volumeMounts": [
                        {"name": "host", "mountPath": "/host", "mountPropagation": "Bidirectional"}
                    ],
                }
            ],
            "volumes": [{"name": "host", "hostPath": {"path": str(host_dir), "type": "Directory"}}],
        },
    }


@pytest.fixture(scope="module")
def node(
    control_plane: ControlPlane, devstack: DevStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KletNode]:
    base = tmp_path_factory.mktemp("createfailnode")
    flags = ["--pod-worker-backoff-period", f"{BACKOFF_S:g}s"]
    with cluster_node(control_plane, devstack, base, name=NODE, extra_flags=flags) as kletnode:
        yield kletnode


def _creates(node: KletNode) -> float:
    ops = "kubelet_runtime_operations_total"
    return node.metric("syncloop", ops, operation_type="create_container") or 0.0


def _failed_events(cp: ControlPlane) -> list[dict[str, Any]]:
    r = cp.kubectl(
        "get",
        "events",
        "-n",
        "default",
        "--field-selector=involvedObject.name=unmountable,reason=Failed",
        "-o",
        "json",
    )
    assert r.returncode == 0, r.stderr
    return list(json.loads(r.stdout)["items"])


def test_a_container_that_cannot_be_created_is_paced_and_one_event_counts_it(
    node: KletNode, control_plane: ControlPlane, tmp_path: Path
) -> None:
    cp = control_plane
    wait_node_ready(cp, NODE)
    host_dir = tmp_path / "private-dir"
    host_dir.mkdir()
    r = cp.kubectl("create", "-f", "-", input=json.dumps(pod(host_dir)))
    assert r.returncode == 0, r.stderr
    try:
        wait_for(lambda: _creates(node) >= 1, timeout_s=60, what="the first CreateContainer")
        first = _creates(node)
        began = time.monotonic()
        # containerd names the new container's ID in its error, so each attempt's
        # message differs: nine Events, then from the tenth one combined Event.
        combined = wait_for(
            lambda: next((e for e in _failed_events(cp) if COMBINED in e["message"]), None),
            timeout_s=10 * BACKOFF_MAX_S + 30,
            what="the combined Failed Event",
        )
        attempts = _creates(node) - first
        took = time.monotonic() - began
        print(f"{attempts:.0f} CreateContainer calls in {took:.1f}s after the first")
        assert attempts <= took / BACKOFF_S + 1, attempts  # the pod worker's back-off
        raised = wait_for(
            lambda: next(
                (
                    e
                    for e in _failed_events(cp)
                    if COMBINED in e["message"] and e["count"] > combined["count"]
                ),
                None,
            ),
            timeout_s=2 * BACKOFF_MAX_S + 10,
            what="the combined Event's count rising",
        )
        attempts = _creates(node) - first
        took = time.monotonic() - began
        events = _failed_events(cp)
        print(f"{attempts:.0f} CreateContainer calls in {took:.1f}s after the first")
        print("Failed Events:", [(e["count"], e["message"][:60]) for e in events])
        assert attempts <= took / BACKOFF_S + 1, attempts
        assert raised["metadata"]["name"] == combined["metadata"]["name"]
        assert len(events) == 10, [e["message"] for e in events]
        assert sum(int(e.get("count") or 1) for e in events) <= attempts + 1
        status = json.loads(cp.kubectl("get", "pod", "unmountable", "-o", "json").stdout)
        [cs] = status["status"]["containerStatuses"]
        assert cs["state"]["waiting"]["reason"] == "CreateContainerError", cs
    finally:
        cp.kubectl("delete", "pod", "unmountable", "--grace-period=0", "--force")
