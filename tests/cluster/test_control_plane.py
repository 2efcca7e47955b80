"""The test control plane itself: a real kube-apiserver (built from k8s.io/kubernetes) and
etcd, with the identities and rights klet's cluster tests rely on.

Covers: the admin kubeconfig works; the built version is reported (not v0.0.0-master);
pods bound by ``spec.nodeName`` are admitted in ``default`` (ServiceAccount admission
finds the default ServiceAccount set up without a controller-manager); a node's client
certificate gets what the Node authorizer and NodeRestriction give a kubelet: it may
create and read its own Node, may not touch another node's, may list pods only with
``fieldSelector=spec.nodeName=<itself>``; the apiserver's kubelet-client identity may use
the kubelet API; the apiserver comes back on the same port after a restart.
"""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from klet.testbed.cluster import ControlPlane

from tests.harness.cluster_fixtures import kubernetes_version


def _kubeconfig_client(kubeconfig: Path, tmp_path: Path) -> tuple[str, ssl.SSLContext]:
    """The server URL and a TLS context for the identity in ``kubeconfig``."""
    config = json.loads(kubeconfig.read_text())
    cluster = config["clusters"][0]["cluster"]
    user = config["users"][0]["user"]
    files = {}
    for field in ("certificate-authority-data", "client-certificate-data", "client-key-data"):
        path = tmp_path / field
        path.write_bytes(base64.b64decode(user.get(field) or cluster[field]))
        files[field] = path
    ctx = ssl.create_default_context(cafile=str(files["certificate-authority-data"]))
    ctx.load_cert_chain(str(files["client-certificate-data"]), str(files["client-key-data"]))
    return cluster["server"], ctx


def _request(
    kubeconfig: Path, tmp_path: Path, method: str, path: str, body: Any = None
) -> tuple[int, dict[str, Any]]:
    """One raw API request as the identity in ``kubeconfig``: (status code, JSON body)."""
    server, ctx = _kubeconfig_client(kubeconfig, tmp_path)
    data = json.dumps(body).encode() if body is not None else None
    content_type = "application/merge-patch+json" if method == "PATCH" else "application/json"
    req = urllib.request.Request(
        server + path, data=data, method=method, headers={"Content-Type": content_type}
    )
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=30) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as err:
        with err:
            return err.code, json.load(err)


def _node(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}


def test_admin_kubeconfig_lists_namespaces(control_plane: ControlPlane) -> None:
    res = control_plane.kubectl("get", "ns", "-o", "name")
    assert res.returncode == 0, res.stderr
    names = set(res.stdout.split())
    assert {"namespace/default", "namespace/kube-system", "namespace/kube-node-lease"} <= names


def test_kubectl_version_reports_the_built_release(control_plane: ControlPlane) -> None:
    res = control_plane.kubectl("version", "-o", "json", check=True)
    versions = json.loads(res.stdout)
    expected = kubernetes_version()
    assert versions["clientVersion"]["gitVersion"] == expected
    assert versions["serverVersion"]["gitVersion"] == expected
    assert versions["serverVersion"]["minor"] == expected.split(".")[1]


def test_admin_creates_a_bound_pod_in_default(control_plane: ControlPlane) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "cp-bound-pod", "namespace": "default"},
        "spec": {
            "nodeName": "node1",
            "containers": [{"name": "c", "image": "busybox", "command": ["sleep", "3600"]}],
        },
    }
    res = control_plane.kubectl("create", "-f", "-", "-o", "json", input=json.dumps(pod))
    assert res.returncode == 0, res.stderr
    try:
        created = json.loads(res.stdout)
        assert created["spec"]["serviceAccountName"] == "default"
        # ServiceAccount admission added the projected token volume, whose CA part is
        # the ConfigMap the set-up published.
        sources = [
            s for v in created["spec"]["volumes"] for s in v.get("projected", {}).get("sources", [])
        ]
        assert {
            "configMap": {
                "name": "kube-root-ca.crt",
                "items": [{"key": "ca.crt", "path": "ca.crt"}],
            }
        } in sources
        cm = control_plane.kubectl("get", "configmap", "kube-root-ca.crt", "-o", "json", check=True)
        assert json.loads(cm.stdout)["data"]["ca.crt"] == control_plane.ca_file.read_text()
    finally:
        control_plane.kubectl("delete", "pod", "cp-bound-pod", "--grace-period=0", "--force")


def test_node_identity_rights(control_plane: ControlPlane, tmp_path: Path) -> None:
    node1 = control_plane.node_kubeconfig("node1")
    admin = control_plane.admin_kubeconfig

    # NodeRestriction lets a node create its own Node object ...
    res = control_plane.kubectl(
        "create", "-f", "-", kubeconfig=node1, input=json.dumps(_node("node1"))
    )
    assert res.returncode == 0, res.stderr
    # ... and read and patch it.
    status, _ = _request(node1, tmp_path, "GET", "/api/v1/nodes/node1")
    assert status == 200
    status, _ = _request(
        node1,
        tmp_path,
        "PATCH",
        "/api/v1/nodes/node1",
        {"metadata": {"labels": {"klet-test": "yes"}}},
    )
    assert status == 200
    # A watch of its own Node by name (fieldSelector metadata.name) is allowed too.
    status, _ = _request(
        node1, tmp_path, "GET", "/api/v1/nodes?fieldSelector=metadata.name%3Dnode1"
    )
    assert status == 200

    # Another node's object: creating it is refused by NodeRestriction ...
    status, body = _request(node1, tmp_path, "POST", "/api/v1/nodes", _node("node2"))
    assert status == 403, body
    assert "node2" in body["message"]
    # ... and once it exists, reading and modifying it are refused by the Node authorizer
    # and NodeRestriction.
    res = control_plane.kubectl("create", "-f", "-", input=json.dumps(_node("node2")))
    assert res.returncode == 0, res.stderr
    try:
        status, body = _request(node1, tmp_path, "GET", "/api/v1/nodes/node2")
        assert status == 403, body
        status, body = _request(
            node1, tmp_path, "PATCH", "/api/v1/nodes/node2", {"metadata": {"labels": {"x": "y"}}}
        )
        assert status == 403, body
        res = control_plane.kubectl("label", "node", "node2", "x=y", kubeconfig=node1)
        assert res.returncode != 0
        assert "Forbidden" in res.stderr
        status, body = _request(node1, tmp_path, "DELETE", "/api/v1/nodes/node2")
        assert status == 403, body
        # Listing all nodes is not allowed either.
        status, body = _request(node1, tmp_path, "GET", "/api/v1/nodes")
        assert status == 403, body
    finally:
        control_plane.kubectl(
            "delete", "node", "node1", "node2", "--ignore-not-found", kubeconfig=admin
        )


def test_node_identity_lists_only_its_own_pods(control_plane: ControlPlane, tmp_path: Path) -> None:
    node1 = control_plane.node_kubeconfig("node1")
    status, body = _request(
        node1, tmp_path, "GET", "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode1"
    )
    assert status == 200, body
    assert body["kind"] == "PodList"
    # Without the selector, or with another node's name: forbidden (Node authorizer, with
    # AuthorizeNodeWithSelectors, GA and locked on in 1.34).
    for query in ("", "?fieldSelector=spec.nodeName%3Dnode2", "?labelSelector=a%3Db"):
        status, body = _request(node1, tmp_path, "GET", f"/api/v1/pods{query}")
        assert status == 403, (query, body)
        assert body["reason"] == "Forbidden"
    # The same through kubectl.
    res = control_plane.kubectl(
        "get", "pods", "-A", "--field-selector=spec.nodeName=node1", kubeconfig=node1
    )
    assert res.returncode == 0, res.stderr
    res = control_plane.kubectl("get", "pods", "-A", kubeconfig=node1)
    assert res.returncode != 0 and "Forbidden" in res.stderr


def test_apiserver_kubelet_client_may_use_the_kubelet_api(control_plane: ControlPlane) -> None:
    # The apiserver calls the kubelet API (logs, exec, port-forward) as this user; klet
    # authorizes such calls with SubjectAccessReviews on the nodes/<sub> subresources.
    for verb in ("get", "create"):
        for sub in ("proxy", "log", "stats", "metrics"):
            res = control_plane.kubectl(
                "auth",
                "can-i",
                verb,
                "nodes",
                f"--subresource={sub}",
                "--as=kube-apiserver-kubelet-client",
            )
            assert res.stdout.strip() == "yes", (verb, sub, res.stdout, res.stderr)
    # ... and nothing beyond that.
    res = control_plane.kubectl(
        "auth", "can-i", "list", "pods", "-A", "--as=kube-apiserver-kubelet-client"
    )
    assert res.stdout.strip() == "no"


def test_kubelet_serving_cert_is_signed_by_the_cluster_ca(control_plane: ControlPlane) -> None:
    cert_path, key_path = control_plane.issue_kubelet_serving_cert("node1", ["127.0.0.1"])
    assert key_path.stat().st_mode & 0o777 == 0o600
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    ca = x509.load_pem_x509_certificate(control_plane.ca_file.read_bytes())
    cert.verify_directly_issued_by(ca)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "system:node:node1"
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["node1"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in eku


def test_apiserver_restarts_on_the_same_port(control_plane: ControlPlane) -> None:
    server = control_plane.server
    control_plane.restart_apiserver(down_s=1.0)
    assert control_plane.server == server
    assert control_plane.ready()
    # State lives in etcd: what set-up created is still there.
    res = control_plane.kubectl("get", "serviceaccount", "default", "-n", "default")
    assert res.returncode == 0, res.stderr
