"""The inbox's wait keeps a cancellation that arrives as the bell rings.

Python 3.11's `asyncio.wait_for` returned normally when its task was cancelled the
moment the awaited event fired, and the publisher's loop around it then never stopped:
pod-source ignored SIGTERM until it was killed (seen in CI). This drives exactly that
interleaving.
"""

from __future__ import annotations

import asyncio

from klet.pod_source.inbox import Inbox


async def test_a_cancel_as_the_bell_rings_stops_the_loop_around_wait() -> None:
    inbox = Inbox()
    rounds = 0

    async def publisher_loop() -> None:
        nonlocal rounds
        while True:
            await inbox.wait(30)
            inbox.take()
            rounds += 1

    task = asyncio.create_task(publisher_loop())
    for _ in range(3):
        await asyncio.sleep(0)  # the loop is waiting on the bell
    inbox.polled()
    await asyncio.sleep(0)  # the bell's waiter is woken, the loop not resumed yet
    task.cancel()
    done, _ = await asyncio.wait([task], timeout=1.0)
    assert task in done and task.cancelled(), f"the loop went on ({rounds} rounds)"


async def test_wait_returns_on_the_bell_and_on_the_timeout() -> None:
    inbox = Inbox()
    inbox.offer("file", [])
    await inbox.wait(30)  # already rung: returns at once
    assert inbox.take() == ({"file": []}, True)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await inbox.wait(0.05)
    assert loop.time() - started >= 0.04
    assert inbox.take() == ({}, False)
