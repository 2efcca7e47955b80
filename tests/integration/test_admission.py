"""Pod admission on real containerd, seen from outside: a node filled to --max-pods
rejects the next static pod (Failed in /pods, a Warning Event on the bus, no sandbox or
container in CRI): static pods are critical, so upstream's kubelet tries to preempt for
it, finds only critical pods, and rejects it with UnexpectedAdmissionError and its
preemption error (naming the pod slot short); a pod requesting more CPU than the node's
allocatable is rejected the same way (naming the millicores short); a second pod wanting a host port
already taken is rejected with NodePorts; a nodeSelector that the node's labels
(--node-labels) do not satisfy gives NodeAffinity while a matching one runs; a pod
asking for a user namespace and a RuntimeClass is rejected with PodFeatureUnsupported
naming both fields; and a
SIGKILLed syncloop restarted at the limit keeps every running pod running with the same
containers, while the rejected pod stays Failed (read back from the bus, not
re-admitted)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from klet.devstack import DevStack, free_port

from tests.harness.node import KletNode, bus_events
from tests.harness.pods import running, runtime_containers, runtime_sandboxes
from tests.harness.waiting import wait_for


def sleeper(name: str, extra_spec: str = "", container_extra: str = "") -> str:
    return f"""
apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  terminationGracePeriodSeconds: 1
{extra_spec}
  containers:
    - name: main
      image: registry.klet.test/busybox:1.36
      command: ["sleep", "100000"]
{container_extra}
"""


UNEXPECTED = "UnexpectedAdmissionError"


def no_preemption_set(resource: str, short: int) -> str:
    """upstream's rejection of a critical (here: static) pod short of `resource` when
    every running pod is critical too, so none can be preempted."""
    return (
        "Unexpected error while attempting to recover from admission failure: preemption: "
        "error finding a set of pods to preempt: no set of running pods found to reclaim "
        f"resources: [(res: {resource}, q: {short}), ]"
    )


def rejected(node: KletNode, name: str) -> dict[str, Any] | None:
    pod = node.pods().get(f"{name}-{node.node_name}")
    if pod and pod["status"].get("phase") == "Failed":
        return pod
    return None


def check_rejected(
    node: KletNode, stack: DevStack, name: str, reason: str, message: str
) -> dict[str, Any]:
    """The pod is Failed with upstream's reason/message, has a Warning Event, and the
    runtime never got a sandbox or container for it."""
    pod: dict[str, Any] = wait_for(
        lambda: rejected(node, name), timeout_s=30, what=f"{name} Failed"
    )
    status = pod["status"]
    assert (status["reason"], status["message"]) == (reason, f"Pod was rejected: {message}")
    events = wait_for(
        lambda: [e for e in bus_events(node, name) if e.reason == reason],
        timeout_s=15,
        what=f"{reason} event of {name}",
    )
    assert (events[0].type, events[0].message) == ("Warning", message)
    full = f"{name}-{node.node_name}"
    assert runtime_sandboxes(stack, full) == []
    assert runtime_containers(stack, full) == {}
    return pod


def test_full_node_rejects_the_next_pod_and_a_restart_keeps_the_running_ones(
    node_factory: Any, manifests: Path, devstack: DevStack
) -> None:
    node: KletNode = node_factory(manifest_dir=manifests, extra_flags=["--max-pods", "3"])
    node.start()
    names = ["fill-a", "fill-b", "fill-c"]
    for name in names:
        (manifests / f"{name}.yaml").write_text(sleeper(name))
    for name in names:
        wait_for(lambda n=name: running(node, n), timeout_s=40, what=f"{name} Running")
    (manifests / "extra.yaml").write_text(sleeper("extra"))
    check_rejected(node, devstack, "extra", UNEXPECTED, no_preemption_set("pods", 1))
    before = {n: runtime_containers(devstack, f"{n}-{node.node_name}") for n in names}
    assert all(len(c) == 1 and set(c.values()) == {"CONTAINER_RUNNING"} for c in before.values())

    node.kill("syncloop")
    node.start("syncloop")
    # The restarted syncloop re-admits the running pods first, without touching any
    # running container; the extra pod stays Failed as its last status on the bus says
    # (a terminal pod is not admitted again, as upstream), with no second rejection.
    wait_for(
        lambda: "pod stays terminal after restart" in node.log("syncloop"),
        timeout_s=30,
        what="the restarted syncloop reading the extra pod's Failed status back",
    )
    assert len([e for e in bus_events(node, "extra") if e.reason == UNEXPECTED]) == 1
    for name in names:
        assert runtime_containers(devstack, f"{name}-{node.node_name}") == before[name]
        pod = running(node, name)
        assert pod is not None, f"{name} not running after the restart"
        assert pod["status"]["containerStatuses"][0]["restartCount"] == 0
    assert runtime_sandboxes(devstack, f"extra-{node.node_name}") == []
    assert rejected(node, "extra") is not None

    # A slot freed by removing a pod is not given to the rejected one (it was admitted
    # once, and refused), but a new pod fits.
    (manifests / "fill-a.yaml").unlink()
    wait_for(
        lambda: runtime_sandboxes(devstack, f"fill-a-{node.node_name}") == [],
        timeout_s=30,
        what="fill-a removed",
    )
    (manifests / "late.yaml").write_text(sleeper("late"))
    wait_for(lambda: running(node, "late"), timeout_s=40, what="late Running in the freed slot")
    assert runtime_sandboxes(devstack, f"extra-{node.node_name}") == []


def test_resources_ports_and_affinity_rejections(
    node_factory: Any, manifests: Path, devstack: DevStack
) -> None:
    node: KletNode = node_factory(
        manifest_dir=manifests, extra_flags=["--node-labels", "disktype=ssd"]
    )
    node.start()
    cpus = os.cpu_count() or 1

    (manifests / "greedy.yaml").write_text(
        sleeper("greedy", container_extra="      resources:\n        requests: {cpu: '1000'}")
    )
    check_rejected(
        node, devstack, "greedy", UNEXPECTED, no_preemption_set("cpu", 1_000_000 - cpus * 1000)
    )

    port = free_port()
    ports = f"      ports:\n        - containerPort: 8080\n          hostPort: {port}"
    (manifests / "port-a.yaml").write_text(sleeper("port-a", container_extra=ports))
    wait_for(lambda: running(node, "port-a"), timeout_s=40, what="port-a Running")
    (manifests / "port-b.yaml").write_text(sleeper("port-b", container_extra=ports))
    check_rejected(
        node,
        devstack,
        "port-b",
        "NodePorts",
        "Predicate NodePorts failed: node(s) didn't have free ports for the requested pod ports",
    )
    assert running(node, "port-a") is not None

    (manifests / "hdd.yaml").write_text(sleeper("hdd", "  nodeSelector: {disktype: hdd}"))
    check_rejected(
        node,
        devstack,
        "hdd",
        "NodeAffinity",
        "Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector",
    )
    (manifests / "ssd.yaml").write_text(sleeper("ssd", "  nodeSelector: {disktype: ssd}"))
    wait_for(lambda: running(node, "ssd"), timeout_s=40, what="ssd (matching selector) Running")

    # More isolation than klet gives: refused, never run with less.
    isolated = "  hostUsers: false\n  runtimeClassName: kata"
    (manifests / "isolated.yaml").write_text(sleeper("isolated", isolated))
    check_rejected(
        node,
        devstack,
        "isolated",
        "PodFeatureUnsupported",
        "Pod requires features this node lacks: spec.hostUsers: user namespaces "
        "(hostUsers: false) are not supported on this node; spec.runtimeClassName: "
        "a RuntimeClass is looked up in the API server and this node has none (standalone)",
    )
