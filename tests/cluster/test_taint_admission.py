"""Admission by the Node's NoExecute taints, against the real apiserver and containerd.

The node is tainted `klet.test/drain=now:NoExecute` with the real kubectl; once
syncloop logs that the taint reached admission (its Node watch), a new pod that does
not tolerate it is rejected as upstream's kubelet rejects it: phase Failed, reason
`TaintToleration`, message "Pod was rejected: Predicate TaintToleration failed:
node(s) had taints that the pod didn't tolerate", a Warning Event with the bare
message, and no container in the runtime. A pod tolerating the taint runs beside it,
and so does a static pod (exempt, and tolerating NoExecute by default). NoSchedule
taints are the scheduler's: a pod bound by nodeName runs under one. Once the taint is
removed a new non-tolerating pod runs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from klet.devstack import DevStack
from klet.testbed.cluster import ControlPlane

from tests.harness.apiview import events, in_phase, node_registered, sleeper_pod
from tests.harness.clusternode import cluster_node
from tests.harness.node import KletNode
from tests.harness.pods import runtime_containers
from tests.harness.waiting import wait_for

NODE = "klettaint1"
TAINT_KEY = "klet.test/drain"
MESSAGE = "Predicate TaintToleration failed: node(s) had taints that the pod didn't tolerate"

STATIC = json.dumps(sleeper_pod("taintstatic"))


def pod(name: str, tolerations: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    extra = {"tolerations": tolerations} if tolerations else {}
    return sleeper_pod(name, node=NODE, terminationGracePeriodSeconds=1, **extra)


@pytest.fixture(scope="module")
def node(
    control_plane: ControlPlane, devstack: DevStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KletNode]:
    base = tmp_path_factory.mktemp("taintnode")
    with cluster_node(control_plane, devstack, base, name=NODE) as kletnode:
        yield kletnode


def taints_seen(node: KletNode, *, present: bool) -> bool:
    """Whether syncloop's last "node taints changed" line has the test's taint."""
    lines = [line for line in node.log("syncloop").splitlines() if "node taints changed" in line]
    return bool(lines) and (TAINT_KEY in lines[-1]) is present


def test_no_execute_taint_rejects_a_pod_that_does_not_tolerate_it(
    node: KletNode, control_plane: ControlPlane, devstack: DevStack
) -> None:
    cp = control_plane
    node_registered(cp, NODE)
    cp.kubectl("taint", "nodes", NODE, f"{TAINT_KEY}=now:NoExecute", check=True)
    cp.kubectl("taint", "nodes", NODE, "klet.test/dedicated=x:NoSchedule", check=True)
    wait_for(lambda: taints_seen(node, present=True), timeout_s=30, what="the taint in syncloop")

    cp.apply(
        [
            pod("untolerating"),
            pod("tolerating", [{"key": TAINT_KEY, "operator": "Exists", "effect": "NoExecute"}]),
        ]
    )
    Path(node.manifests, "static.yaml").write_text(STATIC)  # type: ignore[attr-defined]
    failed = wait_for(
        lambda: in_phase(cp, "untolerating", "Failed"), timeout_s=60, what="untolerating Failed"
    )
    assert failed["status"]["reason"] == "TaintToleration"
    assert failed["status"]["message"] == f"Pod was rejected: {MESSAGE}"
    wait_for(lambda: in_phase(cp, "tolerating", "Running"), timeout_s=90, what="tolerating Running")
    wait_for(
        lambda: in_phase(cp, f"taintstatic-{NODE}", "Running"),
        timeout_s=90,
        what="the static pod's mirror Running",
    )
    rejected = wait_for(
        lambda: events(cp, "untolerating", "TaintToleration"), timeout_s=30, what="the Event"
    )
    assert rejected[0]["type"] == "Warning"
    assert rejected[0]["message"] == MESSAGE
    assert runtime_containers(devstack, "untolerating") == {}

    # Removing the taint lets the next pod in (the NoSchedule one is not the kubelet's).
    cp.kubectl("taint", "nodes", NODE, f"{TAINT_KEY}-", check=True)
    wait_for(lambda: taints_seen(node, present=False), timeout_s=30, what="the taint gone")
    cp.apply([pod("after")])
    wait_for(lambda: in_phase(cp, "after", "Running"), timeout_s=90, what="after Running")
    cp.kubectl("taint", "nodes", NODE, "klet.test/dedicated-", check=True)
    cp.kubectl("delete", "pod", "untolerating", "tolerating", "after", "--wait=false")
