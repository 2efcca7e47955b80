"""The status-reporter's Prometheus metrics, on a registry the caller provides.

Upstream names where upstream has the metric (`kubelet_node_name{node}`,
`kubelet_running_pods`, `kubelet_running_containers{container_state}`,
`kubelet_desired_pods{static}`, `kubelet_active_pods{static}`, `kubelet_mirror_pods`,
`kubelet_pod_status_sync_duration_seconds`, `kubelet_managed_ephemeral_containers`,
`kubelet_cgroup_version`,
`kubernetes_build_info`,
`kubernetes_feature_enabled{name,stage}`),
`klet_status_reporter_*` for our own.

`kubernetes_build_info` and `kubernetes_feature_enabled` describe the node's kubelet, so
one service serves them: this one, which also reports the node's kubeletVersion. The
build's git_version is that kubeletVersion (`v1.34.4-klet`); klet is Python, so go_version
is empty and compiler names the Python implementation (upstream's Go build says `gc`).
Every gate of upstream's table has its series, 1 when on for klet (klet.config.gates:
as set, else klet's default), with upstream's stage label (empty for GA).

Trade-off: upstream counts running pods and containers from the container runtime; we
count them from the API statuses syncloop computed (the view this service already
holds), so the numbers lag the runtime by one status report and cannot see containers
the API status does not mention. Mapping from an API container state:

- `running` → running; `terminated` → exited;
- `waiting` with a `lastState.terminated` → exited (the dead previous instance is kept
  by the runtime until garbage collection, which is what upstream counts);
- `waiting` without a reason → created (the kubelet reports a created-but-not-started
  container as an empty waiting state); any other waiting reason (ContainerCreating,
  ErrImagePull, ...) means no container exists yet and is not counted.

The gauges are recomputed whenever the view changes rather than at scrape time, so a
scrape never touches the view's locks or the bus. The view age is the exception: it is
computed at scrape time from the last successful reload, so it keeps growing while the
bus is down, which is the point of it.
"""

from __future__ import annotations

import math
import os
import platform
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from klet.config import gates as gate_table
from klet.model.pod import API_SOURCE, config_source
from klet.model.types import JSON
from klet.obs.metrics import DEF_BUCKETS
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import Metric

CONTAINER_STATES = ("created", "running", "exited")


@dataclass(frozen=True)
class RunningCounts:
    """What the running gauges show for one view."""

    pods: int
    containers: dict[str, int]


def container_state(cs: JSON) -> str | None:
    """The upstream container_state label of one API ContainerStatus, or None."""
    state = cs.get("state") or {}
    if "running" in state:
        return "running"
    if "terminated" in state:
        return "exited"
    if "waiting" in state:
        if "terminated" in (cs.get("lastState") or {}):
            return "exited"
        if not (state.get("waiting") or {}).get("reason"):
            return "created"
    return None


@dataclass(frozen=True)
class PodCounts:
    """kubelet_desired_pods and kubelet_active_pods by their `static` label ("" or "true"),
    and kubelet_managed_ephemeral_containers: the desired pods' ephemeral containers."""

    desired: dict[str, int]
    active: dict[str, int]
    ephemeral_containers: int = 0


TERMINAL_PHASES = ("Succeeded", "Failed")


def count_pods(pods: Iterable[tuple[JSON, str | None]]) -> PodCounts:
    """Desired pods and the active ones among them, by whether they are static: each
    pod with its latest status phase (None before syncloop reported one). As upstream, a
    pod is active until it is terminal (Succeeded or Failed, a rejected one included);
    a static pod is one a source other than the apiserver delivered."""
    desired = {"": 0, "true": 0}
    active = {"": 0, "true": 0}
    ephemeral = 0
    for pod, phase in pods:
        static = "" if config_source(pod) == API_SOURCE else "true"
        desired[static] += 1
        if phase not in TERMINAL_PHASES:
            active[static] += 1
        ephemeral += len((pod.get("spec") or {}).get("ephemeralContainers") or ())
    return PodCounts(desired=desired, active=active, ephemeral_containers=ephemeral)


def _all_container_statuses(status: JSON) -> Iterable[JSON]:
    for key in ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses"):
        for cs in status.get(key) or ():
            if isinstance(cs, dict):
                yield cs


def count_running(statuses: Iterable[JSON]) -> RunningCounts:
    """Running pods (phase Running or any running container) and containers by state."""
    pods = 0
    containers = dict.fromkeys(CONTAINER_STATES, 0)
    for status in statuses:
        states = [container_state(cs) for cs in _all_container_statuses(status)]
        if status.get("phase") == "Running" or "running" in states:
            pods += 1
        for state in states:
            if state is not None:
                containers[state] += 1
    return RunningCounts(pods=pods, containers=containers)


RENEW_ERRORS = {
    "client": "kubelet_certificate_manager_client_expiration_renew_errors",
    "server": "kubelet_server_expiration_renew_errors",
}
"""upstream's counters of failed renewals, by certificate kind."""


SERVER_ROTATION_BUCKETS = (
    60.0,  # a minute
    3600.0,  # an hour
    14400.0,
    86400.0,  # a day
    604800.0,  # a week
    2592000.0,  # 30 days
    7776000.0,
    15552000.0,
    31104000.0,  # 360 days
    124416000.0,
)
"""upstream's buckets of kubelet_certificate_manager_server_rotation_seconds."""


class CertificateMetrics:
    """upstream's certificate manager metrics, for the certificates klet rotates:
    kubelet_certificate_manager_{client,server}_ttl_seconds, the seconds until the
    current client or serving certificate expires (negative once it has, truncated to
    whole seconds, +Inf while none has been read: upstream's "invalid or unused"),
    computed at each scrape from what the rotation tasks last read
    (klet.kube.rotation); its renewal failure counters (RENEW_ERRORS); and
    kubelet_certificate_manager_server_rotation_seconds, how long each replaced serving
    certificate had lived (from its notBefore). A kind's series exist from `rotating`
    on, which the cluster wiring calls for each certificate it rotates
    (rotateCertificates: client; serverTLSBootstrap: server), as upstream registers
    them only then. The counters keep upstream's names, which lack `_total`:
    prometheus-client would add it to a counter (and tie the TYPE line to that name),
    so they are served untyped, as eviction's kubelet_evictions is."""

    def __init__(
        self, registry: CollectorRegistry, *, clock: Callable[[], float] = time.time
    ) -> None:
        self._clock = clock
        self._expiry: dict[str, float] = {}
        self._registry = registry
        self._gauges: dict[str, Gauge] = {}
        self._failures: dict[str, int] = {}
        self._server_rotation: Histogram | None = None
        registry.register(self)

    def rotating(self, kind: str) -> None:
        """`kind`'s certificate ("client" or "server") is rotated: serve its series."""
        self._failures.setdefault(kind, 0)
        if kind not in self._gauges:
            gauge = Gauge(
                f"kubelet_certificate_manager_{kind}_ttl_seconds",
                f"Seconds until the kubelet's {kind} certificate expires (negative once it "
                "has; +Inf while there is none).",
                registry=self._registry,
            )
            gauge.set_function(lambda: self._ttl(kind))
            self._gauges[kind] = gauge
        if kind == "server" and self._server_rotation is None:
            self._server_rotation = Histogram(
                "kubelet_certificate_manager_server_rotation_seconds",
                "Seconds the previous serving certificate lived before being rotated.",
                buckets=SERVER_ROTATION_BUCKETS,
                registry=self._registry,
            )

    def _ttl(self, kind: str) -> float:
        expiry = self._expiry.get(kind)
        return math.inf if expiry is None else float(math.trunc(expiry - self._clock()))

    def issued(self, kind: str, not_after: float) -> None:
        """`kind` ("client" or "server") now expires at `not_after` (Unix time)."""
        self.rotating(kind)
        self._expiry[kind] = not_after

    def rotated(self, kind: str, lived_s: float) -> None:
        """A new `kind` certificate replaced one that had lived `lived_s` seconds."""
        if kind != "server":
            return  # upstream times the serving certificate's rotations only
        self.rotating(kind)
        if self._server_rotation is not None:
            self._server_rotation.observe(lived_s)

    def renew_failed(self, kind: str) -> None:
        """A renewal of `kind`'s certificate failed (refused, denied, not answered)."""
        self._failures[kind] = self._failures.get(kind, 0) + 1

    def collect(self) -> Iterator[Metric]:
        for kind, count in sorted(self._failures.items()):
            name = RENEW_ERRORS[kind]
            metric = Metric(
                name, f"Failed renewals of the kubelet's {kind} certificate.", "unknown"
            )
            metric.add_sample(name, {}, float(count))
            yield metric


class Metrics:
    """All of the service's metrics, registered on `registry` at construction."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        clock: Callable[[], float] = time.monotonic,
        node_name: str = "",
    ) -> None:
        self._clock = clock
        self._last_reload: float = clock()
        # upstream's kubelet_node_name{node} (pkg/kubelet/metrics): always 1, so a
        # dashboard counts the kubelets it scrapes and joins their node names.
        self.node_name = Gauge(
            "kubelet_node_name",
            "1, labelled with this node's name.",
            ["node"],
            registry=registry,
        )
        if node_name:
            self.node_name.labels(node=node_name).set(1)
        self.running_pods = Gauge(
            "kubelet_running_pods",
            "Pods on this node whose sandbox is running, from the latest reported statuses.",
            registry=registry,
        )
        self.running_containers = Gauge(
            "kubelet_running_containers",
            "Containers on this node by state, from the latest reported statuses.",
            ["container_state"],
            registry=registry,
        )
        self.bus_errors = Counter(
            "klet_status_reporter_bus_errors",
            "Failed reads or acknowledgements on the Redis bus.",
            registry=registry,
        )
        self.view_age = Gauge(
            "klet_status_reporter_view_age_seconds",
            "Seconds since the pod view was last fully reloaded from the bus "
            "(since start-up if it never was).",
            registry=registry,
        )
        self.view_age.set_function(lambda: self._clock() - self._last_reload)
        # upstream's pod manager gauges (pkg/kubelet/metrics), from the desired pods
        self.desired_pods = Gauge(
            "kubelet_desired_pods",
            "The number of pods the kubelet is being instructed to run. static is true if "
            "the pod is not from the apiserver.",
            ["static"],
            registry=registry,
        )
        self.active_pods = Gauge(
            "kubelet_active_pods",
            "The number of pods the kubelet considers active and which are being "
            "considered when admitting new pods. static is true if the pod is not from "
            "the apiserver.",
            ["static"],
            registry=registry,
        )
        self.ephemeral_containers = Gauge(
            "kubelet_managed_ephemeral_containers",
            "Current number of ephemeral containers in pods managed by this kubelet.",
            registry=registry,
        )
        # upstream's count of the pod manager's mirror pods: those the apiserver holds for
        # this node's static pods, as the pod sync manager last listed and reconciled
        # them (cluster mode; 0 standalone, as upstream's)
        self.mirror_pods = Gauge(
            "kubelet_mirror_pods",
            "The number of mirror pods the kubelet will try to create (one per admitted "
            "static pod)",
            registry=registry,
        )
        # upstream's status manager latency: from the first status change not yet on the
        # apiserver (syncloop's computation of it) to the PATCH that carried it
        self.pod_status_sync = Histogram(
            "kubelet_pod_status_sync_duration_seconds",
            "Duration in seconds to sync a pod status update, from the first change not yet "
            "sent until the apiserver took it",
            registry=registry,
            buckets=(0.010, 0.050, 0.100, 0.500, 1, 5, 10, 20, 30, 45, 60),
        )
        # Every state series exists from the start, so a dashboard sees 0, not "no data".
        for state in CONTAINER_STATES:
            self.running_containers.labels(container_state=state).set(0)
        self.observe_pods(())

    def reloaded(self) -> None:
        self._last_reload = self._clock()

    def bus_error(self) -> None:
        self.bus_errors.inc()

    def observe_pods(self, pods: Iterable[tuple[JSON, str | None]]) -> None:
        """The desired pods, each with its latest status phase (None: none yet)."""
        counts = count_pods(pods)
        for static, n in counts.desired.items():
            self.desired_pods.labels(static=static).set(n)
        for static, n in counts.active.items():
            self.active_pods.labels(static=static).set(n)
        self.ephemeral_containers.set(counts.ephemeral_containers)

    def observe(self, statuses: Iterable[JSON]) -> None:
        counts = count_running(statuses)
        self.running_pods.set(counts.pods)
        for state, n in counts.containers.items():
            self.running_containers.labels(container_state=state).set(n)


BUILD_LABELS = (
    "major",
    "minor",
    "git_version",
    "git_commit",
    "git_tree_state",
    "build_date",
    "go_version",
    "compiler",
    "platform",
)
_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le"}


def build_info_labels(*, version: str, system: str, machine: str, compiler: str) -> dict[str, str]:
    """upstream's kubernetes_build_info labels for a kubelet reporting `version`
    (`v1.34.4-klet`) on `system`/`machine` (os.uname's), built by `compiler`."""
    major, minor = version.removeprefix("v").split(".")[:2]
    return {
        "major": major,
        "minor": minor,
        "git_version": version,
        "git_commit": "",
        "git_tree_state": "",
        "build_date": "",
        "go_version": "",
        "compiler": compiler,
        "platform": f"{system.lower()}/{_ARCH.get(machine, machine)}",
    }


def feature_series(gates: Mapping[str, bool]) -> list[tuple[str, str, float]]:
    """(name, stage, value) of kubernetes_feature_enabled for every gate upstream's kubelet
    knows: stage as upstream's label (GA is ""), value 1 when the gate is on for klet."""
    return [
        (name, "" if stage == "GA" else stage, 1.0 if gate_table.enabled(gates, name) else 0.0)
        for name, (_, stage, _) in sorted(gate_table.GATES.items())
    ]


def register_build_and_features(
    registry: CollectorRegistry, *, version: str, gates: Mapping[str, bool]
) -> None:
    """Register kubernetes_build_info (1, labelled) and kubernetes_feature_enabled."""
    uname = os.uname()
    build = Gauge(
        "kubernetes_build_info",
        "A metric with a constant '1' value labeled by major, minor, git version, git commit, "
        "git tree state, build date, Go version, and compiler from which Kubernetes was "
        "built, and platform on which it is running.",
        BUILD_LABELS,
        registry=registry,
    )
    labels = build_info_labels(
        version=version,
        system=uname.sysname,
        machine=uname.machine,
        compiler=platform.python_implementation().lower(),
    )
    build.labels(**labels).set(1)
    enabled = Gauge(
        "kubernetes_feature_enabled",
        "This metric records the data about the stage and enablement of a k8s feature.",
        ["name", "stage"],
        registry=registry,
    )
    for name, stage, value in feature_series(gates):
        enabled.labels(name=name, stage=stage).set(value)


def register_cgroup_version(registry: CollectorRegistry, version: int) -> None:
    """upstream's kubelet_cgroup_version: the host's cgroup version (1 or 2), as the
    kubelet sets it once at start."""
    Gauge("kubelet_cgroup_version", "cgroup version on the hosts.", registry=registry).set(version)


REVIEWS = ("TokenReview", "SubjectAccessReview")


class HttpRequestMetrics:
    """upstream's kubelet server metrics, one set for both of its listeners (the kubelet
    API, server_type readwrite, and the read-only port, readonly), as upstream's are
    global: `kubelet_http_requests_total`, `kubelet_http_requests_duration_seconds`
    (DefBuckets) and `kubelet_http_inflight_requests` by (method, path, server_type,
    long_running), labelled by kubeletapi.requestmetrics."""

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ["method", "path", "server_type", "long_running"]
        self._requests = Counter(
            "kubelet_http_requests",
            "Number of the http requests received since the server started",
            labels,
            registry=registry,
        )
        self._duration = Histogram(
            "kubelet_http_requests_duration_seconds",
            "Duration in seconds to serve http requests",
            labels,
            registry=registry,
            buckets=DEF_BUCKETS,
        )
        self._inflight = Gauge(
            "kubelet_http_inflight_requests",
            "Number of the inflight http requests",
            labels,
            registry=registry,
        )

    def started(self, labels: tuple[str, str, str, str]) -> None:
        """A request labelled (method, path, server_type, long_running) is let in."""
        self._requests.labels(*labels).inc()
        self._inflight.labels(*labels).inc()

    def done(self, labels: tuple[str, str, str, str], seconds: float) -> None:
        """The request is answered (or its stream closed) after `seconds`."""
        self._inflight.labels(*labels).dec()
        self._duration.labels(*labels).observe(max(0.0, seconds))


class KubeletApiMetrics:
    """What the kubelet API's listener refused (port 10250), registered on `registry` at
    construction. klet's own: upstream's kubelet has no connection caps to count.

    Refusal reasons are klet.status_reporter.kubeletapi.connlimits.REFUSALS; every
    series exists from the start, so an alert on a rate sees 0, not "no data".

    And upstream's delegated authentication and authorization series: every TokenReview
    (`apiserver_delegated_authn_request_total{code}`, `..._duration_seconds{code}`) and
    SubjectAccessReview (`apiserver_delegated_authz_...`) the listener's gate sends, by
    the HTTP status code of the answer or "<error>", and the client certificates' time
    left (`apiserver_client_certificate_expiration_seconds`; kubeletapi.authn.ReviewObserver);
    and the token cache's `authentication_token_cache_*` (kubeletapi.authn.TokenCacheObserver);
    and upstream's `kubelet_http_requests_total`, `kubelet_http_requests_duration_seconds`
    and `kubelet_http_inflight_requests` of every request (server.py, labelled by
    kubeletapi.requestmetrics).
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        refusals: Iterable[str],
        http: HttpRequestMetrics | None = None,
    ) -> None:
        self.refused = Counter(
            "klet_kubelet_api_connections_refused",
            "Connections to the kubelet API closed at accept, unanswered, by the cap reached.",
            ["reason"],
            registry=registry,
        )
        self.evicted = Counter(
            "klet_kubelet_api_connections_evicted",
            "Unauthenticated kubelet API connections closed to give their place to a client "
            "holding fewer.",
            registry=registry,
        )
        self.open = Gauge(
            "klet_kubelet_api_connections",
            "Open kubelet API connections, by whether a request on them was let through yet.",
            ["state"],
            registry=registry,
        )
        self.reviews_rejected = Counter(
            "klet_kubelet_api_reviews_rejected",
            "Kubelet API requests answered 429 because every slot for their review was busy "
            "and the queue full.",
            ["review"],
            registry=registry,
        )
        for reason in refusals:
            self.refused.labels(reason=reason)
        for state in ("authenticated", "unauthenticated"):
            self.open.labels(state=state)
        for review in REVIEWS:
            self.reviews_rejected.labels(review=review)
        self._delegated = {
            kind: (
                Counter(
                    f"apiserver_delegated_{kind}_request",
                    "Number of HTTP requests partitioned by status code.",
                    ["code"],
                    registry=registry,
                ),
                Histogram(
                    f"apiserver_delegated_{kind}_request_duration_seconds",
                    "Request latency in seconds. Broken down by status code.",
                    ["code"],
                    registry=registry,
                    buckets=(0.25, 0.5, 0.7, 1, 1.5, 3, 5, 10),
                ),
            )
            for kind in ("authn", "authz")
        }
        # upstream's cached token authenticator (kubeletapi.authn.TokenCacheObserver)
        self._token_latency = Histogram(
            "authentication_token_cache_request_duration_seconds",
            "Seconds a bearer token's lookup in the token cache took, by hit or miss",
            ["status"],
            registry=registry,
            buckets=DEF_BUCKETS,
        )
        self._token_requests = Counter(
            "authentication_token_cache_request",
            "Bearer token lookups in the token cache, by hit or miss",
            ["status"],
            registry=registry,
        )
        self._token_fetches = Counter(
            "authentication_token_cache_fetch",
            "TokenReviews the token cache made, by outcome (ok, error)",
            ["status"],
            registry=registry,
        )
        self._token_active = Gauge(
            "authentication_token_cache_active_fetch_count",
            "TokenReviews in flight and lookups blocked on one",
            ["status"],
            registry=registry,
        )
        for status in ("in_flight", "blocked"):
            self._token_active.labels(status=status)
        self.http = http if http is not None else HttpRequestMetrics(registry)
        self._client_certificates = Histogram(
            "apiserver_client_certificate_expiration_seconds",
            "Distribution of the remaining lifetime on the certificate used to authenticate "
            "a request.",
            registry=registry,
            buckets=(
                0,
                1800,
                3600,
                7200,
                21600,
                43200,
                86400,
                172800,
                345600,
                604800,
                2592000,
                7776000,
                15552000,
                31104000,
            ),
        )

    def token_lookup(self, *, hit: bool, seconds: float) -> None:
        status = "hit" if hit else "miss"
        self._token_requests.labels(status=status).inc()
        self._token_latency.labels(status=status).observe(max(0.0, seconds))

    def token_fetches(self, status: str, delta: int) -> None:
        self._token_active.labels(status=status).inc(delta)

    def token_fetched(self, *, ok: bool) -> None:
        self._token_fetches.labels(status="ok" if ok else "error").inc()

    def http_request_started(self, labels: tuple[str, str, str, str]) -> None:
        self.http.started(labels)

    def http_request_done(self, labels: tuple[str, str, str, str], seconds: float) -> None:
        self.http.done(labels, seconds)

    def client_certificate(self, seconds_left: float) -> None:
        self._client_certificates.observe(seconds_left)

    def delegated_review(self, kind: str, code: str, seconds: float) -> None:
        total, latency = self._delegated[kind]
        total.labels(code=code).inc()
        latency.labels(code=code).observe(max(0.0, seconds))
