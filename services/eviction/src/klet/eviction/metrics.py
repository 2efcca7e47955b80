"""The eviction service's Prometheus metrics, upstream names where upstream has one.

Upstream's `kubelet_evictions{eviction_signal}` (exposed under exactly that name, see
`UpstreamCounter`) counts evictions by the signal that caused them, the local-storage
pseudo-signals `emptydirfs.limit`, `ephemeralpodfs.limit` and
`ephemeralcontainerfs.limit` included; `kubelet_eviction_stats_age_seconds
{eviction_signal}` says how old the measurement was when it was used. The signal gauges
are klet's own: upstream exposes the observations only through its summary API. Label
values are the closed set of signal names."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import Metric


class UpstreamCounter:
    """A labelled counter exposed under its exact upstream name.

    prometheus_client appends `_total` to every counter; upstream's Go client does not,
    and upstream's counter is plainly `kubelet_evictions`. This collector exposes the
    samples under that name, typed `untyped` (the text format ties a counter's TYPE line
    to the `_total` name), so queries and alerts written for upstream work unchanged.
    """

    def __init__(
        self, name: str, documentation: str, label: str, *, registry: CollectorRegistry
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.label = label
        self._values: dict[str, float] = {}
        self._lock = threading.Lock()
        registry.register(self)

    def labels(self, value: str) -> _Child:
        return _Child(self, value)

    def value(self, label_value: str) -> float:
        with self._lock:
            return self._values.get(label_value, 0.0)

    def _inc(self, label_value: str, amount: float) -> None:
        with self._lock:
            self._values[label_value] = self._values.get(label_value, 0.0) + amount

    def collect(self) -> Iterator[Metric]:
        metric = Metric(self.name, self.documentation, "unknown")
        with self._lock:
            for value, count in sorted(self._values.items()):
                metric.add_sample(self.name, {self.label: value}, count)
        yield metric


@dataclass(frozen=True)
class _Child:
    parent: UpstreamCounter
    value: str

    def inc(self, amount: float = 1.0) -> None:
        self.parent._inc(self.value, amount)


@dataclass(frozen=True)
class Metrics:
    evictions: UpstreamCounter
    stats_age: Histogram
    available: Gauge
    capacity: Gauge
    threshold: Gauge
    condition: Gauge
    reclaims: Counter
    passes: Counter


def create_metrics(registry: CollectorRegistry) -> Metrics:
    return Metrics(
        evictions=UpstreamCounter(
            "kubelet_evictions",
            "Pods this node evicted, by the signal that made it evict",
            "eviction_signal",
            registry=registry,
        ),
        stats_age=Histogram(
            "kubelet_eviction_stats_age_seconds",
            "Age of the measurement an eviction was decided on, by signal",
            ["eviction_signal"],
            registry=registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        ),
        available=Gauge(
            "klet_eviction_signal_available",
            "The last observed available amount of an eviction signal (bytes, inodes or PIDs)",
            ["eviction_signal"],
            registry=registry,
        ),
        capacity=Gauge(
            "klet_eviction_signal_capacity",
            "The capacity an eviction signal was last observed against (bytes, inodes or PIDs)",
            ["eviction_signal"],
            registry=registry,
        ),
        threshold=Gauge(
            "klet_eviction_threshold",
            "A configured eviction threshold against the last observed capacity",
            ["eviction_signal", "kind"],
            registry=registry,
        ),
        condition=Gauge(
            "klet_eviction_node_condition",
            "1 while the eviction manager reports the node condition, else 0",
            ["condition"],
            registry=registry,
        ),
        reclaims=Counter(
            "klet_eviction_node_reclaims",
            "Node-level reclaim calls to image-gc's FreeSpace by outcome",
            ["outcome"],
            registry=registry,
        ),
        passes=Counter(
            "klet_eviction_passes",
            "Eviction monitoring passes completed (measurement, decision and any eviction)",
            registry=registry,
        ),
    )
