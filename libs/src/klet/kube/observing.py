"""What the apiserver client tells its observer, and which attempt of a retried call a
request is: the part of the client's instrumentation that does not import `kubernetes`
(a standalone service, and status-reporter's wiring, name these types without it).

client-go tells its metrics adapter of each request's result and latency, the sizes of
its body and of the answer's, the wait in its client-side rate limiter, and each retry
(`rest_client_*`, klet.obs.restclient.RestClientMetrics records them). klet's client
(klet.kube.client.KubeClient) tells a `RequestObserver` the same. client-go retries
inside one request; klet retries in the adapter that names the calls (status-reporter's
`cluster.kubeapi.KubeApi`, one tenacity policy), so the adapter says which attempt it is
making with `attempt(n)` around the call, and the client, which sees the request's
outcome, reports attempts 2..n as retries, as client-go counts them. A context variable
carries it: the client runs each request in a copy of the caller's context, so the
number reaches the worker thread without a parameter on every call of the `Kube`
protocols the fakes also implement.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Protocol

__all__ = ["NO_ANSWER", "RequestObserver", "attempt", "attempt_number"]

NO_ANSWER = "<error>"
"""The `code` of a request that got no HTTP answer (client-go's value)."""

_ATTEMPT: ContextVar[int] = ContextVar("klet_kube_attempt", default=1)


class RequestObserver(Protocol):
    """Told of the apiserver client's work. Label values are the HTTP method (client-go's
    `verb`) and the apiserver's host:port; called from the request's worker thread,
    except `rate_limited`, called on the event loop."""

    def __call__(self, code: str, method: str, host: str, seconds: float) -> None:
        """Each request sent: its status code (or NO_ANSWER) and the seconds until the
        answer was read, a watch's answer began, or it failed."""

    def retried(self, code: str, method: str, host: str) -> None:
        """A request that was the second or later attempt of a retried call, by its own
        outcome (client-go's rest_client_request_retries_total)."""

    def request_size(self, method: str, host: str, size: int) -> None:
        """The bytes of a request's body (0 for none), each attempt."""

    def response_size(self, method: str, host: str, size: int) -> None:
        """The bytes of an answer's body read whole: a success, or an error with a body."""

    def rate_limited(self, method: str, host: str, seconds: float) -> None:
        """The seconds a request waited in the client-side rate limiter
        (kubeAPIQPS/kubeAPIBurst), 0 included; not told when there is no limit."""


@contextmanager
def attempt(number: int) -> Iterator[None]:
    """Requests made inside are attempt `number` (1 = the first) of one call."""
    token = _ATTEMPT.set(number)
    try:
        yield
    finally:
        _ATTEMPT.reset(token)


def attempt_number() -> int:
    """The attempt the current request is (1 outside any `attempt`)."""
    return _ATTEMPT.get()
