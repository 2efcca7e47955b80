"""A real, minimal control plane for the cluster tests: etcd plus kube-apiserver, and
on request kube-controller-manager and kube-scheduler.

The binaries come from ``tools/cluster/build.sh`` (built from the published Go modules,
cached per version outside the repository). Everything else lives under one directory:

    <dir>/pki/                 CA, serving and client certificates, service-account keys
    <dir>/pki/front-proxy/     the front-proxy CA and the apiserver's proxy client certificate
    <dir>/etcd/                etcd's data dir and log (``--unsafe-no-fsync``: tests only)
    <dir>/apiserver/           kube-apiserver's log
    <dir>/controller-manager/  kube-controller-manager's log (``controllers=True``)
    <dir>/scheduler/           kube-scheduler's log (``controllers=True``)
    <dir>/kubeconfigs/         admin and per-identity kubeconfigs (certificates embedded)

Every daemon listens on free loopback ports and is stopped by PID. By default there is
no controller-manager and no scheduler, so ``start`` does by hand what those would do
for the objects a pod needs (see ``prepare_namespace``), tests bind pods with
``spec.nodeName``, and nothing garbage-collects or deletes namespaces. With
``controllers=True`` both run (``klet.testbed.kube_components`` says which controllers
and why): namespaces get their ServiceAccount and CA ConfigMap from the controllers,
workloads make pods, the scheduler binds them, deleted namespaces empty; and nodes can
join as kubeadm's do (``bootstrap_kubeconfig``: a bootstrap token, the apiserver's
bootstrap-token authenticator, kubeadm's ClusterRoleBindings, the CSR approving and
signing controllers signing with the harness CA for ``signing_duration``).

The apiserver runs with the Node authorizer and the NodeRestriction admission plugin, as
on a kubeadm cluster, so a node's client certificate (``node_kubeconfig``) gets exactly
the rights a kubelet gets; it trusts the same CA for klet's serving certificate
(``issue_kubelet_serving_cert``) when it calls the kubelet API (logs, exec).

The aggregation layer is on, as kubeadm sets it up: a front-proxy CA of its own (so no
client certificate of the cluster CA can pose as the proxy), the apiserver's proxy client
certificate ``front-proxy-client`` from it, the request-header flags that tell extension
apiservers (metrics-server) whom to believe, and ``--enable-aggregator-routing`` because
there is no kube-proxy: the apiserver dials an APIService's endpoint addresses directly.
"""

from __future__ import annotations

import base64
import datetime
import json
import logging
import secrets
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from klet.devstack.procs import ManagedProcess, StartError, free_port
from klet.testbed.kube_components import (
    CONTROLLER_MANAGER_USER,
    SCHEDULER_USER,
    SIGNING_DURATION,
    SecureComponent,
    controller_manager_argv,
    scheduler_argv,
)
from klet.testbed.pki import CertificateAuthority, CertPair, file_stem, write_key_pair

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc"
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
# The first address of the service range: the `kubernetes` Service's ClusterIP, which
# in-cluster clients dial, so it belongs in the serving certificate.
KUBERNETES_SERVICE_IP = "10.0.0.1"
KUBELET_CLIENT_USER = "kube-apiserver-kubelet-client"
ADMIN_USER = "kubernetes-admin"
# Namespaces the apiserver creates itself; each gets what pods need in ``start``.
SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
# The group kubeadm gives its node bootstrap tokens.
BOOTSTRAP_GROUP = "system:bootstrappers:kubeadm:default-node-token"
# The common name of the apiserver's front-proxy client certificate, the one name extension
# apiservers accept request headers from (kubeadm's).
FRONT_PROXY_CLIENT = "front-proxy-client"


def _cluster_role_binding(name: str, role: str, group: str) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}],
    }


# What `kubeadm init` binds for TLS bootstrap (with the controllers only: without the
# CSR controllers nothing would approve or sign): bootstrap tokens may create node CSRs,
# which are approved automatically, and a node may renew its own client certificate.
NODE_BOOTSTRAP_BINDINGS = [
    _cluster_role_binding("kubeadm:kubelet-bootstrap", "system:node-bootstrapper", BOOTSTRAP_GROUP),
    _cluster_role_binding(
        "kubeadm:node-autoapprove-bootstrap",
        "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
        BOOTSTRAP_GROUP,
    ),
    _cluster_role_binding(
        "kubeadm:node-autoapprove-certificate-rotation",
        "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
        "system:nodes",
    ),
]


def _tls_context(ca_file: Path, cert: CertPair) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca_file))
    ctx.load_cert_chain(str(cert.cert), str(cert.key))
    return ctx


class ControlPlane:
    """etcd + kube-apiserver under ``dir``, from the binaries in ``bin_dir``.

    ``start()`` creates the PKI (or reuses the one in ``dir``), starts etcd and the
    apiserver, waits for ``/readyz`` and prepares the system namespaces; ``stop()``
    stops them all. With ``controllers=True`` it also starts kube-controller-manager
    and kube-scheduler and waits for their ``/healthz``. The apiserver can be stopped
    and started again on the same port (``stop_apiserver``/``start_apiserver``/
    ``restart_apiserver``) to test outages; the controllers ride that out as they
    would on a real cluster. Usable as a context manager.
    """

    def __init__(
        self,
        dir: Path,
        bin_dir: Path,
        *,
        apiserver_port: int | None = None,
        etcd_port: int | None = None,
        controllers: bool = False,
        signing_duration: str = SIGNING_DURATION,
        runtime_config: tuple[str, ...] = (),
    ) -> None:
        """``runtime_config``: the apiserver's ``--runtime-config`` entries (e.g.
        ``resource.k8s.io/v1beta2=true``, API versions a default apiserver does not serve);
        none by default."""
        self.dir = dir.resolve()
        self.runtime_config = runtime_config
        self.bin_dir = bin_dir.resolve()
        self.port = apiserver_port if apiserver_port is not None else free_port()
        self.etcd_port = etcd_port if etcd_port is not None else free_port()
        self.etcd_peer_port = free_port()
        self.pki_dir = self.dir / "pki"
        self.kubeconfig_dir = self.dir / "kubeconfigs"
        self._ca: CertificateAuthority | None = None
        self._front_proxy_ca: CertificateAuthority | None = None
        self._admin: CertPair | None = None
        self._etcd: ManagedProcess | None = None
        self._apiserver: ManagedProcess | None = None
        self.controllers = controllers
        self.signing_duration = signing_duration
        # Both components serve HTTPS (healthz, metrics) on loopback ports of their own.
        self.controller_manager_port = free_port() if controllers else 0
        self.scheduler_port = free_port() if controllers else 0
        self._components: list[SecureComponent] = []

    # -- addresses and credentials ---------------------------------------------------

    @property
    def server(self) -> str:
        """The apiserver's URL, ``https://127.0.0.1:<port>``."""
        return f"https://127.0.0.1:{self.port}"

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.etcd_port}"

    @property
    def ca(self) -> CertificateAuthority:
        if self._ca is None:
            self._ca = CertificateAuthority.open(self.pki_dir, "klet-test-ca")
        return self._ca

    @property
    def ca_file(self) -> Path:
        """The CA certificate: it signed the apiserver's and klet's serving certificates
        and every client certificate the apiserver accepts."""
        return self.ca.cert_path

    @property
    def front_proxy_ca(self) -> CertificateAuthority:
        """The CA of the apiserver's front-proxy client certificate (aggregation layer)."""
        if self._front_proxy_ca is None:
            self._front_proxy_ca = CertificateAuthority.open(
                self.pki_dir / "front-proxy", "klet-test-front-proxy-ca"
            )
        return self._front_proxy_ca

    @property
    def admin_kubeconfig(self) -> Path:
        """A kubeconfig for a ``system:masters`` client certificate."""
        return self.kubeconfig_dir / "admin.kubeconfig"

    @property
    def apiserver_log(self) -> Path:
        return self.dir / "apiserver" / "kube-apiserver.log"

    @property
    def etcd_log(self) -> Path:
        return self.dir / "etcd" / "etcd.log"

    @property
    def controller_manager_log(self) -> Path:
        return self.dir / "controller-manager" / "kube-controller-manager.log"

    @property
    def scheduler_log(self) -> Path:
        return self.dir / "scheduler" / "kube-scheduler.log"

    @property
    def apiserver_running(self) -> bool:
        return self._apiserver is not None and self._apiserver.alive

    @property
    def controllers_running(self) -> bool:
        """Whether kube-controller-manager and kube-scheduler were started and still run."""
        return bool(self._components) and all(c.alive for c in self._components)

    def user_kubeconfig(
        self, user: str, groups: Sequence[str] = (), *, name: str | None = None
    ) -> Path:
        """A kubeconfig authenticating as ``user`` in ``groups`` (a fresh client certificate).

        Written to ``kubeconfigs/<name>.kubeconfig`` (``name`` defaults to the user name
        made file-safe) with the certificates embedded, so it can be copied anywhere.
        """
        stem = name or file_stem(user)
        pair = self.ca.issue(user, groups, client=True, name=f"client-{stem}")
        return self._write_kubeconfig(stem, user, pair)

    def node_kubeconfig(self, node_name: str) -> Path:
        """A kubeconfig for node ``node_name``: ``CN=system:node:<node>, O=system:nodes``."""
        return self.user_kubeconfig(
            f"system:node:{node_name}", ["system:nodes"], name=f"node-{node_name}"
        )

    def bootstrap_kubeconfig(
        self,
        *,
        name: str = "bootstrap",
        ttl_s: float = 3600.0,
        token: str | None = None,
        group: str = BOOTSTRAP_GROUP,
    ) -> Path:
        """A kubeconfig with a bootstrap token, as ``kubeadm join`` writes one: a new
        ``bootstrap-token-<id>`` Secret in kube-system valid for ``ttl_s`` (negative: one
        already expired), whose user ``system:bootstrap:<id>`` is in
        ``group`` (default ``system:bootstrappers:kubeadm:default-node-token``, whose
        node CSRs are approved automatically). ``token`` puts that text in the kubeconfig
        instead of the Secret's (a wrong token)."""
        token_id, secret = secrets.token_hex(3), secrets.token_hex(8)
        expires = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=ttl_s)
        self.apply(
            [
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": f"bootstrap-token-{token_id}", "namespace": "kube-system"},
                    "type": "bootstrap.kubernetes.io/token",
                    "stringData": {
                        "token-id": token_id,
                        "token-secret": secret,
                        "expiration": expires.strftime("%Y-%m-%dT%H:%M:%SZ"),
                        "usage-bootstrap-authentication": "true",
                        "auth-extra-groups": group,
                    },
                }
            ]
        )
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "klet-test", "cluster": self._cluster_entry()}],
            "users": [
                {
                    "name": "tls-bootstrap-token-user",
                    "user": {"token": token or f"{token_id}.{secret}"},
                }
            ],
            "contexts": [
                {
                    "name": "tls-bootstrap-token-user@klet-test",
                    "context": {"cluster": "klet-test", "user": "tls-bootstrap-token-user"},
                }
            ],
            "current-context": "tls-bootstrap-token-user@klet-test",
        }
        return self._write_config(name, config)

    def issue_kubelet_serving_cert(self, node_name: str, ips: Sequence[str]) -> CertPair:
        """A serving certificate for klet's kubelet API on ``node_name``, signed by the CA
        the apiserver checks kubelets against (``--kubelet-certificate-authority``).

        Subject and names as the upstream kubelet's CSR-issued certificate:
        ``CN=system:node:<node>, O=system:nodes``, DNS ``<node>``, the given IPs.
        """
        return self.ca.issue(
            f"system:node:{node_name}",
            ["system:nodes"],
            dns_names=[node_name],
            ip_addresses=list(ips),
            server=True,
            name=f"kubelet-serving-{file_stem(node_name)}",
        )

    def node_flags(self, node_name: str, ip: str = "127.0.0.1") -> list[str]:
        """What a klet needs on its command line to join as ``node_name`` at ``ip``: its
        node kubeconfig, a serving certificate for the kubelet API, the client CA."""
        cert = self.issue_kubelet_serving_cert(node_name, [ip])
        return [
            "--kubeconfig",
            str(self.node_kubeconfig(node_name)),
            "--node-ip",
            ip,
            "--tls-cert-file",
            str(cert.cert),
            "--tls-private-key-file",
            str(cert.key),
            "--client-ca-file",
            str(self.ca_file),
        ]

    # -- life cycle ------------------------------------------------------------------

    def start(self, *, timeout_s: float = 90.0) -> None:
        """Create the PKI, start etcd and the apiserver, wait for ``/readyz``, set up (and
        with ``controllers`` start the controller-manager and scheduler)."""
        binaries = ["etcd", "kube-apiserver", "kubectl"]
        if self.controllers:
            binaries += ["kube-controller-manager", "kube-scheduler"]
        for binary in binaries:
            if not (self.bin_dir / binary).is_file():
                raise StartError(f"{self.bin_dir / binary} missing: run tools/cluster/build.sh")
        self.dir.mkdir(parents=True, exist_ok=True)
        self._make_pki()
        started = time.monotonic()
        try:
            self._start_etcd(timeout_s=timeout_s)
            self.start_apiserver(timeout_s=timeout_s)
            self._set_up(timeout_s=timeout_s)
        except BaseException:
            self.stop()
            raise
        log.info(
            "control plane ready server=%s etcd=%s seconds=%.1f",
            self.server,
            self.etcd_url,
            time.monotonic() - started,
        )

    def stop(self) -> None:
        """Stop the scheduler and controller-manager, the apiserver, then etcd (each by
        PID); safe after a partial start."""
        while self._components:
            self._components.pop().stop()
        self.stop_apiserver()
        if self._etcd is not None:
            self._etcd.stop(timeout_s=10.0)
            self._etcd = None

    def stop_apiserver(self) -> None:
        if self._apiserver is not None:
            self._apiserver.stop(timeout_s=30.0)
            self._apiserver = None

    def start_apiserver(self, *, timeout_s: float = 90.0) -> None:
        """Start the apiserver (on the same port as before) and wait for ``/readyz``."""
        proc = ManagedProcess("kube-apiserver", self._apiserver_argv(), dir=self.dir / "apiserver")
        proc.start()
        self._apiserver = proc
        try:
            proc.wait_ready(self.ready, timeout_s, f"/readyz on {self.server}")
        except StartError:
            self.stop_apiserver()
            raise

    def restart_apiserver(self, *, down_s: float = 0.0, timeout_s: float = 90.0) -> None:
        """Stop the apiserver, keep it down ``down_s`` seconds, start it on the same port."""
        self.stop_apiserver()
        if down_s > 0:
            time.sleep(down_s)
        self.start_apiserver(timeout_s=timeout_s)

    def ready(self) -> bool:
        """Whether ``/readyz`` answers ``ok`` to the admin certificate."""
        return self.get("/readyz", timeout_s=2.0).strip() == "ok"

    def get(self, path: str, *, timeout_s: float = 10.0) -> str:
        """GET ``path`` from the apiserver as admin; the body as text (raises on non-2xx)."""
        assert self._admin is not None, "start() first"
        ctx = _tls_context(self.ca_file, self._admin)
        with urllib.request.urlopen(self.server + path, timeout=timeout_s, context=ctx) as resp:
            body: bytes = resp.read()
        return body.decode()

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- kubectl ---------------------------------------------------------------------

    def kubectl(
        self,
        *args: str,
        kubeconfig: Path | None = None,
        input: str | None = None,
        check: bool = False,
        timeout_s: float = 60.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run the built kubectl with the admin kubeconfig (or ``kubeconfig``); text output.

        Its discovery cache stays under ``dir``, never in ``$HOME``.
        """
        argv = [
            str(self.bin_dir / "kubectl"),
            f"--kubeconfig={kubeconfig or self.admin_kubeconfig}",
            f"--cache-dir={self.dir / 'kubectl-cache'}",
            *args,
        ]
        return subprocess.run(
            argv,
            input=input,
            capture_output=True,
            text=True,
            check=check,
            timeout=timeout_s,
        )

    def apply(self, objects: Sequence[dict[str, Any]], *, timeout_s: float = 30.0) -> None:
        """Server-side apply ``objects`` as admin, retrying while the apiserver settles."""
        doc = json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)})
        deadline = time.monotonic() + timeout_s
        while True:
            res = self.kubectl(
                "apply",
                "--server-side",
                "--force-conflicts",
                "--field-manager=klet-devstack",
                "-f",
                "-",
                input=doc,
            )
            if res.returncode == 0:
                return
            if time.monotonic() >= deadline:
                raise StartError(f"kubectl apply failed: {res.stderr.strip()}")
            log.debug("apply not yet accepted: %s", res.stderr.strip())
            time.sleep(0.5)

    def prepare_namespace(self, namespace: str, *, timeout_s: float = 60.0) -> None:
        """Make ``namespace`` ready for pods.

        Creates the namespace, its ``default`` ServiceAccount (the ServiceAccount
        admission plugin rejects pods without it) and the ``kube-root-ca.crt`` ConfigMap
        (the projected service-account volume of every pod refers to it). With
        ``controllers`` those two are the controllers' to make: it creates only the
        namespace and waits for them, so nothing races the controllers' own writes.
        """
        if self.controllers:
            self.apply(
                [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}],
                timeout_s=timeout_s,
            )
            for path in (
                f"/api/v1/namespaces/{namespace}/serviceaccounts/default",
                f"/api/v1/namespaces/{namespace}/configmaps/kube-root-ca.crt",
            ):
                self._wait_for_object(path, timeout_s=timeout_s)
            return
        self.apply(
            [
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
                {
                    "apiVersion": "v1",
                    "kind": "ServiceAccount",
                    "metadata": {"name": "default", "namespace": namespace},
                },
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": "kube-root-ca.crt", "namespace": namespace},
                    "data": {"ca.crt": self.ca.cert_pem.decode()},
                },
            ]
        )

    # -- internals -------------------------------------------------------------------

    def _wait_for_object(self, path: str, *, timeout_s: float) -> None:
        """Poll a GET of ``path`` as admin until it succeeds (404 while not made yet)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.get(path, timeout_s=5.0)
                return
            except OSError as exc:  # urllib's HTTPError/URLError are OSErrors
                if time.monotonic() >= deadline:
                    raise StartError(f"{path} not there after {timeout_s:.0f}s: {exc}") from exc
            time.sleep(0.2)

    def _start_controllers(self, *, timeout_s: float) -> None:
        """Start kube-controller-manager, then kube-scheduler; wait for each ``/healthz``."""
        pki = self.pki_dir
        manager = SecureComponent(
            "kube-controller-manager",
            controller_manager_argv(
                self.bin_dir,
                kubeconfig=self.user_kubeconfig(CONTROLLER_MANAGER_USER, name="controller-manager"),
                port=self.controller_manager_port,
                serving=self._serving_cert("controller-manager"),
                ca_file=self.ca_file,
                ca_key=self.ca.key_path,
                service_account_key=pki / "sa.key",
                signing_duration=self.signing_duration,
            ),
            dir=self.dir / "controller-manager",
            port=self.controller_manager_port,
            ca_file=self.ca_file,
        )
        scheduler = SecureComponent(
            "kube-scheduler",
            scheduler_argv(
                self.bin_dir,
                kubeconfig=self.user_kubeconfig(SCHEDULER_USER, name="scheduler"),
                port=self.scheduler_port,
                serving=self._serving_cert("scheduler"),
                ca_file=self.ca_file,
            ),
            dir=self.dir / "scheduler",
            port=self.scheduler_port,
            ca_file=self.ca_file,
        )
        for component in (manager, scheduler):
            component.start(timeout_s=timeout_s)
            self._components.append(component)

    def _serving_cert(self, stem: str) -> CertPair:
        """A loopback serving certificate from the CA (``<stem>-serving.{crt,key}``)."""
        return self.ca.issue(
            f"{stem}-serving",
            dns_names=["localhost"],
            ip_addresses=["127.0.0.1"],
            server=True,
            name=f"{stem}-serving",
        )

    def _make_pki(self) -> None:
        ca = self.ca
        pki = self.pki_dir
        if not (pki / "sa.key").exists():
            write_key_pair(pki / "sa.key", pki / "sa.pub")
        # Re-issued on every start: cheap, and never stale if names change.
        ca.issue(
            "kube-apiserver",
            dns_names=[
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ],
            ip_addresses=["127.0.0.1", KUBERNETES_SERVICE_IP],
            server=True,
            name="apiserver",
        )
        # The identity the apiserver presents to kubelets; its rights come from _set_up.
        ca.issue(KUBELET_CLIENT_USER, client=True, name="apiserver-kubelet-client")
        # The identity it presents to extension apiservers, asserting the user in headers.
        self.front_proxy_ca.issue(FRONT_PROXY_CLIENT, client=True, name=FRONT_PROXY_CLIENT)
        self._admin = ca.issue(ADMIN_USER, ["system:masters"], client=True, name="admin")
        self._write_kubeconfig("admin", ADMIN_USER, self._admin)

    def _write_kubeconfig(self, stem: str, user: str, pair: CertPair) -> Path:
        def b64(path: Path) -> str:
            return base64.b64encode(path.read_bytes()).decode()

        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "klet-test", "cluster": self._cluster_entry()}],
            "users": [
                {
                    "name": user,
                    "user": {
                        "client-certificate-data": b64(pair.cert),
                        "client-key-data": b64(pair.key),
                    },
                }
            ],
            "contexts": [{"name": "klet-test", "context": {"cluster": "klet-test", "user": user}}],
            "current-context": "klet-test",
        }
        return self._write_config(stem, config)

    def _cluster_entry(self) -> dict[str, str]:
        return {
            "server": self.server,
            "certificate-authority-data": base64.b64encode(self.ca_file.read_bytes()).decode(),
        }

    def _write_config(self, stem: str, config: dict[str, Any]) -> Path:
        self.kubeconfig_dir.mkdir(parents=True, exist_ok=True)
        path = self.kubeconfig_dir / f"{stem}.kubeconfig"
        tmp = path.with_suffix(".tmp")
        tmp.touch(mode=0o600)
        tmp.write_text(json.dumps(config, indent=2))  # JSON is YAML: every client reads it
        tmp.replace(path)
        return path

    def _start_etcd(self, *, timeout_s: float) -> None:
        etcd_dir = self.dir / "etcd"
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        argv = [
            str(self.bin_dir / "etcd"),
            "--name=klet-test",
            f"--data-dir={etcd_dir / 'data'}",
            f"--listen-client-urls={self.etcd_url}",
            f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=klet-test={peer}",
            "--unsafe-no-fsync",
            "--log-level=warn",
        ]
        proc = ManagedProcess("etcd", argv, dir=etcd_dir)
        proc.start()
        self._etcd = proc

        def healthy() -> bool:
            with urllib.request.urlopen(self.etcd_url + "/health", timeout=2.0) as resp:
                return bool(json.load(resp).get("health") == "true")

        proc.wait_ready(healthy, timeout_s, f"/health on {self.etcd_url}")

    def _apiserver_argv(self) -> list[str]:
        pki = self.pki_dir
        return [
            str(self.bin_dir / "kube-apiserver"),
            f"--etcd-servers={self.etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.port}",
            f"--cert-dir={self.dir / 'apiserver'}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={self.ca_file}",
            "--enable-bootstrap-token-auth=true",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--api-audiences={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            "--allow-privileged=true",
            f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
            f"--kubelet-certificate-authority={self.ca_file}",
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            *self._aggregation_flags(),
            # The `kubernetes` Service keeps its ClusterIP, but its Endpoints cannot hold
            # the loopback advertise address (validation rejects 127.0.0.0/8): without
            # this the apiserver logs that failure every ten seconds.
            "--endpoint-reconciler-type=none",
            "--profiling=false",
            "--v=1",
            *self._shutdown_flags(),
            *([f"--runtime-config={','.join(self.runtime_config)}"] if self.runtime_config else []),
        ]

    def _aggregation_flags(self) -> list[str]:
        """The front proxy (aggregation layer) as kubeadm configures it."""
        front = self.front_proxy_ca
        return [
            f"--requestheader-client-ca-file={front.cert_path}",
            f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={front.dir / (FRONT_PROXY_CLIENT + '.crt')}",
            f"--proxy-client-key-file={front.dir / (FRONT_PROXY_CLIENT + '.key')}",
            "--enable-aggregator-routing=true",
        ]

    def _shutdown_flags(self) -> list[str]:
        """A stopped apiserver stops listening at once but then waits for open watches
        to end, which they do not: with the controllers' watches ``stop_apiserver`` gave
        up after 30 s and SIGKILLed it. Draining them actively stops it in about 1 s.
        (The plain plane does the same whenever a watch is open, a klet node's for one;
        it is left as it was.)"""
        return ["--shutdown-watch-termination-grace-period=5s"] if self.controllers else []

    def _set_up(self, *, timeout_s: float) -> None:
        self.apply(
            [
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "ClusterRoleBinding",
                    "metadata": {"name": "kube-apiserver-kubelet-api-admin"},
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "ClusterRole",
                        "name": "system:kubelet-api-admin",
                    },
                    "subjects": [
                        {
                            "apiGroup": "rbac.authorization.k8s.io",
                            "kind": "User",
                            "name": KUBELET_CLIENT_USER,
                        }
                    ],
                }
            ],
            timeout_s=timeout_s,
        )
        if self.controllers:
            self.apply(NODE_BOOTSTRAP_BINDINGS, timeout_s=timeout_s)
            self._start_controllers(timeout_s=timeout_s)
        for namespace in SYSTEM_NAMESPACES:
            self.prepare_namespace(namespace, timeout_s=timeout_s)
