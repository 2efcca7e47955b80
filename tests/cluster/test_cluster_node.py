"""klet as a node of a real cluster, end to end with the real kubectl: the Node turns
Ready and its Lease is renewed; a pod bound by nodeName runs and reports Running with
its IP; `kubectl logs`, `exec` (with stdin) and `port-forward` work through the
apiserver and klet's 10250 API; `kubectl delete` finishes within the grace period and
the containers are gone from CRI; a static pod gets a mirror pod that comes back when
deleted; restarting status-reporter or stopping the apiserver stops no pod; 10250
refuses anonymous requests. (The read-only port being off by default and 403 for a
token without RBAC are covered by test_status_reporter.py and test_kubelet_api.py.)"""

from __future__ import annotations

import json
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from klet.devstack import DevStack, free_port
from klet.testbed.cluster import ControlPlane

from tests.harness.clusternode import cluster_node
from tests.harness.node import RELISTS, KletNode, fetch
from tests.harness.pods import runtime_containers
from tests.harness.waiting import wait_for

NODE = "kletnode1"


def pod_manifest(name: str, *, image: str, command: list[str], grace: int = 3) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": NODE,
            "terminationGracePeriodSeconds": grace,
            "containers": [{"name": "main", "image": image, "command": command}],
        },
    }


@pytest.fixture(scope="module")
def node(
    control_plane: ControlPlane, devstack: DevStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KletNode]:
    base = tmp_path_factory.mktemp("clusternode")
    with cluster_node(control_plane, devstack, base, name=NODE) as kletnode:
        yield kletnode


def kget(cp: ControlPlane, *args: str) -> Any:
    """`kubectl get -o json`; a failed kubectl (not there yet, the apiserver away) raises
    CalledProcessError, which wait_for retries."""
    return json.loads(cp.kubectl("get", *args, "-o", "json", check=True).stdout)


def lease_renewed_at(cp: ControlPlane) -> float:
    """The node Lease's renewTime (microsecond precision), as a Unix time."""
    lease = kget(cp, "lease", NODE, "-n", "kube-node-lease")
    return datetime.fromisoformat(lease["spec"]["renewTime"].replace("Z", "+00:00")).timestamp()


def ready(node_obj: dict[str, Any]) -> bool:
    return any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in node_obj["status"].get("conditions", [])
    )


def pod_running(cp: ControlPlane, name: str) -> dict[str, Any] | None:
    r = cp.kubectl("get", "pod", name, "-o", "json")
    if r.returncode != 0:
        return None
    pod = json.loads(r.stdout)
    status = pod.get("status", {})
    statuses = status.get("containerStatuses") or []
    if status.get("phase") == "Running" and statuses and all(c.get("ready") for c in statuses):
        return pod
    return None


def test_node_ready_and_lease_renewed(node: KletNode, control_plane: ControlPlane) -> None:
    obj = wait_for(
        lambda: (n := kget(control_plane, "node", NODE)) and ready(n) and n,
        timeout_s=15,
        what="Node Ready within 15 s",
    )
    status = obj["status"]
    assert int(status["capacity"]["pods"]) == 110 and status["allocatable"]["memory"]
    assert {"type": "InternalIP", "address": "127.0.0.1"} in status["addresses"]
    assert status["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
    assert status["daemonEndpoints"]["kubeletEndpoint"]["Port"] == node.kubelet_port
    assert obj["metadata"]["labels"]["kubernetes.io/hostname"] == NODE

    def renew_time() -> datetime:
        lease = kget(control_plane, "lease", NODE, "-n", "kube-node-lease")
        return datetime.fromisoformat(lease["spec"]["renewTime"].replace("Z", "+00:00"))

    first = wait_for(renew_time, timeout_s=15, what="a Lease")
    wait_for(lambda: renew_time() > first, timeout_s=20, what="the Lease renewed")


def test_pod_runs_logs_exec_port_forward_delete(
    node: KletNode, control_plane: ControlPlane, devstack: DevStack, tmp_path: Path
) -> None:
    cp = control_plane
    web = pod_manifest(
        "web",
        image="registry.klet.test/httpd:1.36",
        command=[
            "sh",
            "-c",
            "echo via-port-forward > /www/index.html; echo started; exec httpd -f -p 80 -h /www",
        ],
    )
    cp.apply([web])
    pod = wait_for(
        lambda: pod_running(cp, "web"), timeout_s=30, what="web Running via the apiserver"
    )
    assert pod["status"]["podIP"] and pod["status"]["containerStatuses"][0][
        "containerID"
    ].startswith("containerd://")

    logs = wait_for(
        lambda: (r := cp.kubectl("logs", "web")).returncode == 0 and r.stdout,
        timeout_s=15,
        what="kubectl logs",
    )
    assert "started" in logs
    r = cp.kubectl("exec", "web", "--", "cat", "/etc/hostname")
    assert r.returncode == 0 and r.stdout.strip() == "web", r.stderr
    r = cp.kubectl("exec", "-i", "web", "--", "sh", "-c", "tr a-z A-Z", input="hello stdin\n")
    assert r.returncode == 0 and r.stdout.strip() == "HELLO STDIN", r.stderr

    local = free_port()
    kubectl = [str(cp.bin_dir / "kubectl"), "--kubeconfig", str(cp.admin_kubeconfig)]
    with subprocess.Popen(
        [*kubectl, "port-forward", "pod/web", f"{local}:80"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    ) as pf:
        try:
            body = wait_for(
                lambda: fetch(f"http://127.0.0.1:{local}/"),
                timeout_s=20,
                what="kubectl port-forward to httpd",
            )
            assert body.strip() == "via-port-forward"
        finally:
            pf.terminate()

    with subprocess.Popen(
        [*kubectl, "logs", "-f", "web"], stdout=subprocess.PIPE, text=True
    ) as follow:
        try:
            assert follow.stdout is not None
            assert "started" in follow.stdout.readline()
        finally:
            follow.terminate()

    before = runtime_containers(devstack, "web")
    assert before
    started = time.monotonic()
    r = cp.kubectl("delete", "pod", "web", "--wait=true", timeout_s=60)
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - started < 3 + 5
    assert all(
        state == "CONTAINER_EXITED" for state in runtime_containers(devstack, "web").values()
    )
    # The object is gone, so the pod is no longer desired: its sandbox and containers go.
    wait_for(
        lambda: not runtime_containers(devstack, "web"),
        timeout_s=10,
        what="containers removed from CRI",
    )


def test_static_pod_has_a_mirror_that_comes_back(
    node: KletNode, control_plane: ControlPlane
) -> None:
    manifests: Path = node.manifests  # type: ignore[attr-defined]
    (manifests / "static.yaml").write_text(
        json.dumps(
            pod_manifest(
                "static", image="registry.klet.test/busybox:1.36", command=["sleep", "100000"]
            )
        )
    )
    name = f"static-{NODE}"
    mirror = wait_for(
        lambda: pod_running(control_plane, name), timeout_s=30, what="mirror pod Running"
    )
    assert "kubernetes.io/config.mirror" in mirror["metadata"]["annotations"]
    control_plane.kubectl("delete", "pod", name, "--wait=false")
    wait_for(
        lambda: (
            (p := pod_running(control_plane, name))
            and p["metadata"]["uid"] != mirror["metadata"]["uid"]
        ),
        timeout_s=30,
        what="mirror pod recreated",
    )
    (manifests / "static.yaml").unlink()
    wait_for(
        lambda: control_plane.kubectl("get", "pod", name).returncode != 0,
        timeout_s=30,
        what="mirror pod deleted with the static pod",
    )


def test_restarts_and_outages_stop_no_pod(
    node: KletNode, control_plane: ControlPlane, devstack: DevStack
) -> None:
    cp = control_plane
    cp.apply(
        [
            pod_manifest(
                "talker", image="registry.klet.test/busybox:1.36", command=["sleep", "100000"]
            )
        ]
    )
    wait_for(lambda: pod_running(cp, "talker"), timeout_s=30, what="talker Running")
    before = runtime_containers(devstack, "talker")

    wait_for(
        lambda: "pod status sent" in node.log("status-reporter"),
        timeout_s=30,
        what="talker's status sent",
    )
    node.kill("status-reporter")
    killed = time.time()  # a renewal after this is the new reporter's
    earlier = len(node.log("status-reporter"))
    node.start("status-reporter")

    def renewed_by_the_new_reporter() -> bool:
        assert ready(kget(cp, "node", NODE)), "node went NotReady during a status-reporter restart"
        return lease_renewed_at(cp) > killed

    wait_for(renewed_by_the_new_reporter, timeout_s=30, what="the restarted reporter's renewal")
    assert runtime_containers(devstack, "talker") == before
    # The new reporter patches what changed, not every pod again: a pod started after
    # the restart has its status sent, talker (unchanged) none.
    cp.apply(
        [
            pod_manifest(
                "later", image="registry.klet.test/busybox:1.36", command=["sleep", "100000"]
            )
        ]
    )
    wait_for(lambda: pod_running(cp, "later"), timeout_s=30, what="later Running")
    sent = [
        line
        for line in node.log("status-reporter")[earlier:].splitlines()
        if "pod status sent" in line
    ]
    assert any("default/later" in line for line in sent), sent
    assert not any("default/talker" in line for line in sent), sent

    # The apiserver stays away until pod-source's api source has failed four lists or
    # watches (its back-off grows from 0.8 s) and syncloop has relisted three times since:
    # an outage taken for an empty pod set would have stopped the pod by then.
    failures = node.metric("pod-source", "klet_pod_source_api_watch_errors_total") or 0.0
    cp.stop_apiserver()
    wait_for(
        lambda: (
            (node.metric("pod-source", "klet_pod_source_api_watch_errors_total") or 0.0)
            >= failures + 4
        ),
        timeout_s=60,
        what="four failed lists or watches of the api source",
    )
    node.wait_passes("syncloop", RELISTS, 3, timeout_s=15)
    assert runtime_containers(devstack, "talker") == before, (
        "a pod changed while the apiserver was down"
    )
    cp.start_apiserver()
    back = time.monotonic()

    def renewed_after_return() -> bool:
        return lease_renewed_at(cp) > time.time() - (time.monotonic() - back)

    wait_for(
        renewed_after_return,
        timeout_s=20,
        what="the Lease renewed within 20 s of the apiserver's return",
    )
    wait_for(
        lambda: pod_running(cp, "talker"),
        timeout_s=20,
        what="pod status after the apiserver's return",
    )
    assert runtime_containers(devstack, "talker") == before


def test_kubelet_api_refuses_anonymous(node: KletNode) -> None:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(
            f"https://127.0.0.1:{node.kubelet_port}/pods", context=ctx, timeout=5
        )  # type: ignore[attr-defined]
    err.value.close()  # the error holds the open response (and its TLS socket)
    assert err.value.code == 401
