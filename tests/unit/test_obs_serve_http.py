"""`klet.obs.serve_http` (uvicorn in the service's loop) on a real loopback socket: answers
with the app's status, headers and body plus a Date and no Server header; keeps a
connection alive across requests (and answers pipelined ones in order); HEAD carries no
body; a streamed answer without a length is chunked; a lifespan start-up that fails is
an error naming the server; a malformed request gets a 400 and the connection closes;
an app that fails gets a 500 and the server goes on serving; nothing is logged per
request (no access log) and uvicorn's own start/stop notices stay out of a service's
log at the default verbosity; on cancellation a request being answered still finishes
while idle connections close, and the signal handlers are left alone.
"""

from __future__ import annotations

import asyncio
import io
import logging
import signal
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from klet.obs import get_app, serve_http
from klet.obs.logs import configure_logging
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from tests.harness.serving import serve_on_free_port

Served = tuple[asyncio.Task[None], int]


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def _hello(_request: Request) -> Response:
    return PlainTextResponse("hello")


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    task, port = await serve_on_free_port(get_app({"/hello": _hello}))
    yield task, port
    await _stop(task)


async def _raw(port: int, data: bytes, *, until: Callable[[bytes], bool]) -> bytes:
    """Send `data` on a fresh connection; read until `until(received)` or EOF."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        got = b""
        while not until(got):
            chunk = await asyncio.wait_for(reader.read(65536), 5)
            if not chunk:
                break
            got += chunk
        return got
    finally:
        writer.close()


async def test_answers_with_the_apps_response_and_a_date(served: Served) -> None:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{served[1]}") as client:
        response = await client.get("/hello")
        missing = await client.get("/nowhere")
    assert (response.status_code, response.text) == (200, "hello")
    assert response.headers["content-type"] == "text/plain; charset=utf-8"
    assert response.headers["content-length"] == "5"
    assert response.headers["date"].endswith(" GMT")
    assert "server" not in response.headers
    assert (missing.status_code, missing.json()) == (404, {"detail": "Not Found"})


async def test_a_connection_is_kept_alive_and_pipelined_requests_answered_in_order(
    served: Served,
) -> None:
    one = b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n"
    last = b"GET /nowhere HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    got = await _raw(served[1], one + one + last, until=lambda _b: False)
    assert got.count(b"HTTP/1.1 200 ") == 2
    assert got.index(b"hello") < got.rindex(b"HTTP/1.1 404 ")
    assert got.endswith(b'{"detail":"Not Found"}')


async def test_head_has_the_length_but_no_body(served: Served) -> None:
    request = b"HEAD /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    got = await _raw(served[1], request, until=lambda _b: False)
    head, _, body = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    assert b"content-length: 5" in head.lower()
    assert body == b""


async def test_a_streamed_answer_without_a_length_is_chunked() -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await receive()
            await send({"type": "lifespan.startup.complete"})
            await receive()
            await send({"type": "lifespan.shutdown.complete"})
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for part in (b"one ", b"two ", b"three"):
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    task, port = await serve_on_free_port(app)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            response = await client.get("/")
        assert response.headers["transfer-encoding"] == "chunked"
        assert response.text == "one two three"
    finally:
        await _stop(task)


async def test_a_failed_lifespan_start_up_is_an_error_naming_the_server() -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "lifespan.startup.failed", "message": "no database"})

    with pytest.raises(RuntimeError, match="test: HTTP server failed to start"):
        await serve_http(app, host="127.0.0.1", port=0, name="test")


async def test_a_malformed_request_is_a_400_and_closes(served: Served) -> None:
    got = await _raw(served[1], b"NOT HTTP AT ALL\r\n\r\n", until=lambda _b: False)
    assert got.startswith(b"HTTP/1.1 400 ")
    assert b"connection: close" in got.lower()


async def test_requests_are_not_logged_nor_the_servers_start_and_stop() -> None:
    out = io.StringIO()
    handler = configure_logging(service="test", verbosity=2, stream=out)
    try:
        task, port = await serve_on_free_port(get_app({"/hello": _hello}), name="quiet")
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            for _ in range(3):
                assert (await client.get("/hello")).text == "hello"
        await _stop(task)
    finally:
        logging.getLogger().removeHandler(handler)
    lines = out.getvalue().splitlines()
    # klet's own two lines, and nothing from uvicorn (its notices are INFO, its access log off)
    assert [line for line in lines if "HTTP" in line] == lines
    assert len(lines) == 2 and "HTTP listening" in lines[0] and "stopped" in lines[1]


async def test_the_signal_handlers_are_left_to_the_process() -> None:
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    task, port = await serve_on_free_port(get_app({"/hello": _hello}))
    try:
        assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    finally:
        await _stop(task)


async def test_a_failing_app_is_a_500_and_the_server_goes_on() -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/boom":
            raise RuntimeError("bug")  # before answering: the server's own 500
        await get_app({"/hello": _hello})(scope, receive, send)

    task, port = await serve_on_free_port(app)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            failed = await client.get("/boom")
            after = await client.get("/hello")
        assert (failed.status_code, failed.text) == (500, "Internal Server Error")
        assert (after.status_code, after.text) == (200, "hello")
    finally:
        await _stop(task)


async def test_on_cancel_a_request_in_flight_finishes_and_idle_connections_close() -> None:
    entered = asyncio.Event()
    release = asyncio.Event()

    async def slow(_request: Request) -> Response:
        entered.set()
        await release.wait()
        return PlainTextResponse("finished")

    task, port = await serve_on_free_port(get_app({"/slow": slow, "/hello": _hello}))
    idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", port)
    idle_writer.write(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
    first = await asyncio.wait_for(idle_reader.readuntil(b"hello"), 5)
    assert first.startswith(b"HTTP/1.1 200 ")
    request = b"GET /slow HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    answer = asyncio.create_task(_raw(port, request, until=lambda _b: False))
    await asyncio.wait_for(entered.wait(), 5)
    task.cancel()
    assert await asyncio.wait_for(idle_reader.read(), 5) == b""  # the idle one: closed
    idle_writer.close()
    release.set()
    got = await asyncio.wait_for(answer, 5)
    assert got.startswith(b"HTTP/1.1 200 ") and got.endswith(b"finished")
    await asyncio.gather(task, return_exceptions=True)
    with socket.create_server(("127.0.0.1", port)):
        pass  # the port was released
