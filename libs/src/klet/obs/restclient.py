"""Upstream's apiserver client metrics (client-go's, through component-base's adapter),
fed by the apiserver client (`klet.kube.client.KubeClient(observer=...)`) of each
service that has one:

- `rest_client_requests_total{code, method, host}`: one per HTTP request, watches
  included, by the answer's status code (`<error>` when no answer came: refused, reset,
  timed out), the HTTP method and the apiserver's host:port.
- `rest_client_request_duration_seconds{verb, host}`: until the answer was read (a
  watch: until its answer began) or the request failed.
- `rest_client_request_size_bytes{verb, host}`: each request's body (0 without one);
  `rest_client_response_size_bytes{verb, host}`: each answer's body read whole (a
  success, or an error that came with a body), not a watch's stream.
- `rest_client_rate_limiter_duration_seconds{verb, host}`: each request's wait in the
  client-side rate limiter (kubeAPIQPS/kubeAPIBurst), 0 included, as client-go observes
  every pass through its limiter.
- `rest_client_request_retries_total{code, verb, host}`: each attempt after the first
  of a retried call (status-reporter's KubeApi policy), by that attempt's outcome.

Labels and buckets are client-go's. `rest_client_dns_resolution_duration_seconds` is
not here: component-base declares it but never registers it, so upstream's kubelet
serves none either. Every service registers these on its own registry; the kubelet
API's /metrics adds the services' counts and buckets up (one node, one count, as
upstream's one process has).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

__all__ = ["DURATION_BUCKETS", "NO_ANSWER", "SIZE_BUCKETS", "RestClientMetrics"]

NO_ANSWER = "<error>"
"""The `code` of a request that got no HTTP answer (client-go's value)."""

DURATION_BUCKETS = (0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0)
"""client-go's request latency and rate limiter buckets (seconds)."""

SIZE_BUCKETS = (
    64.0,
    256.0,
    512.0,
    1024.0,
    4096.0,
    16384.0,
    65536.0,
    262144.0,
    1048576.0,
    4194304.0,
    16777216.0,
)
"""client-go's request and response size buckets (bytes: 64 B to 16 MiB)."""


def _by_verb_and_host(
    registry: CollectorRegistry, name: str, documentation: str, buckets: tuple[float, ...]
) -> Histogram:
    """One of client-go's histograms: all are labelled by verb (the HTTP method) and host."""
    return Histogram(name, documentation, ["verb", "host"], buckets=buckets, registry=registry)


class RestClientMetrics:
    """A `klet.kube.observing.RequestObserver` that records into `registry`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "rest_client_requests",
            "HTTP requests to the apiserver, by status code, method and host.",
            ["code", "method", "host"],
            registry=registry,
        )
        self.duration = _by_verb_and_host(
            registry,
            "rest_client_request_duration_seconds",
            "Seconds an HTTP request to the apiserver took, by method (verb) and host.",
            DURATION_BUCKETS,
        )
        self.request_sizes = _by_verb_and_host(
            registry,
            "rest_client_request_size_bytes",
            "Bytes of the body of each request to the apiserver, by verb and host.",
            SIZE_BUCKETS,
        )
        self.response_sizes = _by_verb_and_host(
            registry,
            "rest_client_response_size_bytes",
            "Bytes of the body of each apiserver answer read, by verb and host.",
            SIZE_BUCKETS,
        )
        self.rate_limiter = _by_verb_and_host(
            registry,
            "rest_client_rate_limiter_duration_seconds",
            "Seconds a request waited in the client-side rate limiter, by verb and host.",
            DURATION_BUCKETS,
        )
        self.retries = Counter(
            "rest_client_request_retries",
            "Retried requests to the apiserver, by status code, verb and host.",
            ["code", "verb", "host"],
            registry=registry,
        )

    def __call__(self, code: str, method: str, host: str, seconds: float) -> None:
        self.requests.labels(code=code, method=method, host=host).inc()
        self.duration.labels(verb=method, host=host).observe(max(0.0, seconds))

    def retried(self, code: str, method: str, host: str) -> None:
        self.retries.labels(code=code, verb=method, host=host).inc()

    def request_size(self, method: str, host: str, size: int) -> None:
        self.request_sizes.labels(verb=method, host=host).observe(max(0, size))

    def response_size(self, method: str, host: str, size: int) -> None:
        self.response_sizes.labels(verb=method, host=host).observe(max(0, size))

    def rate_limited(self, method: str, host: str, seconds: float) -> None:
        self.rate_limiter.labels(verb=method, host=host).observe(max(0.0, seconds))
