"""kube-controller-manager and kube-scheduler for the test control plane.

``ControlPlane(..., controllers=True)`` runs both next to its apiserver; this module
holds what is particular to them: their command lines and a process wrapper that waits
for ``/healthz`` over TLS. Each runs with a client certificate of the identity the
apiserver's built-in RBAC bindings expect (``system:kube-controller-manager``,
``system:kube-scheduler``), serves HTTPS on a free loopback port with a certificate from
the harness CA (so readiness is checked with that CA, not by skipping verification), and
runs without leader election: one instance per plane.

The controller-manager runs a chosen set of controllers, not ``*``; see ``CONTROLLERS``.
"""

from __future__ import annotations

import ssl
import urllib.request
from pathlib import Path

from klet.devstack.procs import ManagedProcess, StartError
from klet.testbed.pki import CertPair

# Canonical names (k8s.io/kubernetes cmd/kube-controller-manager/names, v1.34), with what
# needs each: a Helm install of a node agent (issue 14) or the [NodeConformance] suite
# (issue 16), both of which create and delete namespaces and run workloads.
CONTROLLERS = (
    # Every namespace's `default` ServiceAccount: the ServiceAccount admission plugin
    # rejects pods until it exists, and the e2e framework waits for it per namespace.
    "serviceaccount-controller",
    # Fills Secrets of type kubernetes.io/service-account-token (charts still create
    # them for long-lived tokens); needs --service-account-private-key-file.
    "serviceaccount-token-controller",
    # `kube-root-ca.crt` in every namespace: each pod's projected token volume reads it.
    "root-ca-certificate-publisher-controller",
    # Deleting a namespace empties it (helm uninstall of a namespace, e2e teardown).
    "namespace-controller",
    # Cascading deletion through ownerReferences (Deployment -> ReplicaSet -> Pod,
    # DaemonSet -> Pod): helm uninstall, kubectl delete without --cascade=orphan.
    "garbage-collector-controller",
    # Deletes pods bound to a Node that no longer exists (a test's klet node is deleted
    # at teardown while a DaemonSet may just have made it a pod); nothing else would.
    "pod-garbage-collector-controller",
    # The workloads a chart is made of.
    "deployment-controller",
    "replicaset-controller",
    "daemonset-controller",
    # Helm hooks are commonly Jobs (`helm install --wait-for-jobs`).
    "job-controller",
    # The TaintNodesByCondition admission plugin (on by default) taints every new Node
    # node.kubernetes.io/not-ready:NoSchedule and only this controller removes the taint
    # once the Node is Ready (NodeRestriction forbids a kubelet to change its own
    # taints): without it nothing without a toleration is ever scheduled. It runs with a
    # long grace period (below) and without taint-eviction-controller, so a klet that a
    # test stops is neither marked Unknown within a test nor has its pods evicted.
    "node-lifecycle-controller",
    # The built-in admin/edit/view ClusterRoles are empty until this aggregates the
    # system:aggregate-to-* rules into them; charts bind them.
    "clusterrole-aggregation-controller",
    # Persistent storage (issue 26): claims are bound to PVs (and a CSI provisioner is
    # asked for new ones) only by the binder; the StorageObjectInUseProtection admission
    # plugin puts finalizers on every PVC and PV that only the two protection controllers
    # remove; a pod's `ephemeral` volume gets its claim from the ephemeral-volume
    # controller; StatefulSets make claims from their volumeClaimTemplates. The
    # attach-detach controller makes a VolumeAttachment for each volume of a driver that
    # needs attaching and, once the attacher marks it attached, lists the volume in the
    # Node's status.volumesAttached, which the node waits for; it detaches only after
    # the node drops the volume from status.volumesInUse. (The module proxy here serves
    # no external-attacher: the tests play that part.)
    "persistentvolume-binder-controller",
    "persistentvolume-attach-detach-controller",
    "persistentvolume-protection-controller",
    "persistentvolumeclaim-protection-controller",
    "ephemeral-volume-controller",
    "statefulset-controller",
    # TLS bootstrap and certificate rotation of nodes (issue 27), as on a kubeadm
    # cluster: node client CSRs are approved by the approver (for the groups the
    # ClusterRoleBindings of ControlPlane._set_up allow), signed with the cluster CA by
    # the signer, and removed an hour after issue by the cleaner.
    "certificatesigningrequest-approving-controller",
    "certificatesigningrequest-signing-controller",
    "certificatesigningrequest-cleaner-controller",
    # A ResourceQuota's status.used/hard (issue 37: upstream's pod-resize-resource-quota
    # e2e spec waits for it, and the apiserver's quota admission then counts resizes).
    "resourcequota-controller",
    # DRA (issue 40): a pod's ResourceClaimTemplate becomes its ResourceClaim (named in
    # the pod's status.resourceClaimStatuses, which the node reads) and a finished
    # pod's reservation is released; the scheduler allocates and reserves.
    "resourceclaim-controller",
)

# How long the signer's certificates live unless a test asks for less
# (ControlPlane(signing_duration=...)): upstream's default, a year.
SIGNING_DURATION = "8760h"

# How long a Node may go without a heartbeat (Lease or status) before node-lifecycle
# marks it Unknown and taints it unreachable. Upstream's 50 s would turn a node Unknown
# in any test that keeps klet's status-reporter down for a minute.
NODE_MONITOR_GRACE_PERIOD = "10m"

CONTROLLER_MANAGER_USER = "system:kube-controller-manager"
SCHEDULER_USER = "system:kube-scheduler"


def _common_flags(kubeconfig: Path, port: int, serving: CertPair, ca_file: Path) -> list[str]:
    """Client, delegated authn/authz and serving flags both components share.

    Client certificates are checked against the harness CA given here, so no lookup of
    ``kube-system/extension-apiserver-authentication`` (the test apiserver has no
    front-proxy CA in it, and the lookup would log an error for that again and again);
    tokens and authorization go to the apiserver, which the built-in roles of both
    identities allow.
    """
    return [
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        "--authentication-skip-lookup=true",
        f"--authorization-kubeconfig={kubeconfig}",
        f"--client-ca-file={ca_file}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--tls-cert-file={serving.cert}",
        f"--tls-private-key-file={serving.key}",
        "--leader-elect=false",
        "--profiling=false",
        "--v=1",
    ]


def controller_manager_argv(
    bin_dir: Path,
    *,
    kubeconfig: Path,
    port: int,
    serving: CertPair,
    ca_file: Path,
    ca_key: Path,
    service_account_key: Path,
    signing_duration: str = SIGNING_DURATION,
) -> list[str]:
    """kube-controller-manager running ``CONTROLLERS``, each with its own ServiceAccount;
    the CSR signer signs with the harness CA (which the apiserver trusts for client
    certificates) for at most ``signing_duration``."""
    return [
        str(bin_dir / "kube-controller-manager"),
        *_common_flags(kubeconfig, port, serving, ca_file),
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={service_account_key}",
        f"--root-ca-file={ca_file}",
        f"--controllers={','.join(CONTROLLERS)}",
        f"--node-monitor-grace-period={NODE_MONITOR_GRACE_PERIOD}",
        f"--cluster-signing-cert-file={ca_file}",
        f"--cluster-signing-key-file={ca_key}",
        f"--cluster-signing-duration={signing_duration}",
    ]


def scheduler_argv(
    bin_dir: Path, *, kubeconfig: Path, port: int, serving: CertPair, ca_file: Path
) -> list[str]:
    """kube-scheduler with its default profile."""
    return [str(bin_dir / "kube-scheduler"), *_common_flags(kubeconfig, port, serving, ca_file)]


class SecureComponent:
    """A control-plane daemon whose readiness is ``GET /healthz`` on a loopback HTTPS port.

    Logs to ``<dir>/<name>.log``; stopped by PID. ``/healthz`` is in the components'
    always-allowed paths, so no client certificate is presented; the serving certificate
    is verified against ``ca_file``.
    """

    def __init__(self, name: str, argv: list[str], *, dir: Path, port: int, ca_file: Path) -> None:
        self.name = name
        self.port = port
        self.ca_file = ca_file
        self._proc = ManagedProcess(name, argv, dir=dir)

    @property
    def log_path(self) -> Path:
        return self._proc.log_path

    @property
    def alive(self) -> bool:
        return self._proc.alive

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    def healthy(self) -> bool:
        """Whether ``/healthz`` answers ``ok``."""
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        url = f"https://127.0.0.1:{self.port}/healthz"
        with urllib.request.urlopen(url, timeout=2.0, context=ctx) as resp:
            body: bytes = resp.read()
        return body.decode().strip() == "ok"

    def start(self, *, timeout_s: float) -> None:
        """Start the process and wait for ``/healthz``; stopped again if it never answers."""
        self._proc.start()
        try:
            self._proc.wait_ready(self.healthy, timeout_s, f"/healthz on 127.0.0.1:{self.port}")
        except StartError:
            self.stop()
            raise

    def stop(self, *, timeout_s: float = 15.0) -> None:
        self._proc.stop(timeout_s=timeout_s)
