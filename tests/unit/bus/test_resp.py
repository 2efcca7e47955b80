"""klet.bus.resp, the bus's own Redis client, against a scripted RESP server of the test's
own on a unix socket (the real Redis is the integration tier's: tests/integration/
test_bus*.py). Covers: commands go out as arrays of bulk strings and every reply type is
read (nested arrays, nil, integers, an error in place inside a pipeline, bytes that are
not UTF-8); URLs and their mistakes; AUTH and SELECT on each new connection, and
refused credentials; a pooled connection Redis closed is replaced once, transparently;
a call that times out or is cancelled closes its connection, so no later call reads its
late reply; the pool never opens more than its bound."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from klet.bus.resp import (
    ConnectionFailed,
    Endpoint,
    ReplyError,
    RespClient,
    _encode,
    _read,
    field_map,
    stream_entries,
)

Handler = Callable[[list[str]], bytes | None]
"""What the server answers to one command (raw RESP), or None to close the connection."""


class Server:
    """A RESP server that answers each command through `handler` and records what it got."""

    def __init__(self, path: Path, handler: Handler) -> None:
        self.path = path
        self.handler = handler
        self.commands: list[list[str]] = []
        self.connections = 0
        self.open = 0
        self.most_open = 0
        self.delay_s = 0.0
        self._writers: list[asyncio.StreamWriter] = []
        self.tasks: list[asyncio.Task[None]] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.append(task)
        self.connections += 1
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        self._writers.append(writer)
        try:
            while True:
                try:
                    command = await _read(reader)
                except asyncio.IncompleteReadError:
                    return
                self.commands.append(command)
                answer = self.handler(command)
                if answer is None:
                    return
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                writer.write(answer)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            return  # the client hung up, or the test is over
        finally:
            self.open -= 1
            writer.close()

    def drop_all(self) -> None:
        """Close every connection, as a restarted Redis has."""
        for writer in self._writers:
            writer.close()


@asynccontextmanager
async def serving(tmp_path: Path, handler: Handler) -> AsyncIterator[Server]:
    server = Server(tmp_path / "redis.sock", handler)
    unix = await asyncio.start_unix_server(server.serve, path=str(server.path))
    try:
        yield server
    finally:
        unix.close()
        server.drop_all()
        for task in server.tasks:
            task.cancel()
        await asyncio.gather(*server.tasks, return_exceptions=True)


def echo(command: list[str]) -> bytes:
    """PING → PONG, AUTH/SELECT → OK, anything else → its arguments as an array."""
    if command[0] == "PING":
        return b"+PONG\r\n"
    if command[0] in ("AUTH", "SELECT"):
        return b"+OK\r\n"
    return _encode(command[1:])


async def reply_of(raw: bytes) -> object:
    reader = asyncio.StreamReader()
    reader.feed_data(raw)
    reader.feed_eof()
    return await _read(reader)


async def test_every_reply_type_is_read() -> None:
    assert await reply_of(b"+OK\r\n") == "OK"
    assert await reply_of(b":-42\r\n") == -42
    assert await reply_of(b"$-1\r\n") is None
    assert await reply_of(b"*-1\r\n") is None
    assert await reply_of(b"$5\r\na\r\nbc\r\n") == "a\r\nbc"  # lengths, not line ends
    assert await reply_of(b"*2\r\n*1\r\n:1\r\n$0\r\n\r\n") == [[1], ""]
    err = await reply_of(b"-NOGROUP No such key\r\n")
    assert isinstance(err, ReplyError) and err.code == "NOGROUP"
    assert await reply_of(b"$2\r\n\xff{\r\n") == "\ufffd{"  # the record decoder rejects it
    with pytest.raises(ValueError, match="not a RESP2 reply"):
        await reply_of(b"?what\r\n")
    encoded = _encode(["HSET", "k", 1, "é"])
    assert encoded == b"*4\r\n$4\r\nHSET\r\n$1\r\nk\r\n$1\r\n1\r\n$2\r\n\xc3\xa9\r\n"


def test_field_lists_and_stream_entries() -> None:
    assert field_map(["a", "1", "b", "2"]) == {"a": "1", "b": "2"}
    assert field_map(None) is None
    entries = stream_entries([["1-0", ["r", "x"]], ["2-0", None]])
    assert entries == [("1-0", {"r": "x"}), ("2-0", None)]
    assert stream_entries(None) == []


@pytest.mark.parametrize(
    ("url", "where", "tls", "db"),
    [
        ("unix:///run/klet/redis/redis.sock", "/run/klet/redis/redis.sock", False, 0),
        ("unix:///tmp/r.sock?db=3", "/tmp/r.sock", False, 3),
        ("redis://127.0.0.1:7000/2", "127.0.0.1:7000", False, 2),
        ("rediss://redis.example:6380", "redis.example:6380", True, 0),
        ("redis://redis.example", "redis.example:6379", False, 0),
    ],
)
def test_urls(url: str, where: str, tls: bool, db: int) -> None:
    e = Endpoint.parse(url)
    assert (e.describe(), e.tls, e.db) == (where, tls, db)


def test_credentials_in_the_url_are_used() -> None:
    e = Endpoint.parse("redis://klet%40n1:s3cr%2Ft@h:1")
    assert (e.username, e.password) == ("klet@n1", "s3cr/t")


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://h:1", "unix://, redis:// or rediss://"),
        ("unix://", "socket's path"),
        ("redis://:1", "needs a host"),
        ("redis://h/zero", "must be a number"),
    ],
)
def test_bad_urls_say_what_is_wrong(url: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        Endpoint.parse(url)


async def test_commands_pipelines_and_transactions(tmp_path: Path) -> None:
    def handler(command: list[str]) -> bytes:
        if command[0] == "MULTI":
            return b"+OK\r\n"
        if command[0] == "EXEC":
            return b"*2\r\n:1\r\n$3\r\n1-0\r\n"
        if command[0] in ("HSET", "XADD"):
            return b"+QUEUED\r\n"
        if command[0] == "BAD":
            return b"-ERR unknown command 'BAD'\r\n"
        return echo(command)

    async with serving(tmp_path, handler) as server:
        client = RespClient(Endpoint.parse(f"unix://{server.path}"))
        try:
            assert await client.execute("ECHO", "x", 2) == ["x", "2"]
            with pytest.raises(ReplyError, match="unknown command"):
                await client.execute("BAD")
            commands = [("HSET", "h", "f", "v"), ("XADD", "s")]
            assert await client.pipeline(commands, transaction=True) == [1, "1-0"]
            # without a transaction every reply is read before the first error is raised
            with pytest.raises(ReplyError, match="unknown command"):
                await client.pipeline([("BAD",), ("ECHO", "after")], transaction=False)
            assert await client.execute("PING") == "PONG"  # the connection is still in step
            assert server.connections == 1
        finally:
            await client.close()
    assert server.commands[2:6] == [["MULTI"], ["HSET", "h", "f", "v"], ["XADD", "s"], ["EXEC"]]


async def test_each_new_connection_authenticates_and_selects(tmp_path: Path) -> None:
    def handler(command: list[str]) -> bytes:
        if command[0] == "AUTH" and command[-1] != "right":
            return b"-WRONGPASS invalid username-password pair\r\n"
        return echo(command)

    async with serving(tmp_path, handler) as server:
        endpoint = Endpoint.parse(f"unix://{server.path}?db=4")
        client = RespClient(endpoint, username="klet-syncloop@n1", password="right")
        try:
            assert await client.execute("PING") == "PONG"
        finally:
            await client.close()
        assert server.commands == [["AUTH", "klet-syncloop@n1", "right"], ["SELECT", "4"], ["PING"]]
        wrong = RespClient(endpoint, username="klet-syncloop@n1", password="wrong")
        try:
            with pytest.raises(ConnectionFailed, match="refused user klet-syncloop@n1: WRONGPASS"):
                await wrong.execute("PING")
        finally:
            await wrong.close()


async def test_a_pooled_connection_redis_closed_is_replaced_once(tmp_path: Path) -> None:
    async with serving(tmp_path, echo) as server:
        client = RespClient(Endpoint.parse(f"unix://{server.path}"))
        try:
            assert await client.execute("PING") == "PONG"
            server.drop_all()  # Redis restarted while the connection sat in the pool
            await asyncio.sleep(0.01)
            assert await client.execute("ECHO", "again") == ["again"]
            assert server.connections == 2
        finally:
            await client.close()


async def test_a_new_connection_that_breaks_is_not_retried(tmp_path: Path) -> None:
    async with serving(tmp_path, lambda command: None) as server:  # hangs up on anything
        client = RespClient(Endpoint.parse(f"unix://{server.path}"))
        try:
            with pytest.raises(ConnectionFailed, match="closed the connection"):
                await client.execute("PING")
            assert server.connections == 1
        finally:
            await client.close()


async def test_unreachable_redis_is_a_connection_failure(tmp_path: Path) -> None:
    client = RespClient(Endpoint.parse(f"unix://{tmp_path}/none.sock"), timeout_s=1)
    with pytest.raises(ConnectionFailed, match=f"cannot connect to Redis at {tmp_path}/none.sock"):
        await client.execute("PING")


async def test_a_late_reply_is_never_read_by_the_next_call(tmp_path: Path) -> None:
    async with serving(tmp_path, echo) as server:
        client = RespClient(Endpoint.parse(f"unix://{server.path}"), timeout_s=0.2)
        try:
            server.delay_s = 0.5
            with pytest.raises(ConnectionFailed, match="did not answer within 0.2s"):
                await client.execute("ECHO", "slow")
            task = asyncio.create_task(client.execute("ECHO", "cancelled", block_s=5))
            await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            server.delay_s = 0.0
            assert await client.execute("ECHO", "mine") == ["mine"]
            assert server.connections == 3  # each cut-off call closed its connection
        finally:
            await client.close()


async def test_the_pool_opens_no_more_than_its_bound(tmp_path: Path) -> None:
    async with serving(tmp_path, echo) as server:
        server.delay_s = 0.05
        client = RespClient(Endpoint.parse(f"unix://{server.path}"), max_connections=2)
        try:
            replies = await asyncio.gather(*(client.execute("ECHO", str(i)) for i in range(6)))
            assert replies == [[str(i)] for i in range(6)]
            assert server.most_open == 2
        finally:
            await client.close()
