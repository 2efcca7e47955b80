"""A node that joins as a kubeadm node does: with a bootstrap token only, asking for its
serving certificate, then renewing both certificates twice, against a real apiserver
(bootstrap-token authenticator, Node authorizer) and kube-controller-manager's CSR
approving, signing and cleaner controllers, with the ClusterRoleBindings `kubeadm init`
makes.

The control plane here signs for 40 s (`--cluster-signing-duration`), so rotation, due
between 70% and 90% of a certificate's life counted from its issue, comes every 28-36 s.

Covers: every service of a node started with `--bootstrap-kubeconfig` and no
kubeconfig waits for one CSR (made with the token, `system:bootstrap:<id>`), the node
registers and goes Ready with `CN=system:node:<name>` from `<cert-dir>`, its kubeconfig
naming `kubelet-client-current.pem`; with `serverTLSBootstrap` the node asks for its
serving certificate (signer kubelet-serving, SANs the node name and IP), 10250 refuses
connections until the test, as the operator, approves it, then serves it, and the
apiserver (which checks kubelets against the cluster CA) reads a pod's log through it;
with `rotateCertificates` status-reporter renews the client certificate twice (CSRs made
as the node itself) and the serving one twice (approved by the test), while the Node
never leaves Ready, its Lease keeps being renewed by the new identity and a pod's
container never restarts; once the first certificate has expired, a new pod still goes
through pod-source, syncloop and status-reporter to Running (each service's client
presents the current file); a restarted service uses what is there without asking
again; status-reporter serves upstream's kubelet_certificate_manager_{client,server}_ttl_seconds
and the renewal failure counters.
Bad input: a wrong token and an expired one (401, named), a CSR that an operator
denies (its reason, named), a signer that does not answer in time (the CSR named): each
a service that exits 1 with that message and no kubeconfig written; nothing else on the
node is touched.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from klet.devstack import DevStack
from klet.testbed.cluster import ControlPlane
from prometheus_client.parser import text_string_to_metric_families

from tests.harness.cluster_fixtures import _plane
from tests.harness.clusternode import cluster_node, wait_node_ready
from tests.harness.node import KletNode
from tests.harness.waiting import wait_for

pytestmark = pytest.mark.timeout(600)

NODE = "kletbootstrap1"
SIGNING_S = 40
"""How long the control plane's certificates last: short, so two rotations of each take
about a minute; long enough that a renewal (a CSR, its approval, the new file) ends well
before the certificate it replaces expires on a loaded machine."""
IMAGE = "registry.klet.test/busybox:1.36"


@pytest.fixture(scope="module")
def cp(pytestconfig: pytest.Config) -> Iterator[ControlPlane]:
    yield from _plane(
        pytestconfig, prefix="klet-cpcsr-", controllers=True, signing_duration=f"{SIGNING_S}s"
    )


def bootstrap_flags(
    cp: ControlPlane, base: Path, bootstrap: Path, name: str, *, serving: bool = True
) -> list[str]:
    """A node's flags with a bootstrap kubeconfig; with a serving certificate from the
    harness CA, or (`serving=False`) none: serverTLSBootstrap gets it."""
    flags = [
        "--kubeconfig",
        str(base / "kubelet.conf"),  # absent: written by the bootstrap
        "--bootstrap-kubeconfig",
        str(bootstrap),
        "--node-ip",
        "127.0.0.1",
        "--client-ca-file",
        str(cp.ca_file),
    ]
    if serving:
        pair = cp.issue_kubelet_serving_cert(name, ["127.0.0.1"])
        flags += ["--tls-cert-file", str(pair.cert), "--tls-private-key-file", str(pair.key)]
    return flags


def kget(cp: ControlPlane, *args: str) -> Any:
    return json.loads(cp.kubectl("get", *args, "-o", "json", check=True).stdout)


def current_cert(cert_dir: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificates((cert_dir / "kubelet-client-current.pem").read_bytes())[
        0
    ]


def pending_serving(cp: ControlPlane) -> Any:
    """The node's kubelet-serving CSR that waits for approval, if any."""
    for c in kget(cp, "csr")["items"]:
        if (
            c["spec"]["signerName"] == "kubernetes.io/kubelet-serving"
            and c["spec"]["username"] == f"system:node:{NODE}"
            and not (c.get("status") or {}).get("conditions")
        ):
            return c
    return None


def bootstrap_requests(cp: ControlPlane) -> set[str]:
    """The names of the CSRs made with a bootstrap token."""
    return {
        c["metadata"]["name"]
        for c in kget(cp, "csr")["items"]
        if c["spec"]["username"].startswith("system:bootstrap:")
    }


def served_cert(node: KletNode) -> x509.Certificate | None:
    """The certificate 10250 presents now; None when it refuses the connection."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # read what is served, whatever it is
    try:
        with (
            socket.create_connection(("127.0.0.1", node.kubelet_port), timeout=5) as raw,
            context.wrap_socket(raw) as tls,
        ):
            der = tls.getpeercert(binary_form=True)
    except (OSError, ssl.SSLError):
        return None
    return x509.load_der_x509_certificate(der) if der else None


def node_ready(cp: ControlPlane, name: str) -> bool:
    conditions = kget(cp, "node", name)["status"].get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


@pytest.fixture(scope="module")
def node(
    cp: ControlPlane, devstack: DevStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KletNode]:
    base = tmp_path_factory.mktemp("bootstrap-node")
    config = base / "kubelet.yaml"
    config.write_text(
        json.dumps(
            {
                "apiVersion": "kubelet.config.k8s.io/v1beta1",
                "kind": "KubeletConfiguration",
                "rotateCertificates": True,
                "serverTLSBootstrap": True,
            }
        )
    )
    with cluster_node(
        cp,
        devstack,
        base,
        name=NODE,
        node_flags=bootstrap_flags(cp, base, cp.bootstrap_kubeconfig(), NODE, serving=False),
        extra_flags=["--config", str(config)],
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

    # the serving certificate: asked for as the node, refused connections until an
    # operator (here the test) approves it, then served, with the node's names
    serving = wait_for(lambda: pending_serving(cp), timeout_s=60, what="the kubelet-serving CSR")
    assert serving["spec"]["username"] == f"system:node:{NODE}"
    assert sorted(serving["spec"]["usages"]) == ["digital signature", "server auth"]
    assert served_cert(node) is None  # nothing to serve with yet
    cp.kubectl("certificate", "approve", serving["metadata"]["name"], check=True)
    served = wait_for(lambda: served_cert(node), timeout_s=60, what="10250 serving")
    assert served.subject == first.subject
    sans = served.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == [NODE]
    assert [str(i) for i in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]

    cp.kubectl(
        "run", "steady", f"--image={IMAGE}", "--restart=Never",
        f"--overrides={json.dumps({'spec': {'nodeName': NODE}})}",
        "--", "sh", "-c", "echo steady-up; sleep 3600", check=True,
    )  # fmt: skip
    wait_for(
        lambda: kget(cp, "pod", "steady")["status"].get("phase") == "Running",
        timeout_s=60,
        what="steady Running",
    )
    # the apiserver reaches the kubelet API and checks the served certificate against
    # the cluster CA (--kubelet-certificate-authority)
    wait_for(lambda: "steady-up" in cp.kubectl("logs", "steady").stdout, timeout_s=30, what="logs")

    serials = [first.serial_number]
    served_serials = [served.serial_number]
    renewals: list[float] = []
    # the Lease's renewTime when each client rotation was seen, until it changes (checked
    # on the later rounds, which keep approving serving CSRs meanwhile)
    lease_at_swap: list[str] = []
    began = time.monotonic()
    while len(serials) < 3 or len(served_serials) < 3 or lease_at_swap:
        assert time.monotonic() - began < 240, (
            f"rotations seen: client {len(serials) - 1}, serving {len(served_serials) - 1} of 2;"
            f" Lease renewals awaited after a swap: {lease_at_swap}"
        )
        assert node_ready(cp, NODE), "the Node left Ready during rotation"
        if (again := pending_serving(cp)) is not None:
            cp.kubectl("certificate", "approve", again["metadata"]["name"], check=True)
        now_served = served_cert(node)
        if now_served is not None and now_served.serial_number != served_serials[-1]:
            served_serials.append(now_served.serial_number)
        now = current_cert(cert_dir)
        swapped = now.serial_number != serials[-1]
        if swapped:
            serials.append(now.serial_number)
            renewals.append(time.monotonic() - began)
            # issued for this node as the node itself
            assert now.subject == first.subject
        # and in use: the Lease is renewed after the swap (its renewTime read after the
        # swap was seen changes later)
        renew_time = kget(cp, "lease", NODE, "-n", "kube-node-lease")["spec"]["renewTime"]
        lease_at_swap = [t for t in lease_at_swap if t == renew_time]
        if swapped:
            lease_at_swap.append(renew_time)
        time.sleep(2)
    # upstream's expiry gauges, which kubernetes-mixin's certificate alerts read (read
    # first: the test approves no serving CSR after the loop, so that certificate ages)
    port = node.ports["status-reporter"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        families = {f.name: f for f in text_string_to_metric_families(r.read().decode())}
    for kind in ("client", "server"):
        [sample] = families[f"kubelet_certificate_manager_{kind}_ttl_seconds"].samples
        assert 0 < sample.value <= SIGNING_S, (kind, sample.value)
    # and the renewal failure counters of both rotations, under upstream's names
    for name in (
        "kubelet_certificate_manager_client_expiration_renew_errors",
        "kubelet_server_expiration_renew_errors",
    ):
        [sample] = families[name].samples
        assert sample.name == name and sample.value >= 0, sample
    assert "steady-up" in cp.kubectl("logs", "steady").stdout  # through the newest one
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
    # with the token (status-reporter's renewals, made as the node, go on meanwhile)
    asked = bootstrap_requests(cp)
    node.stop("syncloop")
    node.start("syncloop")
    assert bootstrap_requests(cp) <= asked
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
        "6s",
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
    assert "not issued within 6s (not approved yet)" in waited.stderr
    [pending] = [c for c in kget(cp, "csr")["items"] if group in c["spec"]["groups"]]
    assert not (pending.get("status") or {}).get("conditions")
    cp.kubectl(
        "certificate", "deny", pending["metadata"]["name"], check=True
    )  # an operator says no
    denied = run_status_reporter(cp, devstack, tmp_path, bootstrap, "kletmanual")
    assert denied.returncode == 1, denied.stderr[-2000:]
    assert f"certificate signing request {pending['metadata']['name']} was denied" in denied.stderr
    assert not (tmp_path / "kubelet.conf").exists()


EMBEDDED = "kletembedded1"


def test_a_kubeconfig_embedding_its_certificate_seeds_the_store(
    cp: ControlPlane, devstack: DevStack, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """kubeadm's kubelet.conf: the node's pair embedded (client-certificate-data), with
    rotateCertificates on. The node joins and its empty store is seeded with the
    embedded pair as kubelet-client-current.pem; the kubeconfig is left as it was. (The
    renewal of that store is the one the test above sees; the clients presenting the
    store's file: test_certificate_seeding. Kept short for make test's budget.)"""
    base = tmp_path_factory.mktemp("embedded-node")
    pair = cp.ca.issue(
        f"system:node:{EMBEDDED}", ["system:nodes"], client=True, name=f"client-{EMBEDDED}-e"
    )
    config = yaml.safe_load(cp.node_kubeconfig(EMBEDDED).read_text())
    config["users"][0]["user"] = {
        "client-certificate-data": base64.b64encode(pair.cert.read_bytes()).decode(),
        "client-key-data": base64.b64encode(pair.key.read_bytes()).decode(),
    }
    kubeconfig = base / "kubelet.conf"
    kubeconfig.write_text(yaml.safe_dump(config))
    before = kubeconfig.read_text()
    embedded = x509.load_pem_x509_certificate(pair.cert.read_bytes())
    settings = base / "kubelet.yaml"
    settings.write_text(
        json.dumps(
            {
                "apiVersion": "kubelet.config.k8s.io/v1beta1",
                "kind": "KubeletConfiguration",
                "rotateCertificates": True,
            }
        )
    )
    flags = cp.node_flags(EMBEDDED)
    flags[flags.index("--kubeconfig") + 1] = str(kubeconfig)
    assert not (base / "pki" / "kubelet-client-current.pem").exists()
    with cluster_node(
        cp,
        devstack,
        base,
        name=EMBEDDED,
        node_flags=flags,
        extra_flags=["--config", str(settings)],
    ) as n:
        wait_node_ready(cp, EMBEDDED, timeout_s=90)
        current = n.dir / "pki" / "kubelet-client-current.pem"
        assert current.is_symlink()
        assert current_cert(n.dir / "pki").serial_number == embedded.serial_number
        assert pair.key.read_bytes().strip() in current.read_bytes()
        assert kubeconfig.read_text() == before  # klet does not rewrite it (kubeadm does)
