"""Logging, health endpoints and root-task supervision (klet.obs).

Covers: JSON log lines carrying every `extra=` field and the traceback as a string (the
text form is test_obs_logs.py's), klog-style verbosity, once-per-change error logging
with recovery lines, the health app in-process through httpx.ASGITransport (/healthz ok,
verbose and 500 forms in upstream's format, async and raising checks, ?exclude,
/healthz/<name>, /readyz, /metrics content type, 404/405 with a JSON detail, HEAD), the
`klet_leader` gauge, serve_http on a loopback port (ready event, clean cancellation,
SO_REUSEPORT shared by two servers, a busy port raising OSError), and run_supervised
(siblings cancelled when a task fails or returns, caller cancellation, SIGTERM as a
normal stop).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import os
import signal
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from klet.obs import (
    CONTENT_TYPE,
    OnceLogger,
    RootTaskFailed,
    configure_logging,
    create_health_app,
    leader_metric,
    log_once_per_change,
    new_registry,
    render,
    run_supervised,
    serve_http,
)
from prometheus_client import CollectorRegistry, Counter

from tests.harness.serving import serve_on_free_port

# --- logging -------------------------------------------------------------------------------


@pytest.fixture
def restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)


def configured(fmt: str = "json", verbosity: int = 0) -> io.StringIO:
    stream = io.StringIO()
    configure_logging(service="syncloop", verbosity=verbosity, fmt=fmt, stream=stream)
    return stream


def lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


@pytest.mark.usefixtures("restore_root_logger")
def test_json_lines_carry_extra_fields() -> None:
    stream = configured()
    logging.getLogger("klet.test").info(
        "pod %s started", "web", extra={"pod": "default/web", "uid": "u1", "restarts": 2}
    )
    [line] = lines(stream)
    assert line["level"] == "info"
    assert line["service"] == "syncloop"
    assert line["logger"] == "klet.test"
    assert line["msg"] == "pod web started"
    assert (line["pod"], line["uid"], line["restarts"]) == ("default/web", "u1", 2)
    assert line["ts"].endswith("Z") and "T" in line["ts"]
    assert line["caller"].startswith("test_obs.py:")  # not under a klet package
    assert set(line) == {
        *("ts", "level", "service", "logger", "caller", "msg"),
        *("pod", "uid", "restarts"),
    }


@pytest.mark.usefixtures("restore_root_logger")
def test_json_exc_info_and_colliding_and_unserializable_fields() -> None:
    stream = configured()
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("klet.test").exception(
            "sync failed", extra={"service": "other", "path": object()}
        )
    [line] = lines(stream)
    assert line["level"] == "error"
    assert line["service"] == "syncloop" and line["extra_service"] == "other"
    assert line["path"].startswith("<object object")
    assert "Traceback" in line["exc_info"] and "RuntimeError: boom" in line["exc_info"]


@pytest.mark.usefixtures("restore_root_logger")
@pytest.mark.parametrize(
    ("verbosity", "debug_shown"), [(0, False), (2, False), (3, False), (4, True), (6, True)]
)
def test_verbosity_levels(verbosity: int, debug_shown: bool) -> None:
    stream = configured(verbosity=verbosity)
    log = logging.getLogger("klet.test")
    log.debug("detail")
    log.info("state change")
    assert [line["msg"] for line in lines(stream)] == (["detail"] if debug_shown else []) + [
        "state change"
    ]


@pytest.mark.usefixtures("restore_root_logger")
def test_configure_logging_replaces_its_own_handler() -> None:
    first = configured()
    second = configured()
    logging.getLogger("klet.test").info("once")
    assert first.getvalue() == "" and len(lines(second)) == 1


@pytest.mark.usefixtures("restore_root_logger")
def test_configure_logging_rejects_unknown_format() -> None:
    with pytest.raises(ValueError, match="text or json"):
        configure_logging(service="x", verbosity=0, fmt="xml")


@pytest.mark.usefixtures("restore_root_logger")
def test_once_logger_logs_once_per_change_and_recovery() -> None:
    stream = configured()
    once = OnceLogger(logging.getLogger("klet.test.once"))
    results = [
        once.error("redis", "redis unavailable: refused", addr="127.0.0.1:6379"),
        once.error("redis", "redis unavailable: refused", addr="127.0.0.1:6379"),
        once.error("redis", "redis unavailable: timeout"),
        once.error("cri", "runtime unavailable"),
        once.clear("redis"),
        once.clear("redis"),
        once.error(
            "redis", "redis unavailable: refused", name="field named like a record attribute"
        ),
    ]
    assert results == [True, False, True, True, True, False, True]
    logged = lines(stream)
    assert [(line["level"], line["msg"]) for line in logged] == [
        ("error", "redis unavailable: refused"),
        ("error", "redis unavailable: timeout"),
        ("error", "runtime unavailable"),
        ("info", "recovered: redis unavailable: timeout"),
        ("error", "redis unavailable: refused"),
    ]
    assert logged[0]["addr"] == "127.0.0.1:6379"
    assert logged[3]["previous_error"] == "redis unavailable: timeout"
    assert logged[4]["name_"] == "field named like a record attribute"
    assert once.active() == {"cri": "runtime unavailable", "redis": "redis unavailable: refused"}


@pytest.mark.usefixtures("restore_root_logger")
def test_once_logger_cause_under_a_fixed_message_and_level() -> None:
    stream = configured()
    once = OnceLogger(logging.getLogger("klet.test.once-cause"), level=logging.WARNING)
    results = [
        once.error("cri", "stats unavailable", cause="refused", error="refused"),
        once.error("cri", "stats unavailable", cause="refused", error="refused again"),
        once.error("cri", "stats unavailable", cause="timeout", level=logging.ERROR),
        once.clear("cri", "stats available again"),
    ]
    assert results == [True, False, True, True]
    assert [(line["level"], line["msg"]) for line in lines(stream)] == [
        ("warning", "stats unavailable"),
        ("error", "stats unavailable"),
        ("info", "stats available again"),
    ]


@pytest.mark.usefixtures("restore_root_logger")
def test_once_logger_retain_forgets_gone_keys_silently() -> None:
    stream = configured()
    once = OnceLogger(logging.getLogger("klet.test.once-retain"))
    once.error("c1", "not rotated")
    once.error("c2", "not rotated")
    once.retain(["c2", "c3"])
    assert once.active() == {"c2": "not rotated"}
    assert once.error("c1", "not rotated")  # a new object under an old key logs again
    assert not once.error("c2", "not rotated")
    assert [line["msg"] for line in lines(stream)] == ["not rotated"] * 3


@pytest.mark.usefixtures("restore_root_logger")
def test_log_once_per_change_function() -> None:
    stream = configured()
    log = logging.getLogger("klet.test.once-function")
    assert log_once_per_change(log, "k", "failing", attempt=1)
    assert not log_once_per_change(log, "k", "failing", attempt=2)
    assert log_once_per_change(log, "k", None)
    assert not log_once_per_change(log, "k", None)
    assert [line["msg"] for line in lines(stream)] == ["failing", "recovered: failing"]


# --- health app ---------------------------------------------------------------------------


class Flags:
    """Health conditions a test flips."""

    def __init__(self) -> None:
        self.redis = True
        self.ready = True

    async def cri(self) -> bool:
        await asyncio.sleep(0)
        return True

    def broken(self) -> bool:
        raise ConnectionError("refused")


def client_for(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://svc")


@pytest.fixture
def flags() -> Flags:
    return Flags()


@pytest.fixture
def registry() -> CollectorRegistry:
    registry = new_registry()
    Counter("klet_test_events", "Events seen by the test.", registry=registry).inc(3)
    return registry


@pytest.fixture
def app(flags: Flags, registry: CollectorRegistry) -> Any:
    return create_health_app(
        registry=registry,
        checks={"redis": lambda: flags.redis, "cri": flags.cri},
        ready=lambda: flags.ready,
    )


async def test_healthz_ok(app: Any) -> None:
    async with client_for(app) as client:
        response = await client.get("/healthz")
    assert (response.status_code, response.text) == (200, "ok")
    assert response.headers["content-type"].startswith("text/plain")


async def test_healthz_verbose(app: Any) -> None:
    async with client_for(app) as client:
        response = await client.get("/healthz", params={"verbose": ""})
    assert response.status_code == 200
    assert response.text == "[+]ping ok\n[+]redis ok\n[+]cri ok\nhealthz check passed\n"


async def test_healthz_failing_check_is_500_with_upstream_listing(app: Any, flags: Flags) -> None:
    flags.redis = False
    async with client_for(app) as client:
        response = await client.get("/healthz")
        excluded = await client.get("/healthz", params={"exclude": "redis", "verbose": "1"})
    assert response.status_code == 500
    assert response.text == (
        "[+]ping ok\n[-]redis failed: reason withheld\n[+]cri ok\nhealthz check failed\n"
    )
    assert excluded.status_code == 200
    assert "[+]redis excluded: ok\n" in excluded.text


async def test_raising_check_counts_as_failed(flags: Flags, registry: CollectorRegistry) -> None:
    app = create_health_app(registry=registry, checks={"broken": flags.broken}, ready=lambda: True)
    async with client_for(app) as client:
        response = await client.get("/healthz")
    assert response.status_code == 500
    assert "[-]broken failed: reason withheld" in response.text


async def test_slow_async_check_times_out(registry: CollectorRegistry) -> None:
    async def hangs() -> bool:
        await asyncio.sleep(10)
        return True

    app = create_health_app(
        registry=registry, checks={"hangs": hangs}, ready=lambda: True, check_timeout=0.01
    )
    async with client_for(app) as client:
        response = await client.get("/healthz")
    assert response.status_code == 500


async def test_single_check_endpoint(app: Any, flags: Flags) -> None:
    flags.redis = False
    async with client_for(app) as client:
        ok = await client.get("/healthz/cri")
        failed = await client.get("/healthz/redis")
        missing = await client.get("/healthz/nope")
    assert (ok.status_code, ok.text) == (200, "ok")
    assert failed.status_code == 500 and "redis check failed" in failed.text
    assert missing.status_code == 404


async def test_readyz(app: Any, flags: Flags) -> None:
    async with client_for(app) as client:
        assert (await client.get("/readyz")).text == "ok"
        flags.ready = False
        response = await client.get("/readyz")
        healthz = await client.get("/healthz")
    assert response.status_code == 500
    assert response.text.endswith("[-]ready failed: reason withheld\nreadyz check failed\n")
    assert healthz.status_code == 200  # not being ready is not being unhealthy


async def test_unknown_paths_and_methods_and_head(app: Any) -> None:
    async with client_for(app) as client:
        missing = await client.get("/nope")
        nested = await client.get("/healthz/cri/more")
        post = await client.post("/healthz")
        head = await client.head("/healthz")
    assert (missing.status_code, missing.json()) == (404, {"detail": "Not Found"})
    assert nested.status_code == 404
    assert (post.status_code, post.json()) == (405, {"detail": "Method Not Allowed"})
    assert post.headers["allow"] == "GET, HEAD"
    assert (head.status_code, head.content) == (200, b"")
    assert head.headers["content-length"] == "2"  # the GET body's length
    assert head.headers["content-type"] == "text/plain; charset=utf-8"


async def test_metrics(app: Any) -> None:
    async with client_for(app) as client:
        response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"] == CONTENT_TYPE
    assert "klet_test_events_total 3.0" in response.text


def test_render_and_process_metrics() -> None:
    body, content_type = render(new_registry(process_metrics=True))
    assert content_type == CONTENT_TYPE
    assert b"python_info" in body


def test_leader_metric_follows_the_leader_loop() -> None:
    registry = new_registry()
    leading = [False]
    leader_metric(registry, service="eviction", leading=lambda: leading[0])
    assert registry.get_sample_value("klet_leader", {"service": "eviction"}) == 0.0
    leading[0] = True
    assert registry.get_sample_value("klet_leader", {"service": "eviction"}) == 1.0


def test_ready_is_a_reserved_check_name(registry: CollectorRegistry) -> None:
    with pytest.raises(ValueError, match="reserved"):
        create_health_app(registry=registry, checks={"ready": lambda: True}, ready=lambda: True)


# --- serve_http -----------------------------------------------------------------------------


async def test_serve_http_serves_and_stops_on_cancel(app: Any) -> None:
    task, port = await serve_on_free_port(app, name="health")
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        response = await client.get("/healthz")
    assert (response.status_code, response.text) == (200, "ok")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    with socket.create_server(("127.0.0.1", port)):
        pass  # the port was released


async def test_serve_http_busy_port_raises(app: Any) -> None:
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        with pytest.raises(OSError, match=f"health: cannot listen on 127.0.0.1:{port}"):
            await serve_http(app, host="127.0.0.1", port=port, name="health")


async def test_serve_http_reuse_port_lets_replicas_share_a_port(app: Any) -> None:
    # Replicas of status-reporter bind the same kubelet ports; both must set the option.
    ready = [asyncio.Event(), asyncio.Event()]
    bound: list[int] = []
    first = asyncio.create_task(
        serve_http(
            app,
            host="127.0.0.1",
            port=0,
            name="one",
            ready=ready[0],
            on_listening=lambda _host, port: bound.append(port),
            reuse_port=True,
        )
    )
    await asyncio.wait_for(ready[0].wait(), 5)
    with pytest.raises(OSError, match="cannot listen"):  # without the option: busy
        await serve_http(app, host="127.0.0.1", port=bound[0], name="plain")
    second = asyncio.create_task(
        serve_http(
            app, host="127.0.0.1", port=bound[0], name="two", ready=ready[1], reuse_port=True
        )
    )
    try:
        await asyncio.wait_for(ready[1].wait(), 5)
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        # The first one is gone: new connections reach the second.
        for _ in range(5):
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{bound[0]}") as client:
                assert (await client.get("/healthz")).text == "ok"
    finally:
        for task in (first, second):
            task.cancel()
        await asyncio.gather(first, second, return_exceptions=True)


async def test_serve_http_lifespan_failure_is_an_error(registry: CollectorRegistry) -> None:
    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        raise RuntimeError("cannot open client")
        yield

    app = FastAPI(lifespan=lifespan)
    with pytest.raises(RuntimeError, match="health: HTTP server failed to start"):
        await serve_http(app, host="127.0.0.1", port=0, name="health")


# --- run_supervised ---------------------------------------------------------------------------


async def test_failing_task_cancels_siblings() -> None:
    cancelled = asyncio.Event()

    async def forever() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            cancelled.set()

    async def fails() -> None:
        await asyncio.sleep(0)
        raise ConnectionError("redis gone")

    with pytest.raises(RootTaskFailed) as info:
        await run_supervised({"consumer": forever(), "heartbeat": fails()}, handle_signals=False)
    assert info.value.name == "heartbeat"
    assert isinstance(info.value.exc, ConnectionError)
    assert isinstance(info.value.__cause__, ConnectionError)
    assert cancelled.is_set()


async def test_returning_task_is_a_failure_too() -> None:
    async def forever() -> None:
        await asyncio.sleep(3600)

    async def returns() -> None:
        return None

    with pytest.raises(RootTaskFailed, match="'server' returned") as info:
        await run_supervised({"consumer": forever(), "server": returns()}, handle_signals=False)
    assert info.value.exc is None


async def test_cancelling_the_supervisor_cancels_every_task() -> None:
    started = asyncio.Event()
    stopped: list[str] = []

    async def worker(name: str) -> None:
        try:
            started.set()
            await asyncio.sleep(3600)
        finally:
            stopped.append(name)

    supervisor = asyncio.create_task(
        run_supervised({"a": worker("a"), "b": worker("b")}, handle_signals=False)
    )
    await started.wait()
    supervisor.cancel()
    with pytest.raises(asyncio.CancelledError):
        await supervisor
    assert sorted(stopped) == ["a", "b"]


async def test_sigterm_stops_everything_normally() -> None:
    # Signal handlers need the main thread, which is where pytest runs tests.
    stopped: list[str] = []

    async def worker() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            stopped.append("worker")

    async def terminator() -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.sleep(3600)

    before = signal.getsignal(signal.SIGTERM)
    await asyncio.wait_for(run_supervised({"worker": worker(), "signal": terminator()}), 5)
    assert stopped == ["worker"]
    assert signal.getsignal(signal.SIGTERM) == before


async def test_run_supervised_needs_tasks() -> None:
    with pytest.raises(ValueError, match="at least one task"):
        await run_supervised({})


async def test_a_task_that_ignores_cancellation_is_abandoned_with_where_it_waits(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = asyncio.Event()

    async def stubborn_wait() -> None:
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await release.wait()

    async def stubborn() -> None:
        await stubborn_wait()

    async def fails() -> None:
        await asyncio.sleep(0)
        raise RuntimeError("boom")

    with caplog.at_level(logging.ERROR, logger="klet.obs.supervise"):
        with pytest.raises(RootTaskFailed):
            await run_supervised(
                {"stubborn": stubborn(), "fails": fails()},
                handle_signals=False,
                shutdown_timeout=0.05,
            )
    release.set()
    [record] = [r for r in caplog.records if r.getMessage().startswith("root task did not stop")]
    assert record.task == "stubborn"  # type: ignore[attr-defined]
    chain = record.awaiting  # type: ignore[attr-defined]
    assert [line.rsplit(" ", 1)[-1] for line in chain[:2]] == ["stubborn", "stubborn_wait"]
    assert any(line.endswith(" wait") for line in chain), chain
    assert "Future" in chain[-1], chain


async def test_a_task_that_swallows_one_cancellation_is_cancelled_again(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from klet.obs import supervise

    monkeypatch.setattr(supervise, "RECANCEL_S", 0.01)
    swallowed: list[str] = []

    async def reader() -> None:
        # What a client library's race does: the first cancellation becomes a normal
        # return of the read and the loop reads again.
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if swallowed:
                    raise
                swallowed.append("once")

    async def fails() -> None:
        await asyncio.sleep(0)
        raise RuntimeError("boom")

    with caplog.at_level(logging.ERROR, logger="klet.obs.supervise"):
        with pytest.raises(RootTaskFailed):
            await run_supervised(
                {"reader": reader(), "fails": fails()}, handle_signals=False, shutdown_timeout=5
            )
    assert swallowed == ["once"]
    assert not [r for r in caplog.records if r.getMessage().startswith("root task did not stop")]
