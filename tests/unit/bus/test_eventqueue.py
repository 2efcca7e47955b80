"""The shared Event queue (`klet.bus.eventqueue.EventQueue`): records built as upstream's
recorder does, published in order by the root task, retried while the bus fails (the
outage logged once), and the oldest dropped and counted when the queue is full."""

from __future__ import annotations

import asyncio
import logging

import pytest
from klet.bus import BusUnavailable, Fenced
from klet.bus.eventqueue import EventQueue, node_reference
from klet.model.records import EventRecord


class Stream:
    """An `events` stream that fails its next `failures` publishes."""

    def __init__(self, failures: list[Exception] | None = None) -> None:
        self.failures = list(failures or [])
        self.published: list[EventRecord] = []
        self.done = asyncio.Event()
        self.expect = 0

    async def publish(self, record: EventRecord) -> str:
        if self.failures:
            raise self.failures.pop(0)
        self.published.append(record)
        if len(self.published) >= self.expect:
            self.done.set()
        return str(len(self.published))


async def drain(queue: EventQueue, stream: Stream, count: int) -> None:
    stream.expect = count
    task = asyncio.create_task(queue.run())
    try:
        await asyncio.wait_for(stream.done.wait(), 2.0)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_emit_builds_a_kubelet_record_at_the_clock() -> None:
    queue = EventQueue(Stream(), cap=10, clock=lambda: 42.0)
    queue.emit(node_reference("n1"), "Warning", "ImageGCFailed", "no space")
    (record,) = queue.queue
    assert record == EventRecord(
        type="Warning",
        reason="ImageGCFailed",
        message="no space",
        involved={"kind": "Node", "name": "n1", "uid": "n1", "apiVersion": "v1"},
        component="kubelet",
        at=42.0,
    )


async def test_publishes_in_order() -> None:
    stream = Stream()
    queue = EventQueue(stream, cap=10)
    for reason in ("A", "B", "C"):
        queue.emit(node_reference("n1"), "Normal", reason, "m")
    await drain(queue, stream, 3)
    assert [r.reason for r in stream.published] == ["A", "B", "C"]
    assert not queue.queue


async def test_retries_while_the_bus_fails_and_logs_once(caplog: pytest.LogCaptureFixture) -> None:
    stream = Stream([BusUnavailable("down"), BusUnavailable("down"), Fenced("refused")])
    queue = EventQueue(stream, cap=10, retry_s=0.0)
    queue.emit(node_reference("n1"), "Warning", "A", "m")
    with caplog.at_level(logging.WARNING, logger="klet.bus.eventqueue"):
        await drain(queue, stream, 1)
    assert [r.reason for r in stream.published] == ["A"]
    assert [r.message for r in caplog.records] == ["cannot publish events, will retry"]


def test_a_full_queue_drops_the_oldest() -> None:
    queue = EventQueue(Stream(), cap=2)
    for reason in ("A", "B", "C"):
        queue.emit(node_reference("n1"), "Normal", reason, "m")
    assert [r.reason for r in queue.queue] == ["B", "C"]
    assert queue.dropped == 1


async def test_published_waits_for_the_queue_to_reach_the_stream() -> None:
    stream = Stream([BusUnavailable("down")])
    queue = EventQueue(stream, cap=10, retry_s=0.0)
    await asyncio.wait_for(queue.published(), 1.0)  # nothing queued: at once
    queue.emit(node_reference("n1"), "Warning", "A", "m")
    waiter = asyncio.create_task(queue.published())
    await asyncio.sleep(0)
    assert not waiter.done()
    task = asyncio.create_task(queue.run())
    try:
        await asyncio.wait_for(waiter, 2.0)
        assert [r.reason for r in stream.published] == ["A"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
