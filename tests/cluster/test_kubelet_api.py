"""The kubelet API as the real kube-apiserver and kubectl use it.

A KletNode (standalone services, real containerd) runs the `talker` static pod; the
kubelet API is served in this process over the node's pod view, with the cluster CA as
client CA, a serving certificate the apiserver verifies (--kubelet-certificate-
authority), TokenReview/SubjectAccessReview through the node's own client certificate
(Node authorizer), and authorization.mode Webhook. The test registers the Node (InternalIP
127.0.0.1, daemonEndpoints.kubeletEndpoint.Port = the API's port) and a pod object of the
same name bound to it, so the apiserver routes to us.

Covers: `kubectl logs` (plain and --tail), `kubectl exec -- cat /etc/hostname`,
`kubectl exec -i` feeding stdin, and `kubectl port-forward` to the pod's httpd, each
going apiserver → (SPDY) → this API → containerd's stream server; a ServiceAccount token
without RBAC gets upstream's 403, one granted `get nodes/proxy` gets 200 on /pods but
403 on a WebSocket exec (an upgraded GET, authorized as `create`), an unknown token 401.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from klet.cri import CRISettings, RuntimeClient
from klet.cri import labels as L
from klet.devstack import DevStack, free_port
from klet.testbed.cluster import ControlPlane

from tests.harness.node import KletNode
from tests.harness.waiting import wait_for
from tests.integration.test_kubelet_api_containerd import (
    TALKER,
    Client,
    KubeletApiThread,
    api_settings,
)


def kubectl(cp: ControlPlane, *args: str, input: str | None = None, timeout_s: float = 60) -> str:
    res = cp.kubectl(*args, input=input, timeout_s=timeout_s)
    assert res.returncode == 0, f"kubectl {' '.join(args)}: {res.stderr}"
    return res.stdout


async def _remove_pods(endpoint: str, node_name: str) -> None:
    cri = RuntimeClient(CRISettings(runtime_endpoint=endpoint, timeout_s=30))
    try:
        for s in await cri.list_pod_sandboxes():
            if s.labels.get(L.POD_NAME, "").endswith(f"-{node_name}"):
                await cri.stop_pod_sandbox(s.id)
                await cri.remove_pod_sandbox(s.id)
    finally:
        await cri.close()


@pytest.fixture
def node(devstack: DevStack, tmp_path: Path) -> Iterator[KletNode]:
    name = f"kapi-{uuid.uuid4().hex[:6]}"
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    # "n", not the node name: the unix sockets under its root dir must fit 107 bytes
    n = KletNode(devstack, tmp_path / "n", node_name=name, manifest_dir=manifests)
    try:
        n.start()
        (manifests / "talker.yaml").write_text(TALKER)

        def running() -> bool:
            pod = n.pods().get(f"talker-{name}")
            return bool(
                pod
                and pod["status"].get("phase") == "Running"
                and bool(statuses := pod["status"].get("containerStatuses"))
                and all(c["ready"] for c in statuses)
            )

        wait_for(running, timeout_s=30, what="talker Running")
        yield n
    finally:
        n.stop()
        asyncio.run(_remove_pods(devstack.runtime_endpoint, name))


@pytest.fixture
def api(node: KletNode, control_plane: ControlPlane) -> Iterator[KubeletApiThread]:
    cp = control_plane
    serving = cp.issue_kubelet_serving_cert(node.node_name, ["127.0.0.1"])
    settings = api_settings(node, ca=cp.ca, serving=serving, authorization="Webhook", webhook=True)
    with KubeletApiThread(settings, kubeconfig=cp.node_kubeconfig(node.node_name)) as thread:
        objects = [
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": node.node_name},
                "status": {
                    "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                    "daemonEndpoints": {"kubeletEndpoint": {"Port": settings.kubelet.port}},
                },
            },
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"talker-{node.node_name}", "namespace": "default"},
                "spec": {
                    "nodeName": node.node_name,
                    "containers": [
                        {"name": "talk", "image": "registry.klet.test/busybox:1.36"},
                        {"name": "web", "image": "registry.klet.test/httpd:1.36"},
                    ],
                },
            },
        ]
        kubectl(
            cp,
            "create",
            "-f",
            "-",
            input=json.dumps({"kind": "List", "apiVersion": "v1", "items": objects}),
        )
        # kubectl port-forward wants a Running pod; nobody else reports its status here.
        kubectl(
            cp, "patch", "pod", f"talker-{node.node_name}", "--subresource=status",
            "--type=merge", "-p", json.dumps({"status": {"phase": "Running"}}),
        )  # fmt: skip
        try:
            yield thread
        finally:
            cp.kubectl(
                "delete",
                "pod",
                f"talker-{node.node_name}",
                "--force",
                "--grace-period=0",
                "--wait=false",
            )
            cp.kubectl("delete", "node", node.node_name, "--wait=false")


def test_kubectl_logs_exec_and_port_forward(
    api: KubeletApiThread, node: KletNode, control_plane: ControlPlane
) -> None:
    cp = control_plane
    pod = f"talker-{node.node_name}"

    logs = wait_for(
        lambda: (out := cp.kubectl("logs", pod, "-c", "talk").stdout) and "tick-2" in out and out,
        timeout_s=15, what="kubectl logs with ticks",
    )  # fmt: skip
    assert logs.startswith("hello-1\nhello-2\nhello-3\nhello-4\nhello-5\ntick-1\n")
    tail = kubectl(cp, "logs", pod, "-c", "talk", "--tail=2").splitlines()
    assert len(tail) == 2 and all(t.startswith("tick-") for t in tail)

    assert kubectl(cp, "exec", pod, "-c", "talk", "--", "cat", "/etc/hostname").strip() == pod
    echoed = kubectl(
        cp, "exec", "-i", pod, "-c", "talk", "--", "sh", "-c", "read x; echo got-$x",
        input="from-stdin\n",
    )  # fmt: skip
    assert echoed == "got-from-stdin\n"
    failed = cp.kubectl("exec", pod, "-c", "talk", "--", "sh", "-c", "exit 3")
    assert failed.returncode != 0 and "exit code 3" in failed.stderr

    local = free_port()
    argv = [
        str(cp.bin_dir / "kubectl"), f"--kubeconfig={cp.admin_kubeconfig}",
        f"--cache-dir={cp.dir / 'kubectl-cache'}",
        "port-forward", f"pod/{pod}", f"{local}:8080", "--address=127.0.0.1",
    ]  # fmt: skip
    forward = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert forward.stdout is not None
        line = forward.stdout.readline()
        assert "Forwarding from 127.0.0.1" in line, line + (
            forward.stderr.read() if forward.poll() is not None else ""
        )

        def fetch() -> bytes:
            with urllib.request.urlopen(f"http://127.0.0.1:{local}/", timeout=5) as r:
                return bytes(r.read())

        body = wait_for(fetch, timeout_s=15, what="httpd through kubectl port-forward")
        assert body.decode().strip() == "served-through-port-forward"
    finally:
        forward.terminate()
        forward.communicate(timeout=10)


def test_tokens_need_rbac(
    api: KubeletApiThread, node: KletNode, control_plane: ControlPlane
) -> None:
    cp = control_plane
    suffix = uuid.uuid4().hex[:6]
    nobody, reader = f"nobody-{suffix}", f"reader-{suffix}"
    kubectl(cp, "create", "serviceaccount", nobody)
    kubectl(cp, "create", "serviceaccount", reader)
    kubectl(
        cp,
        "create",
        "clusterrole",
        f"kubelet-reader-{suffix}",
        "--verb=get",
        "--resource=nodes/proxy",
    )
    kubectl(
        cp,
        "create",
        "clusterrolebinding",
        f"kubelet-reader-{suffix}",
        f"--clusterrole=kubelet-reader-{suffix}",
        f"--serviceaccount=default:{reader}",
    )
    try:
        ca = cp.ca_file

        def as_token(
            token: str, path: str = "/pods", headers: dict[str, str] | None = None
        ) -> tuple[int, bytes]:
            req = urllib.request.Request(
                api.url + path, headers={"Authorization": f"Bearer {token}", **(headers or {})}
            )
            client = Client(api.url, ca, None)
            try:
                with urllib.request.urlopen(req, context=client.context(), timeout=10) as r:
                    return r.status, r.read()
            except urllib.error.HTTPError as err:
                with err:
                    return err.code, err.read()

        denied = kubectl(cp, "create", "token", nobody).strip()
        status, body = as_token(denied)
        assert status == 403
        assert body.decode() == (
            f"Forbidden (user=system:serviceaccount:default:{nobody}, verb=get, "
            "resource=nodes, subresource(s)=[pods proxy])\n"
        )
        allowed = kubectl(cp, "create", "token", reader).strip()
        # RBAC may take a moment to see the new binding (and a denial is cached 30 s,
        # so the first try must be after it is visible).
        wait_for(
            lambda: cp.kubectl("auth", "can-i", "get", "nodes", "--subresource=proxy",
                               f"--as=system:serviceaccount:default:{reader}"
                               ).stdout.strip() == "yes",
            timeout_s=10, what="RBAC binding visible",
        )  # fmt: skip
        status, body = as_token(allowed)
        assert status == 200 and json.loads(body)["kind"] == "PodList"
        # Reading nodes/proxy is not running commands: a WebSocket exec is a GET.
        websocket = {
            "Connection": "Upgrade",
            "Upgrade": "websocket",
            "Sec-WebSocket-Version": "13",
            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
            "Sec-WebSocket-Protocol": "v4.channel.k8s.io",
        }
        exec_path = f"/exec/default/talker-{node.node_name}/talk?command=id"
        status, body = as_token(allowed, exec_path, websocket)
        assert status == 403
        assert body.decode() == (
            f"Forbidden (user=system:serviceaccount:default:{reader}, verb=create, "
            "resource=nodes, subresource(s)=[proxy])\n"
        )
        assert as_token("not-a-token")[0] == 401
    finally:
        cp.kubectl("delete", "clusterrolebinding", f"kubelet-reader-{suffix}")
        cp.kubectl("delete", "clusterrole", f"kubelet-reader-{suffix}")
        cp.kubectl("delete", "serviceaccount", nobody, reader)
