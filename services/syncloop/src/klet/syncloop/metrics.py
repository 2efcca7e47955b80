"""syncloop's Prometheus metrics, upstream names where upstream has one."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


@dataclass(frozen=True)
class Metrics:
    running_pods: Gauge
    pod_workers: Gauge
    pleg_relist_duration: Histogram
    pleg_last_seen: Gauge
    pod_worker_duration: Histogram
    bad_bus_entries: Counter
    bus_errors: Counter


def create_metrics(registry: CollectorRegistry) -> Metrics:
    return Metrics(
        running_pods=Gauge(
            "kubelet_running_pods",
            "Number of pods that have a running pod sandbox",
            registry=registry,
        ),
        pod_workers=Gauge("klet_syncloop_pod_workers", "Pod workers alive", registry=registry),
        pleg_relist_duration=Histogram(
            "kubelet_pleg_relist_duration_seconds",
            "Duration in seconds for relisting pods in PLEG.",
            registry=registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        ),
        pleg_last_seen=Gauge(
            "kubelet_pleg_last_seen_seconds",
            "Timestamp in seconds when PLEG was last seen active.",
            registry=registry,
        ),
        pod_worker_duration=Histogram(
            "kubelet_pod_worker_duration_seconds",
            "Duration in seconds to sync a single pod.",
            ["operation"],
            registry=registry,
        ),
        bad_bus_entries=Counter(
            "klet_syncloop_bad_bus_entries_total",
            "Entries of the pods stream that could not be decoded",
            registry=registry,
        ),
        bus_errors=Counter(
            "klet_syncloop_bus_errors_total", "Failed reads of the Redis bus", registry=registry
        ),
    )
