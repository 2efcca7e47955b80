"""How Redis client errors become bus errors: unreachable vs refused (a Redis that is
there but not serving, LOADING, READONLY, MASTERDOWN, TRYAGAIN, OOM, is unavailable, as
the replies redis-py parses them into), and a task being cancelled keeps its
cancellation (the client can turn one into a connection error)."""

from __future__ import annotations

import asyncio

import pytest
from klet.bus import BusError, BusUnavailable
from klet.bus.redisbus import _wrap
from redis._parsers import _RESP3Parser
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError


async def test_connection_errors_are_unavailable_and_others_plain_bus_errors() -> None:
    assert isinstance(_wrap(RedisConnectionError("refused")), BusUnavailable)
    assert isinstance(_wrap(OSError("gone")), BusUnavailable)
    refused = _wrap(ResponseError("NOPERM"))
    assert isinstance(refused, BusError) and not isinstance(refused, BusUnavailable)


@pytest.mark.parametrize(
    "reply",
    [
        "LOADING Redis is loading the dataset in memory",
        "READONLY You can't write against a read only replica.",
        "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
        "TRYAGAIN Multiple keys request during rehashing of slot",
        "OOM command not allowed when used memory > 'maxmemory'.",
    ],
)
def test_a_redis_that_cannot_serve_yet_is_unavailable(reply: str) -> None:
    """The reply as redis-py's own parser classifies it, then wrapped."""
    parsed = _RESP3Parser(socket_read_size=65536).parse_error(reply)
    assert isinstance(_wrap(parsed), BusUnavailable), type(parsed)


def test_plain_refusals_stay_bus_errors() -> None:
    for reply in ("NOPERM this user has no permissions", "WRONGTYPE Operation", "ERR script"):
        parsed = _RESP3Parser(socket_read_size=65536).parse_error(reply)
        wrapped = _wrap(parsed)
        assert isinstance(wrapped, BusError) and not isinstance(wrapped, BusUnavailable)


async def test_a_task_being_cancelled_gets_its_cancellation_back() -> None:
    waiting = asyncio.Event()
    wrapped: list[BaseException] = []

    async def reader() -> None:
        waiting.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            # what the client does when a cancellation lands in a read
            wrapped.append(_wrap(RedisConnectionError("Connection closed by server.")))

    task = asyncio.create_task(reader())
    await waiting.wait()
    task.cancel()
    await task
    assert len(wrapped) == 1 and isinstance(wrapped[0], asyncio.CancelledError)
