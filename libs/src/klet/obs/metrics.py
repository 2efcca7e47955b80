"""Prometheus helpers shared by the services: a fresh registry, and its text rendering.

Each service declares its metrics in its own `metrics.py`, taking a `CollectorRegistry`
(STYLE rule 18) so every test gets a fresh one and nothing registers into the global
default registry by import side effect. This module only builds such registries and
renders them for the `/metrics` endpoint of health.py.

The `_created` series that prometheus_client adds to every counter, histogram and
summary are turned off for the whole process when this module is imported (every
service imports it): upstream's kubelet serves none, each would double the series a
scrape carries, and Prometheus reads a counter's reset from the counter itself.

Trade-off: process and platform collectors (RSS, CPU seconds, open fds, python_info) are
opt-in; production wiring turns them on, unit tests leave them off so scrapes are
deterministic.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import (
    CollectorRegistry,
    Gauge,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    exposition,
    generate_latest,
)

__all__ = [
    "CONTENT_TYPE",
    "DEF_BUCKETS",
    "LEADER_METRIC",
    "leader_metric",
    "new_registry",
    "render",
]

disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped in prometheus_client

DEF_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""The Go client's DefBuckets, which upstream's histograms use when they name none
(prometheus_client's own default has four more)."""

LEADER_METRIC = "klet_leader"
"""1 while this replica holds its service's bus lease (acts), 0 while it stands by; one
name for every service, told apart by the `service` label."""

# Content type of what generate_latest() writes: the classic text format 0.0.4 (newer
# prometheus_client names it CONTENT_TYPE_PLAIN_0_0_4; its CONTENT_TYPE_LATEST moved on).
CONTENT_TYPE: str = getattr(
    exposition, "CONTENT_TYPE_PLAIN_0_0_4", "text/plain; version=0.0.4; charset=utf-8"
)


def new_registry(*, process_metrics: bool = False) -> CollectorRegistry:
    """A new, empty registry; with process_metrics also the process_*, python_info and
    python_gc_* collectors that the global default registry carries."""
    registry = CollectorRegistry(auto_describe=True)
    if process_metrics:
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)
    return registry


def render(registry: CollectorRegistry) -> tuple[bytes, str]:
    """The registry in the Prometheus text format, and the content type to serve it with."""
    return generate_latest(registry), CONTENT_TYPE


def leader_metric(
    registry: CollectorRegistry, *, service: str, leading: Callable[[], bool]
) -> Gauge:
    """Register `klet_leader{service=...}`, read from `leading()` at every scrape (so it
    can never disagree with the leader loop's own state)."""
    gauge = Gauge(
        LEADER_METRIC,
        "Whether this replica holds its service's lease on the bus and acts (1) or stands by (0).",
        ["service"],
        registry=registry,
    )
    gauge.labels(service=service).set_function(lambda: 1.0 if leading() else 0.0)
    return gauge
