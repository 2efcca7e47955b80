"""The status-reporter's dependencies, built once from settings (production and tests alike).

`build_deps(settings, overrides=...)` is the only place that decides what talks to
what: by default the pod view reads the node's Redis bus; a test passes `Overrides` with
fakes (see `testing.py`) and gets the same `Deps` with no Redis behind it, plus a fresh
metrics registry so tests never share metric state.

Settings are read through `ServiceSettings`, a protocol of just the fields this service
uses, so the wiring does not depend on the rest of the settings tree.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from klet.bus import Bus, NodeBus
from klet.config import DEFAULT_SERVICE_PORTS
from klet.obs import new_registry
from klet.status_reporter.metrics import Metrics
from klet.status_reporter.podcache import (
    CachePolicy,
    DesiredTable,
    PodCache,
    StatusFeed,
    StatusTable,
)
from prometheus_client import CollectorRegistry

SERVICE = "status-reporter"

DEFAULT_SERVICE_PORT = DEFAULT_SERVICE_PORTS[SERVICE]
"""The private /healthz /readyz /metrics port when `service_port` is 0 (unset).

`load_settings` already resolves 0 to it; settings built by hand (tests) may not."""


class KubeletServing(Protocol):
    """The KubeletConfiguration fields this service reads (upstream names in brackets)."""

    @property
    def address(self) -> str: ...  # [address] bind address of the kubelet ports

    @property
    def read_only_port(self) -> int: ...  # [readOnlyPort] 0 = off

    @property
    def healthz_port(self) -> int: ...  # [healthzPort] 0 = off

    @property
    def healthz_bind_address(self) -> str: ...  # [healthzBindAddress]


class KletSettings(Protocol):
    """The klet-only settings this service reads."""

    @property
    def redis_url(self) -> str: ...

    @property
    def node_name(self) -> str: ...

    @property
    def service_port(self) -> int: ...  # 0 = DEFAULT_SERVICE_PORT

    @property
    def service_bind_address(self) -> str: ...


class ServiceSettings(Protocol):
    """The settings tree, as far as this service is concerned."""

    @property
    def kubelet(self) -> KubeletServing: ...

    @property
    def klet(self) -> KletSettings: ...


@dataclass(frozen=True)
class Listener:
    """One TCP listener: where an HTTP app is served."""

    host: str
    port: int


@dataclass(frozen=True)
class Overrides:
    """Replacements for production dependencies (tests); None keeps the default."""

    desired: DesiredTable | None = None
    status: StatusTable | None = None
    feed: StatusFeed | None = None
    registry: CollectorRegistry | None = None
    policy: CachePolicy | None = None
    clock: Callable[[], float] | None = None
    consumer: str | None = None


async def _nothing_to_close() -> None:
    return None


@dataclass(frozen=True)
class Deps:
    """Everything the status-reporter's root tasks and HTTP apps use."""

    pods: PodCache
    registry: CollectorRegistry
    metrics: Metrics
    healthz: Listener | None
    """The healthz-only listener; None when healthzPort is 0."""
    read_only: Listener | None
    """The read-only API listener; None when readOnlyPort is 0 (the default)."""
    service: Listener
    """The private /healthz /readyz /metrics listener."""
    close: Callable[[], Awaitable[None]] = _nothing_to_close
    """Releases clients (the Redis connection pool) at shutdown."""


def build_deps(settings: ServiceSettings, *, overrides: Overrides | None = None) -> Deps:
    """Build the service's dependencies; `overrides` replaces any of the defaults."""
    o = overrides or Overrides()
    kubelet, klet = settings.kubelet, settings.klet

    close: Callable[[], Awaitable[None]] = _nothing_to_close
    desired, status, feed = o.desired, o.status, o.feed
    if desired is None or status is None or feed is None:
        bus = Bus.from_url(klet.redis_url, klet.node_name)
        node = NodeBus.of(bus)
        desired = node.desired if desired is None else desired
        status = node.status if status is None else status
        feed = node.podstatus if feed is None else feed
        close = bus.close

    # Production scrapes carry process_* series, as any Prometheus target (upstream too).
    registry = o.registry if o.registry is not None else new_registry(process_metrics=True)
    clock = o.clock if o.clock is not None else time.monotonic
    metrics = Metrics(registry, clock=clock)
    pods = PodCache(
        desired=desired,
        status=status,
        feed=feed,
        # Stable across restarts of one replica, distinct between replicas on other hosts.
        consumer=o.consumer or socket.gethostname(),
        metrics=metrics,
        policy=o.policy or CachePolicy(),
        clock=clock,
    )
    return Deps(
        pods=pods,
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
        service=Listener(klet.service_bind_address, klet.service_port or DEFAULT_SERVICE_PORT),
        close=close,
    )
