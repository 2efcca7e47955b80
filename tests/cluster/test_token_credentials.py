"""ServiceAccount token credentials against the real apiserver: what the chart's helm
test objects rely on.

Covers: a kubeconfig with a `tokenFile` (as the chart renders for the helm test pod)
authenticates KubeClient as the ServiceAccount, which the binding to the built-in
system:node ClusterRole lets read nodes and write node leases; a token file rewritten
in place (as the kubelet rotates a projected token) is read again, a bad token is
refused and a good one accepted on the next re-read; `klet check-node` with the helm
test's ServiceAccount (get on one Node and its Lease, nothing else) passes for a Ready
node with a fresh Lease and reports a stale Lease and a node it may not read.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from klet.cli.checknode import check_node
from klet.kube import Forbidden, KubeSettings
from klet.kube.client import KubeClient
from klet.model.timestamps import micro_time, rfc3339
from klet.testbed.cluster import ControlPlane


def token_kubeconfig(plane: ControlPlane, tmp_path: Path, token: str) -> Path:
    (tmp_path / "token").write_text(token)
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "default",
                "cluster": {"server": plane.server, "certificate-authority": str(plane.ca_file)},
            }
        ],
        "users": [{"name": "default", "user": {"tokenFile": "token"}}],
        "contexts": [{"name": "default", "context": {"cluster": "default", "user": "default"}}],
        "current-context": "default",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(config))
    return path


def service_account_token(plane: ControlPlane, namespace: str, name: str) -> str:
    res = plane.kubectl("-n", namespace, "create", "token", name, "--duration=10m", check=True)
    return res.stdout.strip()


def binding(name: str, role: str, namespace: str, sa: str) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": namespace}],
    }


def lease(node: str, renewed: float) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": node, "namespace": "kube-node-lease"},
        "spec": {
            "holderIdentity": node,
            "leaseDurationSeconds": 40,
            "renewTime": micro_time(renewed),
        },
    }


@pytest.fixture
def namespace(control_plane: ControlPlane) -> str:
    name = f"klet-token-{uuid.uuid4().hex[:6]}"
    control_plane.prepare_namespace(name)
    control_plane.prepare_namespace("kube-node-lease")
    return name


async def test_token_file_as_system_node(
    control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    sa = "klet"
    control_plane.apply(
        [
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": sa, "namespace": namespace},
            },
            binding(f"{namespace}-node", "system:node", namespace, sa),
        ]
    )
    token = service_account_token(control_plane, namespace, sa)
    kubeconfig = token_kubeconfig(control_plane, tmp_path, token)
    client = KubeClient(KubeSettings(kubeconfig=kubeconfig))
    client._token_file.max_age_s = 0  # type: ignore[union-attr]  # re-read every request
    node = f"node-{namespace}"
    try:
        # RBAC propagates to the authorizer's cache within a moment of the apply.
        for _ in range(100):
            try:
                await client.get("/api/v1/nodes")
                break
            except Forbidden:
                await asyncio.sleep(0.1)
        listed = await client.get("/api/v1/nodes")
        assert listed["kind"] == "NodeList"
        created = await client.create(
            "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
            lease(node, renewed=0.0),
        )
        assert created["spec"]["holderIdentity"] == node
        (tmp_path / "token").write_text("not-a-token")
        with pytest.raises(Forbidden):
            await client.get("/api/v1/nodes")
        (tmp_path / "token").write_text(service_account_token(control_plane, namespace, sa))
        assert (await client.get("/api/v1/nodes"))["kind"] == "NodeList"
    finally:
        await client.close()
        control_plane.kubectl("-n", "kube-node-lease", "delete", "lease", node)
        control_plane.kubectl("delete", "clusterrolebinding", f"{namespace}-node")
        control_plane.kubectl("delete", "namespace", namespace, "--wait=false")


async def test_check_node_with_the_helm_test_rights(
    control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    import time

    node, other, sa = f"node-{namespace}", f"other-{namespace}", "klet-test"
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": f"{namespace}-test"},
        "rules": [
            {"apiGroups": [""], "resources": ["nodes"], "resourceNames": [node], "verbs": ["get"]},
            {
                "apiGroups": ["coordination.k8s.io"],
                "resources": ["leases"],
                "resourceNames": [node],
                "verbs": ["get"],
            },
        ],
    }
    now = time.time()
    control_plane.apply(
        [
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": sa, "namespace": namespace},
            },
            role,
            binding(f"{namespace}-test", f"{namespace}-test", namespace, sa),
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}},
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": other}},
            lease(node, renewed=now),
        ]
    )
    status = {
        "status": {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "ready",
                    "lastHeartbeatTime": rfc3339(now),
                    "lastTransitionTime": rfc3339(now),
                }
            ]
        }
    }
    control_plane.kubectl(
        "patch",
        "node",
        node,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(status),
        check=True,
    )
    kubeconfig = token_kubeconfig(
        control_plane, tmp_path, service_account_token(control_plane, namespace, sa)
    )
    client = KubeClient(KubeSettings(kubeconfig=kubeconfig))
    try:
        assert await check_node(client, node, timeout_s=20, interval_s=0.2) == []
        problems = await check_node(client, other, timeout_s=0, interval_s=0)
        assert len(problems) == 1 and problems[0].startswith("apiserver:"), problems
        assert "forbidden" in problems[0].lower()
        control_plane.apply([lease(node, renewed=now - 120)])
        (problem,) = await check_node(client, node, timeout_s=0, interval_s=0)
        assert problem.startswith("Lease renewed") and "more than its 40s" in problem
    finally:
        await client.close()
        control_plane.kubectl("delete", "node", node, other)
        control_plane.kubectl("-n", "kube-node-lease", "delete", "lease", node)
        control_plane.kubectl("delete", "clusterrolebinding,clusterrole", f"{namespace}-test")
        control_plane.kubectl("delete", "namespace", namespace, "--wait=false")
