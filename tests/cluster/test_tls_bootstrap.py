"""A node that joins as a kubeadm node does: with a bootstrap token only, then renewing its
client certificate twice, against a real apiserver (bootstrap-token authenticator, Node
authorizer) and kube-controller-manager's CSR approving, signing and cleaner controllers,
with the ClusterRoleBindings `kubeadm init` makes.

The control plane here signs for 60 s (`--cluster-signing-duration`), so rotation, due
between 70% and 90% of a certificate's life counted from its issue, comes every 42-54 s.

Covers: every service of a node started with `--bootstrap-kubeconfig` and no
kubeconfig waits for one CSR (made with the token, `system:bootstrap:<id>`), the node
registers and goes Ready with `CN=system:node:<name>` from `<cert-dir>`, its kubeconfig
naming `kubelet-client-current.pem`; with `rotateCertificates` status-reporter renews it
twice (CSRs made as the node itself), while the Node never leaves Ready, its Lease keeps
being renewed by the new identity and a pod's container never restarts; once the first
certificate has expired, a new pod still goes through pod-source, syncloop and
status-reporter to Running (each service's client presents the current file); a
restarted service uses what is there without asking again. Bad input: a wrong token and
an expired one (401, named), a CSR that an operator denies (its reason, named), a signer
that does not answer in time (the CSR named): each a service that exits 1 with that
message and no kubeconfig written; nothing else on the node is touched.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from klet.devstack import DevStack
from klet.devstack.cluster import ControlPlane

from tests.harness.cluster_fixtures import _plane
from tests.harness.clusternode import cluster_node, wait_node_ready
from tests.harness.node import KletNode
from tests.harness.waiting import wait_for

pytestmark = pytest.mark.timeout(600)

NODE = "kletbootstrap1"
IMAGE = "registry.klet.test/busybox:1.36"


@pytest.fixture(scope="module")
def cp(pytestconfig: pytest.Config) -> Iterator[ControlPlane]:
    yield from _plane(pytestconfig, prefix="klet-cpcsr-", controllers=True, signing_duration="60s")


def bootstrap_flags(cp: ControlPlane, base: Path, bootstrap: Path, name: str) -> list[str]:
    serving = cp.issue_kubelet_serving_cert(name, ["127.0.0.1"])
    return [
        "--kubeconfig",
        str(base / "kubelet.conf"),  # absent: written by the bootstrap
        "--bootstrap-kubeconfig",
        str(bootstrap),
        "--node-ip",
        "127.0.0.1",
        "--tls-cert-file",
        str(serving.cert),
        "--tls-private-key-file",
        str(serving.key),
        "--client-ca-file",
        str(cp.ca_file),
    ]


def kget(cp: ControlPlane, *args: str) -> Any:
    return json.loads(cp.kubectl("get", *args, "-o", "json", check=True).stdout)


def current_cert(cert_dir: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificates((cert_dir / "kubelet-client-current.pem").read_bytes())[
        0
    ]


def node_ready(cp: ControlPlane, name: str) -> bool:
    conditions = kget(cp, "node", name)["status"].get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


@pytest.fixture(scope="module")
def node(
    cp: ControlPlane, devstack: DevStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KletNode]:
    base = tmp_path_factory.mktemp("bootstrap-node")
    with cluster_node(
        cp,
        devstack,
        base,
        name=NODE,
        node_flags=bootstrap_flags(cp, base, cp.bootstrap_kubeconfig(), NODE),
        extra_flags=["--rotate-certificates=true"],
    ) as n:
        yield n


def test_a_node_joins_with_a_bootstrap_token_and_rotates_its_certificate(
    cp: ControlPlane, node: KletNode
) -> None:
    cert_dir = node.dir / "pki"
    kubeconfig = node.dir / "kubelet.conf"
    wait_node_ready(cp, NODE, timeout_s=90)
    first = current_cert(cert_dir)
    assert first.subject.rfc4514_string() == f"CN=system:node:{NODE},O=system:nodes"
    assert (cert_dir / "kubelet-client-current.pem").is_symlink()
    assert str(cert_dir / "kubelet-client-current.pem") in kubeconfig.read_text()
    # one request for the node's three apiserver clients, made with the token
    csrs = kget(cp, "csr")["items"]
    joined = [c for c in csrs if c["spec"]["username"].startswith("system:bootstrap:")]
    assert len(joined) == 1, [c["metadata"]["name"] for c in csrs]
    assert joined[0]["spec"]["signerName"] == "kubernetes.io/kube-apiserver-client-kubelet"
    assert any(c["type"] == "Approved" for c in joined[0]["status"]["conditions"])

    cp.kubectl(
        "run", "steady", f"--image={IMAGE}", "--restart=Never",
        f"--overrides={json.dumps({'spec': {'nodeName': NODE}})}",
        "--", "sleep", "3600", check=True,
    )  # fmt: skip
    wait_for(
        lambda: kget(cp, "pod", "steady")["status"].get("phase") == "Running",
        timeout_s=60,
        what="steady Running",
    )

    serials = [first.serial_number]
    renewals: list[float] = []
    began = time.monotonic()
    while len(serials) < 3:
        assert time.monotonic() - began < 240, f"rotations seen: {len(serials) - 1} of 2"
        assert node_ready(cp, NODE), "the Node left Ready during rotation"
        now = current_cert(cert_dir)
        if now.serial_number != serials[-1]:
            serials.append(now.serial_number)
            renewals.append(time.monotonic() - began)
            # issued for this node as the node itself, and in use: the Lease is renewed
            # after the swap
            assert now.subject == first.subject
            renewed = kget(cp, "lease", NODE, "-n", "kube-node-lease")["spec"]["renewTime"]
            wait_for(
                lambda renewed=renewed: (
                    kget(cp, "lease", NODE, "-n", "kube-node-lease")["spec"]["renewTime"] != renewed
                ),
                timeout_s=30,
                what="the Lease renewed after the rotation",
            )
        time.sleep(2)
    rotated = [
        c for c in kget(cp, "csr")["items"] if c["spec"]["username"] == f"system:node:{NODE}"
    ]
    assert len(rotated) >= 2, [c["metadata"]["name"] for c in rotated]
    pod = kget(cp, "pod", "steady")
    assert pod["status"]["phase"] == "Running"
    assert [c["restartCount"] for c in pod["status"]["containerStatuses"]] == [0]
    assert node_ready(cp, NODE)
    # the old certificate files stay, as upstream keeps them; current names the newest
    dated = sorted(p.name for p in cert_dir.glob("kubelet-client-2*.pem"))
    assert len(dated) >= 3 and os.readlink(cert_dir / "kubelet-client-current.pem") == dated[-1]
    print(f"rotations after {', '.join(f'{s:.0f} s' for s in renewals)}")
    # the first certificate has expired: every service talks with the current one
    assert time.time() > first.not_valid_after_utc.timestamp()
    cp.kubectl(
        "run", "late", f"--image={IMAGE}", "--restart=Never",
        f"--overrides={json.dumps({'spec': {'nodeName': NODE}})}",
        "--", "sleep", "3600", check=True,
    )  # fmt: skip
    wait_for(
        lambda: kget(cp, "pod", "late")["status"].get("phase") == "Running",
        timeout_s=60,
        what="a pod made after the first certificate expired Running",
    )
    # a restarted service finds the kubeconfig and the current certificate: no request
    asked = {c["metadata"]["name"] for c in kget(cp, "csr")["items"]}
    node.stop("syncloop")
    node.start("syncloop")
    assert {c["metadata"]["name"] for c in kget(cp, "csr")["items"]} <= asked
    assert not (cert_dir / "kubelet-client.key.tmp").exists()
    cp.kubectl("delete", "pod", "steady", "late", "--grace-period=1")


def run_status_reporter(
    cp: ControlPlane, devstack: DevStack, base: Path, bootstrap: Path, name: str
) -> subprocess.CompletedProcess[str]:
    """One service, bootstrapping alone; it must end (exit 1) by itself."""
    flags = [
        *bootstrap_flags(cp, base, bootstrap, name),
        "--hostname-override",
        name,
        "--cert-dir",
        str(base / "pki"),
        "--root-dir",
        str(base / "root"),
        "--run-dir",
        str(base / "run"),
        "--container-runtime-endpoint",
        devstack.runtime_endpoint,
        "--tls-bootstrap-timeout",
        "20s",
    ]
    return subprocess.run(
        [sys.executable, "-m", "klet.status_reporter", *flags],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("bad", ["wrong", "expired"])
def test_a_bad_token_is_named(
    cp: ControlPlane, devstack: DevStack, tmp_path: Path, bad: str
) -> None:
    bootstrap = (
        cp.bootstrap_kubeconfig(name="wrong", token="abcdef.0123456789abcdef")
        if bad == "wrong"
        else cp.bootstrap_kubeconfig(name="expired", ttl_s=-60)
    )
    done = run_status_reporter(cp, devstack, tmp_path, bootstrap, f"kletbad{bad}")
    assert done.returncode == 1, done.stderr[-2000:]
    assert "TLS bootstrap failed" in done.stderr
    assert (
        "refused its credentials (401 Unauthorized): the token is wrong or expired" in done.stderr
    )
    assert not (tmp_path / "kubelet.conf").exists()


def test_a_denied_request_and_a_signer_that_never_answers_are_named(
    cp: ControlPlane, devstack: DevStack, tmp_path: Path
) -> None:
    # A token whose group may ask but is not approved automatically: the request waits.
    group = "system:bootstrappers:klet-manual"
    cp.apply(
        [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": "klet-manual-bootstrap"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "system:node-bootstrapper",
                },
                "subjects": [
                    {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}
                ],
            }
        ]
    )
    bootstrap = cp.bootstrap_kubeconfig(name="manual", group=group)
    waited = run_status_reporter(cp, devstack, tmp_path, bootstrap, "kletmanual")
    assert waited.returncode == 1, waited.stderr[-2000:]
    assert "not issued within 20s (not approved yet)" in waited.stderr
    [pending] = [c for c in kget(cp, "csr")["items"] if group in c["spec"]["groups"]]
    assert not (pending.get("status") or {}).get("conditions")
    cp.kubectl(
        "certificate", "deny", pending["metadata"]["name"], check=True
    )  # an operator says no
    denied = run_status_reporter(cp, devstack, tmp_path, bootstrap, "kletmanual")
    assert denied.returncode == 1, denied.stderr[-2000:]
    assert f"certificate signing request {pending['metadata']['name']} was denied" in denied.stderr
    assert not (tmp_path / "kubelet.conf").exists()
