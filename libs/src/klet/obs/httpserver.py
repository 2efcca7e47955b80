"""A small HTTP/1.1 server for klet's own ASGI apps, on asyncio streams and h11.

It serves the private service port of every service and the status-reporter's healthz
and read-only ports (`klet.obs.health.serve_http`): a few GET paths answered at once by
the apps of `klet.obs.asgi`. uvicorn did this before; importing it (with click, its
process supervisors and multiprocessing) cost every service about 2.5 MB resident, more
than these endpoints need (issue 15). h11 is the HTTP/1.1 state machine uvicorn itself
uses, and the kubelet API's own server (`klet.status_reporter.kubeletapi.server`) too.

What it does, per connection: read a request head (at most `MAX_HEAD` bytes, within
`HEAD_TIMEOUT_S` of its first byte), read and discard its body (at most `MAX_BODY`),
call the app with one `http` scope, and frame the app's answer (its Content-Length, or
chunked when it streams without one). Connections are kept alive `KEEPALIVE_S` between
requests. A malformed request gets a 400 and the connection is closed; an app that
fails before it answered gets a 500 (logged), after it started answering the connection
is closed. The ASGI lifespan protocol runs before serving and after: a failed start-up
is `LifespanFailed`. On `close()` the listener stops at once, requests being answered
get `GRACEFUL_S` to finish, idle connections are closed.

Trade-off: no HTTP/2, no WebSocket, no TLS: these ports are plain HTTP/1.1 in upstream's
kubelet too, and the one HTTPS API (10250) has its own server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Awaitable, Callable, MutableMapping
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote

import h11

__all__ = ["GRACEFUL_S", "HttpServer", "LifespanFailed"]

log = logging.getLogger(__name__)

MAX_HEAD = 16 * 1024
"""Bytes a request head may take (uvicorn's default, which served these ports before)."""

MAX_BODY = 1024 * 1024
"""Bytes of request body read (and discarded) before the request is refused with 413."""

HEAD_TIMEOUT_S = 10.0
"""Seconds from a request's first byte until its head must be complete."""

KEEPALIVE_S = 5.0
"""Seconds an idle kept-alive connection stays open (uvicorn's default)."""

GRACEFUL_S = 5.0
"""Seconds requests in flight get to finish once the server closes."""

READ_SIZE = 64 * 1024

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


class LifespanFailed(RuntimeError):
    """The app's lifespan start-up failed (or raised)."""


class _Drop(Exception):
    """The connection ends here: the client left, timed out or broke the protocol."""


def _http_date(now: float) -> bytes:
    return time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(now)).encode()


class _Lifespan:
    """The ASGI lifespan protocol around the server's life."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.inbox: asyncio.Queue[Message] = asyncio.Queue()
        self.outbox: asyncio.Queue[Message] = asyncio.Queue()
        self.task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        scope: Scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}}
        await self.app(scope, self.inbox.get, self.outbox.put)

    async def _step(self, kind: str) -> None:
        assert self.task is not None
        await self.inbox.put({"type": f"lifespan.{kind}"})
        answer = asyncio.ensure_future(self.outbox.get())
        await asyncio.wait([answer, self.task], return_when=asyncio.FIRST_COMPLETED)
        if answer.done():
            message = answer.result()
            if message["type"] == f"lifespan.{kind}.complete":
                return
            raise LifespanFailed(str(message.get("message") or f"lifespan {kind} failed"))
        answer.cancel()
        err = self.task.exception()
        raise LifespanFailed(f"lifespan {kind} raised {err!r}") from err

    async def startup(self) -> None:
        self.task = asyncio.create_task(self._run(), name="http-lifespan")
        try:
            await self._step("startup")
        except LifespanFailed as failed:
            # An app may report the failure and then raise it too (Starlette does): the
            # error it raised is the cause worth showing, and is retrieved here.
            self.task.cancel()
            (ended,) = await asyncio.gather(self.task, return_exceptions=True)
            if isinstance(ended, Exception) and failed.__cause__ is None:
                raise LifespanFailed(str(failed)) from ended
            raise

    async def shutdown(self) -> None:
        if self.task is None or self.task.done():
            return
        try:
            await self._step("shutdown")
        finally:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)


class HttpServer:
    """Serves `app` on listening sockets until `close()`; see the module."""

    def __init__(self, app: App, *, name: str, graceful_s: float = GRACEFUL_S) -> None:
        self.app = app
        self.name = name
        self.graceful_s = graceful_s
        self._lifespan = _Lifespan(app)
        self._servers: list[asyncio.Server] = []
        self._busy: dict[asyncio.Task[None], bool] = {}  # connection task -> answering

    async def start(self, sock: socket.socket) -> None:
        """Run the lifespan start-up, then accept connections on `sock` (listening)."""
        await self._lifespan.startup()
        server = await asyncio.start_server(self._accept, sock=sock, limit=READ_SIZE)
        self._servers.append(server)

    async def close(self) -> None:
        """Stop accepting; let requests being answered finish (`graceful_s`), drop the
        rest; then the lifespan shutdown."""
        for server in self._servers:
            server.close()
        for task, busy in list(self._busy.items()):
            if not busy:
                task.cancel()
        pending = set(self._busy)
        if pending:
            _, late = await asyncio.wait(pending, timeout=self.graceful_s)
            for task in late:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        for server in self._servers:
            with contextlib.suppress(Exception):
                await server.wait_closed()
        self._servers.clear()
        await self._lifespan.shutdown()

    def abort(self) -> None:
        """Drop every connection now (a second cancellation while closing)."""
        for server in self._servers:
            server.close()
        for task in self._busy:
            task.cancel()
        if self._lifespan.task is not None:
            self._lifespan.task.cancel()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._busy[task] = False
        try:
            await self._connection(task, reader, writer)
        except (_Drop, ConnectionError, asyncio.IncompleteReadError):
            pass
        except Exception:  # a bug here must not end the listener
            log.exception("HTTP connection failed", extra={"server": self.name})
        finally:
            self._busy.pop(task, None)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _connection(
        self, task: asyncio.Task[None], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        peer = writer.get_extra_info("peername")
        local = writer.get_extra_info("sockname")
        while True:
            try:
                request = await self._read_head(conn, reader)
            except h11.RemoteProtocolError as err:
                await self._refuse(conn, writer, err.error_status_hint or 400)
                return
            if request is None:
                return
            self._busy[task] = True
            try:
                await self._drain_body(conn, reader)
            except h11.RemoteProtocolError as err:
                await self._refuse(conn, writer, err.error_status_hint or 400)
                return
            except _TooLarge:
                await self._refuse(conn, writer, 413)
                return
            await self._answer(conn, writer, request, peer, local)
            self._busy[task] = False
            if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                return
            conn.start_next_cycle()

    async def _read_head(
        self, conn: h11.Connection, reader: asyncio.StreamReader
    ) -> h11.Request | None:
        """The next request's head; None when the client closed or idled out between
        requests."""
        deadline: float | None = None
        loop = asyncio.get_running_loop()
        while True:
            event = conn.next_event()
            if isinstance(event, h11.Request):
                return event
            if isinstance(event, h11.ConnectionClosed):
                return None
            if event is not h11.NEED_DATA:  # pragma: no cover - h11 gives a head first
                raise _Drop()
            timeout = KEEPALIVE_S if deadline is None else max(deadline - loop.time(), 0.0)
            try:
                data = await asyncio.wait_for(reader.read(READ_SIZE), timeout)
            except TimeoutError:
                if deadline is None:
                    return None  # idle between requests: close quietly
                raise _Drop() from None
            if deadline is None and data:
                deadline = loop.time() + HEAD_TIMEOUT_S
            conn.receive_data(data)

    async def _drain_body(self, conn: h11.Connection, reader: asyncio.StreamReader) -> None:
        size = 0
        while True:
            event = conn.next_event()
            if isinstance(event, h11.EndOfMessage):
                return
            if isinstance(event, h11.Data):
                size += len(event.data)
                if size > MAX_BODY:
                    raise _TooLarge()
                continue
            if isinstance(event, h11.ConnectionClosed):
                raise _Drop()
            try:
                data = await asyncio.wait_for(reader.read(READ_SIZE), HEAD_TIMEOUT_S)
            except TimeoutError:
                raise _Drop() from None
            conn.receive_data(data)

    async def _refuse(
        self, conn: h11.Connection, writer: asyncio.StreamWriter, status: int
    ) -> None:
        if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        body = HTTPStatus(status).phrase
        with contextlib.suppress(h11.LocalProtocolError):
            writer.write(
                conn.send(
                    h11.Response(
                        status_code=status,
                        headers=[
                            (b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close"),
                            (b"date", _http_date(time.time())),
                        ],
                    )
                )
                or b""
            )
            writer.write(conn.send(h11.Data(data=body.encode())) or b"")
            writer.write(conn.send(h11.EndOfMessage()) or b"")
            await writer.drain()

    async def _answer(
        self,
        conn: h11.Connection,
        writer: asyncio.StreamWriter,
        request: h11.Request,
        peer: Any,
        local: Any,
    ) -> None:
        target = request.target
        path, _, query = target.partition(b"?")
        method = request.method.decode("ascii")
        scope: Scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": request.http_version.decode("ascii"),
            "method": method,
            "scheme": "http",
            "path": unquote(path.decode("latin-1")),
            "raw_path": path,
            "query_string": query,
            "root_path": "",
            "headers": [(name.lower(), value) for name, value in request.headers],
            "client": tuple(peer[:2]) if isinstance(peer, tuple) else None,
            "server": tuple(local[:2]) if isinstance(local, tuple) else None,
        }
        responded = False
        finished = False
        delivered = False

        async def receive() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": b"", "more_body": False}
            # The body was read in full; these apps never wait for a disconnect, and one
            # that did waits until the server closes.
            await asyncio.Event().wait()
            return {"type": "http.disconnect"}  # pragma: no cover - never reached

        async def send(message: Message) -> None:
            nonlocal responded, finished
            if message["type"] == "http.response.start":
                if responded:
                    raise RuntimeError("http.response.start sent twice")
                responded = True
                headers = [(bytes(k), bytes(v)) for k, v in message.get("headers", [])]
                if not any(k.lower() == b"date" for k, _ in headers):
                    headers.append((b"date", _http_date(time.time())))
                writer.write(
                    conn.send(h11.Response(status_code=message["status"], headers=headers))
                    or b""
                )
            elif message["type"] == "http.response.body":
                if not responded or finished:
                    raise RuntimeError("http.response.body out of order")
                body = bytes(message.get("body", b""))
                if body and method != "HEAD":
                    writer.write(conn.send(h11.Data(data=body)) or b"")
                if not message.get("more_body", False):
                    finished = True
                    writer.write(conn.send(h11.EndOfMessage()) or b"")
                await writer.drain()

        try:
            await self.app(scope, receive, send)
        except ConnectionError:  # the client went away while the answer was written
            raise _Drop() from None
        except Exception:
            log.exception(
                "HTTP app failed", extra={"server": self.name, "method": method, "path": path}
            )
            if not responded:
                await self._refuse(conn, writer, 500)
            raise _Drop() from None
        if not finished:  # the app returned without a complete answer
            if not responded:
                await self._refuse(conn, writer, 500)
            raise _Drop()


class _TooLarge(Exception):
    """The request body is over MAX_BODY."""
