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
   with upstream's bodies. A refused request's body is never read: when it has one,
   the answer says `Connection: close` and the connection is closed;
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

- connections: a global and a per-client cap (`connlimits.py`), counted from accept,
  before the handshake; one over a cap is closed unanswered;
- time: the TLS handshake (10 s) and then the whole request head (10 s) each have a
  deadline, not an idle timeout that each byte restarts (a client sending a byte a
  second is cut off); a kept-alive connection may idle 90 s between requests only once
  a request on it was authenticated, and its next head has the same deadline from its
  first byte; the body of an authorized request has its own (60 s);
- memory: the request head is bounded (1 MiB, upstream's MaxHeaderBytes), a body
  (1 MiB; a larger Content-Length is refused before a byte of it is read), and what a
  client sends while a response is being produced (a head and a body's worth, then the
  connection is closed); writes wait for the client to take the bytes (drain).

The alternative, uvicorn on a private unix socket behind a reverse proxy here, would
parse every request twice and still need this module's upgrade handling; in-process is
smaller and has one fewer moving part. HTTP/2 is not offered (ALPN http/1.1), which
SPDY and WebSocket need anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

import h11
from klet.status_reporter.kubeletapi.app import HttpProblem, create_app, resolve_stream_url
from klet.status_reporter.kubeletapi.connlimits import (
    ConnectionLimiter,
    RefusalLog,
    client_key,
)
from klet.status_reporter.kubeletapi.deps import KubeletApiDeps, KubeletApiSettings
from klet.status_reporter.kubeletapi.gate import Gate
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


class _Closed(Exception):
    """The client went away, broke the protocol or missed a deadline: drop the
    connection."""


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
    ) -> None:
        self.deps = deps
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

    async def _receive(self, deadline: float, what: str) -> None:
        """Feed h11 the next bytes, which must come before `deadline` (loop time)."""
        try:
            async with asyncio.timeout_at(deadline):
                data = await self.reader.read(READ_SIZE)
        except TimeoutError as err:
            raise _Closed(f"{what} deadline passed") from err
        except (OSError, ConnectionError) as err:
            raise _Closed("reset") from err
        self.h11.receive_data(data)

    async def _read_head(self) -> h11.Request | None:
        """The next request head; None when the client closed between requests."""
        s = self.settings
        now = asyncio.get_running_loop().time()
        # Until a request authenticated here, the head's deadline runs from the end of
        # the handshake (or of the last answer): an unauthenticated client may not idle.
        started = not self.authenticated or bool(self.h11.trailing_data[0])
        deadline = now + (s.header_timeout_s if started else s.idle_timeout_s)
        while True:
            event = self._event()
            if event is h11.NEED_DATA:
                await self._receive(deadline, "request head" if started else "idle")
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
        """Answer one request; True when the connection is done (closed by the answer,
        or handed to a stream)."""
        method = request.method.decode("ascii", "replace")
        target = urlsplit(request.target.decode("latin-1"))
        path = unquote(target.path)
        headers: dict[str, str] = {}
        for name, value in request.headers:
            key, text = name.decode("latin-1"), value.decode("latin-1")
            headers[key] = f"{headers[key]}, {text}" if key in headers else text
        has_body = expects_body(headers)
        denied = await self.gate.check(method, path, headers, self.peercert)
        if denied is not None:
            # The body of a refused request is not read: close instead of draining it.
            await self._send_text(*denied, close=has_body)
            if has_body:
                return True
            await self._read_body()  # the EndOfMessage h11 already holds
            return False
        self.authenticated = True
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
    await asyncio.to_thread(serving_tls.load)
    gate = Gate(deps)
    app = create_app(deps)
    limiter = ConnectionLimiter(
        max_total=s.max_connections, max_per_client=s.max_connections_per_client
    )
    refusals = RefusalLog()
    connections: set[asyncio.Task[Any]] = set()
    # Set when the server stops and cancels its open connections: a connection task
    # then ends normally. asyncio's stream protocol (Python 3.11) asks a finished
    # connection task for its exception, which raises for a cancelled one and is logged
    # as "Exception in callback" for every connection open at shutdown.
    closing = False

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        key = client_key(writer.get_extra_info("peername"))
        refused = limiter.acquire(key)
        if refused is not None:
            refusals.refused(refused)
            writer.transport.abort()
            return
        task = asyncio.current_task()
        assert task is not None
        connections.add(task)
        try:
            context = await serving_tls.current()
            await writer.start_tls(context, ssl_handshake_timeout=s.handshake_timeout_s)
            await _Connection(deps, app, gate, reader, writer).run()
        except (_Closed, ssl.SSLError, OSError, ConnectionError, TimeoutError):
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
            limiter.release(key)
            connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 2)

    try:
        server = await asyncio.get_running_loop().create_server(
            lambda: _PausedProtocol(asyncio.StreamReader(limit=READ_SIZE), handle),
            s.address,
            s.port,
            reuse_port=reuse_port or None,
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
