"""syncloop's Prometheus metrics, upstream names where upstream has one.

The prober and the pod controller do not import prometheus: wiring hands them the
small recorders below (`ProberMetrics`, `Metrics.record_admission_rejection`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

if TYPE_CHECKING:
    from klet.cri.types import RuntimeEvent
    from klet.syncloop.probing.prober import ProbeRun

# upstream's prober_probe_total `result` values; upstream's third value, "unknown", is
# never reached: a probe that errors is thrown away there and here, not counted.
PROBE_SUCCESSFUL = "successful"
PROBE_FAILED = "failed"

# upstream's allowlist for the `reason` label of kubelet_admission_rejections_total (it
# keeps the label's cardinality bounded): other "OutOf<resource>" reasons count as
# OutOfExtendedResources, anything else as Other.
ADMISSION_REJECTION_REASONS = frozenset(
    {
        "AppArmor",
        "PodOSSelectorNodeLabelDoesNotMatch",
        "PodOSNotSupported",
        "InvalidNodeInfo",
        "InitContainerRestartPolicyForbidden",
        "SupplementalGroupsPolicyNotSupported",
        "UnexpectedAdmissionError",
        "UnknownReason",
        "UnexpectedPredicateFailureType",
        "OutOfcpu",
        "OutOfmemory",
        "OutOfephemeral-storage",
        "OutOfpods",
        "node(s) had taints that the pod didn't tolerate",
        "Evicted",
        "SysctlForbidden",
        "TopologyAffinityError",
        "NodeShutdown",
    }
)


def admission_rejection_reason(reason: str) -> str:
    """The `reason` label upstream records for a pod rejected with `reason`."""
    if reason in ADMISSION_REJECTION_REASONS:
        return reason
    if reason.startswith("OutOf"):
        return "OutOfExtendedResources"
    return "Other"


@dataclass
class ProberMetrics:
    """prober_probe_total and prober_probe_duration_seconds, fed by the probe manager.

    As upstream, a probe run counts by result, its duration is observed for successes
    only, and a removed pod's series are deleted.
    """

    results: Counter
    duration: Histogram
    _series: dict[str, set[tuple[str, ...]]] = field(default_factory=dict)

    def observe(self, run: ProbeRun) -> None:
        base = (run.kind.value, run.container, run.pod, run.namespace)
        result = PROBE_SUCCESSFUL if run.ok else PROBE_FAILED
        self.results.labels(base[0], result, *base[1:], run.pod_uid).inc()
        self._series.setdefault(run.pod_uid, set()).add((result, *base))
        if run.ok:
            self.duration.labels(*base).observe(max(0.0, run.duration_s))

    def forget_pod(self, uid: str) -> None:
        # The duration has no pod_uid label: a pod recreated under the same name shares
        # the series, which stays while any pod still has it.
        kept = {
            s[1:]
            for u, series in self._series.items()
            if u != uid
            for s in series
            if s[0] == PROBE_SUCCESSFUL
        }
        for result, *base in self._series.pop(uid, set()):
            self.results.remove(base[0], result, *base[1:], uid)
            if result == PROBE_SUCCESSFUL and tuple(base) not in kept:
                self.duration.remove(*base)


@dataclass(frozen=True)
class PlegMetrics:
    """The evented PLEG's recorder (runtimeevents.EventObserver).

    Upstream's evented PLEG counts connections in `kubelet_evented_pleg_connection_*_count`
    counters; prometheus_client would expose those as `..._count_total`, so klet names its
    own: stream opens by source, stream failures, whether a stream is open, and events
    by kind. The latency histogram keeps upstream's name: seconds from the runtime's
    timestamp of an event to its arrival here (same host, same clock).
    """

    opens: Counter
    errors: Counter
    up: Gauge
    events: Counter
    latency: Histogram
    clock: Callable[[], float] = time.time

    def subscribed(self, source: str) -> None:
        self.opens.labels(source if source in ("cri", "containerd") else "other").inc()
        self.up.set(1)

    def unsubscribed(self, *, error: bool) -> None:
        self.up.set(0)
        if error:
            self.errors.inc()

    def event(self, event: RuntimeEvent) -> None:
        self.events.labels(event.kind.value).inc()
        if event.at > 0:
            self.latency.observe(max(0.0, self.clock() - event.at))


@dataclass(frozen=True)
class Metrics:
    running_pods: Gauge
    pod_workers: Gauge
    pleg_relist_duration: Histogram
    pleg_last_seen: Gauge
    pod_worker_duration: Histogram
    bad_bus_entries: Counter
    bus_errors: Counter
    admission_rejections: Counter
    prober: ProberMetrics
    pleg: PlegMetrics

    def record_admission_rejection(self, reason: str) -> None:
        self.admission_rejections.labels(admission_rejection_reason(reason)).inc()


def volume_counts(registry: CollectorRegistry) -> Callable[[Mapping[tuple[str, str], int]], None]:
    """upstream's volume_manager_total_volumes{plugin_name, state}: the volumes of the
    node's pods by plugin, in the desired state (what the pods ask for) and the actual
    state (what is set up); the returned function sets them from the manager's totals."""
    gauge = Gauge(
        "volume_manager_total_volumes",
        "Number of volumes in Volume Manager",
        ["plugin_name", "state"],
        registry=registry,
    )
    shown: set[tuple[str, str]] = set()

    def record(totals: Mapping[tuple[str, str], int]) -> None:
        for key in shown - set(totals):
            gauge.remove(*key)
        for (plugin_name, state), count in totals.items():
            gauge.labels(plugin_name, state).set(count)
        shown.clear()
        shown.update(totals)

    return record


def create_metrics(registry: CollectorRegistry) -> Metrics:
    return Metrics(
        running_pods=Gauge(
            "kubelet_running_pods",
            "Pods whose sandbox is running on this node",
            registry=registry,
        ),
        pod_workers=Gauge("klet_syncloop_pod_workers", "Pod workers alive", registry=registry),
        pleg_relist_duration=Histogram(
            "kubelet_pleg_relist_duration_seconds",
            "Seconds one PLEG relist of the runtime took",
            registry=registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        ),
        pleg_last_seen=Gauge(
            "kubelet_pleg_last_seen_seconds",
            "Unix time of the last completed PLEG relist",
            registry=registry,
        ),
        pod_worker_duration=Histogram(
            "kubelet_pod_worker_duration_seconds",
            "Seconds one pod worker sync took",
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
        admission_rejections=Counter(
            "kubelet_admission_rejections_total",
            "Pods this node refused to admit, by reason",
            ["reason"],
            registry=registry,
        ),
        pleg=PlegMetrics(
            opens=Counter(
                "klet_syncloop_runtime_event_streams_total",
                "Runtime event subscriptions opened, by source (cri, containerd)",
                ["source"],
                registry=registry,
            ),
            errors=Counter(
                "klet_syncloop_runtime_event_stream_errors_total",
                "Runtime event subscriptions that failed or dropped",
                registry=registry,
            ),
            up=Gauge(
                "klet_syncloop_runtime_event_stream_up",
                "1 while a runtime event subscription is open (PLEG relists at its long period)",
                registry=registry,
            ),
            events=Counter(
                "klet_syncloop_runtime_events_total",
                "Runtime events received, by kind (created, started, exited, oom, deleted)",
                ["kind"],
                registry=registry,
            ),
            latency=Histogram(
                "kubelet_evented_pleg_connection_latency_seconds",
                "Seconds from a runtime event's timestamp to its arrival in syncloop",
                registry=registry,
                buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            ),
        ),
        prober=ProberMetrics(
            results=Counter(
                "prober_probe_total",
                "Probe runs of containers, by probe type and result",
                ["probe_type", "result", "container", "pod", "namespace", "pod_uid"],
                registry=registry,
            ),
            duration=Histogram(
                "prober_probe_duration_seconds",
                "Seconds a successful probe run took",
                ["probe_type", "container", "pod", "namespace"],
                registry=registry,
            ),
        ),
    )
