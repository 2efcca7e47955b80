"""exec, attach and portForward: ask CRI for the runtime's streaming URL, then proxy the
client's upgraded connection to it byte for byte.

This is what upstream's kubelet does by default (it stopped redirecting clients to the
runtime long ago): the runtime's stream server (containerd's on 127.0.0.1) is never
exposed, and whatever protocol the client negotiates with it — SPDY/3.1 with
`X-Stream-Protocol-Version`, or WebSocket with `Sec-WebSocket-Protocol`
(v4/v5.channel.k8s.io, portforward.k8s.io) — passes through untouched:

1. the client's request head goes to the streaming server with the method and every
   header kept, except that the target becomes the streaming URL's path and query,
   `Host` names the streaming server and `Authorization` is dropped (the runtime has no
   use for the client's credentials);
2. the server's response head comes back as is; after a `101 Switching Protocols` both
   directions are spliced until either side closes (the protocols carry their own
   close frames, so a TCP half-close is not propagated) or nothing moved for
   streamingConnectionIdleTimeout; any other answer is relayed with its body and the
   connection is closed.

TLS streaming URLs (`https://`) are dialled without certificate verification: the
runtime generates a self-signed certificate for a loopback server the CRI call just
named, as upstream's kubelet trusts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Mapping, Sequence
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

MAX_RESPONSE_HEAD = 64 * 1024
BUFFER = 64 * 1024
RELAY_IDLE_S = 10.0
_DROPPED = frozenset({"host", "authorization"})


class ProxyError(Exception):
    """The streaming server could not be reached or answered garbage: a 502."""


def backend_request_head(method: str, url: str, headers: Sequence[tuple[str, str]]) -> bytes:
    """The request head to send to the streaming server at `url`."""
    parts = urlsplit(url)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    lines = [f"{method} {target} HTTP/1.1", f"Host: {parts.netloc}"]
    lines += [f"{k}: {v}" for k, v in headers if k.lower() not in _DROPPED]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def parse_response_head(head: bytes) -> tuple[int, dict[str, str]]:
    """(status, lowercased headers) of an HTTP/1.x response head. Raises ProxyError."""
    lines = head.decode("latin-1").split("\r\n")
    status_line = lines[0].split(" ", 2)
    if len(status_line) < 2 or not status_line[0].startswith("HTTP/1."):
        raise ProxyError(f"bad response from the streaming server: {lines[0][:100]!r}")
    try:
        status = int(status_line[1])
    except ValueError:
        raise ProxyError(f"bad status from the streaming server: {lines[0][:100]!r}") from None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if ":" in line:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
    return status, headers


async def _open(url: str, timeout_s: float) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    parts = urlsplit(url)
    tls = parts.scheme == "https"
    port = parts.port or (443 if tls else 80)
    context: ssl.SSLContext | None = None
    if tls:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    try:
        async with asyncio.timeout(timeout_s):
            return await asyncio.open_connection(parts.hostname, port, ssl=context)
    except (OSError, TimeoutError) as err:
        raise ProxyError(f"cannot reach the streaming server at {parts.netloc}: {err}") from err


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, touched: list[float]) -> None:
    while data := await src.read(BUFFER):
        dst.write(data)
        await dst.drain()
        touched[0] = time.monotonic()


async def _idle_watch(touched: list[float], idle_timeout_s: float) -> None:
    while True:
        left = touched[0] + idle_timeout_s - time.monotonic()
        if left <= 0:
            log.info("stream idle, closing", extra={"idle_timeout_s": idle_timeout_s})
            return
        await asyncio.sleep(left)


async def splice(
    a: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    b: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    *,
    idle_timeout_s: float,
) -> None:
    """Copy both ways until either side closes or the connection idles out."""
    touched = [time.monotonic()]
    tasks = [
        asyncio.create_task(_pipe(a[0], b[1], touched), name="stream a->b"),
        asyncio.create_task(_pipe(b[0], a[1], touched), name="stream b->a"),
        asyncio.create_task(_idle_watch(touched, idle_timeout_s), name="stream idle"),
    ]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, OSError, ConnectionError):
                await t


async def proxy_upgrade(
    client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    *,
    url: str,
    method: str,
    headers: Sequence[tuple[str, str]],
    body: bytes = b"",
    early: bytes = b"",
    idle_timeout_s: float,
    connect_timeout_s: float = 30.0,
) -> int:
    """Proxy one upgrade request to `url`; returns the streaming server's status.

    `early` holds bytes the client sent after its request head (already read by the
    HTTP layer). Raises ProxyError before anything was written to the client.
    """
    reader, writer = await _open(url, connect_timeout_s)
    try:
        writer.write(backend_request_head(method, url, headers) + body + early)
        await writer.drain()
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError as err:
            raise ProxyError("streaming server response head too large") from err
        except (asyncio.IncompleteReadError, OSError) as err:
            raise ProxyError(f"streaming server closed the connection: {err}") from err
        if len(head) > MAX_RESPONSE_HEAD:
            raise ProxyError("streaming server response head too large")
        status, response_headers = parse_response_head(head)
        client[1].write(head)
        await client[1].drain()
        if status == 101:
            await splice(client, (reader, writer), idle_timeout_s=idle_timeout_s)
        else:
            await _relay_body(reader, client[1], response_headers)
        return status
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(5):
                await writer.wait_closed()


async def _relay_body(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, headers: Mapping[str, str]
) -> None:
    # Without a length the body ends when the server closes, or (chunked, on a kept-alive
    # connection) when it falls silent: an error answer is small and sent at once.
    length = headers.get("content-length")
    remaining = int(length) if length and length.isdigit() else None
    while remaining is None or remaining > 0:
        size = BUFFER if remaining is None else min(BUFFER, remaining)
        try:
            async with asyncio.timeout(RELAY_IDLE_S):
                data = await reader.read(size)
        except TimeoutError:
            break
        if not data:
            break
        writer.write(data)
        await writer.drain()
        if remaining is not None:
            remaining -= len(data)
