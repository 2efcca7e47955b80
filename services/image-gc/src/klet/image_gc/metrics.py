"""image-gc's Prometheus metrics, upstream names where upstream has one.

`kubelet_image_garbage_collected_total{reason}` is upstream's (reasons "age" and
"space"); the pass durations and the container GC counters are klet's own (upstream's
kubelet has none for container GC).
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_PASS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


@dataclass(frozen=True)
class Metrics:
    images_collected: Counter
    image_gc_duration: Histogram
    image_gc_failures: Counter
    images_tracked: Gauge
    containers_removed: Counter
    sandboxes_removed: Counter
    log_dirs_removed: Counter
    container_gc_errors: Counter
    container_gc_duration: Histogram
    bytes_freed: Counter


def create_metrics(registry: CollectorRegistry) -> Metrics:
    return Metrics(
        images_collected=Counter(
            "kubelet_image_garbage_collected_total",
            "Images removed by image GC, by why: disk space or age",
            ["reason"],
            registry=registry,
        ),
        image_gc_duration=Histogram(
            "klet_image_gc_duration_seconds",
            "Duration in seconds of one image GC pass (detection included).",
            registry=registry,
            buckets=_PASS_BUCKETS,
        ),
        image_gc_failures=Counter(
            "klet_image_gc_failures_total", "Image GC passes that failed", registry=registry
        ),
        images_tracked=Gauge(
            "klet_image_gc_images", "Images image GC keeps a record of", registry=registry
        ),
        containers_removed=Counter(
            "klet_container_gc_containers_removed_total",
            "Dead containers removed by container GC",
            registry=registry,
        ),
        sandboxes_removed=Counter(
            "klet_container_gc_sandboxes_removed_total",
            "Pod sandboxes removed by container GC",
            registry=registry,
        ),
        log_dirs_removed=Counter(
            "klet_container_gc_log_dirs_removed_total",
            "Pod log directories removed by container GC",
            registry=registry,
        ),
        container_gc_errors=Counter(
            "klet_container_gc_errors_total",
            "Container GC removals that failed (retried on the next pass)",
            registry=registry,
        ),
        container_gc_duration=Histogram(
            "klet_container_gc_duration_seconds",
            "Duration in seconds of one container GC pass.",
            registry=registry,
            buckets=_PASS_BUCKETS,
        ),
        bytes_freed=Counter(
            "klet_gc_freed_bytes_total",
            "Bytes freed by GC, by what was removed",
            ["kind"],
            registry=registry,
        ),
    )
