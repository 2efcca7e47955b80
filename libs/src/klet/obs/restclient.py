"""Upstream's `rest_client_requests_total{code, method, host}`, fed by the apiserver
client (`klet.kube.client.KubeClient(observer=...)`) of each service that has one.

As client-go counts them: one per HTTP request to the apiserver, watches included, by
the answer's status code (`<error>` when no answer came: refused, reset, timed out),
the HTTP method and the apiserver's host:port. Every service registers it on its own
registry; the kubelet API's /metrics adds the services' counts up (one node, one
count, as upstream's one process has).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

__all__ = ["NO_ANSWER", "RestClientMetrics"]

NO_ANSWER = "<error>"
"""The `code` of a request that got no HTTP answer (client-go's value)."""


class RestClientMetrics:
    """A `klet.kube.client.RequestObserver` that counts into `registry`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "rest_client_requests",
            "HTTP requests to the apiserver, by status code, method and host.",
            ["code", "method", "host"],
            registry=registry,
        )

    def __call__(self, code: str, method: str, host: str) -> None:
        self.requests.labels(code=code, method=method, host=host).inc()
