"""What every service's wiring builds the same way: its bus, its bus lease, its metrics
registry, its private port and, for the services that talk to the runtime, a CRI client.

The five `wiring.py` files each repeated these steps (and each wrote the lease TTL
again); now each calls `service_base` with what is its own (its name, the overrides its
tests give, whether its scrape carries the process series) and builds only its own
managers over the `ServiceBase` it gets back. Each service's `Overrides` extends
`BaseOverrides`, its settings protocol `BaseSettings`, and a `Deps` that holds the base
extends `OnServiceBase`. The lease TTL is `LEASE_TTL_MS` (defined by klet.bus.redisbus as
`Bus.lease`'s default), used here and in no service's wiring (tests/unit/test_wiring.py
keeps it so).

The module sits one floor above klet.bus, klet.obs and klet.cri and nothing in libs
imports it, so the packages keep importing each other one way. klet.cri is imported
only inside `runtime_client`: a standalone status-reporter loads no gRPC
(tests/unit/test_import_footprint.py), and pod-source never does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from klet.bus import Bus, BusAuth, Lease, NodeBus, service_lease
from klet.bus.redisbus import LEASE_TTL_MS
from klet.model.layout import grpc_socket
from klet.obs import ServicePort, new_registry
from klet.obs.runtimeops import RuntimeOperationMetrics
from klet.obs.serviceport import ServicePortSettings
from prometheus_client import CollectorRegistry

if TYPE_CHECKING:
    from klet.cri import RuntimeClient
    from klet.cri.client import RuntimeConfig


class BaseSettings(ServicePortSettings, Protocol):
    """The klet-only settings the shared set-up reads (the private port's come from
    ServicePortSettings: bind address, port, port file, run directory)."""

    @property
    def node_name(self) -> str: ...  # the bus's key prefix

    @property
    def redis_url(self) -> str: ...  # --redis-url

    @property
    def redis_auth(self) -> BusAuth: ...  # the service's ACL user and TLS files


@dataclass(frozen=True)
class BaseOverrides:
    """A test's replacements for the shared set-up; None keeps the production choice.
    Each service's `Overrides` adds its own fields to these."""

    bus: Bus | None = None
    """The node's bus (e.g. `klet.testbed.fakes.bus.FakeBus`): tables, streams and the lease."""
    registry: CollectorRegistry | None = None
    """The metrics registry (a test's own, to read what it counts)."""
    lease_holder: str | None = None
    """The lease holder ID; default: a fresh one from this process's replica slot."""


@dataclass(frozen=True)
class ServiceBase:
    """What a service's own wiring builds on."""

    bus: Bus
    """The node's bus: one connection pool for the service's tables, streams and lease."""
    node_bus: NodeBus
    """The bus's tables and streams as this service may use them."""
    registry: CollectorRegistry
    """The service's metrics; a test's own, or a fresh one."""
    lease: Lease
    """The service's bus lease (`LEASE_TTL_MS` unless a test shortens it); the bus's
    writes are fenced by it."""
    port: ServicePort
    """The private /healthz /readyz /metrics port and its port files."""
    service: str
    """The service's name ("syncloop", ...), as `service_base` was given it."""
    run_dir: Path
    """The node's run directory (--run-dir): sockets, port files, lease slots."""

    @property
    def grpc_socket(self) -> Path:
        """The unix socket the service serves its gRPC API on (`klet.model.layout`);
        only syncloop, eviction and image-gc serve one."""
        return grpc_socket(self.run_dir, self.service)


def service_base(
    service: str,
    klet: BaseSettings,
    overrides: BaseOverrides | None = None,
    *,
    process_metrics: bool = False,
    lease_ttl_ms: int | None = None,
) -> ServiceBase:
    """The shared set-up of `service` ("syncloop", ...: the bus service, lease and port
    name), with a test's `overrides`; `process_metrics` adds the process_*, python_*
    series to a fresh registry; `lease_ttl_ms` (a test's) replaces `LEASE_TTL_MS`.
    Without a holder given, the lease is held under this process's replica slot in the
    run directory (`klet.bus.holder.service_lease`: a restart takes over its dead
    predecessor's lease at once)."""
    o = overrides or BaseOverrides()
    registry = o.registry
    if registry is None:
        registry = new_registry(process_metrics=True) if process_metrics else CollectorRegistry()
    bus = o.bus
    if bus is None:
        bus = Bus.from_url(klet.redis_url, klet.node_name, auth=klet.redis_auth)
    ttl_ms = LEASE_TTL_MS if lease_ttl_ms is None else lease_ttl_ms
    lease = (
        bus.lease(service, o.lease_holder, ttl_ms=ttl_ms)
        if o.lease_holder
        else service_lease(bus, service, Path(klet.run_dir), ttl_ms=ttl_ms)
    )
    return ServiceBase(
        bus=bus,
        node_bus=NodeBus.of(bus, service=service),
        registry=registry,
        lease=lease,
        port=ServicePort.of(service, klet),
        service=service,
        run_dir=Path(klet.run_dir),
    )


@dataclass(frozen=True)
class OnServiceBase:
    """A service's `Deps` built on a `ServiceBase`: its shared parts read as the Deps'
    own (`deps.bus`, `deps.lease`, ...), so the services' apps and tests need not know
    where they were built."""

    base: ServiceBase

    @property
    def bus(self) -> Bus:
        return self.base.bus

    @property
    def node_bus(self) -> NodeBus:
        return self.base.node_bus

    @property
    def registry(self) -> CollectorRegistry:
        return self.base.registry

    @property
    def lease(self) -> Lease:
        return self.base.lease

    @property
    def service_port(self) -> ServicePort:
        return self.base.port


def runtime_client(
    kubelet: RuntimeConfig, registry: CollectorRegistry, *, image_endpoint: str | None = None
) -> RuntimeClient:
    """A CRI client on the configured endpoints (`image_endpoint` replaces the image
    service's), its calls counted in `registry` under upstream's runtime operation
    metrics."""
    from klet.cri import RuntimeClient, cri_settings  # only here: loads gRPC

    replaced: dict[str, Any] = {} if image_endpoint is None else {"image_endpoint": image_endpoint}
    return RuntimeClient(
        cri_settings(kubelet, **replaced), observer=RuntimeOperationMetrics(registry)
    )
