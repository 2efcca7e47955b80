"""A real metrics-server behind the test control plane's aggregation layer, for the
`kubectl top` cluster test.

metrics-server (built by tools/metrics-server/build.sh) runs as a process on this host
and is registered as upstream's manifests register it: the `v1beta1.metrics.k8s.io`
APIService pointing at the `kube-system/metrics-server` Service, its RBAC (the
`system:metrics-server` ClusterRole for nodes/metrics, nodes and pods; auth-delegator;
the extension-apiserver-authentication-reader Role), and a serving certificate from the
cluster CA for `metrics-server.kube-system.svc`, which the APIService's caBundle trusts.

There is no kube-proxy and no endpoint controller here: the apiserver routes to the
Service's endpoints itself (`--enable-aggregator-routing`, set by ControlPlane), and it
reads them from EndpointSlices, so the test writes one by hand with this host's
non-loopback address (EndpointSlices refuse loopback addresses, as the apiserver's node
proxy refuses loopback node addresses): tests/harness/nodeaddress.host_address.
"""

from __future__ import annotations

import base64
import json
import ssl
import urllib.request
from pathlib import Path
from typing import Any

from klet.devstack import free_port
from klet.devstack.procs import ManagedProcess
from klet.testbed.cluster import ControlPlane

from tests.harness.waiting import wait_for

NAMESPACE = "kube-system"
NAME = "metrics-server"
USER = "system:metrics-server"  # the client certificate's CN
APISERVICE = "v1beta1.metrics.k8s.io"


def _rbac() -> list[dict[str, Any]]:
    def ref(kind: str, name: str) -> dict[str, str]:
        return {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name}

    user = {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "system:metrics-server"},
            "rules": [
                {"apiGroups": [""], "resources": ["nodes/metrics"], "verbs": ["get"]},
                {
                    "apiGroups": [""],
                    "resources": ["pods", "nodes"],
                    "verbs": ["get", "list", "watch"],
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "system:metrics-server"},
            "roleRef": ref("ClusterRole", "system:metrics-server"),
            "subjects": [user],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "metrics-server:system:auth-delegator"},
            "roleRef": ref("ClusterRole", "system:auth-delegator"),
            "subjects": [user],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "metrics-server-auth-reader", "namespace": NAMESPACE},
            "roleRef": ref("Role", "extension-apiserver-authentication-reader"),
            "subjects": [user],
        },
    ]


def _registration(address: str, port: int, ca_bundle: bytes) -> list[dict[str, Any]]:
    """The Service, its EndpointSlice (this host's address and metrics-server's port) and
    the APIService."""
    return [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": NAME, "namespace": NAMESPACE},
            "spec": {"ports": [{"name": "https", "port": 443, "targetPort": port}]},
        },
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": NAME,
                "namespace": NAMESPACE,
                "labels": {"kubernetes.io/service-name": NAME},
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
            "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
        },
        {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": APISERVICE},
            "spec": {
                "group": "metrics.k8s.io",
                "version": "v1beta1",
                "service": {"name": NAME, "namespace": NAMESPACE, "port": 443},
                "caBundle": base64.b64encode(ca_bundle).decode(),
                "groupPriorityMinimum": 100,
                "versionPriority": 100,
            },
        },
    ]


class MetricsServer:
    """metrics-server from ``binary`` on ``address``, registered with ``cp``; its files
    (log, serving certificate dir) under ``dir``. Usable as a context manager."""

    def __init__(self, cp: ControlPlane, binary: Path, dir: Path, *, address: str) -> None:
        self.cp = cp
        self.address = address
        self.port = free_port()
        self.dir = dir
        serving = cp.ca.issue(
            "metrics-server",
            dns_names=[f"{NAME}.{NAMESPACE}.svc"],
            ip_addresses=[address],
            server=True,
            name="metrics-server-serving",
        )
        kubeconfig = cp.user_kubeconfig(USER, name="metrics-server")
        argv = [
            str(binary),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            f"--bind-address={address}",
            f"--secure-port={self.port}",
            f"--cert-dir={dir / 'certs'}",
            f"--tls-cert-file={serving.cert}",
            f"--tls-private-key-file={serving.key}",
            # klet's serving certificate is the cluster CA's and names the node's IP.
            f"--kubelet-certificate-authority={cp.ca_file}",
            "--kubelet-preferred-address-types=InternalIP",
            # The harness's 10250 is a free port: the Node's daemonEndpoints names it.
            "--kubelet-use-node-status-port",
            # The shortest resolution allowed; each scrape must time out before 90% of it.
            "--metric-resolution=10s",
            "--kubelet-request-timeout=5s",
            "--v=2",
        ]
        self._proc = ManagedProcess("metrics-server", argv, dir=dir)

    @property
    def log_path(self) -> Path:
        return self._proc.log_path

    def _live(self) -> bool:
        ctx = ssl.create_default_context(cafile=str(self.cp.ca_file))
        url = f"https://{self.address}:{self.port}/livez"
        with urllib.request.urlopen(url, timeout=2.0, context=ctx) as resp:
            return bool(resp.status == 200)

    def _available(self) -> bool:
        res = self.cp.kubectl("get", "apiservice", APISERVICE, "-o", "json")
        if res.returncode != 0:
            return False
        conditions = json.loads(res.stdout)["status"].get("conditions", [])
        return any(c["type"] == "Available" and c["status"] == "True" for c in conditions)

    def start(self, *, timeout_s: float = 60.0) -> None:
        """Apply the RBAC, start the process, wait for ``/livez``, register the APIService
        and wait until the apiserver reports it Available."""
        self.cp.apply(_rbac())
        self._proc.start()
        try:
            self._proc.wait_ready(self._live, timeout_s, f"/livez on {self.address}:{self.port}")
            self.cp.apply(_registration(self.address, self.port, self.cp.ca.cert_pem))
            wait_for(self._available, timeout_s=timeout_s, what=f"APIService {APISERVICE}")
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Unregister (so the shared control plane has no unavailable APIService left) and
        stop the process by PID."""
        self.cp.kubectl("delete", "apiservice", APISERVICE, "--ignore-not-found")
        self.cp.kubectl(
            "delete",
            "-n",
            NAMESPACE,
            "service/" + NAME,
            "endpointslice/" + NAME,
            "--ignore-not-found",
        )
        self._proc.stop(timeout_s=15.0)

    def __enter__(self) -> MetricsServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
