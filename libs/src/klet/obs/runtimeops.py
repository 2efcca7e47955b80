"""Upstream's runtime operation metrics, fed by the CRI client of each service.

`kubelet_runtime_operations_total`, `kubelet_runtime_operations_duration_seconds` and
`kubelet_runtime_operations_errors_total`, with upstream's `operation_type` label values
(`run_podsandbox`, `list_containers`, `container_status`, ...) and duration buckets, so
an operator's dashboards and alerts for the upstream kubelet read klet's too. Each
service that calls the runtime exports the calls it makes itself (syncloop most of them,
eviction and status-reporter the stats, image-gc the image calls). As upstream's
instrumented runtime service, RunPodSandbox is also timed and its failures counted by
the runtime handler it asked for (`kubelet_run_podsandbox_duration_seconds` and
`kubelet_run_podsandbox_errors_total{runtime_handler}`, "" for the runtime's default).
"""

from __future__ import annotations

import functools
import re

from klet.obs.metrics import DEF_BUCKETS
from prometheus_client import CollectorRegistry, Counter, Histogram

OPERATIONS = "kubelet_runtime_operations_total"
DURATION = "kubelet_runtime_operations_duration_seconds"
ERRORS = "kubelet_runtime_operations_errors_total"

BUCKETS = tuple(0.005 * 2.5**i for i in range(14))
"""Upstream's buckets: 5 ms growing by 2.5 fourteen times (to about 7.5 min)."""

_SPECIAL = {"UpdateContainerResources": "update_container"}


@functools.cache
def operation_type(method: str) -> str:
    """Upstream's name of a CRI method: snake case, with "pod sandbox" as one word
    (`RunPodSandbox` -> `run_podsandbox`)."""
    if method in _SPECIAL:
        return _SPECIAL[method]
    snake = re.sub(r"(?<!^)(?=[A-Z])", "_", method).lower()
    return snake.replace("pod_sandbox", "podsandbox")


class RuntimeOperationMetrics:
    """A `klet.cri.client.CallObserver` that records into `registry`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ["operation_type"]
        self.operations = Counter(
            OPERATIONS.removesuffix("_total"),
            "Cumulative number of runtime operations by operation type.",
            labels,
            registry=registry,
        )
        self.duration = Histogram(
            DURATION,
            "Duration in seconds of runtime operations. Broken down by operation type.",
            labels,
            buckets=BUCKETS,
            registry=registry,
        )
        self.errors = Counter(
            ERRORS.removesuffix("_total"),
            "Cumulative number of runtime operation errors by operation type.",
            labels,
            registry=registry,
        )
        self.sandbox_duration = Histogram(
            "kubelet_run_podsandbox_duration_seconds",
            "Duration in seconds of the run_podsandbox operations. Broken down by "
            "RuntimeClass.Handler.",
            ["runtime_handler"],
            buckets=DEF_BUCKETS,
            registry=registry,
        )
        self.sandbox_errors = Counter(
            "kubelet_run_podsandbox_errors",
            "Cumulative number of the run_podsandbox operation errors by RuntimeClass.Handler.",
            ["runtime_handler"],
            registry=registry,
        )

    def observe(
        self, method: str, seconds: float, *, failed: bool, runtime_handler: str | None = None
    ) -> None:
        op = operation_type(method)
        self.operations.labels(op).inc()
        self.duration.labels(op).observe(seconds)
        if failed:
            self.errors.labels(op).inc()
        if method == "RunPodSandbox":
            handler = runtime_handler or ""
            self.sandbox_duration.labels(handler).observe(seconds)
            if failed:
                self.sandbox_errors.labels(handler).inc()
