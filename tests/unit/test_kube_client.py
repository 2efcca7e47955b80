"""KubeClient's worker threads: given `threads`, its requests run on a pool of its own
(at most that many at once, threads named kube-client), so a default executor that is
all taken (as the kubelet API's TokenReviews could take it) does not delay them, while
a client without `threads` waits for that executor; close() ends the pool.

And what it tells RestClientMetrics, read back from a fresh registry: each request
counted and timed by code, method and host; each body's size as the JSON sent (0
without one) and each answer's size (a success's, an error's with a body; none without
an answer); the rate limiter's wait for every request when kubeAPIQPS limits (the
second of a one-token bucket waiting its refill), none without a limit; a request made
as attempt 2 of a call counted as a retry by its own code, attempt 1 not. Importing it
loads neither the certificate machinery nor `cryptography` (only a rotated certificate
needs them)."""

from __future__ import annotations

import asyncio
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from klet.kube import KubeSettings
from klet.kube.client import KubeClient
from klet.kube.errors import KubeError

from tests.harness.freshimports import loaded_after
from tests.unit.test_kube_tokens import kubeconfig


class Response:
    status = 200

    def read(self) -> bytes:
        return b"{}"


class Recorder:
    """Stands in for the REST client's blocking request: notes the thread and how many
    run at once, and blocks until `release` is set."""

    def __init__(self) -> None:
        self.threads: set[str] = set()
        self.running = 0
        self.peak = 0
        self.release = threading.Event()
        self._lock = threading.Lock()

    def request(self, method: str, url: str, **_: Any) -> Response:
        with self._lock:
            self.threads.add(threading.current_thread().name)
            self.running += 1
            self.peak = max(self.peak, self.running)
        self.release.wait(5)
        with self._lock:
            self.running -= 1
        return Response()


def client_of(tmp_path: Path, recorder: Recorder, threads: int | None) -> KubeClient:
    client = KubeClient(
        KubeSettings(kubeconfig=kubeconfig(tmp_path, {"token": "t"})), threads=threads
    )
    client._rest.request = recorder.request  # type: ignore[method-assign,assignment]
    return client


async def test_requests_run_on_the_clients_own_threads(tmp_path: Path) -> None:
    recorder = Recorder()
    client = client_of(tmp_path, recorder, threads=2)
    calls = [asyncio.create_task(client.get("/api")) for _ in range(5)]
    await asyncio.sleep(0.2)
    assert recorder.running == 2
    recorder.release.set()
    assert await asyncio.gather(*calls) == [{}] * 5
    assert recorder.peak == 2
    assert all(name.startswith("kube-client") for name in recorder.threads), recorder.threads
    await client.close()
    assert client._executor is not None and client._executor._shutdown


async def test_a_busy_default_executor_delays_only_clients_without_threads(
    tmp_path: Path,
) -> None:
    loop = asyncio.get_running_loop()
    default = ThreadPoolExecutor(max_workers=1)
    loop.set_default_executor(default)
    busy = threading.Event()
    hog = loop.run_in_executor(None, busy.wait, 5)  # the one default thread, taken
    own, shared = Recorder(), Recorder()
    own.release.set()
    shared.release.set()
    with_threads = client_of(tmp_path, own, threads=1)
    without = client_of(tmp_path, shared, threads=None)
    try:
        assert await asyncio.wait_for(with_threads.get("/api"), 2) == {}
        waiting = asyncio.create_task(without.get("/api"))
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.shield(waiting), 0.5)
        busy.set()
        assert await asyncio.wait_for(waiting, 5) == {}
    finally:
        busy.set()
        await hog
        await with_threads.close()
        await without.close()
        default.shutdown()


async def test_each_request_is_counted_and_timed_for_rest_client_metrics(tmp_path: Path) -> None:
    from klet.kube.errors import KubeError

    answers: list[Any] = [Response(), NotFoundResponse(), OSError("connection refused")]
    client, registry, host = _metrics_client(tmp_path, answers)
    await client.get("/api")
    with pytest.raises(KubeError):
        await client.delete("/api/v1/namespaces/default/pods/gone")
    with pytest.raises(KubeError):
        await client.create("/api/v1/namespaces/default/events", {})

    def count(code: str, method: str) -> float | None:
        labels = {"code": code, "method": method, "host": host}
        return registry.get_sample_value("rest_client_requests_total", labels)

    assert count("200", "GET") == 1
    assert count("404", "DELETE") == 1
    assert count("<error>", "POST") == 1
    # and each is timed, by method (client-go's verb), whatever the answer
    for verb in ("GET", "DELETE", "POST"):
        labels = {"verb": verb, "host": host}
        assert registry.get_sample_value("rest_client_request_duration_seconds_count", labels) == 1
        assert registry.get_sample_value("rest_client_request_duration_seconds_sum", labels) >= 0
    await client.close()


class NotFoundResponse:
    status = 404

    def read(self) -> bytes:
        return b'{"kind":"Status","reason":"NotFound","message":"pods \\"gone\\" not found"}'


def _metrics_client(
    tmp_path: Path, answers: list[Any], *, qps: float = 50.0, burst: int = 100
) -> tuple[KubeClient, Any, str]:
    """A client whose requests are answered by `answers` in turn (an exception is raised),
    observed by RestClientMetrics: the client, its registry and the host label."""
    from klet.obs.restclient import RestClientMetrics
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    client = KubeClient(
        KubeSettings(kubeconfig=kubeconfig(tmp_path, {"token": "t"}), qps=qps, burst=burst),
        observer=RestClientMetrics(registry),
    )

    def request(method: str, url: str, **_: Any) -> Any:
        answer = answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    client._rest.request = request  # type: ignore[method-assign,assignment]
    return client, registry, client.host.split("://", 1)[1]


async def test_request_and_response_bodies_are_sized_as_sent_and_read(tmp_path: Path) -> None:
    from klet.kube.errors import KubeError

    answers: list[Any] = [Response(), NotFoundResponse(), OSError("connection refused")]
    client, registry, host = _metrics_client(tmp_path, answers)
    body = {"metadata": {"name": "ünïcode-event"}, "message": "m" * 80}  # 64 < size < 256
    await client.get("/api")
    with pytest.raises(KubeError):
        await client.patch("/api/v1/nodes/n", body)
    with pytest.raises(KubeError):
        await client.create("/api/v1/namespaces/default/events", body)
    await client.close()

    def size(kind: str, verb: str, what: str) -> float | None:
        labels = {"verb": verb, "host": host}
        return registry.get_sample_value(f"rest_client_{kind}_size_bytes_{what}", labels)

    sent = len(json.dumps(body).encode())  # what the kubernetes client sends, escaped
    assert (size("request", "GET", "count"), size("request", "GET", "sum")) == (1, 0)
    assert (size("request", "PATCH", "count"), size("request", "PATCH", "sum")) == (1, sent)
    # a request that got no answer was still sent
    assert (size("request", "POST", "count"), size("request", "POST", "sum")) == (1, sent)
    assert size("response", "GET", "sum") == len(Response().read())
    # an error answer with a body is sized, as client-go's Do does
    assert size("response", "PATCH", "sum") == len(NotFoundResponse().read())
    assert size("response", "POST", "count") is None
    labels = {"verb": "PATCH", "host": host, "le": "64.0"}
    assert registry.get_sample_value("rest_client_request_size_bytes_bucket", labels) == 0
    labels["le"] = "256.0"
    assert registry.get_sample_value("rest_client_request_size_bytes_bucket", labels) == 1


async def test_rate_limiter_waits_are_observed_when_kube_api_qps_limits(tmp_path: Path) -> None:
    # one token, refilled at 2 a second: of two requests asked for together (their
    # tokens taken one after the other in one pass of the loop), the second waits for the
    # refill, 500 ms less the time between the two takes (microseconds; the bound below
    # leaves a loaded machine 250 ms of it: at 20 a second a stall of 10 ms between the
    # takes made this fail)
    client, registry, host = _metrics_client(tmp_path, [Response(), Response()], qps=2, burst=1)
    await asyncio.gather(client.get("/api"), client.get("/api"))
    await client.close()
    labels = {"verb": "GET", "host": host}
    name = "rest_client_rate_limiter_duration_seconds"
    assert registry.get_sample_value(f"{name}_count", labels) == 2
    waited = registry.get_sample_value(f"{name}_sum", labels)
    assert waited is not None and waited >= 0.25  # the refill it slept for

    unlimited, registry, host = _metrics_client(tmp_path, [Response()], qps=0)
    await unlimited.get("/api")
    await unlimited.close()
    assert registry.get_sample_value(f"{name}_count", {"verb": "GET", "host": host}) is None


async def test_a_request_made_as_a_later_attempt_counts_as_a_retry(tmp_path: Path) -> None:
    from klet.kube.observing import attempt

    answers: list[Any] = [Unavailable503(), Response(), Response()]
    client, registry, host = _metrics_client(tmp_path, answers)
    with attempt(1):
        with pytest.raises(KubeError):
            await client.get("/api")
    with attempt(2):
        await client.get("/api")
    await client.get("/api")  # outside any numbered call: a first attempt
    await client.close()

    def retries(code: str) -> float | None:
        labels = {"code": code, "verb": "GET", "host": host}
        return registry.get_sample_value("rest_client_request_retries_total", labels)

    assert retries("200") == 1 and retries("503") is None
    labels = {"code": "200", "method": "GET", "host": host}
    assert registry.get_sample_value("rest_client_requests_total", labels) == 2


class Unavailable503:
    status = 503

    def read(self) -> bytes:
        return b'{"kind":"Status","reason":"ServiceUnavailable","message":"shutting down"}'


def test_the_client_loads_no_certificate_machinery() -> None:
    """pod-source's and syncloop's clients (no rotated certificate) cost no
    `cryptography`: importing the client leaves klet.kube.bootstrap and
    cryptography.x509 unloaded (a fresh interpreter tells; redis-py imports the bare
    `cryptography` package itself); test_certificate_seeding covers the rotated
    client, which loads them when built."""
    loaded = loaded_after(
        "import klet.kube.client",
        ["klet.kube.bootstrap", "klet.kube.certificates", "cryptography.x509", "kubernetes"],
    )
    assert loaded == ["kubernetes"]
