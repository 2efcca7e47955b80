"""syncloop's Prometheus metrics, upstream names where upstream has one.

The prober, the pod controller, the syncer and the image puller do not import
prometheus: wiring hands them the small recorders below (`ProberMetrics`,
`PodStartTracker`, `CgroupTimer`, `Metrics.record_admission_rejection`, ...).

Upstream's definitions (pkg/kubelet/metrics/metrics.go) give the names, labels and
buckets (the HELP texts are ours); where each is observed follows upstream's call sites:

- `kubelet_pod_worker_duration_seconds{operation_type}`: one pod worker sync, by
  `pods.podstate.pod_worker_operation` (create, update, sync, kill, terminated); upstream times from
  the update's arrival, klet from the sync's start (klet's workers coalesce updates);
- `kubelet_pod_start_duration_seconds`: from the pod's first sighting
  (`kubernetes.io/config.seen`) to the first Running status this process computes for
  it; `kubelet_pod_start_sli_duration_seconds`: from its creationTimestamp to the first
  status in which every container runs, less the time its image pulls took (their
  union) and the run time of its init containers, as upstream's startup latency
  tracker; `kubelet_pod_start_total_duration_seconds`: the same moment, nothing left
  out (pulls and init containers included). A pod already running when this process
  first syncs it (a restart) is observed by none, nor is a pod that ends before it
  runs; a pod without a creationTimestamp (a static pod) has no SLI nor total.
  Upstream takes the SLI moment from the apiserver's watch; syncloop has no watch of
  its own pods, so it is the status's computation (earlier by one status write);
- `kubelet_pod_worker_start_duration_seconds`: at a pod's first sync in this process
  (its `create`), the time since the pod was first seen (`kubernetes.io/config.seen`), or
  since this process started when it was seen before (upstream's restarted kubelet
  stamps its pods seen anew); a pod without the annotation is not observed, as upstream;
  `kubelet_containers_per_pod_count`: at the same first sync, the pod's regular
  containers (upstream observes it when its pod worker first starts the pod);
- `kubelet_restarted_pods_total{static}`: a pod desired again under the same UID while
  its worker was removing it (its new life starts from scratch; "true" for a static
  pod, "" otherwise, as upstream); `kubelet_orphaned_runtime_pods_total`: a pod found in
  the runtime that no source wanted in this process (after a restart, one deleted
  meanwhile), counted once it is killed;
- `kubelet_sleep_action_terminated_early_total`: a lifecycle hook's sleep action that
  ended before its seconds were up (the grace period or the hook's timeout ran out);
  `kubelet_lifecycle_handler_http_fallbacks_total`: an HTTPS httpGet hook whose server
  answered in plain HTTP, delivered by the retry over HTTP (`containers/hooks.py`);
- `kubelet_preemptions{preemption_signal}`: a pod killed to admit a critical pod, by
  the first resource the critical pod lacked (`admission/preemption.py`); a counter
  upstream names without `_total` (`UnsuffixedCounter`);
- `kubelet_working_pods{lifecycle, config, static}`: the pods with a worker after each
  relist, every valid combination set (zeros too) as upstream's housekeeping does
  (`pods.podstate.working_pod`);
- `kubelet_started_pods_total` / `_errors_total`: sandbox creations tried / failed;
  `kubelet_started_containers_total{container_type}` / `_errors_total{container_type,
  code}`: container starts tried / failed (`code` is the waiting reason, as upstream's
  error codes: ErrImagePull, CreateContainerError, RunContainerError, ...);
- `kubelet_image_pull_duration_seconds{image_size_in_bytes}`: a successful pull, the
  wait for a pull slot included, by upstream's image size buckets;
- `kubelet_cgroup_manager_duration_seconds{operation_type}`: the pod cgroup's create
  and update;
- `kubelet_pleg_relist_duration_seconds` and `kubelet_pleg_relist_interval_seconds`:
  each successful relist's duration, and the time from the previous successful relist's
  start to this one's (upstream observes it as a relist begins, klet as it ends, from
  its start).
- `kubelet_device_plugin_registration_total{resource_name}`: each Register on the device
  plugin socket, refused ones too (counted before the checks, as upstream);
  `kubelet_device_plugin_alloc_duration_seconds{resource_name}`: each Allocate call to a
  plugin (`DeviceMetrics`).
- `plugin_manager_total_plugins{socket_path, state}`: at each scrape, the plugin
  watcher's sockets, 1 per socket in `desired_state_of_world` (found by its last scan)
  and in `actual_state_of_world` (registered), as upstream's plugin manager collector
  (`plugin_counts`).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from klet.model.pod import CONFIG_SEEN
from klet.model.types import JSON
from klet.obs.metrics import DEF_BUCKETS
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

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


# upstream's podStartupDurationBuckets and imagePullDurationBuckets, seconds
POD_START_BUCKETS = (
    0.5, 1, 2, 3, 4, 5, 6, 8, 10, 20, 30, 45, 60, 120, 180, 240, 300, 360, 480, 600, 900,
    1200, 1800, 2700, 3600,
)  # fmt: skip
IMAGE_PULL_BUCKETS = (
    1, 5, 10, 20, 30, 60, 120, 180, 240, 300, 360, 480, 600, 900, 1200, 1800, 2700, 3600,
)  # fmt: skip

_MIB, _GIB = 1024 * 1024, 1024 * 1024 * 1024
# upstream's imageSizeBuckets: (lower bound exclusive, label)
IMAGE_SIZE_BUCKETS = (
    (0, "0-10MB"),
    (10 * _MIB, "10MB-100MB"),
    (100 * _MIB, "100MB-500MB"),
    (500 * _MIB, "500MB-1GB"),
    (1 * _GIB, "1GB-5GB"),
    (5 * _GIB, "5GB-10GB"),
    (10 * _GIB, "10GB-20GB"),
    (20 * _GIB, "20GB-30GB"),
    (30 * _GIB, "30GB-40GB"),
    (40 * _GIB, "40GB-60GB"),
    (60 * _GIB, "60GB-100GB"),
    (100 * _GIB, "GT100GB"),
)


def image_size_bucket(size: int) -> str:
    """upstream's `image_size_in_bytes` label of a pulled image's size ("N/A" unknown)."""
    if size <= 0:
        return "N/A"
    for lower, label in reversed(IMAGE_SIZE_BUCKETS):
        if size > lower:
            return label
    return "N/A"  # unreachable: size > 0 is above the first bound


def _timestamp(value: object) -> float | None:
    """A Unix time from an RFC 3339 string (`creationTimestamp`, `config.seen`)."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed.timestamp() if parsed.tzinfo is not None else None


@dataclass
class _Starting:
    first_synced: float
    pull_open: float | None = None  # when the pull under way began
    pulls: list[tuple[float, float]] = field(default_factory=list)  # (began, ended)
    started: bool = False  # kubelet_pod_start_duration_seconds observed
    sli: bool = False  # kubelet_pod_start_sli_duration_seconds observed


def _union_s(intervals: list[tuple[float, float]]) -> float:
    """Seconds covered by `intervals` (overlapping pulls of one pod counted once)."""
    total, reach = 0.0, float("-inf")
    for began, ended in sorted(intervals):
        began = max(began, reach)
        if ended > began:
            total += ended - began
            reach = ended
    return total


def _init_runtime_s(status: JSON) -> float:
    """Seconds the pod's init containers that ran to their end took (from the status)."""
    total = 0.0
    for cs in status.get("initContainerStatuses") or ():
        terminated = (cs.get("state") or {}).get("terminated") or {}
        began, ended = (_timestamp(terminated.get(k)) for k in ("startedAt", "finishedAt"))
        if began is not None and ended is not None:
            total += max(0.0, ended - began)
    return total


def _containers_running(pod: JSON, status: JSON) -> bool:
    """Every regular container of the pod reports running (upstream's hasPodStartedSLO)."""
    statuses = status.get("containerStatuses") or []
    wanted = len((pod.get("spec") or {}).get("containers") or ())
    return len(statuses) >= wanted and all("running" in (cs.get("state") or {}) for cs in statuses)


@dataclass
class PodStartTracker:
    """kubelet_pod_start_duration_seconds, kubelet_pod_start_sli_duration_seconds and
    kubelet_pod_start_total_duration_seconds (see the module docstring for when each is
    observed). Times are Unix seconds."""

    start: Histogram
    sli: Histogram
    total: Histogram
    _starting: dict[str, _Starting] = field(default_factory=dict)
    _done: set[str] = field(default_factory=set)

    def pulling(self, uid: str, now: float) -> None:
        starting = self._starting.get(uid)
        if starting is not None:
            starting.pull_open = now  # one failed before (never finished) is replaced

    def pulled(self, uid: str, now: float) -> None:
        starting = self._starting.get(uid)
        if starting is not None and starting.pull_open is not None:
            starting.pulls.append((starting.pull_open, now))
            starting.pull_open = None

    def status(self, uid: str, pod: JSON, status: JSON, now: float) -> None:
        """The pod's status as computed at `now`: observes its start once it runs, and
        its start SLI once every container runs."""
        if uid in self._done:
            return
        phase = status.get("phase", "")
        starting = self._starting.get(uid)
        if starting is None:
            if phase == "Pending":
                self._starting[uid] = _Starting(first_synced=now)
            else:  # running (or over) before this process saw it start
                self._done.add(uid)
            return
        if phase in ("Succeeded", "Failed"):  # over: whatever was not observed never will
            del self._starting[uid]
            self._done.add(uid)
            return
        meta = pod.get("metadata") or {}
        if phase == "Running" and not starting.started:
            starting.started = True
            seen = _timestamp((meta.get("annotations") or {}).get(CONFIG_SEEN))
            since = seen if seen is not None else starting.first_synced
            self.start.observe(max(0.0, now - since))
        if not starting.sli and _containers_running(pod, status):
            starting.sli = True
            created = _timestamp(meta.get("creationTimestamp"))
            if created is not None:
                excluded = _union_s(starting.pulls) + _init_runtime_s(status)
                self.sli.observe(max(0.0, now - created - excluded))
                self.total.observe(max(0.0, now - created))
        if starting.started and starting.sli:
            del self._starting[uid]
            self._done.add(uid)

    def forget(self, uid: str) -> None:
        self._starting.pop(uid, None)
        self._done.discard(uid)


@dataclass(frozen=True)
class ImagePullMetrics:
    """kubelet_image_pull_duration_seconds, and the pod start tracker's pull times
    (containers.images.PullObserver)."""

    duration: Histogram
    starts: PodStartTracker

    def pulling(self, uid: str, now: float) -> None:
        self.starts.pulling(uid, now)

    def pulled(self, uid: str, now: float, *, seconds: float, size: int) -> None:
        self.duration.labels(image_size_bucket(size)).observe(max(0.0, seconds))
        self.starts.pulled(uid, now)


@dataclass(frozen=True)
class StartMetrics:
    """kubelet_started_{pods,containers}_total and their _errors_total
    (pods.syncpod.StartObserver)."""

    pods: Counter
    pod_errors: Counter
    containers: Counter
    container_errors: Counter

    def pod_starting(self) -> None:
        self.pods.inc()

    def pod_failed(self) -> None:
        self.pod_errors.inc()

    def container_starting(self, container_type: str) -> None:
        self.containers.labels(container_type).inc()

    def container_failed(self, container_type: str, code: str) -> None:
        self.container_errors.labels(container_type, code).inc()


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

    Upstream's evented PLEG counts each event stream opened in
    `kubelet_evented_pleg_connection_success_count` and each that ended in an error in
    `kubelet_evented_pleg_connection_error_count`: served under those exact names
    (UnsuffixedCounter), beside klet's own: stream opens by source, stream failures,
    whether a stream is open, and events by kind. The latency histogram keeps upstream's
    name: seconds from the runtime's timestamp of an event to its arrival here (same
    host, same clock).
    """

    opens: Counter
    errors: Counter
    up: Gauge
    events: Counter
    latency: Histogram
    connections: UnsuffixedCounter
    connection_errors: UnsuffixedCounter
    clock: Callable[[], float] = time.time

    def __post_init__(self) -> None:
        # upstream's are plain counters: 0 from the start, not absent
        self.connections.inc(amount=0)
        self.connection_errors.inc(amount=0)

    def subscribed(self, source: str) -> None:
        self.opens.labels(source if source in ("cri", "containerd") else "other").inc()
        self.connections.inc()
        self.up.set(1)

    def unsubscribed(self, *, error: bool) -> None:
        self.up.set(0)
        if error:
            self.errors.inc()
            self.connection_errors.inc()

    def event(self, event: RuntimeEvent) -> None:
        self.events.labels(event.kind.value).inc()
        if event.at > 0:
            self.latency.observe(max(0.0, self.clock() - event.at))


class RelistMetrics:
    """The PLEG relist's two histograms (see the module docstring)."""

    def __init__(self, *, duration: Histogram, interval: Histogram) -> None:
        self.duration = duration
        self.interval = interval
        self._last_start: float | None = None

    def relisted(self, duration_s: float, *, now: float) -> None:
        """A relist that took `duration_s` completed at `now` (monotonic seconds)."""
        start = now - duration_s
        if self._last_start is not None:
            self.interval.observe(max(0.0, start - self._last_start))
        self._last_start = start
        self.duration.observe(max(0.0, duration_s))


@dataclass(frozen=True)
class Metrics:
    running_pods: Gauge
    pod_workers: Gauge
    working_pods: Gauge
    pleg_relists: RelistMetrics
    pleg_last_seen: Gauge
    pod_worker_duration: Histogram
    pod_worker_start: Histogram
    containers_per_pod: Histogram
    restarted_pods: Counter
    orphaned_runtime_pods: Counter
    sleeps_cut_short: Counter
    http_fallbacks: Counter
    preemptions: UnsuffixedCounter
    bad_bus_entries: Counter
    bus_errors: Counter
    admission_rejections: Counter
    prober: ProberMetrics
    pleg: PlegMetrics
    pod_starts: PodStartTracker
    image_pulls: ImagePullMetrics
    starts: StartMetrics
    cgroup_manager_duration: Histogram
    started_at: float
    """When this process began (Unix seconds): pods seen before it count from it."""

    def set_working_pods(self, counts: Mapping[tuple[str, str, str], int]) -> None:
        for (lifecycle, config, static), count in counts.items():
            self.working_pods.labels(lifecycle, config, static).set(count)

    def record_admission_rejection(self, reason: str) -> None:
        self.admission_rejections.labels(admission_rejection_reason(reason)).inc()

    # pods.controller.WorkerObserver
    def pod_worker(self, operation: str, seconds: float) -> None:
        self.pod_worker_duration.labels(operation).observe(max(0.0, seconds))

    def pod_worker_creating(self, pod: JSON, now: float) -> None:
        self.containers_per_pod.observe(len((pod.get("spec") or {}).get("containers") or ()))
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        seen = _timestamp(annotations.get(CONFIG_SEEN))
        if seen is not None:
            self.pod_worker_start.observe(max(0.0, now - max(seen, self.started_at)))

    def pod_restarted(self, *, static: bool) -> None:
        self.restarted_pods.labels("true" if static else "").inc()

    def orphaned_runtime_pod(self) -> None:
        self.orphaned_runtime_pods.inc()

    def pod_status(self, uid: str, pod: JSON, status: JSON, now: float) -> None:
        self.pod_starts.status(uid, pod, status, now)

    def forget(self, uid: str) -> None:
        self.pod_starts.forget(uid)

    # pods.syncpod.StartObserver
    def pod_starting(self) -> None:
        self.starts.pod_starting()

    def pod_failed(self) -> None:
        self.starts.pod_failed()

    def container_starting(self, container_type: str) -> None:
        self.starts.container_starting(container_type)

    def container_failed(self, container_type: str, code: str) -> None:
        self.starts.container_failed(container_type, code)

    def cgroup_operation(self, operation: str, seconds: float) -> None:
        self.cgroup_manager_duration.labels(operation).observe(max(0.0, seconds))


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


def volume_stat_collection(registry: CollectorRegistry) -> Callable[[str, float], None]:
    """upstream's kubelet_volume_metric_collection_duration_seconds{metric_source}: each
    volume usage measurement of syncloop's stats collector (volumes.volumestats), by the
    CSI driver's name, `du` or `statfs`, as upstream's metrics providers label theirs."""
    histogram = Histogram(
        "kubelet_volume_metric_collection_duration_seconds",
        "Duration in seconds to calculate volume stats",
        ["metric_source"],
        registry=registry,
        buckets=DEF_BUCKETS,
    )

    def record(source: str, seconds: float) -> None:
        histogram.labels(source).observe(max(0.0, seconds))

    return record


class PluginStates(Protocol):
    """The plugin watcher's two states (klet.syncloop.plugins.watcher.PluginWatcher)."""

    @property
    def present(self) -> frozenset[Path]: ...

    @property
    def known(self) -> Mapping[Path, tuple[int, int]]: ...


class _PluginCounts(Collector):
    def __init__(self, states: PluginStates) -> None:
        self.states = states

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "plugin_manager_total_plugins",
            "Number of plugins in Plugin Manager",
            labels=["socket_path", "state"],
        )
        for state, sockets in (
            ("actual_state_of_world", list(self.states.known)),
            ("desired_state_of_world", self.states.present),
        ):
            for socket in sorted(sockets):
                family.add_metric([str(socket), state], 1.0)
        yield family


def plugin_counts(registry: CollectorRegistry, states: PluginStates) -> None:
    """Serve `plugin_manager_total_plugins` from `states` at each scrape."""
    registry.register(_PluginCounts(states))


def orphan_sweeps(registry: CollectorRegistry) -> Callable[[int, int], None]:
    """upstream's kubelet_orphan_pod_cleaned_volumes and _errors: the orphaned pod
    directories the last sweep found (volumes.manager.VolumeManager.clean_orphans), and
    those it could not remove."""
    found = Gauge(
        "kubelet_orphan_pod_cleaned_volumes",
        "The total number of orphaned Pods whose volumes were cleaned in the last periodic sweep.",
        registry=registry,
    )
    failed = Gauge(
        "kubelet_orphan_pod_cleaned_volumes_errors",
        "The number of orphaned Pods whose volumes failed to be cleaned in the last periodic "
        "sweep.",
        registry=registry,
    )

    def record(total: int, errors: int) -> None:
        found.set(total)
        failed.set(errors)

    return record


STORAGE_OPERATION_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 25, 50, 120, 300, 600)
"""upstream's buckets of storage_operation_duration_seconds (seconds)."""


def storage_operations(registry: CollectorRegistry) -> Callable[[str, str, bool, float], None]:
    """upstream's storage_operation_duration_seconds{volume_plugin, operation_name,
    status, migrated}: each volume set-up and tear-down (volumes.manager.StorageOperation),
    `status` "success" or upstream's "fail-unknown", `migrated` always "false" (klet has
    no in-tree plugins to migrate to CSI)."""
    histogram = Histogram(
        "storage_operation_duration_seconds",
        "Seconds a volume operation took, by plugin, operation and outcome",
        ["volume_plugin", "operation_name", "status", "migrated"],
        registry=registry,
        buckets=STORAGE_OPERATION_BUCKETS,
    )

    def record(operation: str, plugin: str, succeeded: bool, seconds: float) -> None:
        status = "success" if succeeded else "fail-unknown"
        histogram.labels(plugin, operation, status, "false").observe(max(0.0, seconds))

    return record


def volume_operation_totals(registry: CollectorRegistry) -> Callable[[str, str, float], None]:
    """upstream's volume_operation_total_seconds{plugin_name, operation_name}: the
    end-to-end time of each volume mount that succeeded, from the first time the pod's
    volume was asked for (volumes.manager's `totals`, operation `overall_volume_mount`,
    the one upstream's kubelet records), with upstream's buckets."""
    histogram = Histogram(
        "volume_operation_total_seconds",
        "Seconds from a volume operation's first request to its success, by plugin",
        ["plugin_name", "operation_name"],
        registry=registry,
        buckets=STORAGE_OPERATION_BUCKETS,
    )

    def record(operation: str, plugin: str, seconds: float) -> None:
        histogram.labels(plugin, operation).observe(max(0.0, seconds))

    return record


def csi_operations(registry: CollectorRegistry) -> Callable[[str, str, str, float], None]:
    """upstream's csi_operations_seconds{driver_name, method_name, grpc_status_code,
    migrated}: every call syncloop's CSI node clients make (klet.csi.client.CSIClient's
    observer), by driver, full gRPC method (`/csi.v1.Node/NodeStageVolume`) and grpc-go's
    status code name (`OK`, `DeadlineExceeded`, ...), with upstream's buckets;
    `migrated` always "false" (klet has no in-tree plugins to migrate to CSI)."""
    histogram = Histogram(
        "csi_operations_seconds",
        "Container Storage Interface operation duration with gRPC error code status total",
        ["driver_name", "method_name", "grpc_status_code", "migrated"],
        registry=registry,
        buckets=STORAGE_OPERATION_BUCKETS,
    )

    def record(driver: str, method: str, code: str, seconds: float) -> None:
        histogram.labels(driver, method, code, "false").observe(max(0.0, seconds))

    return record


DRA_DURATION_BUCKETS = (
    0.1,
    0.1534127404634391,
    0.23535468936502524,
    0.36106407876409946,
    0.5539182980610752,
    0.849781240983936,
    1.303672689737678,
    1.9999999999999993,
    3.0682548092687805,
    4.7070937873005025,
    7.221281575281985,
    11.078365961221499,
    16.995624819678714,
    26.07345379475354,
    39.99999999999997,
)
"""upstream's DRADurationBuckets, ExponentialBucketsRange(0.1, 40, 15): 0.1 s up to 40 s
(below the 45 s deadline of a DRA driver's calls), 0.1 * (400 ** (1/14)) ** i as Go's
math.Pow computes them, so the `le` labels are upstream's to the last digit (Python's
pow differs in the last bits of six of them)."""


def dra_operations(registry: CollectorRegistry) -> Callable[[str, bool, float], None]:
    """upstream's dra_operations_duration_seconds{operation_name, is_error}: each
    PrepareResources / UnprepareResources of a pod's claims (dra.manager.ClaimManager's
    observe). `is_error` as upstream's v1.34 sets it, FormatBool(err == nil): "true" for
    an operation that succeeded, "false" for one that failed (its label name says the
    opposite; kept, so dashboards written against upstream read klet the same)."""
    histogram = Histogram(
        "dra_operations_duration_seconds",
        "Latency histogram in seconds for the duration of handling all ResourceClaims "
        "referenced by a pod when the pod starts or stops",
        ["operation_name", "is_error"],
        registry=registry,
        buckets=DRA_DURATION_BUCKETS,
    )

    def record(operation: str, succeeded: bool, seconds: float) -> None:
        histogram.labels(operation, "true" if succeeded else "false").observe(max(0.0, seconds))

    return record


def dra_grpc_operations(registry: CollectorRegistry) -> Callable[[str, str, str, float], None]:
    """upstream's dra_grpc_operations_duration_seconds{driver_name, method_name,
    grpc_status_code}: every call to a DRA driver (klet.rpc.dra.GrpcDRAPlugin's
    observer), by driver, full gRPC method
    (`/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources`) and grpc-go's
    name of the status code (`OK`, `DeadlineExceeded`, ...)."""
    histogram = Histogram(
        "dra_grpc_operations_duration_seconds",
        "Duration in seconds of the DRA gRPC operations",
        ["driver_name", "method_name", "grpc_status_code"],
        registry=registry,
        buckets=DRA_DURATION_BUCKETS,
    )

    def record(driver: str, method: str, code: str, seconds: float) -> None:
        histogram.labels(driver, method, code).observe(max(0.0, seconds))

    return record


class DRAClaimsInUse(Collector):
    """upstream's dra_resource_claims_in_use{driver_name} gauge, read at each scrape
    from the claim manager (dra.manager.ClaimManager.claims_in_use): per driver, and
    `<any>` for all claims in use, as upstream's claimInfoCollector; a driver whose
    claims are all gone no longer has a series."""

    NAME = "dra_resource_claims_in_use"

    def __init__(
        self, counts: Callable[[], Mapping[str, int]], *, registry: CollectorRegistry
    ) -> None:
        self.counts = counts
        registry.register(self)

    HELP = (
        "The number of ResourceClaims that are currently in use on the node, by driver "
        "name and across all drivers (<any>)"
    )

    def describe(self) -> Iterator[Metric]:
        yield Metric(self.NAME, self.HELP, "gauge")

    def collect(self) -> Iterator[Metric]:
        family = Metric(self.NAME, self.HELP, "gauge")
        for driver, count in sorted(self.counts().items()):
            family.add_sample(self.NAME, {"driver_name": driver}, float(count))
        yield family


def create_metrics(registry: CollectorRegistry, *, started_at: float | None = None) -> Metrics:
    """syncloop's recorders; `started_at` is when the process began (Unix seconds, now
    when not given)."""
    pod_starts = PodStartTracker(
        start=Histogram(
            "kubelet_pod_start_duration_seconds",
            "Seconds from the first sighting of a pod on this node to its first Running status",
            registry=registry,
            buckets=POD_START_BUCKETS,
        ),
        sli=Histogram(
            "kubelet_pod_start_sli_duration_seconds",
            "Seconds from a pod's creation to its first Running status, less the time its "
            "images took to pull",
            registry=registry,
            buckets=POD_START_BUCKETS,
        ),
        total=Histogram(
            "kubelet_pod_start_total_duration_seconds",
            "Seconds from a pod's creation to the first status in which all its containers "
            "run, image pulls and init containers included",
            registry=registry,
            buckets=POD_START_BUCKETS,
        ),
    )
    return Metrics(
        started_at=time.time() if started_at is None else started_at,
        pod_starts=pod_starts,
        image_pulls=ImagePullMetrics(
            duration=Histogram(
                "kubelet_image_pull_duration_seconds",
                "Seconds a successful image pull took, the wait for a pull slot included, "
                "by image size",
                ["image_size_in_bytes"],
                registry=registry,
                buckets=IMAGE_PULL_BUCKETS,
            ),
            starts=pod_starts,
        ),
        starts=StartMetrics(
            pods=Counter("kubelet_started_pods", "Pod sandbox creations tried", registry=registry),
            pod_errors=Counter(
                "kubelet_started_pods_errors",
                "Pod sandbox creations that failed",
                registry=registry,
            ),
            containers=Counter(
                "kubelet_started_containers",
                "Container starts tried, by container type",
                ["container_type"],
                registry=registry,
            ),
            container_errors=Counter(
                "kubelet_started_containers_errors",
                "Container starts that failed, by container type and error code",
                ["container_type", "code"],
                registry=registry,
            ),
        ),
        cgroup_manager_duration=Histogram(
            "kubelet_cgroup_manager_duration_seconds",
            "Seconds pod cgroup operations took, by operation",
            ["operation_type"],
            registry=registry,
            buckets=DEF_BUCKETS,
        ),
        running_pods=Gauge(
            "kubelet_running_pods",
            "Pods whose sandbox is running on this node",
            registry=registry,
        ),
        pod_workers=Gauge("klet_syncloop_pod_workers", "Pod workers alive", registry=registry),
        working_pods=Gauge(
            "kubelet_working_pods",
            "Pods with a pod worker, by lifecycle phase, whether a source still wants them "
            "(desired, orphan, runtime_only) and whether they are static",
            ["lifecycle", "config", "static"],
            registry=registry,
        ),
        pleg_relists=RelistMetrics(
            duration=Histogram(
                "kubelet_pleg_relist_duration_seconds",
                "Seconds one PLEG relist of the runtime took",
                registry=registry,
                buckets=DEF_BUCKETS,
            ),
            interval=Histogram(
                "kubelet_pleg_relist_interval_seconds",
                "Seconds from the start of the previous PLEG relist to the start of this one",
                registry=registry,
                buckets=DEF_BUCKETS,
            ),
        ),
        pleg_last_seen=Gauge(
            "kubelet_pleg_last_seen_seconds",
            "Unix time of the last completed PLEG relist",
            registry=registry,
        ),
        pod_worker_duration=Histogram(
            "kubelet_pod_worker_duration_seconds",
            "Seconds one pod worker sync took, by operation type (create, update, sync, kill, "
            "terminated)",
            ["operation_type"],
            registry=registry,
            buckets=DEF_BUCKETS,
        ),
        pod_worker_start=Histogram(
            "kubelet_pod_worker_start_duration_seconds",
            "Seconds from this node first seeing a pod to its pod worker's first sync",
            registry=registry,
            buckets=DEF_BUCKETS,
        ),
        containers_per_pod=Histogram(
            "kubelet_containers_per_pod_count",
            "The number of containers per pod.",
            registry=registry,
            buckets=(1, 2, 4, 8, 16),
        ),
        restarted_pods=Counter(
            "kubelet_restarted_pods",
            "Pods desired again under the same UID while their worker was removing them, "
            "by whether they are static",
            ["static"],
            registry=registry,
        ),
        sleeps_cut_short=Counter(
            "kubelet_sleep_action_terminated_early",
            "The number of times lifecycle sleep handler got terminated before it finishes",
            registry=registry,
        ),
        http_fallbacks=Counter(
            "kubelet_lifecycle_handler_http_fallbacks",
            "HTTPS httpGet lifecycle hooks answered in plain HTTP and delivered over HTTP",
            registry=registry,
        ),
        preemptions=UnsuffixedCounter(
            "kubelet_preemptions",
            "Pods killed to admit a critical pod, by the resource they were preempted for",
            ["preemption_signal"],
            registry=registry,
        ),
        orphaned_runtime_pods=Counter(
            "kubelet_orphaned_runtime_pods",
            "Pods found in the container runtime that no source wanted in this process",
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
            connections=UnsuffixedCounter(
                "kubelet_evented_pleg_connection_success_count",
                "The number of times a streaming client was obtained to receive CRI Events.",
                registry=registry,
            ),
            connection_errors=UnsuffixedCounter(
                "kubelet_evented_pleg_connection_error_count",
                "The number of errors encountered during the establishment of streaming "
                "connection with the CRI runtime.",
                registry=registry,
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


class ResizeMetrics:
    """upstream's in-place resize metrics (pkg/kubelet/metrics), for pods/resizing.py:
    kubelet_container_requested_resizes_total{resource,requirement,operation},
    kubelet_pod_resize_duration_milliseconds{success},
    kubelet_pod_pending_resizes{reason}, kubelet_pod_infeasible_resizes_total
    {reason_detail}, kubelet_pod_in_progress_resizes and
    kubelet_pod_deferred_accepted_resizes_total{retry_trigger}."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._requested = Counter(
            "kubelet_container_requested_resizes_total",
            "Number of requested resizes, counted at the container level",
            ["resource", "requirement", "operation"],
            registry=registry,
        )
        self._duration = Histogram(
            "kubelet_pod_resize_duration_milliseconds",
            "Duration in milliseconds to actuate a pod resize",
            ["success"],
            registry=registry,
            buckets=(
                10,
                50,
                100,
                500,
                1000,
                2000,
                5000,
                10000,
                20000,
                30000,
                60000,
                120000,
                300000,
                600000,
            ),
        )
        self._pending = Gauge(
            "kubelet_pod_pending_resizes",
            "Number of pending resizes for pods",
            ["reason"],
            registry=registry,
        )
        self._infeasible = Counter(
            "kubelet_pod_infeasible_resizes_total",
            "Number of infeasible resizes for pods",
            ["reason_detail"],
            registry=registry,
        )
        self._in_progress = Gauge(
            "kubelet_pod_in_progress_resizes",
            "Number of in-progress resizes for pods",
            registry=registry,
        )
        self._deferred_accepted = Counter(
            "kubelet_pod_deferred_accepted_resizes_total",
            "Cumulative number of resizes that were accepted after being deferred",
            ["retry_trigger"],
            registry=registry,
        )

    def requested(self, change: Any) -> None:
        self._requested.labels(change.resource, change.requirement, change.operation).inc()

    def infeasible(self, reason_detail: str) -> None:
        self._infeasible.labels(reason_detail).inc()

    def deferred_accepted(self, trigger: str) -> None:
        self._deferred_accepted.labels(trigger).inc()

    def duration(self, seconds: float, *, success: bool) -> None:
        self._duration.labels(str(success).lower()).observe(max(0.0, seconds) * 1000)

    def counts(self, pending: Mapping[str, int], in_progress: int) -> None:
        self._pending.clear()
        for reason, count in pending.items():
            self._pending.labels(reason).set(count)
        self._in_progress.set(in_progress)


@dataclass(frozen=True)
class DeviceMetrics:
    """The device manager's two upstream series (devices/manager.py's DeviceObserver)."""

    registrations: Counter
    allocations: Histogram

    @classmethod
    def create(cls, registry: CollectorRegistry) -> DeviceMetrics:
        return cls(
            registrations=Counter(
                "kubelet_device_plugin_registration",
                "Device plugin registrations, by resource name",
                ["resource_name"],
                registry=registry,
            ),
            allocations=Histogram(
                "kubelet_device_plugin_alloc_duration_seconds",
                "Seconds a device plugin took to answer Allocate, by resource name",
                ["resource_name"],
                registry=registry,
                buckets=DEF_BUCKETS,
            ),
        )

    def registered(self, resource: str) -> None:
        self.registrations.labels(resource).inc()

    def allocated(self, resource: str, seconds: float) -> None:
        self.allocations.labels(resource).observe(seconds)


class UnsuffixedCounter(Collector):
    """A counter upstream names without `_total` (client_golang leaves a counter's name
    as given), served under that exact name.

    prometheus_client renames every counter family to `<name>_total` in the text
    exposition, and its parser reads a `# TYPE x counter` family only through
    `x_total` samples; so the one way to give operators upstream's series
    (`kubelet_pod_resources_endpoint_requests_list{server_api_version="v1"} 3`) is to
    serve the family untyped: the samples are upstream's names and values, only the
    TYPE line says `untyped` where upstream's says `counter` (PromQL's rate() and
    increase() take either). It only goes up, as a counter."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        registry: CollectorRegistry,
    ) -> None:
        self.name, self.documentation = name, documentation
        self.labelnames = tuple(labelnames)
        self._values: dict[tuple[str, ...], float] = {}
        self._lock = threading.Lock()  # a scrape may run in another thread
        registry.register(self)

    def inc(self, *labelvalues: str, amount: float = 1.0) -> None:
        """Add `amount` (0 makes the series exist) to the series of `labelvalues`."""
        if len(labelvalues) != len(self.labelnames):
            raise ValueError(f"{self.name}: labels {self.labelnames}, given {labelvalues}")
        if amount < 0:
            raise ValueError(f"{self.name}: a counter cannot go down ({amount})")
        with self._lock:
            self._values[labelvalues] = self._values.get(labelvalues, 0.0) + amount

    def value(self, *labelvalues: str) -> float | None:
        with self._lock:
            return self._values.get(labelvalues)

    def describe(self) -> Iterator[Metric]:
        yield Metric(self.name, self.documentation, "unknown")

    def collect(self) -> Iterator[Metric]:
        family = Metric(self.name, self.documentation, "unknown")
        with self._lock:
            for values, value in self._values.items():
                family.add_sample(self.name, dict(zip(self.labelnames, values, strict=True)), value)
        yield family


PODRESOURCES_METHODS = {
    "List": "list",
    "Get": "get",
    "GetAllocatableResources": "get_allocatable",
}
"""The v1 API's methods and upstream's suffix of their per-method series."""


@dataclass(frozen=True)
class PodResourcesMetrics:
    """The PodResources API's upstream series, by API version ("v1", the one klet
    serves), each at 0 from when the leader serves: every call its rate limit let
    through (kubelet_pod_resources_endpoint_requests_total), the same per method
    (kubelet_pod_resources_endpoint_requests_{list,get,get_allocatable}), and the calls
    answered with an error per method (kubelet_pod_resources_endpoint_errors_*: only
    Get's disabled gate and unknown pod, as upstream, whose List and
    GetAllocatableResources never fail). The per-method ones are counters upstream
    names without `_total` (UnsuffixedCounter)."""

    requests: Counter
    per_method: Mapping[str, UnsuffixedCounter]
    errors: Mapping[str, UnsuffixedCounter]

    @classmethod
    def create(cls, registry: CollectorRegistry) -> PodResourcesMetrics:
        requests = Counter(
            "kubelet_pod_resources_endpoint_requests",
            "Calls to the PodResources API the rate limit let through, by API version",
            ["server_api_version"],
            registry=registry,
        )
        requests.labels("v1")

        def counter(kind: str, method: str, suffix: str) -> UnsuffixedCounter:
            made = UnsuffixedCounter(
                f"kubelet_pod_resources_endpoint_{kind}_{suffix}",
                f"Calls to the PodResources {method} endpoint"
                + (" answered with an error" if kind == "errors" else "")
                + ", by API version",
                ["server_api_version"],
                registry=registry,
            )
            made.inc("v1", amount=0)
            return made

        return cls(
            requests=requests,
            per_method={m: counter("requests", m, s) for m, s in PODRESOURCES_METHODS.items()},
            errors={m: counter("errors", m, s) for m, s in PODRESOURCES_METHODS.items()},
        )

    def request(self, method: str) -> None:
        """One call of `method` (List, Get, GetAllocatableResources) of the v1 API."""
        self.requests.labels("v1").inc()
        self.per_method[method].inc("v1")

    def error(self, method: str) -> None:
        """One call of `method` of the v1 API answered with an error."""
        self.errors[method].inc("v1")


@dataclass(frozen=True)
class AlignedComputeMetrics:
    """Upstream's kubelet_container_aligned_compute_resources_count and _failure_count
    {scope, boundary}: allocations the CPU manager (`container` scope, boundary
    `physical_cpu` under full-pcpus-only) and the topology manager (`container` or `pod`
    scope, boundary `numa_node` under single-numa-node) made aligned, and those that
    could not be. Counters upstream names without `_total` (UnsuffixedCounter). Both
    managers count into the one pair of families of a registry (`aligned_compute`)."""

    aligned: UnsuffixedCounter
    failed: UnsuffixedCounter

    def count(self, scope: str, boundary: str, *, failed: bool, amount: int = 1) -> None:
        """`amount` more (0 makes the series exist, as upstream's Add(0) at start)."""
        (self.failed if failed else self.aligned).inc(scope, boundary, amount=amount)


_ALIGNED: weakref.WeakKeyDictionary[CollectorRegistry, AlignedComputeMetrics] = (
    weakref.WeakKeyDictionary()
)


def aligned_compute(registry: CollectorRegistry) -> AlignedComputeMetrics:
    """The registry's one AlignedComputeMetrics (made at the first call)."""
    made = _ALIGNED.get(registry)
    if made is None:
        labels = ["scope", "boundary"]
        made = _ALIGNED[registry] = AlignedComputeMetrics(
            aligned=UnsuffixedCounter(
                "kubelet_container_aligned_compute_resources_count",
                "Cumulative number of aligned compute resources allocated to containers by "
                "alignment type.",
                labels,
                registry=registry,
            ),
            failed=UnsuffixedCounter(
                "kubelet_container_aligned_compute_resources_failure_count",
                "Cumulative number of failures to allocate aligned compute resources to "
                "containers by alignment type.",
                labels,
                registry=registry,
            ),
        )
    return made


@dataclass(frozen=True)
class CPUManagerMetrics:
    """Upstream's CPU manager series (cpumanager/manager.py's CPUObserver): the
    containers that asked for exclusive CPUs and those refused, the shared pool's size,
    the exclusive CPUs given out, and those per NUMA node; and its aligned allocations
    (AlignedComputeMetrics, `container` scope)."""

    requests: Counter
    errors: Counter
    shared: Gauge
    exclusive: Gauge
    per_numa: Gauge
    alignment: AlignedComputeMetrics

    @classmethod
    def create(cls, registry: CollectorRegistry) -> CPUManagerMetrics:
        return cls(
            alignment=aligned_compute(registry),
            requests=Counter(
                "kubelet_cpu_manager_pinning_requests",
                "The number of cpu core allocations which required pinning.",
                registry=registry,
            ),
            errors=Counter(
                "kubelet_cpu_manager_pinning_errors",
                "The number of cpu core allocations which required pinning failed.",
                registry=registry,
            ),
            shared=Gauge(
                "kubelet_cpu_manager_shared_pool_size_millicores",
                "The size of the shared CPU pool for non-guaranteed QoS pods, in millicores.",
                registry=registry,
            ),
            exclusive=Gauge(
                "kubelet_cpu_manager_exclusive_cpu_allocation_count",
                "The total number of CPUs exclusively allocated to containers running on this node",
                registry=registry,
            ),
            per_numa=Gauge(
                "kubelet_cpu_manager_allocation_per_numa",
                "Number of CPUs allocated per NUMA node",
                ["numa_node"],
                registry=registry,
            ),
        )

    def pinning(self, *, requested: int, failed: int) -> None:
        self.requests.inc(requested)
        self.errors.inc(failed)

    def pool(self, *, shared_millicores: int, exclusive: int, per_numa: Mapping[int, int]) -> None:
        self.shared.set(shared_millicores)
        self.exclusive.set(exclusive)
        for node, count in per_numa.items():
            self.per_numa.labels(str(node)).set(count)

    def aligned(self, boundary: str, *, failed: bool, amount: int = 1) -> None:
        self.alignment.count("container", boundary, failed=failed, amount=amount)


@dataclass(frozen=True)
class NUMAMetrics:
    """Upstream's memory manager and topology manager series (numaalignment.Observer):
    Guaranteed containers' memory pinnings and those refused; every admission the
    topology manager decided, how long it took (milliseconds, upstream's buckets), and
    those it refused; and its aligned allocations (AlignedComputeMetrics, `numa_node`).
    """

    pin_requests: Counter
    pin_errors: Counter
    admissions: Counter
    admission_errors: Counter
    admission_ms: Histogram
    alignment: AlignedComputeMetrics

    @classmethod
    def create(cls, registry: CollectorRegistry) -> NUMAMetrics:
        return cls(
            alignment=aligned_compute(registry),
            pin_requests=Counter(
                "kubelet_memory_manager_pinning_requests",
                "The number of memory pages allocations which required pinning.",
                registry=registry,
            ),
            pin_errors=Counter(
                "kubelet_memory_manager_pinning_errors",
                "The number of memory pages allocations which required pinning that failed.",
                registry=registry,
            ),
            admissions=Counter(
                "kubelet_topology_manager_admission_requests",
                "The number of admission requests where resources have to be aligned.",
                registry=registry,
            ),
            admission_errors=Counter(
                "kubelet_topology_manager_admission_errors",
                "The number of admission request failures where resources could not be aligned.",
                registry=registry,
            ),
            admission_ms=Histogram(
                "kubelet_topology_manager_admission_duration_ms",
                "Duration in milliseconds to serve a pod admission request.",
                buckets=[0.05 * 2**i for i in range(15)],
                registry=registry,
            ),
        )

    def pinning(self, *, failed: bool) -> None:
        self.pin_requests.inc()
        if failed:
            self.pin_errors.inc()

    def admission(self, *, seconds: float, error: bool) -> None:
        self.admissions.inc()
        self.admission_ms.observe(seconds * 1000)
        if error:
            self.admission_errors.inc()

    def aligned(self, scope: str, *, failed: bool, amount: int = 1) -> None:
        self.alignment.count(scope, "numa_node", failed=failed, amount=amount)


@dataclass(frozen=True)
class CredentialProviderMetrics:
    """Upstream's two series of credential provider plugin runs
    (containers/credentialplugins.py's PluginObserver): every run's duration, and the
    runs that failed to execute, exited non-zero or timed out."""

    duration: Histogram
    errors: Counter
    config_info: Gauge

    @classmethod
    def create(cls, registry: CollectorRegistry, *, config_hash: str) -> CredentialProviderMetrics:
        info = Gauge(
            "kubelet_credential_provider_config_info",
            "Information about the last applied credential provider configuration with "
            "hash as label",
            ["hash"],
            registry=registry,
        )
        info.labels(config_hash).set(1)
        return cls(
            config_info=info,
            duration=Histogram(
                "kubelet_credential_provider_plugin_duration",
                "Duration of execution in seconds for credential provider plugin",
                ["plugin_name"],
                registry=registry,
                buckets=DEF_BUCKETS,
            ),
            errors=Counter(
                "kubelet_credential_provider_plugin_errors",
                "Number of errors from credential provider plugin",
                ["plugin_name"],
                registry=registry,
            ),
        )

    def plugin_ran(self, name: str, *, seconds: float, failed: bool) -> None:
        self.duration.labels(name).observe(seconds)
        if failed:
            self.errors.labels(name).inc()
