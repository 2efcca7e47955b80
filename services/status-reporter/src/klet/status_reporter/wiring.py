"""The status-reporter's dependencies, built once from settings (production and tests alike).

`build_deps(settings, overrides=...)` is the only place that decides what talks to
what: by default the pod view reads the node's Redis bus (built, with the lease, the
registry and the private port, as every service's: `klet.wiring.service_base`); a test
passes `Overrides` with fakes (see `klet.testbed.fakes.status_reporter`) and gets the
same `Deps` with no Redis behind it, plus a fresh metrics registry so tests never share
metric state.

Settings are read through `ServiceSettings`, a protocol of just the fields this service
uses, so the wiring does not depend on the rest of the settings tree.

Every replica gets the "status-reporter" bus lease (`Deps.lease`, held under a holder ID
of its own, `klet.bus.holder`); the app runs the writers only while it holds it. The
bus is fenced by that lease, so a write from a replica that does not hold it is refused
by Redis, whatever the code above it does. `Overrides.bus` puts the whole service on a
`klet.testbed.fakes.bus.FakeBus`.

With a kubeconfig (`klet.kubeconfig` set) `Deps.cluster` holds the cluster-mode managers
(`cluster/managers.py`); without one it is None and nothing of cluster mode is built, so
standalone behaviour does not change. `Overrides.cluster` builds cluster mode over
fakes even without a kubeconfig (tests).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from klet.bus import Lease
from klet.bus.history import story_json
from klet.cgroups import CgroupFS
from klet.config import Settings
from klet.kube import kube_settings
from klet.model.layout import DEFAULT_SERVICE_PORTS
from klet.obs import ServicePort, leader_metric
from klet.obs.restclient import RestClientMetrics
from klet.stats import StatsProvider
from klet.status_reporter.cluster.managers import (
    ClusterDeps,
    ClusterKlet,
    ClusterKubelet,
    ClusterOverrides,
    build_cluster,
)
from klet.status_reporter.cluster.nodestatus import KUBELET_VERSION
from klet.status_reporter.kubeletapi import (
    HistoryLookup,
    KubeletApiDeps,
    KubeletApiSettings,
    build_kubelet_api_deps,
)
from klet.status_reporter.kubeletapi.deps import host_reader, host_reader_of
from klet.status_reporter.kubeletapi.healthchecks import (
    HealthChecks,
    SliMetrics,
    SyncloopCheck,
    kubelet_health_checks,
)
from klet.status_reporter.metrics.containermetrics import ContainerMetrics
from klet.status_reporter.metrics.instruments import (
    CertificateMetrics,
    HttpRequestMetrics,
    Metrics,
    register_build_and_features,
    register_cgroup_version,
)
from klet.status_reporter.metrics.lazyruntime import LazyRuntime
from klet.status_reporter.metrics.logusage import ContainerLogUsage
from klet.status_reporter.metrics.nodemetrics import NodeMetrics, port_file_replicas
from klet.status_reporter.metrics.nodestartup import node_startup, read_boot_time
from klet.status_reporter.pods.history import HistoryKeeper, HistoryPolicy
from klet.status_reporter.pods.podcache import (
    CachePolicy,
    DesiredTable,
    PodCache,
    StatusFeed,
    StatusTable,
)
from klet.status_reporter.tables.devices import DeviceView
from klet.status_reporter.tables.volumes import VolumeView
from klet.wiring import BaseOverrides, BaseSettings, runtime_client, service_base
from prometheus_client import CollectorRegistry

if TYPE_CHECKING:
    from klet.kube.client import KubeClient

SERVICE = "status-reporter"

DEFAULT_SERVICE_PORT = DEFAULT_SERVICE_PORTS[SERVICE]
"""The private /healthz /readyz /metrics port when `service_port` is None (not given).

`load_settings` already resolves None to it; settings built by hand (tests) may not."""


class KubeletServing(ClusterKubelet, Protocol):
    """The KubeletConfiguration fields this service reads (upstream names in brackets);
    those of cluster mode (read only when a kubeconfig is set) come from ClusterKubelet."""

    @property
    def address(self) -> str: ...  # [address] bind address of the kubelet ports

    @property
    def read_only_port(self) -> int: ...  # [readOnlyPort] 0 = off

    @property
    def healthz_port(self) -> int: ...  # [healthzPort] 0 = off

    @property
    def healthz_bind_address(self) -> str: ...  # [healthzBindAddress]


class KletSettings(ClusterKlet, BaseSettings, Protocol):
    """The klet-only settings this service reads (cluster mode's from ClusterKlet; the
    bus's, the lease's and the private port's from BaseSettings: its port is
    DEFAULT_SERVICE_PORT when `service_port` is None; `run_dir` also holds the port
    files of every service's replicas, which /metrics merges)."""


class ServiceSettings(Protocol):
    """The settings tree, as far as this service is concerned."""

    @property
    def kubelet(self) -> KubeletServing: ...

    @property
    def klet(self) -> KletSettings: ...


log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Listener:
    """One TCP listener: where an HTTP app is served."""

    host: str
    port: int


@dataclass(frozen=True)
class Overrides(BaseOverrides):
    """Replacements for production dependencies (tests), beside the shared ones (bus,
    registry, lease holder); None keeps the default."""

    desired: DesiredTable | None = None
    status: StatusTable | None = None
    feed: StatusFeed | None = None
    policy: CachePolicy | None = None
    clock: Callable[[], float] | None = None
    lease_ttl_ms: int | None = None
    """The lease TTL; default klet.wiring.LEASE_TTL_MS (tests shorten it to watch a
    handover)."""
    cluster: ClusterOverrides | None = None
    """Build cluster mode over these (even without a kubeconfig)."""


async def _nothing_to_close() -> None:
    return None


@dataclass(frozen=True)
class Deps:
    """Everything the status-reporter's root tasks and HTTP apps use."""

    pods: PodCache
    lease: Lease
    """The "status-reporter" bus lease; only its holder runs the cluster-mode writers."""
    registry: CollectorRegistry
    metrics: Metrics
    healthz: Listener | None
    """The healthz-only listener; None when healthzPort is 0."""
    read_only: Listener | None
    """The read-only API listener; None when readOnlyPort is 0 (the default)."""
    service: ServicePort
    """The private /healthz /readyz /metrics listener and its port files."""
    health: HealthChecks
    """The read-only port's /healthz checks: the kubelet API's (ping, log, syncloop)."""
    slis: SliMetrics
    """/metrics/slis: where every listener's /healthz records its checks (10250, the
    read-only port, 10248), one registry as upstream's."""
    close: Callable[[], Awaitable[None]] = _nothing_to_close
    """Releases clients (the Redis connection pool, apiserver and CRI clients) at shutdown."""
    cluster: ClusterDeps | None = None
    """Cluster mode's managers; None when standalone."""
    kubelet_api: KubeletApiDeps | None = None
    """The kubelet API on --port; None when enableServer is off or it cannot authorize."""
    volumes: VolumeView | None = None
    """The bus `volumes` table's last read (volumesInUse, volume stats); a root task."""
    devices: DeviceView | None = None
    """The bus `devices` table's last read (the Node's device resources); a root task."""
    node_metrics: NodeMetrics | None = None
    """Every service's metrics for /metrics and /metrics/probes (nodemetrics.py); None:
    `registry` alone."""
    http_requests: HttpRequestMetrics | None = None
    """upstream's kubelet_http_requests_* of both listeners; the read-only port's
    requests are counted in it (None: not counted, hand-built test deps)."""
    container_metrics: ContainerMetrics | None = None
    """/metrics/cadvisor on the read-only port, through the kubelet API's CRI client;
    None when that API is off."""
    history: HistoryKeeper | None = None
    """Each pod's history for `klet why` (history.py): the leader's root task."""
    log_usage: ContainerLogUsage | None = None
    """kubelet_container_log_filesystem_used_bytes (metrics/logusage.py): a root task
    measures the pods' log directories (None: not served, hand-built test deps)."""
    elected: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once this replica holds the lease (by `klet.bus.leader.hold`); never cleared:
    losing the lease ends the process."""


def build_deps(settings: ServiceSettings, *, overrides: Overrides | None = None) -> Deps:
    """Build the service's dependencies; `overrides` replaces any of the defaults."""
    o = overrides or Overrides()
    kubelet, klet = settings.kubelet, settings.klet

    # One connection pool for every table, stream and the lease; the bus a test gives
    # stays open at close (the test may hand it to another replica).
    base = service_base(
        SERVICE,
        klet,
        o,
        # Production scrapes carry process_* series, as any Prometheus target (upstream too).
        process_metrics=True,
        lease_ttl_ms=o.lease_ttl_ms or None,
    )
    lease, node, registry = base.lease, base.node_bus, base.registry
    owned_bus = base.bus if o.bus is None else None

    desired = node.desired if o.desired is None else o.desired
    status = node.status if o.status is None else o.status
    feed = node.podstatus if o.feed is None else o.feed

    clock = o.clock if o.clock is not None else time.monotonic
    metrics = Metrics(registry, clock=clock, node_name=klet.node_name)
    # getattr: settings trees built by hand (older tests) have no featureGates.
    gates = getattr(kubelet, "feature_gates", {})
    register_build_and_features(registry, version=KUBELET_VERSION, gates=gates)
    register_cgroup_version(registry, CgroupFS().version)
    pods = PodCache(
        desired=desired,
        status=status,
        feed=feed,
        metrics=metrics,
        policy=o.policy or CachePolicy(),
        clock=clock,
    )
    volumes = VolumeView(node.volumes, registry)
    devices = DeviceView(node.devices)
    requests = RestClientMetrics(registry)
    http_requests = HttpRequestMetrics(registry)  # 10250's and the read-only port's
    startup = node_startup(registry, boot_at=read_boot_time())  # 0s unless registered
    log_usage = ContainerLogUsage(
        registry,
        pods=pods,
        # getattr: settings trees built by hand (older tests) have no podLogsDir.
        pod_logs_dir=Path(getattr(kubelet, "pod_logs_dir", "/var/log/pods")),
    )
    cluster: ClusterDeps | None = None
    # getattr: standalone settings trees built by hand (older tests) have no kubeconfig.
    if getattr(klet, "kubeconfig", None) is not None or o.cluster is not None:
        cluster = build_cluster(
            kubelet,
            klet,
            view=pods,
            bus=lambda: node,
            # Its own consumer in the events group: a dead leader's pending entries are
            # then another consumer's, which the new leader claims at election.
            consumer=lease.holder,
            overrides=o.cluster,
            volumes_in_use=volumes.in_use,
            devices=devices.amounts,
            requests=requests,
            certificates=CertificateMetrics(registry),
            mirror_pods=metrics.mirror_pods.set,
            status_synced=metrics.pod_status_sync.observe,
            startup=startup,
        )

    history = HistoryKeeper(
        bus=node,
        # Its own consumer in the history group, as in the events group.
        consumer=lease.holder,
        changes=pods,  # the view's status changes: one stream read serves both
        policy=HistoryPolicy(
            # getattr: settings trees built by hand (older tests) have no such fields.
            max_entries=getattr(klet, "pod_history_max_entries", HistoryPolicy.max_entries),
            max_age_s=getattr(klet, "pod_history_max_age", HistoryPolicy.max_age_s),
            max_pods=getattr(klet, "pod_history_max_pods", HistoryPolicy.max_pods),
        ),
    )
    elected = asyncio.Event()
    # One SLI registry and one syncloop check behind every listener's /healthz.
    slis = SliMetrics()
    syncloop = SyncloopCheck(run_dir=Path(klet.run_dir))
    node_metrics = NodeMetrics(
        registry, leading=elected.is_set, replicas=port_file_replicas(Path(klet.run_dir))
    )
    kubelet_api, api_closers = _kubelet_api(
        settings,
        history=functools.partial(story_json, node),
        pods=pods,
        registry=registry,
        volumes=volumes,
        node_metrics=node_metrics,
        requests=requests,
        slis=slis,
        syncloop=syncloop,
        http=http_requests,
    )

    container_metrics, metrics_closers = _container_metrics(
        kubelet_api, settings, pods=pods, registry=registry
    )

    async def close() -> None:
        if cluster is not None:
            await cluster.close()
        for closer in [*api_closers, *metrics_closers]:
            await closer()
        if owned_bus is not None:
            await owned_bus.close()

    leader_metric(registry, service=SERVICE, leading=elected.is_set)
    return Deps(
        pods=pods,
        lease=lease,
        elected=elected,
        history=history,
        registry=registry,
        metrics=metrics,
        healthz=(
            Listener(kubelet.healthz_bind_address, kubelet.healthz_port)
            if kubelet.healthz_port
            else None
        ),
        read_only=(
            Listener(kubelet.address, kubelet.read_only_port) if kubelet.read_only_port else None
        ),
        service=base.port,
        health=kubelet_health_checks(syncloop=syncloop, slis=slis),
        slis=slis,
        close=close,
        cluster=cluster,
        kubelet_api=kubelet_api,
        volumes=volumes,
        devices=devices,
        node_metrics=node_metrics,
        container_metrics=container_metrics,
        http_requests=http_requests,
        log_usage=log_usage,
    )


def _container_metrics(
    api: KubeletApiDeps | None,
    settings: ServiceSettings,
    *,
    pods: PodCache,
    registry: CollectorRegistry,
) -> tuple[ContainerMetrics | None, list[Callable[[], Awaitable[None]]]]:
    """/metrics/cadvisor of the read-only port: through the kubelet API's CRI client, or,
    with that API off (a standalone node's usual read-only set-up), a client of its own
    opened at the first scrape (`LazyRuntime`), as upstream serves the page there whether
    or not 10250 is on."""
    if api is not None:
        return ContainerMetrics(StatsProvider(api.runtime, host_reader(api)), api.pods), []
    if not isinstance(settings, Settings) or not settings.kubelet.read_only_port:
        return None, []
    kubelet = settings.kubelet
    # Opened at the first scrape, not here: a CRI client loads gRPC and the CRI stubs
    # (about 13 MB resident), and most nodes never ask for this page (issue 42).
    runtime = LazyRuntime(
        functools.partial(
            runtime_client,
            kubelet,
            registry,
            image_endpoint=kubelet.effective_image_service_endpoint,
        )
    )
    host = host_reader_of(KubeletApiSettings.from_settings(settings), CgroupFS())
    return ContainerMetrics(StatsProvider(runtime, host), pods), [runtime.close]


def _kubelet_api(
    settings: ServiceSettings,
    *,
    pods: PodCache,
    registry: CollectorRegistry,
    volumes: VolumeView,
    node_metrics: NodeMetrics,
    requests: RestClientMetrics,
    history: HistoryLookup,
    slis: SliMetrics,
    syncloop: SyncloopCheck,
    http: HttpRequestMetrics,
) -> tuple[KubeletApiDeps | None, list[Callable[[], Awaitable[None]]]]:
    """The 10250 API's dependencies, with their own apiserver and CRI clients (the
    apiserver client with threads of its own: whoever reaches the port can cause
    TokenReviews, which must not take the threads of the node Lease's renewal).

    Off when enableServer is false, and off (with a warning) when authorization is
    Webhook but there is no apiserver to ask — upstream refuses to start then; turning
    the API off keeps the rest of the node's reporting alive.
    """
    if not isinstance(settings, Settings) or not settings.kubelet.enable_server:
        return None, []
    kubelet = settings.kubelet
    closers: list[Callable[[], Awaitable[None]]] = []
    api_kube: KubeClient | None = None
    api_settings = kube_settings(settings)
    if api_settings is not None:
        from klet.kube.client import KubeClient  # cluster mode only: loads `kubernetes`

        threads = KubeletApiSettings.from_settings(settings).review_threads
        api_kube = KubeClient(api_settings, threads=threads, observer=requests)
        closers.append(api_kube.close)
    if api_kube is None and kubelet.authorization.mode == "Webhook":
        log.warning("kubelet API on --port is off: authorization mode Webhook needs --kubeconfig")
        return None, closers
    # Only with the API: a CRI client loads gRPC.
    api_cri = runtime_client(
        kubelet, registry, image_endpoint=kubelet.effective_image_service_endpoint
    )
    closers.append(api_cri.close)
    deps = build_kubelet_api_deps(
        settings,
        pods=pods,
        runtime=api_cri,
        registry=registry,
        apiserver=api_kube,
        volumes=volumes,
        node_metrics=node_metrics,
        history=history,
        slis=slis,
        syncloop=syncloop,
        http=http,
    )
    return deps, closers
