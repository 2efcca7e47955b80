"""Graceful node shutdown on a node whose PID 1 is a real systemd, with a real logind
(tests/harness/systemd_node.py): klet up in the node container with
`shutdownGracePeriod: 20s` and `shutdownGracePeriodCriticalPods: 8s`, three static pods
(two of priority 0, one of system-node-critical priority), each with a preStop hook that
appends its name to a file on the node's bound state directory.

Checked, in order:

- klet raised logind's InhibitDelayMaxSec (5 s by default) to the 20 s the periods need
  (its drop-in and logind's property) and holds a delay lock for shutdown
  (`systemd-inhibit --list`);
- when logind restarts (its locks go with it) and when the eviction service is
  SIGKILLed, klet takes a new lock (logging why for logind) and every pod runs on;
- `systemctl poweroff` (through logind, as an operator's or a reboot's) makes klet
  handle the shutdown: every pod ends Failed with reason `Terminated`, upstream's
  message and the DisruptionTarget condition; the preStop hooks ran, the priority-0
  pods' before the critical pod's; a pod that arrives meanwhile is rejected with
  `NodeShutdown`; klet's lock is released afterwards;
- the start and end gauges (`kubelet_graceful_shutdown_*_time_seconds`, on the
  read-only port's merged /metrics) and the state file that keeps them are written.

The node joins the session's control plane (through the harness's apiserver relay), so
the final statuses are read where the cluster reads them, from the apiserver (the
static pods' mirror pods), beside the node's own view; the Node's Ready condition is
False with "node is shutting down".

The test holds a delay lock of its own (`systemd-inhibit ... sleep`), and after klet has
raised the delay it raises it further with a drop-in of its own, so that logind waits
for the test after klet's lock is gone: the node's own view (the read-only port) and
the rejection of a late pod are read before the node powers off. Then the test lets go
and the container exits.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from klet.testbed.cluster import ControlPlane

from tests.harness.systemd_node import NODE_STATE, READ_ONLY_PORT, SystemdNode, build_image
from tests.harness.waiting import wait_for

pytestmark = [pytest.mark.systemd, pytest.mark.timeout(900)]

CONFIG = """\
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
shutdownGracePeriod: 20s
shutdownGracePeriodCriticalPods: 8s
"""
BUSYBOX = "registry.klet.test/busybox:1.36"
CRITICAL = 2_000_001_000
ORDER = "shutdown-order"
PODS = {"web": 0, "batch": 0, "critical": CRITICAL}
MESSAGE = "Pod was terminated in response to imminent node shutdown."


def manifest(name: str, priority: int) -> str:
    # As kubeadm's static pods: the class beside the value, which the apiserver's
    # Priority admission requires of the mirror pod when the value is not its default.
    klass = "\n  priorityClassName: system-node-critical" if priority == CRITICAL else ""
    return f"""\
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default}}
spec:
  priority: {priority}{klass}
  terminationGracePeriodSeconds: 5
  volumes:
    - name: state
      hostPath: {{path: {NODE_STATE}, type: Directory}}
  containers:
    - name: main
      image: {BUSYBOX}
      command: ["sh", "-c", "trap 'exit 0' TERM; sleep 100000 & wait"]
      volumeMounts: [{{name: state, mountPath: /state}}]
      lifecycle:
        preStop:
          exec:
            command: ["sh", "-c", "echo {name} >> /state/{ORDER}"]
"""


@pytest.fixture(scope="module")
def node(
    tmp_path_factory: pytest.TempPathFactory, control_plane: ControlPlane
) -> Iterator[SystemdNode]:
    base = tmp_path_factory.mktemp("sd-shutdown")
    archive = build_image(base / "image")
    node = SystemdNode(base / "n", name="shutdown-node")
    try:
        node.start(archive)
        for name, priority in PODS.items():
            (node.manifests / f"{name}.yaml").write_text(manifest(name, priority))
        node.start_klet(CONFIG, *node.join(control_plane))
        yield node
    finally:
        node.stop()
        control_plane.kubectl(
            "delete",
            "pods",
            "--namespace=default",
            f"--field-selector=spec.nodeName={node.name}",
            "--grace-period=0",
            "--force",
            "--ignore-not-found",
        )
        control_plane.kubectl("delete", "node", node.name, "--ignore-not-found")


def _api_pods(plane: ControlPlane, node: SystemdNode) -> dict[str, dict[str, Any]]:
    """The node's (mirror) pods in the apiserver, by manifest name."""
    res = plane.kubectl(
        "get",
        "pods",
        "--namespace=default",
        f"--field-selector=spec.nodeName={node.name}",
        "-o",
        "json",
    )
    if res.returncode != 0:
        return {}
    items = json.loads(res.stdout)["items"]
    return {str(p["metadata"]["name"]).removesuffix(f"-{node.name}"): p for p in items}


def _api_ready(plane: ControlPlane, node: SystemdNode) -> dict[str, Any]:
    """The Node's Ready condition in the apiserver ({} before it registers)."""
    res = plane.kubectl("get", "node", node.name, "-o", "json")
    if res.returncode != 0:
        return {}
    conditions = json.loads(res.stdout)["status"].get("conditions") or []
    return next((c for c in conditions if c["type"] == "Ready"), {})


def _by_name(node: SystemdNode) -> dict[str, dict[str, Any]]:
    """The node's pods by manifest name (static pods are `<name>-<node>`)."""
    return {str(p["metadata"]["name"]).removesuffix(f"-{node.name}"): p for p in node.pods()}


def _read(node: SystemdNode, path: str) -> str:
    return node.exec(
        [
            "python3",
            "-c",
            "import sys,urllib.request;"
            f"sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:{READ_ONLY_PORT}{path}',"
            "timeout=5).read().decode())",
        ],
        check=False,
    ).stdout


def _metric(node: SystemdNode, name: str) -> float | None:
    for line in _read(node, "/metrics").splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def _inhibitors(node: SystemdNode) -> str:
    return node.exec(["systemd-inhibit", "--list", "--no-pager"], check=False).stdout


def _lock_holder(node: SystemdNode) -> str | None:
    """The PID holding klet's delay lock for shutdown (`systemd-inhibit --list`'s
    columns: WHO UID USER PID COMM WHAT WHY MODE), None when there is none."""
    for line in _inhibitors(node).splitlines():
        fields = line.split()
        if fields and fields[0] == "kubelet" and "delay" in fields:
            return fields[3]
    return None


def test_a_poweroff_kills_pods_by_priority_and_reports_each(
    node: SystemdNode, control_plane: ControlPlane
) -> None:
    def running() -> bool:
        pods = _by_name(node)
        return set(pods) == set(PODS) and all(
            p["status"].get("phase") == "Running" for p in pods.values()
        )

    wait_for(running, timeout_s=240, what="the three static pods Running")
    wait_for(
        lambda: _api_ready(control_plane, node).get("status") == "True",
        timeout_s=120,
        what=f"node {node.name} Ready in the apiserver",
    )

    def mirrored() -> bool:
        pods = _api_pods(control_plane, node)
        return set(pods) >= set(PODS) and all(
            pods[n]["status"].get("phase") == "Running" for n in PODS
        )

    wait_for(mirrored, timeout_s=120, what="the three mirror pods Running in the apiserver")

    def locked() -> bool:
        listing = _inhibitors(node)
        return "kubelet" in listing and "delay" in listing

    wait_for(locked, timeout_s=60, what="klet's delay lock for shutdown")
    dropin = node.exec(["cat", "/etc/systemd/logind.conf.d/99-kubelet.conf"]).stdout
    assert "InhibitDelayMaxSec=20" in dropin
    delay = node.exec(
        [
            "busctl",
            "get-property",
            "org.freedesktop.login1",
            "/org/freedesktop/login1",
            "org.freedesktop.login1.Manager",
            "InhibitDelayMaxUSec",
        ]
    ).stdout.split()
    assert delay == ["t", "20000000"], delay

    # logind restarted (its locks die with it), then the eviction service SIGKILLed: each
    # time klet takes a new lock, and no pod is touched.
    first = _lock_holder(node)
    node.exec(["systemctl", "restart", "systemd-logind"])
    wait_for(
        lambda: _lock_holder(node) is not None, timeout_s=60, what="a lock after logind's restart"
    )
    assert "systemd-logind left the system bus" in node.journal()
    pid = node.exec(["pgrep", "-f", "-o", "--", "-m klet.eviction"]).stdout.strip()
    node.exec(["kill", "-KILL", pid])
    wait_for(
        lambda: _lock_holder(node) not in (None, pid),
        timeout_s=60,
        what="a lock from the restarted eviction service",
    )
    assert running(), "a pod stopped while logind or the eviction service restarted"
    assert first is not None
    # Room for the test to read the statuses once klet is done (a later drop-in wins).
    node.exec(
        [
            "sh",
            "-c",
            "printf '[Login]\\nInhibitDelayMaxSec=90\\n' "
            "> /etc/systemd/logind.conf.d/99-zz-observer.conf"
            " && systemctl kill --signal=HUP systemd-logind",
        ]
    )

    # Our own delay lock: logind waits for it after klet's goes, so the statuses can be
    # read before the node goes down.
    node.dockerd.docker(
        [
            "exec",
            "--detach",
            node.name,
            "systemd-inhibit",
            "--what=shutdown",
            "--mode=delay",
            "--who=observer",
            "--why=read the final statuses",
            "sleep",
            "600",
        ]
    )
    wait_for(lambda: "observer" in _inhibitors(node), timeout_s=20, what="the observer's lock")
    began = time.monotonic()
    node.exec(["systemctl", "poweroff"])

    def all_failed() -> bool:
        pods = _by_name(node)
        return set(pods) >= set(PODS) and all(
            pods[name]["status"].get("phase") == "Failed" for name in PODS
        )

    wait_for(all_failed, timeout_s=60, what="every pod Failed by the shutdown")
    took = time.monotonic() - began

    # What the cluster sees: every pod's final status reported to the apiserver before
    # the node went down, and the Node not Ready while it shuts down.
    def reported() -> bool:
        pods = _api_pods(control_plane, node)
        return set(pods) >= set(PODS) and all(
            pods[n]["status"].get("phase") == "Failed" for n in PODS
        )

    wait_for(reported, timeout_s=60, what="every pod Failed in the apiserver")
    reported_after = time.monotonic() - began
    api_pods = _api_pods(control_plane, node)
    for pods in (_by_name(node), api_pods):
        for name in PODS:
            status = pods[name]["status"]
            assert (status.get("reason"), status.get("message")) == ("Terminated", MESSAGE), name
            [target] = [c for c in status["conditions"] if c["type"] == "DisruptionTarget"]
            assert (target["status"], target["reason"]) == ("True", "TerminationByKubelet")
    ready = _api_ready(control_plane, node)
    assert ready.get("status") == "False", ready
    assert "node is shutting down" in ready.get("message", ""), ready

    order = (node.state / ORDER).read_text().split()
    assert sorted(order) == sorted(PODS), order
    assert order[-1] == "critical", order

    wait_for(
        lambda: "kubelet" not in _inhibitors(node),
        timeout_s=30,
        what="klet's lock released after the shutdown",
    )

    (node.manifests / "late.yaml").write_text(manifest("late", 0))

    def late_rejected() -> bool:
        late = _by_name(node).get("late")
        return late is not None and late["status"].get("reason") == "NodeShutdown"

    wait_for(late_rejected, timeout_s=30, what="a pod arriving during the shutdown rejected")
    # klet up's root dir is <run-dir>/root, on the node's bound state directory.
    state = (node.state / "run" / "root" / "graceful_node_shutdown_state").read_text()
    assert "startTime" in state and "endTime" in state, state
    started = _metric(node, "kubelet_graceful_shutdown_start_time_seconds")
    ended = _metric(node, "kubelet_graceful_shutdown_end_time_seconds")
    assert started and ended and ended >= started > 0, (started, ended)
    journal = node.journal()
    assert "node shutdown handled" in journal, journal[-3000:]
    print(
        f"graceful shutdown: poweroff -> every pod Failed in {took:.1f}s,"
        f" in the apiserver after {reported_after:.1f}s"
    )
    node.exec(["pkill", "-f", "systemd-inhibit --what=shutdown --mode=delay --who=observer"])
