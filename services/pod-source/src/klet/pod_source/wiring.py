"""pod-source's dependencies, built once from settings, by production and tests alike.

`build_deps(settings, overrides=...)` decides what talks to what: which sources are
configured (the file source when staticPodPath is set, the URL source when staticPodURL
is set, the apiserver source when --kubeconfig is given), the inbox that joins sources
to the publisher; the Redis bus, the lease, the metrics registry and the private port
are every service's (`klet.wiring.service_base`). Tests pass
`Overrides` to shorten timeouts and back-offs, to name the lease holder, or to give a
fake apiserver (`pod_api`, unit tests); the objects built are the production ones.

Settings are read through `ServiceSettings`, a protocol of just the fields this service
uses, so the wiring does not depend on the rest of the settings tree.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from klet.bus import Bus, Lease
from klet.kube import kube_settings
from klet.model.records import SourceName
from klet.obs import ServicePort
from klet.obs.restclient import RestClientMetrics
from klet.pod_source.inbox import Inbox
from klet.pod_source.metrics import Metrics, create_metrics
from klet.pod_source.publisher import LEASE_NAME, Publisher, RetryPolicy
from klet.pod_source.sources import PodSource
from klet.pod_source.sources.api import (
    DEFAULT_RETRY,
    MIN_WATCH_TIMEOUT_S,
    ApiSource,
    KubePodApi,
    PodApi,
)
from klet.pod_source.sources.files import FileSource
from klet.wiring import BaseOverrides, BaseSettings, service_base
from prometheus_client import CollectorRegistry

SERVICE = LEASE_NAME


class SourceSettings(Protocol):
    """The KubeletConfiguration fields this service reads (upstream names in brackets)."""

    @property
    def static_pod_path(self) -> str: ...  # [staticPodPath] "" = no file source

    @property
    def static_pod_url(self) -> str: ...  # [staticPodURL] "" = no URL source

    @property
    def static_pod_url_header(self) -> Mapping[str, Sequence[str]]: ...  # [staticPodURLHeader]

    @property
    def file_check_frequency(self) -> float: ...  # [fileCheckFrequency] seconds

    @property
    def http_check_frequency(self) -> float: ...  # [httpCheckFrequency] seconds

    @property
    def kube_api_qps(self) -> int: ...  # [kubeAPIQPS] requests per second

    @property
    def kube_api_burst(self) -> int: ...  # [kubeAPIBurst] requests

    @property
    def rotate_certificates(self) -> bool: ...  # [rotateCertificates] the client presents the store


class KletSettings(BaseSettings, Protocol):
    """The klet-only settings this service reads (the bus's, the lease's and the private
    port's from BaseSettings)."""

    @property
    def kubeconfig(self) -> Path | None: ...  # --kubeconfig; None = standalone (no api source)

    @property
    def cert_dir(self) -> Path: ...  # --cert-dir: the client certificate store


class ServiceSettings(Protocol):
    """The settings tree, as far as this service is concerned."""

    @property
    def kubelet(self) -> SourceSettings: ...

    @property
    def klet(self) -> KletSettings: ...


@dataclass(frozen=True)
class Overrides(BaseOverrides):
    """Replacements for production choices (tests), beside the shared ones (bus,
    registry, lease holder); None keeps the default."""

    clock: Callable[[], float] | None = None
    retry: RetryPolicy | None = None
    lease_ttl_s: float | None = None
    http_timeout_s: float | None = None
    use_inotify: bool | None = None
    pod_api: PodApi | None = None  # the apiserver source's client (with a kubeconfig only)
    api_retry: RetryPolicy | None = None  # back-off of the apiserver source
    api_watch_timeout_s: int | None = None  # shortest server-side watch timeout


@dataclass(frozen=True)
class Deps:
    """Everything pod-source's root tasks use."""

    node_name: str
    configured: frozenset[SourceName]
    bus: Bus
    lease: Lease
    publisher: Publisher
    sources: tuple[PodSource, ...]
    registry: CollectorRegistry
    metrics: Metrics
    service: ServicePort

    async def close(self) -> None:
        await self.bus.close()


def build_deps(settings: ServiceSettings, overrides: Overrides | None = None) -> Deps:
    o = overrides or Overrides()
    kubelet, klet = settings.kubelet, settings.klet
    node = klet.node_name
    base = service_base(
        SERVICE,
        klet,
        o,
        process_metrics=True,
        lease_ttl_ms=None if o.lease_ttl_s is None else int(o.lease_ttl_s * 1000),
    )
    registry, lease = base.registry, base.lease
    metrics = create_metrics(registry)
    inbox = Inbox()

    sources: list[PodSource] = []
    if kubelet.static_pod_path:
        sources.append(
            FileSource(
                path=Path(kubelet.static_pod_path),
                node_name=node,
                period_s=kubelet.file_check_frequency,
                inbox=inbox,
                metrics=metrics,
                use_inotify=o.use_inotify if o.use_inotify is not None else True,
            )
        )
    if kubelet.static_pod_url:
        # Only with --manifest-url: the HTTP source loads httpx (about 10 MB resident).
        from klet.pod_source.sources.http import DEFAULT_TIMEOUT_S, HttpSource

        sources.append(
            HttpSource(
                url=kubelet.static_pod_url,
                headers=kubelet.static_pod_url_header,
                node_name=node,
                period_s=kubelet.http_check_frequency,
                inbox=inbox,
                metrics=metrics,
                timeout_s=o.http_timeout_s if o.http_timeout_s is not None else DEFAULT_TIMEOUT_S,
            )
        )
    if klet.kubeconfig is not None:
        api = o.pod_api
        if api is None:
            api_settings = kube_settings(settings)
            assert api_settings is not None  # a kubeconfig is set
            from klet.kube.client import KubeClient  # cluster mode only: loads `kubernetes`

            client = KubeClient(api_settings, observer=RestClientMetrics(registry))
            api = KubePodApi(
                client,
                node_name=node,
                watch_timeout_s=o.api_watch_timeout_s or MIN_WATCH_TIMEOUT_S,
            )
        sources.append(
            ApiSource(
                api=api,
                node_name=node,
                inbox=inbox,
                metrics=metrics,
                retry=o.api_retry if o.api_retry is not None else DEFAULT_RETRY,
            )
        )
    configured = frozenset(s.name for s in sources)
    publisher = Publisher(
        bus=base.node_bus,
        inbox=inbox,
        configured=configured,
        metrics=metrics,
        # Wakes as often as the leader loop renews (a third of the TTL) when idle.
        idle_s=lease.ttl_ms / 1000 / 3,
        retry=o.retry if o.retry is not None else RetryPolicy(),
        clock=o.clock if o.clock is not None else time.time,
    )
    return Deps(
        node_name=node,
        configured=configured,
        bus=base.bus,
        lease=lease,
        publisher=publisher,
        sources=tuple(sources),
        registry=registry,
        metrics=metrics,
        service=base.port,
    )
