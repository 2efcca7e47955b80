"""Cluster mode (a kubeconfig is set): its dependencies, built once, and its root tasks.

`build_cluster` wires the five cluster-mode managers to their adapters:

- `node-status` (`NodeStatusManager`): registration and the node status loop, observing
  the host (`hostinfo`), the CRI runtime and the bus's node condition tables (`NodeObserver`);
- `node-lease` (`LeaseManager`): the Lease heartbeat, on its own apiserver client (its
  own QPS bucket and connections, as upstream's dedicated heartbeat client), so a burst
  of pod status writes can never delay a renewal;
- `pod-status` (`PodSyncManager`): pod statuses, mirror pods, final deletions, reading
  the same pod view the HTTP API serves;
- `events` (`EventSink`): the services' bus Events streams to core/v1 Events;
- `csinode` (`CSINodeManager`): the CSI drivers registered on the node (syncloop's
  `csidrivers` table) into the CSINode object and the Node's annotation and labels;
- `client-certificate` (klet.kube.rotation, with `rotateCertificates: true`): the node's
  client certificate renewed through the certificates API before it expires;
  `serving-certificate` (with `serverTLSBootstrap: true`): the kubelet API's certificate
  asked for and renewed the same way.

Every adapter can be replaced through `ClusterOverrides` (tests pass
`testing.FakeApiServer` and friends); what is not replaced is built from settings.
Settings are read through the protocols below: exactly the fields cluster mode uses.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from klet.bus import NodeBus
from klet.kube.observing import RequestObserver
from klet.model.node import storage_aware_eviction_hard
from klet.status_reporter.cluster.capacity import MachineInfo
from klet.status_reporter.cluster.csinode import CSINodeManager
from klet.status_reporter.cluster.csinode import DriverTable as CSIDriverTable
from klet.status_reporter.cluster.eventsink import EventFeed, EventPolicy, EventSink
from klet.status_reporter.cluster.hostinfo import detect_node_ips, read_machine
from klet.status_reporter.cluster.kubeapi import NO_RETRY, Kube, KubeApi, RetryPolicy
from klet.status_reporter.cluster.nodeid import NodeIdentity
from klet.status_reporter.cluster.nodelease import LeaseManager, LeasePolicy
from klet.status_reporter.cluster.nodemanager import (
    EventPublisher,
    NodeStatusManager,
    NodeStatusPolicy,
    StartupRecorder,
)
from klet.status_reporter.cluster.nodeobserver import ConditionTable, NodeObserver, RuntimeService
from klet.status_reporter.cluster.nodestatus import KUBELET_VERSION, NodeConfig
from klet.status_reporter.cluster.podsync import (
    PodSyncManager,
    PodSyncPolicy,
    PodView,
    SourcesTable,
)


class ClusterKubelet(Protocol):
    """The KubeletConfiguration fields cluster mode reads (upstream names in brackets)."""

    @property
    def port(self) -> int: ...  # [port] the kubelet API port, reported in daemonEndpoints

    @property
    def max_pods(self) -> int: ...  # [maxPods]

    @property
    def node_status_max_images(self) -> int: ...  # [nodeStatusMaxImages] -1 = all

    @property
    def kube_reserved(self) -> Mapping[str, str]: ...  # [kubeReserved]

    @property
    def system_reserved(self) -> Mapping[str, str]: ...  # [systemReserved]

    @property
    def eviction_hard(self) -> Mapping[str, str]: ...  # [evictionHard]

    @property
    def local_storage_capacity_isolation(self) -> bool: ...  # [localStorageCapacityIsolation]

    @property
    def register_node(self) -> bool: ...  # [registerNode]

    @property
    def register_with_taints(self) -> tuple[Mapping[str, Any], ...]: ...  # [registerWithTaints]

    @property
    def provider_id(self) -> str: ...  # [providerID]

    @property
    def enable_controller_attach_detach(self) -> bool: ...  # [enableControllerAttachDetach]

    @property
    def node_status_update_frequency(self) -> float: ...  # [nodeStatusUpdateFrequency] s

    @property
    def node_status_report_frequency(self) -> float: ...  # [nodeStatusReportFrequency] s

    @property
    def node_lease_duration_seconds(self) -> int: ...  # [nodeLeaseDurationSeconds]

    @property
    def event_record_qps(self) -> int: ...  # [eventRecordQPS] 0 = unlimited

    @property
    def event_burst(self) -> int: ...  # [eventBurst]

    @property
    def kube_api_qps(self) -> int: ...  # [kubeAPIQPS]

    @property
    def kube_api_burst(self) -> int: ...  # [kubeAPIBurst]

    @property
    def container_runtime_endpoint(self) -> str: ...  # [containerRuntimeEndpoint]

    @property
    def effective_image_service_endpoint(self) -> str: ...  # [imageServiceEndpoint]

    @property
    def rotate_certificates(self) -> bool: ...  # [rotateCertificates]

    @property
    def server_tls_bootstrap(self) -> bool: ...  # [serverTLSBootstrap]


class ClusterKlet(Protocol):
    """The klet-only settings cluster mode reads."""

    @property
    def node_name(self) -> str: ...

    @property
    def node_ips(self) -> tuple[str, ...]: ...  # --node-ip, split; () = detect

    @property
    def cloud_provider(self) -> str: ...  # --cloud-provider: "" or "external"

    @property
    def node_labels(self) -> Mapping[str, str]: ...  # --node-labels

    @property
    def kubeconfig(self) -> Path | None: ...  # None = standalone

    @property
    def cert_dir(self) -> Path: ...  # --cert-dir: the client certificate rotation renews

    @property
    def root_dir(self) -> Path: ...  # --root-dir: its filesystem is ephemeral-storage


@dataclass(frozen=True)
class ClusterOverrides:
    """Replacements for cluster mode's production dependencies (tests)."""

    kube: Kube | None = None
    lease_kube: Kube | None = None
    runtime: RuntimeService | None = None
    conditions: ConditionTable | None = None
    sources: SourcesTable | None = None
    events: EventFeed | None = None
    publisher: EventPublisher | None = None
    read_machine: Callable[[], MachineInfo] | None = None
    node_ips: tuple[str, ...] | None = None
    retry: RetryPolicy | None = None
    node_policy: NodeStatusPolicy | None = None
    lease_policy: LeasePolicy | None = None
    pod_policy: PodSyncPolicy | None = None
    event_policy: EventPolicy | None = None
    csidrivers: CSIDriverTable | None = None


async def _nothing() -> None:
    return None


@dataclass(frozen=True)
class ClusterDeps:
    """The cluster-mode managers, ready to run."""

    identity: NodeIdentity
    node_status: NodeStatusManager
    lease: LeaseManager
    pods: PodSyncManager
    events: EventSink
    csinode: CSINodeManager
    close: Callable[[], Awaitable[None]] = field(default=_nothing)
    # task name -> klet.kube.rotation.CertificateRotation ("client-certificate" with
    # rotateCertificates, "serving-certificate" with serverTLSBootstrap)
    certificates: Mapping[str, Any] = field(default_factory=dict)


def cluster_tasks(c: ClusterDeps) -> dict[str, Callable[[], Coroutine[Any, Any, None]]]:
    """The named root tasks of cluster mode, as functions that start them: every one
    writes to the apiserver or consumes the `events` group, so only the lease holder may
    run them, and a standby never even creates their coroutines (app.py)."""
    tasks = {
        "node-status": c.node_status.run,
        "node-lease": c.lease.run,
        "pod-status": c.pods.run,
        "events": c.events.run,
        "csinode": c.csinode.run,
    }
    for name, rotation in c.certificates.items():
        tasks[name] = rotation.run
    return tasks


def node_config(kubelet: ClusterKubelet, klet: ClusterKlet) -> NodeConfig:
    eviction_hard = storage_aware_eviction_hard(
        kubelet.eviction_hard,
        local_storage_capacity_isolation=kubelet.local_storage_capacity_isolation,
    )
    return NodeConfig(
        node_name=klet.node_name,
        node_labels=dict(klet.node_labels),
        register_with_taints=tuple(kubelet.register_with_taints),
        provider_id=kubelet.provider_id,
        external_cloud_provider=klet.cloud_provider == "external",
        given_node_ips=tuple(klet.node_ips),
        kubelet_port=kubelet.port,
        max_pods=kubelet.max_pods,
        max_images=kubelet.node_status_max_images,
        kube_reserved=dict(kubelet.kube_reserved),
        system_reserved=dict(kubelet.system_reserved),
        eviction_hard=eviction_hard,
        controller_attach_detach=kubelet.enable_controller_attach_detach,
    )


def _kube_client(
    kubeconfig: Path,
    kubelet: ClusterKubelet,
    node: str,
    observer: RequestObserver | None,
    *,
    cert_dir: Path,
    threads: int | None = None,
) -> Any:
    from klet.kube import KubeSettings
    from klet.kube.certificates import CertStore
    from klet.kube.client import KubeClient

    # rotateCertificates: a certificate the kubeconfig embeds gives way to the store's.
    rotated = CertStore(cert_dir).current_path if kubelet.rotate_certificates else None

    return KubeClient(
        KubeSettings(
            kubeconfig=kubeconfig,
            qps=float(kubelet.kube_api_qps),
            burst=kubelet.kube_api_burst,
            user_agent=f"klet/{KUBELET_VERSION} ({node})",
            rotated_certificate=rotated,
        ),
        observer=observer,
        threads=threads,
    )


def _certificates(
    kube: Kube,
    kubelet: ClusterKubelet,
    klet: ClusterKlet,
    node_ips: tuple[str, ...],
    observer: CertificateObserver | None,
) -> dict[str, Any]:
    """The certificate renewals the configuration asks for; rotateCertificates is refused
    (ValueError, naming the field) when the kubeconfig does not use the certificate
    directory's current file."""
    if not (kubelet.rotate_certificates or kubelet.server_tls_bootstrap):
        return {}
    from klet.kube.certificates import CertStore
    from klet.kube.rotation import CLIENT, CertificateRotation, check_rotatable, serving_kind

    out: dict[str, Any] = {}
    if kubelet.rotate_certificates:
        assert klet.kubeconfig is not None
        check_rotatable(klet.kubeconfig, klet.cert_dir)
        if observer is not None:
            observer.rotating("client")
        out["client-certificate"] = CertificateRotation(
            store=CertStore(klet.cert_dir, prefix=CLIENT.prefix),
            api=kube,
            node_name=klet.node_name,
            kind=CLIENT,
            on_issued=_told(observer, "client"),
            on_renew_failed=_failed(observer, "client"),
        )
    if kubelet.server_tls_bootstrap:
        kind = serving_kind(klet.node_name, node_ips)
        if observer is not None:
            observer.rotating("server")
        out["serving-certificate"] = CertificateRotation(
            store=CertStore(klet.cert_dir, prefix=kind.prefix),
            api=kube,
            node_name=klet.node_name,
            kind=kind,
            on_issued=_told(observer, "server"),
            on_renew_failed=_failed(observer, "server"),
            on_rotated=None if observer is None else _rotated(observer, "server"),
        )
    return out


class CertificateObserver(Protocol):
    """Told of the rotated certificates (status_reporter.metrics.CertificateMetrics)."""

    def rotating(self, kind: str) -> None: ...

    def issued(self, kind: str, not_after: float) -> None: ...

    def renew_failed(self, kind: str) -> None: ...

    def rotated(self, kind: str, lived_s: float) -> None: ...


def _told(observer: CertificateObserver | None, kind: str) -> Any:
    """The rotation's on_issued hook: tell `observer` when the certificate expires."""
    if observer is None:
        return None
    return lambda issued: observer.issued(kind, issued.not_after.timestamp())


def _rotated(observer: CertificateObserver, kind: str) -> Callable[[float], None]:
    """The rotation's on_rotated hook: how long the replaced certificate lived."""
    return lambda lived_s: observer.rotated(kind, lived_s)


def _failed(observer: CertificateObserver | None, kind: str) -> Any:
    """The rotation's on_renew_failed hook."""
    if observer is None:
        return None
    return lambda: observer.renew_failed(kind)


def build_cluster(
    kubelet: ClusterKubelet,
    klet: ClusterKlet,
    *,
    view: PodView,
    bus: Callable[[], NodeBus],
    consumer: str,
    overrides: ClusterOverrides | None = None,
    volumes_in_use: Callable[[], tuple[str, ...] | None] = lambda: None,
    devices: Callable[[], Mapping[str, tuple[int, int]] | None] = lambda: None,
    requests: RequestObserver | None = None,
    certificates: CertificateObserver | None = None,
    mirror_pods: Callable[[int], None] | None = None,
    status_synced: Callable[[float], None] | None = None,
    startup: StartupRecorder | None = None,
) -> ClusterDeps:
    """Build cluster mode's managers; `bus()` gives the node's tables when not overridden.
    `consumer` names this process in the `events` consumer group (unique per process);
    `requests` is told of every apiserver request (the rest_client_* metrics);
    `certificates` of each rotated certificate's expiry and failed renewals; `mirror_pods`
    of the node's mirror pods after each reconcile (kubelet_mirror_pods); `status_synced`
    of each status the apiserver took (kubelet_pod_status_sync_duration_seconds);
    `startup` of the node's registration and first Ready (kubelet_node_startup_*)."""
    o = overrides or ClusterOverrides()
    closers: list[Callable[[], Awaitable[None]]] = []

    kube = o.kube
    lease_kube = o.lease_kube
    if kube is None or lease_kube is None:
        if klet.kubeconfig is None:
            raise ValueError("cluster mode needs a kubeconfig (or a Kube override)")
        if kube is None:
            kube = _kube_client(
                klet.kubeconfig, kubelet, klet.node_name, requests, cert_dir=klet.cert_dir
            )
            closers.append(kube.close)
        if lease_kube is None:
            # The Lease's own thread, as upstream's kubelet has a heartbeat client of its
            # own: its renewal never queues behind the default executor's other work
            # (log streams, stats, pod status patches), which a flood of 10250 requests
            # can keep busy (a renewal once waited 10 s there: a 20 s gap).
            lease_kube = _kube_client(
                klet.kubeconfig,
                kubelet,
                klet.node_name,
                requests,
                cert_dir=klet.cert_dir,
                threads=1,
            )
            closers.append(lease_kube.close)

    runtime = o.runtime
    if runtime is None:
        from klet.cri import CRISettings, RuntimeClient

        client = RuntimeClient(
            CRISettings(
                runtime_endpoint=kubelet.container_runtime_endpoint,
                image_endpoint=kubelet.effective_image_service_endpoint,
                timeout_s=10.0,
                read_attempts=1,
            )
        )
        runtime = client
        closers.append(client.close)

    retry = o.retry or RetryPolicy()
    api = KubeApi(kube, retry=retry)
    identity = NodeIdentity(klet.node_name)
    root_dir = klet.root_dir
    node_ips = (
        o.node_ips if o.node_ips is not None else detect_node_ips(klet.node_ips, klet.node_name)
    )
    observer = NodeObserver(
        runtime=runtime,
        conditions=o.conditions or bus().node,
        read_machine=o.read_machine or (lambda: read_machine(root_dir)),
        node_ips=node_ips,
        volumes_in_use=volumes_in_use,
        devices=devices,
    )
    node_policy = o.node_policy or NodeStatusPolicy(
        update_frequency_s=kubelet.node_status_update_frequency,
        report_frequency_s=kubelet.node_status_report_frequency,
        register=kubelet.register_node,
    )
    node_status = NodeStatusManager(
        # The status loop makes its own 5 tries, each a fresh GET: no retries inside.
        api=KubeApi(kube, retry=NO_RETRY),
        observer=observer,
        identity=identity,
        config=node_config(kubelet, klet),
        policy=node_policy,
        events=o.publisher or bus().events,
        startup=startup,
    )
    lease = LeaseManager(
        api=KubeApi(lease_kube, retry=NO_RETRY),
        identity=identity,
        policy=o.lease_policy or LeasePolicy(duration_s=kubelet.node_lease_duration_seconds),
    )
    pods = PodSyncManager(
        view=view,
        api=api,
        identity=identity,
        sources=o.sources or bus().sources,
        policy=o.pod_policy or PodSyncPolicy(),
        on_mirrors=mirror_pods,
        on_synced=status_synced,
    )
    event_sink = EventSink(
        feed=o.events or bus().event_feed,
        # The sink retries an unavailable apiserver itself, per event.
        api=KubeApi(kube, retry=NO_RETRY),
        node_name=klet.node_name,
        mirror_uid=pods.mirror_uid,
        consumer=consumer,
        policy=o.event_policy
        or EventPolicy(qps=float(kubelet.event_record_qps), burst=kubelet.event_burst),
    )

    async def close() -> None:
        for closer in reversed(closers):
            await closer()

    csinode = CSINodeManager(kube, o.csidrivers or bus().csidrivers, identity)
    return ClusterDeps(
        certificates=_certificates(kube, kubelet, klet, tuple(node_ips), certificates),
        identity=identity,
        node_status=node_status,
        lease=lease,
        pods=pods,
        events=event_sink,
        csinode=csinode,
        close=close,
    )
