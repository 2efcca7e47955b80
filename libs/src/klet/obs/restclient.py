"""Upstream's `rest_client_requests_total{code, method, host}` and
`rest_client_request_duration_seconds{verb, host}`, fed by the apiserver client
(`klet.kube.client.KubeClient(observer=...)`) of each service that has one.

As client-go counts them: one per HTTP request to the apiserver, watches included, by
the answer's status code (`<error>` when no answer came: refused, reset, timed out),
the HTTP method and the apiserver's host:port; the duration, by method (client-go's
`verb`) and host, runs until the answer was read (a watch: until its answer began) or
the request failed, in client-go's buckets. Every service registers them on its own
registry; the kubelet API's /metrics adds the services' counts up (one node, one
count, as upstream's one process has).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

__all__ = ["DURATION_BUCKETS", "NO_ANSWER", "RestClientMetrics"]

NO_ANSWER = "<error>"
"""The `code` of a request that got no HTTP answer (client-go's value)."""

DURATION_BUCKETS = (0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0)
"""client-go's request latency buckets (seconds)."""


class RestClientMetrics:
    """A `klet.kube.client.RequestObserver` that records into `registry`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "rest_client_requests",
            "HTTP requests to the apiserver, by status code, method and host.",
            ["code", "method", "host"],
            registry=registry,
        )
        self.duration = Histogram(
            "rest_client_request_duration_seconds",
            "Seconds an HTTP request to the apiserver took, by method (verb) and host.",
            ["verb", "host"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        )

    def __call__(self, code: str, method: str, host: str, seconds: float) -> None:
        self.requests.labels(code=code, method=method, host=host).inc()
        self.duration.labels(verb=method, host=host).observe(max(0.0, seconds))
