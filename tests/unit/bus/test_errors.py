"""How Redis client errors become bus errors: unreachable vs refused, and a task being
cancelled keeps its cancellation (the client can turn one into a connection error)."""

from __future__ import annotations

import asyncio

from klet.bus import BusError, BusUnavailable
from klet.bus.redisbus import _wrap
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError


async def test_connection_errors_are_unavailable_and_others_plain_bus_errors() -> None:
    assert isinstance(_wrap(RedisConnectionError("refused")), BusUnavailable)
    assert isinstance(_wrap(OSError("gone")), BusUnavailable)
    refused = _wrap(ResponseError("NOPERM"))
    assert isinstance(refused, BusError) and not isinstance(refused, BusUnavailable)


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
