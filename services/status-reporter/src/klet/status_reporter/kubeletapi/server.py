"""The kubelet API listener (port 10250): an asyncio TLS server of our own.

Why not uvicorn: exec, attach and portForward must hand the client's raw upgraded
connection to the runtime's stream server (SPDY/3.1 or WebSocket, whatever the client
negotiated), and uvicorn only offers an ASGI WebSocket, never the socket. So this
module owns the connection: an asyncio stream server on plain TCP, the TLS handshake
started per connection with the SSLContext `tlsconfig.ServingTLS` holds at that moment
(so a reloaded certificate or client CA serves the next handshake), h11 (the HTTP/1.1
state machine uvicorn itself uses) to read request heads and frame responses, and per
request:

1. authenticate and authorize (`gate.py`) on the request head alone: 401, 403 or 500
   with upstream's bodies, 429 when the review it needs has no free slot. A refused
   request's body is never read: when it has one, the answer says `Connection: close`
   and the connection is closed; so it is when no request on the connection was let
   through yet (a client without credentials gets one answer per connection, and so
   one review per handshake);
2. an upgrade request to /exec, /attach or /portForward: resolve the runtime's URL
   (`app.resolve_stream_url`) and proxy the connection (`streaming.proxy_upgrade`);
   the connection then belongs to the stream and is closed with it;
3. anything else: call the FastAPI app of `app.py` in-process through a minimal ASGI
   adapter (one `http` scope per request, body read in full first, responses framed
   by h11 — chunked when the app streams, as followed logs do). While the app runs, a
   reader watches the socket so a client that goes away is reported as
   `http.disconnect` and a followed log stops.

What one client can make the server hold is bounded, since anyone who reaches the port
can open connections before any credential is checked:

- connections: a global and a per-client cap, and a small pool (with a per-client
  share) for connections no request was let through on yet (`connlimits.py`), counted
  from accept, before the handshake; one over a cap is closed unanswered, and when the
  unauthenticated pool is full a newcomer takes the place of the oldest connection of
  the client holding the most of it;
- time: the TLS handshake (10 s) and then the whole request head (10 s) each have a
  deadline, not an idle timeout that each byte restarts (a client sending a byte a
  second is cut off); a kept-alive connection may idle 90 s between requests only once
  a request on it was authenticated, and its next head has the same deadline from its
  first byte; the body of an authorized request has its own (60 s);
- memory: the request head is bounded (64 KiB; upstream's 1 MiB would let the
  unauthenticated pool alone pin 128 MiB), a body (1 MiB; a larger Content-Length is
  refused before a byte of it is read), and what a client sends while a response is
  being produced (a head and a body's worth, then the connection is closed); writes
  wait for the client to take the bytes (drain). asyncio's TLS layer gives every
  connection a 256 KiB read buffer, zero-filled at once (so resident) before the
  handshake; `serve_kubelet_api` lowers it to 32 KiB (TLS records are at most 16 KiB),
  which brings an idle connection from about 300 KiB to under 100 KiB;
- work: TokenReviews and SubjectAccessReviews run in bounded slots, on an apiserver
  client with threads of its own (`reviewslots.py`).

The alternative, uvicorn on a private unix socket behind a reverse proxy here, would
parse every request twice and still need this module's upgrade handling; in-process is
smaller and has one fewer moving part. HTTP/2 is not offered (ALPN http/1.1), which
SPDY and WebSocket need anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import SplitResult, unquote, urlsplit

import h11
from klet.status_reporter.kubeletapi.app import HttpProblem, create_app, resolve_stream_url
from klet.status_reporter.kubeletapi.connlimits import (
    ConnectionCaps,
    ConnectionLimiter,
    RefusalLog,
    Ticket,
    client_key,
)
from klet.status_reporter.kubeletapi.deps import KubeletApiDeps, KubeletApiSettings
from klet.status_reporter.kubeletapi.gate import Gate
from klet.status_reporter.kubeletapi.requestmetrics import path_buckets, request_labels
from klet.status_reporter.kubeletapi.routes import (
    StreamTarget,
    is_upgrade,
    is_websocket,
    parse_stream_path,
)
from klet.status_reporter.kubeletapi.streaming import ProxyError, proxy_upgrade
from klet.status_reporter.kubeletapi.tlsconfig import ServingTLS, TLSSettings

log = logging.getLogger(__name__)

READ_SIZE = 64 * 1024

TLS_READ_BUFFER = 32 * 1024
"""asyncio's per-connection TLS read buffer here (its default is 256 KiB)."""


def shrink_tls_read_buffer(size: int = TLS_READ_BUFFER) -> None:
    """Lower the read buffer asyncio's TLS protocol allocates for every connection.

    `SSLProtocol.__init__` zero-fills a `max_size` bytearray (256 KiB in Python 3.11 and
    3.12), resident from accept, and neither `start_tls` nor the server API offers a way
    to choose it per connection: the class attribute is the only hook. It is the socket
    read size and the largest plaintext chunk handed on, so 32 KiB (two full TLS
    records) costs a few more loop iterations on a bulk stream and nothing else. It
    applies to every asyncio TLS connection of the process (the bus client's too),
    which is the same trade everywhere."""
    sslproto: Any = getattr(asyncio, "sslproto", None)
    protocol = getattr(sslproto, "SSLProtocol", None)
    if protocol is not None and getattr(protocol, "max_size", 0) > size:
        protocol.max_size = size


class _Closed(Exception):
    """The client went away, broke the protocol or missed a deadline: drop the
    connection (`abort`: at once, with nothing left to tell it)."""

    def __init__(self, reason: str, *, abort: bool = False) -> None:
        super().__init__(reason)
        self.abort = abort


CLOSE_TIMEOUT_S = 2.0
"""How long a connection closed with an answer may take to finish its TLS shutdown
before it is aborted; it stays counted against the caps until then."""


async def _close(writer: asyncio.StreamWriter, *, abort: bool) -> None:
    """Close a connection: gracefully (the answer is delivered, close_notify exchanged)
    within CLOSE_TIMEOUT_S, else, or when `abort`, by a reset. asyncio's own TLS
    shutdown waits 30 s for a client that never answers close_notify, holding the
    connection's memory, which a client without credentials could repeat at will."""
    if not abort and writer.transport is not None:
        writer.close()
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await writer.wait_closed()
            return
        except Exception:  # noqa: BLE001 - timed out or failed: reset it
            pass
    _abort(writer)


def _abort(writer: asyncio.StreamWriter) -> None:
    transport: Any = writer.transport
    if transport is not None:
        transport.abort()


def tls_settings(s: KubeletApiSettings) -> TLSSettings:
    return TLSSettings(
        cert_file=s.tls_cert_file,
        key_file=s.tls_private_key_file,
        cert_dir=s.cert_dir,
        host=s.node_name,
        ips=s.node_ips,
        client_ca_file=s.client_ca_file,
        min_version=s.tls_min_version,
        cipher_suites=s.tls_cipher_suites,
        check_interval_s=s.tls_reload_interval_s,
        issued_by_api=s.server_tls_bootstrap,
    )


def expects_body(headers: Mapping[str, str]) -> bool:
    """Whether a request (already framed by h11, so its headers are consistent) carries
    a body."""
    if "transfer-encoding" in headers:
        return True
    length = headers.get("content-length", "0").strip()
    return length != "0" and length != ""


def declared_length(headers: Mapping[str, str]) -> int | None:
    length = headers.get("content-length", "").split(",")[0].strip()
    return int(length) if length.isdigit() else None


class _Connection:
    """One client connection: a loop of requests until close, or one proxied stream."""

    def __init__(
        self,
        deps: KubeletApiDeps,
        app: Any,
        gate: Gate,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        on_authenticated: Callable[[], None] = lambda: None,
    ) -> None:
        self.deps = deps
        self.on_authenticated = on_authenticated
        self.settings = deps.settings
        self.app = app
        self.gate = gate
        self.reader = reader
        self.writer = writer
        self.h11 = h11.Connection(
            h11.SERVER, max_incomplete_event_size=deps.settings.max_header_bytes
        )
        self.peercert = writer.get_extra_info("peercert")
        self.peer = writer.get_extra_info("peername")
        self.sock = writer.get_extra_info("sockname")
        self.authenticated = False
        """A request on this connection passed the gate: it may idle between requests."""
        self.buckets = path_buckets(
            debugging=self.settings.enable_debugging_handlers,
            checkpoint=self.settings.container_checkpoint,
        )

    # -- I/O -----------------------------------------------------------------------------

    async def _send(self, event: Any) -> None:
        data = self.h11.send(event)
        if data:
            self.writer.write(data)
            try:
                await self.writer.drain()
            except (OSError, ConnectionError) as err:
                raise _Closed(str(err)) from err

    def _event(self) -> Any:
        try:
            return self.h11.next_event()
        except h11.RemoteProtocolError as err:
            raise _ProtocolError(err) from err

    async def _receive(self, deadline: float, what: str, *, at_most: int = READ_SIZE) -> int:
        """Feed h11 the next bytes (at most `at_most`), which must come before `deadline`
        (loop time); how many."""
        try:
            async with asyncio.timeout_at(deadline):
                data = await self.reader.read(max(1, min(READ_SIZE, at_most)))
        except TimeoutError as err:
            raise _Closed(f"{what} deadline passed", abort=True) from err
        except (OSError, ConnectionError) as err:
            raise _Closed("reset", abort=True) from err
        self.h11.receive_data(data)
        return len(data)

    async def _read_head(self) -> h11.Request | None:
        """The next request head; None when the client closed between requests."""
        s = self.settings
        now = asyncio.get_running_loop().time()
        # Until a request authenticated here, the head's deadline runs from the end of
        # the handshake (or of the last answer): an unauthenticated client may not idle.
        buffered = len(self.h11.trailing_data[0])
        started = not self.authenticated or bool(buffered)
        deadline = now + (s.header_timeout_s if started else s.idle_timeout_s)
        while True:
            event = self._event()
            if event is h11.NEED_DATA:
                # h11 refuses a head only while it is incomplete past the bound: never
                # feed it more than one byte past it, so a head that would complete
                # beyond it is refused too (431) instead of being parsed whole.
                buffered += await self._receive(
                    deadline,
                    "request head" if started else "idle",
                    at_most=s.max_header_bytes + 1 - buffered,
                )
                if not started:
                    started = True
                    deadline = asyncio.get_running_loop().time() + s.header_timeout_s
                continue
            if isinstance(event, h11.ConnectionClosed):
                return None
            if isinstance(event, h11.Request):
                return event
            raise _Closed(f"unexpected {type(event).__name__}")

    async def _read_body(self) -> bytes | None:
        """The request body (None when larger than max_body_bytes), which must arrive
        within body_timeout_s."""
        if self.h11.they_are_waiting_for_100_continue:
            await self._send(h11.InformationalResponse(status_code=100, headers=[]))
        deadline = asyncio.get_running_loop().time() + self.settings.body_timeout_s
        chunks: list[bytes] = []
        size = 0
        while True:
            event = self._event()
            if event is h11.NEED_DATA:
                await self._receive(deadline, "request body")
            elif isinstance(event, h11.Data):
                size += len(event.data)
                if size > self.settings.max_body_bytes:
                    return None
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                return b"".join(chunks)
            else:
                raise _Closed("request ended early")

    async def _protocol_error(self, err: h11.RemoteProtocolError) -> None:
        if self.h11.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            with contextlib.suppress(Exception):
                status = err.error_status_hint
                await self._send_text(status, "Bad Request" if status == 400 else str(err))

    async def _send_text(self, status: int, body: str, *, close: bool = False) -> None:
        data = body.encode()
        headers = [
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"x-content-type-options", b"nosniff"),
            (b"content-length", str(len(data)).encode()),
        ]
        if status == 429:
            headers.append((b"retry-after", b"1"))
        if close:
            headers.append((b"connection", b"close"))
        await self._send(h11.Response(status_code=status, headers=headers))
        await self._send(h11.Data(data=data))
        await self._send(h11.EndOfMessage())

    # -- requests ------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            await self._requests()
        except _ProtocolError as err:
            await self._protocol_error(err.error)
            raise _Closed(str(err.error)) from err

    async def _requests(self) -> None:
        while True:
            request = await self._read_head()
            if request is None:
                return
            if await self._handle(request):
                return  # answered with close, or the connection went to a stream
            if self.h11.our_state is not h11.DONE or self.h11.their_state is not h11.DONE:
                return
            self.h11.start_next_cycle()

    async def _handle(self, request: h11.Request) -> bool:
        """Answer one request, counted and timed as upstream's server does (every
        request, refused ones too; a stream until it closes): True when the connection
        is done (closed by the answer, or handed to a stream)."""
        method = request.method.decode("ascii", "replace")
        target = urlsplit(request.target.decode("latin-1"))
        verb, root, long_running = request_labels(method, unquote(target.path), self.buckets)
        labels = (verb, root, "readwrite", long_running)
        metrics = self.deps.metrics
        metrics.http_request_started(labels)
        started = time.monotonic()
        try:
            return await self._answer(request, method, target)
        finally:
            metrics.http_request_done(labels, time.monotonic() - started)

    async def _answer(self, request: h11.Request, method: str, target: SplitResult) -> bool:
        path = unquote(target.path)
        headers: dict[str, str] = {}
        for name, value in request.headers:
            key, text = name.decode("latin-1"), value.decode("latin-1")
            headers[key] = f"{headers[key]}, {text}" if key in headers else text
        has_body = expects_body(headers)
        denied = await self.gate.check(method, path, headers, self.peercert)
        if denied is not None:
            # The body of a refused request is not read: close instead of draining it.
            # A connection nothing was let through on yet is closed too, giving its
            # place in the unauthenticated pool back.
            close = has_body or not self.authenticated
            await self._send_text(*denied, close=close)
            if close:
                return True
            await self._read_body()  # the EndOfMessage h11 already holds
            return False
        if not self.authenticated:
            self.authenticated = True
            self.on_authenticated()
        length = declared_length(headers)
        if length is not None and length > self.settings.max_body_bytes:
            await self._send_text(413, "Request Entity Too Large", close=True)
            return True
        body = await self._read_body()
        if body is None:
            await self._send_text(413, "Request Entity Too Large", close=True)
            return True
        stream = parse_stream_path(target.path) if method in ("GET", "POST") else None
        if stream is not None and is_upgrade(headers):
            return await self._stream(request, body, stream, target.query, headers)
        await self._asgi(request, method, target.path, target.query, body)
        return False

    async def _stream(
        self,
        request: h11.Request,
        body: bytes,
        stream: StreamTarget,
        query: str,
        headers: Mapping[str, str],
    ) -> bool:
        try:
            url = await resolve_stream_url(
                self.deps, stream, query, websocket=is_websocket(headers)
            )
        except HttpProblem as err:
            await self._send_text(err.status, err.body)
            return False
        early, _ = self.h11.trailing_data
        raw = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw_items()]
        log.debug("proxying stream", extra={"kind": stream.kind, "pod": stream.pod})
        try:
            await proxy_upgrade(
                (self.reader, self.writer),
                url=url,
                method=request.method.decode("ascii"),
                headers=raw,
                body=body,
                early=bytes(early),
                idle_timeout_s=self.settings.streaming_idle_timeout_s,
            )
        except ProxyError as err:
            log.error("streaming proxy failed", extra={"url": url, "error": str(err)})
            with contextlib.suppress(Exception):
                await self._send_text(502, str(err), close=True)
        return True

    async def _asgi(
        self, request: h11.Request, method: str, raw_path: str, query: str, body: bytes
    ) -> None:
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": request.http_version.decode("ascii"),
            "method": method,
            "scheme": "https",
            "path": unquote(raw_path),
            "raw_path": raw_path.encode("latin-1"),
            "query_string": query.encode("latin-1"),
            "root_path": "",
            "headers": [(bytes(k), bytes(v)) for k, v in request.headers],
            "client": tuple(self.peer[:2]) if self.peer else None,
            "server": tuple(self.sock[:2]) if self.sock else None,
        }
        disconnected = asyncio.Event()
        # What the client sends while the app answers (a pipelined request) is kept for
        # h11, up to a head and a body's worth; more is abuse and ends the connection.
        stash = bytearray()
        stash_limit = self.settings.max_header_bytes + self.settings.max_body_bytes
        eof = False
        overflow = False
        request_sent = False
        started = False

        async def watch() -> None:
            nonlocal eof, overflow
            while True:
                try:
                    data = await self.reader.read(READ_SIZE)
                except (OSError, ConnectionError):
                    data = b""
                if not data:
                    eof = True
                    disconnected.set()
                    return
                stash.extend(data)
                if len(stash) > stash_limit:
                    overflow = True
                    disconnected.set()
                    return

        async def receive() -> dict[str, Any]:
            nonlocal request_sent
            if not request_sent:
                request_sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await disconnected.wait()
            return {"type": "http.disconnect"}

        async def send(message: Mapping[str, Any]) -> None:
            nonlocal started
            if disconnected.is_set():
                raise OSError("client disconnected")
            if message["type"] == "http.response.start":
                started = True
                await self._send(
                    h11.Response(
                        status_code=message["status"], headers=list(message.get("headers", []))
                    )
                )
            elif message["type"] == "http.response.body":
                data = message.get("body", b"")
                if data and method != "HEAD":
                    await self._send(h11.Data(data=data))
                if not message.get("more_body", False):
                    await self._send(h11.EndOfMessage())

        watcher = asyncio.create_task(watch(), name="kubelet-api client watch")
        try:
            await self.app(scope, receive, send)
        except _Closed:
            raise
        except Exception as err:  # noqa: BLE001 - an app bug answers 500, the server lives
            if started or disconnected.is_set():
                raise _Closed(f"app failed mid-response: {err}") from err
            log.exception("kubelet API request failed", extra={"path": raw_path})
            await self._send_text(500, "Internal Server Error", close=True)
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        if overflow:
            raise _Closed("the client sent too much while its answer was produced")
        if stash:
            self.h11.receive_data(bytes(stash))
        if eof:
            self.h11.receive_data(b"")


class _ProtocolError(Exception):
    def __init__(self, error: h11.RemoteProtocolError) -> None:
        super().__init__(str(error))
        self.error = error


class _PausedProtocol(asyncio.StreamReaderProtocol):
    """A stream protocol that does not read until TLS starts: the client's first
    handshake bytes must stay in the socket for `start_tls`, since bytes the stream
    reader took meanwhile would be lost to the handshake (and choosing the context may
    yield to a reload). `start_tls` resumes reading."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if isinstance(transport, asyncio.ReadTransport):
            transport.pause_reading()
        super().connection_made(transport)


async def serve_kubelet_api(
    deps: KubeletApiDeps,
    *,
    ready: asyncio.Event | None = None,
    on_listening: Callable[[str, int], None] | None = None,
    tls: ServingTLS | None = None,
    reuse_port: bool = False,
) -> None:
    """Serve the kubelet API on settings.address:port until cancelled.

    Raises OSError when the port cannot be bound or the certificate files cannot be
    read, ValueError for a bad TLS or authorization setting. `on_listening(host, port)`
    gets the bound address (port 0 in tests) before `ready` is set. `tls` replaces the
    `ServingTLS` built from the settings (tests inject one with a clock). `reuse_port`
    sets SO_REUSEPORT, so every replica of the service listens on the same port and the
    kernel spreads connections over them (see klet.obs.serve_http).
    """
    s = deps.settings
    serving_tls = tls if tls is not None else ServingTLS(tls_settings(s))
    await asyncio.to_thread(serving_tls.load_at_start)
    shrink_tls_read_buffer()
    gate = Gate(deps)
    app = create_app(deps)
    limiter = ConnectionLimiter(
        ConnectionCaps(
            max_total=s.max_connections,
            max_per_client=s.max_connections_per_client,
            max_unauthenticated=s.max_unauthenticated_connections,
            max_unauthenticated_per_client=s.max_unauthenticated_per_client,
        )
    )
    metrics = deps.metrics
    metrics.open.labels(state="unauthenticated").set_function(lambda: limiter.unauthenticated)
    metrics.open.labels(state="authenticated").set_function(
        lambda: limiter.total - limiter.unauthenticated
    )
    refusals = RefusalLog()
    evictions = RefusalLog(action="closing unauthenticated connections for others", done="closed")
    connections: set[asyncio.Task[Any]] = set()
    # How to end each unauthenticated connection, should its place be given away.
    evictors: dict[Ticket, Callable[[], None]] = {}
    # Set when the server stops and cancels its open connections: a connection task
    # then ends normally. asyncio's stream protocol (Python 3.11) asks a finished
    # connection task for its exception, which raises for a cancelled one and is logged
    # as "Exception in callback" for every connection open at shutdown.
    closing = False

    def authenticated(ticket: Ticket) -> None:
        limiter.authenticated(ticket)
        evictors.pop(ticket, None)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        key = client_key(writer.get_extra_info("peername"))
        admission = limiter.admit(key)
        ticket = admission.ticket
        if ticket is None:
            metrics.refused.labels(reason=admission.refused).inc()
            refusals.refused(admission.message)
            writer.transport.abort()
            return
        if admission.evicted is not None:
            metrics.evicted.inc()
            evictions.refused(admission.message)
            evict = evictors.pop(admission.evicted, None)
            if evict is not None:
                evict()
        task = asyncio.current_task()
        assert task is not None
        connections.add(task)
        abort = True
        try:
            # An eviction ends whatever the connection awaits (its handshake, a head) as
            # this scope's timeout: the task itself is never cancelled (see `closing`).
            async with asyncio.timeout(None) as scope:
                loop = asyncio.get_running_loop()
                evictors[ticket] = lambda: scope.reschedule(loop.time())
                context = await serving_tls.current()
                await writer.start_tls(context, ssl_handshake_timeout=s.handshake_timeout_s)
                await _Connection(
                    deps, app, gate, reader, writer, on_authenticated=lambda: authenticated(ticket)
                ).run()
            abort = False
        except _Closed as err:
            abort = err.abort
        except (ssl.SSLError, OSError, ConnectionError, TimeoutError):
            pass
        except asyncio.CancelledError:
            if not closing:
                raise
        except Exception:  # noqa: BLE001 - one broken connection must not end the server
            log.exception(
                "kubelet API connection failed",
                extra={"peer": str(writer.get_extra_info("peername"))},
            )
        finally:
            evictors.pop(ticket, None)
            # Counted (and awaited by a stopping server) until it is really gone: a
            # closing connection still holds its memory.
            try:
                await _close(writer, abort=abort or closing)
            except asyncio.CancelledError:
                _abort(writer)
                if not closing:
                    raise
            finally:
                limiter.release(ticket)
                connections.discard(task)

    try:
        server = await asyncio.get_running_loop().create_server(
            lambda: _PausedProtocol(asyncio.StreamReader(limit=READ_SIZE), handle),
            s.address,
            s.port,
            reuse_port=reuse_port or None,
            # The kernel's bound (as Go's listeners), not asyncio's 100: while refused
            # connections churn, an apiserver's SYN must not find the queue full.
            backlog=socket.SOMAXCONN,
        )
    except OSError as err:
        raise OSError(
            err.errno, f"kubelet API: cannot listen on {s.address}:{s.port}: {err.strerror}"
        ) from err
    host, port = server.sockets[0].getsockname()[:2]
    log.info(
        "kubelet API listening",
        extra={"host": host, "port": port, "certificate": str(serving_tls.cert_path)},
    )
    if on_listening is not None:
        on_listening(host, port)
    if ready is not None:
        ready.set()
    try:
        async with server:
            await server.serve_forever()
    finally:
        server.close()
        closing = True
        for task in list(connections):
            task.cancel()
        if connections:
            await asyncio.wait(list(connections), timeout=5)
