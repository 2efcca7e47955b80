"""Critical pod preemption against the real apiserver and containerd.

A node with `--max-pods 2` runs two API pods (priority 0): a BestEffort one and a
Burstable one. A static pod arriving then is critical and finds no pod slot: as
upstream's kubelet, syncloop kills the BestEffort pod (the lowest QoS class that frees a
slot), whose API status becomes Failed with reason `Preempting`, message "Preempted in
order to admit critical pod" and the DisruptionTarget condition (reason
TerminationByKubelet), with a Warning `Preempting` Event; the Burstable pod runs on, the
static pod runs (its mirror pod Running), and syncloop's
kubelet_preemptions{preemption_signal="pods"} is 1.

This is a cluster test, not an integration one: on a standalone node every pod is
static, so critical, and none can be preempted (tests/integration/test_admission.py
shows that refusal).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from klet.devstack import DevStack
from klet.testbed.cluster import ControlPlane

from tests.harness.apiview import events, get_pod, in_phase, node_registered, sleeper_pod
from tests.harness.clusternode import cluster_node
from tests.harness.node import KletNode
from tests.harness.pods import runtime_containers
from tests.harness.waiting import wait_for

NODE = "kletpreempt1"
STATIC = json.dumps(sleeper_pod("critical", terminationGracePeriodSeconds=1))


def api_pod(name: str, resources: dict[str, Any] | None = None) -> dict[str, Any]:
    extra = {"resources": resources} if resources else {}
    return sleeper_pod(name, node=NODE, container=extra, terminationGracePeriodSeconds=1)


@pytest.fixture(scope="module")
def node(
    control_plane: ControlPlane, devstack: DevStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KletNode]:
    base = tmp_path_factory.mktemp("preemptnode")
    with cluster_node(
        control_plane, devstack, base, name=NODE, extra_flags=["--max-pods", "2"]
    ) as kletnode:
        yield kletnode


def test_a_static_pod_preempts_the_best_effort_pod_at_a_full_node(
    node: KletNode, control_plane: ControlPlane, devstack: DevStack
) -> None:
    cp = control_plane
    node_registered(cp, NODE)
    cp.apply([api_pod("low"), api_pod("mid", {"requests": {"cpu": "10m"}})])
    wait_for(lambda: in_phase(cp, "low", "Running"), timeout_s=90, what="low Running")
    wait_for(lambda: in_phase(cp, "mid", "Running"), timeout_s=90, what="mid Running")
    low = get_pod(cp, "low")
    assert low is not None and low["spec"].get("priority") == 0  # what preemption compares

    Path(node.manifests, "critical.yaml").write_text(STATIC)  # type: ignore[attr-defined]
    failed = wait_for(lambda: in_phase(cp, "low", "Failed"), timeout_s=60, what="low Failed")
    status = failed["status"]
    assert (status["reason"], status["message"]) == (
        "Preempting",
        "Preempted in order to admit critical pod",
    )
    [target] = [c for c in status["conditions"] if c["type"] == "DisruptionTarget"]
    assert (target["status"], target["reason"], target["message"]) == (
        "True",
        "TerminationByKubelet",
        "Pod was preempted by Kubelet to accommodate a critical pod.",
    )
    wait_for(
        lambda: in_phase(cp, f"critical-{NODE}", "Running"),
        timeout_s=90,
        what="the static pod's mirror Running",
    )
    assert in_phase(cp, "mid", "Running") is not None
    assert "CONTAINER_RUNNING" not in runtime_containers(devstack, "low").values()
    preempting = wait_for(lambda: events(cp, "low", "Preempting"), timeout_s=30, what="Event")
    assert (preempting[0]["type"], preempting[0]["message"]) == (
        "Warning",
        "Preempted in order to admit critical pod",
    )
    assert node.metric("syncloop", "kubelet_preemptions", preemption_signal="pods") == 1
    cp.kubectl("delete", "pod", "low", "mid", "--wait=false")
