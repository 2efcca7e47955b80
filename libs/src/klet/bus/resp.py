"""A small asyncio Redis client for the bus: RESP2 over a unix socket, TCP or TLS.

The bus needs about twenty commands, a pool and pipelines; a general client library
costs every service about 11 MB of resident memory for the rest (bench/README.md).
This one sends commands as arrays of bulk strings and reads replies as Python values:
simple and bulk strings as `str` (UTF-8; bytes that are not come out as U+FFFD, so a
corrupt value reaches the record decoder, which rejects it, instead of failing the
call), integers as `int`, arrays as `list`, nil as `None`, and an error reply as
`ReplyError` (raised, or returned in place inside a pipeline's replies until all are
read).

Connections. At most `max_connections` at once; a call that finds none free waits up
to the timeout. A connection is used by one call at a time and goes back to the pool
only after a complete reply: a call that failed, timed out or was cancelled part-way
closes its connection, so no later call can read a stale reply. A pooled connection
that Redis closed meanwhile (Redis restarted) fails at once with end-of-file or a
reset; the call is then made once more on a new connection, as a client that checked
the connection first would have done. A timeout is not retried.

Errors. `ConnectionFailed` (Redis unreachable, refused the credentials, did not answer
in time, or the connection broke) and `ReplyError` (Redis answered with an error) are
both `RespError`; nothing else escapes a call but a cancellation.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

Arg = str | int | float | bytes


class RespError(Exception):
    """Base of the client's errors."""


class ConnectionFailed(RespError):
    """Redis could not be reached, refused the credentials, did not answer in time, or
    the connection broke during the call."""


class ReplyError(RespError):
    """Redis answered with an error reply; `code` is its first word (ERR, NOSCRIPT,
    NOGROUP, NOPERM, or a script's own such as FENCED)."""

    @property
    def code(self) -> str:
        return str(self).split(" ", 1)[0]


class _Broken(ConnectionFailed):
    """The connection was closed by the other end before any reply came: a pooled
    connection Redis dropped; worth one more try on a new connection."""


@dataclass(frozen=True)
class Endpoint:
    """Where Redis is: a unix socket path, or a host and port (with TLS for rediss://),
    the database number and any credentials the URL carries."""

    url: str
    path: str = ""
    host: str = ""
    port: int = 6379
    tls: bool = False
    db: int = 0
    username: str = ""
    password: str = ""

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        """`unix:///path/to/socket[?db=N]`, `redis://[user:pass@]host[:port][/N]` or
        the same with `rediss://`; ValueError naming what is wrong otherwise."""
        parts = urlsplit(url)
        username = unquote(parts.username or "")
        password = unquote(parts.password or "")
        query = parse_qs(parts.query)
        if parts.scheme == "unix":
            if not parts.path:
                raise ValueError(f"{url!r}: a unix:// Redis URL needs the socket's path")
            db = query.get("db", ["0"])[0]
            return cls(url, path=parts.path, db=_db(url, db), username=username, password=password)
        if parts.scheme not in ("redis", "rediss"):
            raise ValueError(f"{url!r}: a Redis URL is unix://, redis:// or rediss://")
        if not parts.hostname:
            raise ValueError(f"{url!r}: a Redis URL needs a host")
        db = parts.path.strip("/") or query.get("db", ["0"])[0]
        return cls(
            url,
            host=parts.hostname,
            port=parts.port or 6379,
            tls=parts.scheme == "rediss",
            db=_db(url, db),
            username=username,
            password=password,
        )

    def describe(self) -> str:
        return self.path if self.path else f"{self.host}:{self.port}"


def _db(url: str, text: str) -> int:
    if not text.isdigit():
        raise ValueError(f"{url!r}: the database must be a number, not {text!r}")
    return int(text)


@dataclass(frozen=True)
class TLSFiles:
    """For rediss://: the CA to check the server against (None: the system's) and an
    optional client certificate and key."""

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def call(self, commands: Sequence[Sequence[Arg]], timeout_s: float) -> list[Any]:
        """Send `commands` at once and read one reply each (error replies in place)."""
        try:
            async with asyncio.timeout(timeout_s):
                self.writer.write(b"".join(_encode(c) for c in commands))
                await self.writer.drain()
                replies = [await _read(self.reader)]
                replies += [await _read(self.reader) for _ in commands[1:]]
                return replies
        except TimeoutError:
            raise ConnectionFailed(f"Redis did not answer within {timeout_s:g}s") from None
        except (asyncio.IncompleteReadError, ConnectionResetError, BrokenPipeError) as err:
            raise _Broken(f"Redis closed the connection: {_describe(err)}") from err
        except (OSError, asyncio.LimitOverrunError, ValueError) as err:
            raise ConnectionFailed(f"connection to Redis failed: {_describe(err)}") from err

    def close(self) -> None:
        self.writer.close()


def _describe(err: BaseException) -> str:
    if isinstance(err, asyncio.IncompleteReadError):
        return "end of file"
    return str(err) or type(err).__name__


def _encode(args: Sequence[Arg]) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


async def _read(reader: asyncio.StreamReader) -> Any:
    line = await reader.readuntil(b"\r\n")
    kind, rest = line[:1], line[1:-2]
    if kind == b"$":
        size = int(rest)
        if size < 0:
            return None
        return (await reader.readexactly(size + 2))[:-2].decode(errors="replace")
    if kind == b"*":
        size = int(rest)
        if size < 0:
            return None
        return [await _read(reader) for _ in range(size)]
    if kind == b":":
        return int(rest)
    if kind == b"+":
        return rest.decode(errors="replace")
    if kind == b"-":
        return ReplyError(rest.decode(errors="replace"))
    raise ValueError(f"not a RESP2 reply: {line[:40]!r}")


class RespClient:
    """A pool of connections to one Redis, authenticated as one user."""

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        username: str = "",
        password: str = "",
        tls: TLSFiles | None = None,
        max_connections: int = 32,
        timeout_s: float = 5.0,
    ) -> None:
        self.endpoint = endpoint
        self.username = username or endpoint.username
        self.password = password or endpoint.password
        self.tls = tls or TLSFiles()
        self.timeout_s = timeout_s
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: list[_Connection] = []
        self._closed = False

    async def execute(self, *args: Arg, block_s: float = 0.0) -> Any:
        """One command's reply; `block_s` is how long a blocking command (XREAD BLOCK)
        may wait on the server, on top of the timeout."""
        (reply,) = await self._run([args], self.timeout_s + block_s)
        if isinstance(reply, ReplyError):
            raise reply
        return reply

    async def pipeline(self, commands: Sequence[Sequence[Arg]], *, transaction: bool) -> list[Any]:
        """The replies of `commands` sent in one round trip (in MULTI/EXEC when
        `transaction`); raises the first error reply, after reading them all."""
        if transaction:
            replies = await self._run([("MULTI",), *commands, ("EXEC",)], self.timeout_s)
            for reply in replies:
                if isinstance(reply, ReplyError):
                    raise reply
            executed = replies[-1]
            if not isinstance(executed, list):
                raise ReplyError(f"EXECABORT the transaction was not executed: {executed!r}")
            replies = executed
        else:
            replies = await self._run(commands, self.timeout_s)
        for reply in replies:
            if isinstance(reply, ReplyError):
                raise reply
        return replies

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    async def _run(self, commands: Sequence[Sequence[Arg]], timeout_s: float) -> list[Any]:
        deadline = time.monotonic() + self.timeout_s
        try:
            async with asyncio.timeout(self.timeout_s):
                await self._slots.acquire()
        except TimeoutError:
            raise ConnectionFailed(
                f"no free connection to Redis within {self.timeout_s:g}s"
            ) from None
        try:
            while True:
                pooled = bool(self._idle)
                conn = self._idle.pop() if pooled else await self._connect(deadline)
                try:
                    replies = await conn.call(commands, timeout_s)
                except _Broken:
                    conn.close()
                    if pooled:
                        continue  # Redis dropped it while idle: once more, on a new one
                    raise
                except BaseException:
                    conn.close()  # its state is unknown: a late reply must not be read
                    raise
                if self._closed:
                    conn.close()
                else:
                    self._idle.append(conn)
                return replies
        finally:
            self._slots.release()

    async def _connect(self, deadline: float) -> _Connection:
        where = self.endpoint.describe()
        try:
            async with asyncio.timeout(max(deadline - time.monotonic(), 0.001)):
                if self.endpoint.path:
                    reader, writer = await asyncio.open_unix_connection(self.endpoint.path)
                elif self.endpoint.tls:
                    reader, writer = await asyncio.open_connection(
                        self.endpoint.host,
                        self.endpoint.port,
                        ssl=self._ssl_context(),
                        server_hostname=self.endpoint.host,
                    )
                else:
                    reader, writer = await asyncio.open_connection(
                        self.endpoint.host, self.endpoint.port
                    )
        except TimeoutError:
            raise ConnectionFailed(
                f"cannot connect to Redis at {where} within {self.timeout_s:g}s"
            ) from None
        except OSError as err:
            raise ConnectionFailed(f"cannot connect to Redis at {where}: {err}") from err
        conn = _Connection(reader, writer)
        hello: list[tuple[Arg, ...]] = []
        if self.password:
            user = (self.username,) if self.username else ()
            hello.append(("AUTH", *user, self.password))
        if self.endpoint.db:
            hello.append(("SELECT", self.endpoint.db))
        if not hello:
            return conn
        try:
            replies = await conn.call(hello, max(deadline - time.monotonic(), 0.001))
        except BaseException:
            conn.close()
            raise
        for reply in replies:
            if isinstance(reply, ReplyError):
                conn.close()
                who = self.username or "default"
                raise ConnectionFailed(f"Redis at {where} refused user {who}: {reply}")
        return conn

    def _ssl_context(self) -> Any:
        import ssl  # only for rediss://

        context = ssl.create_default_context(
            cafile=str(self.tls.ca_file) if self.tls.ca_file else None
        )
        if self.tls.cert_file is not None:
            key = str(self.tls.key_file) if self.tls.key_file else None
            context.load_cert_chain(str(self.tls.cert_file), key)
        return context


def field_map(flat: list[Any] | None) -> dict[str, Any] | None:
    """`[f1, v1, f2, v2, ...]` (HGETALL, a stream entry's fields) as a dict; None stays."""
    if flat is None:
        return None
    return dict(zip(flat[::2], flat[1::2], strict=True))


def stream_entries(reply: list[Any] | None) -> list[tuple[str, dict[str, Any] | None]]:
    """XRANGE's reply (or one stream of XREAD's) as (id, fields) pairs."""
    return [(str(mid), field_map(fields)) for mid, fields in reply or []]
