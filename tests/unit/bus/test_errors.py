"""How Redis client errors become bus errors: unreachable vs refused, and a task being
cancelled keeps its cancellation even if a connection error is what it caught."""

from __future__ import annotations

import asyncio

from klet.bus import BusError, BusUnavailable
from klet.bus.redisbus import _wrap
from klet.bus.resp import ConnectionFailed, ReplyError


async def test_connection_errors_are_unavailable_and_others_plain_bus_errors() -> None:
    assert isinstance(_wrap(ConnectionFailed("refused")), BusUnavailable)
    refused = _wrap(ReplyError("NOPERM this user has no permissions"))
    assert isinstance(refused, BusError) and not isinstance(refused, BusUnavailable)


async def test_a_task_being_cancelled_gets_its_cancellation_back() -> None:
    waiting = asyncio.Event()
    wrapped: list[BaseException] = []

    async def reader() -> None:
        waiting.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            # a connection error caught while the task is being cancelled
            wrapped.append(_wrap(ConnectionFailed("Redis closed the connection")))

    task = asyncio.create_task(reader())
    await waiting.wait()
    task.cancel()
    await task
    assert len(wrapped) == 1 and isinstance(wrapped[0], asyncio.CancelledError)
