"""The shared Event queue (`klet.bus.eventqueue.EventQueue`): records built as upstream's
recorder does, published in order by the root task, everything queued at a wake-up in
one bus write (issue 42), retried while the bus fails (the outage logged once), the
oldest dropped and counted when the queue is full, and a record the bus refuses dropped
alone."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import pytest
from klet.bus import BusUnavailable, Fenced, WriteTooLarge
from klet.bus.eventqueue import BATCH, EventQueue, node_reference
from klet.model.records import EventRecord
from klet.testbed.fakes.bus import FakeBus


class Stream:
    """An `events` stream that fails its next `failures` publishes."""

    def __init__(self, failures: list[Exception] | None = None) -> None:
        self.failures = list(failures or [])
        self.published: list[EventRecord] = []
        self.writes: list[int] = []  # records in each successful write, in order
        self.done = asyncio.Event()
        self.expect = 0

    async def publish_many(self, records: Sequence[EventRecord]) -> list[str]:
        if self.failures:
            raise self.failures.pop(0)
        self.published.extend(records)
        self.writes.append(len(records))
        if len(self.published) >= self.expect:
            self.done.set()
        return [str(len(self.published) - len(records) + i + 1) for i in range(len(records))]


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


async def test_events_queued_together_go_in_one_write() -> None:
    stream = Stream()
    queue = EventQueue(stream, cap=1000)
    for reason in ("Pulled", "Created", "Started", "Killing"):
        queue.emit(node_reference("n1"), "Normal", reason, "m")
    await drain(queue, stream, 4)
    assert stream.writes == [4]
    assert [r.reason for r in stream.published] == ["Pulled", "Created", "Started", "Killing"]


async def test_a_write_holds_at_most_batch_records() -> None:
    stream = Stream()
    queue = EventQueue(stream, cap=1000)
    for i in range(BATCH + 5):
        queue.emit(node_reference("n1"), "Normal", f"R{i}", "m")
    await drain(queue, stream, BATCH + 5)
    assert stream.writes == [BATCH, 5]
    assert [r.reason for r in stream.published] == [f"R{i}" for i in range(BATCH + 5)]


async def test_a_failed_write_is_retried_whole() -> None:
    stream = Stream([Fenced("refused")])
    queue = EventQueue(stream, cap=10, retry_s=0.0)
    for reason in ("A", "B", "C"):
        queue.emit(node_reference("n1"), "Normal", reason, "m")
    await drain(queue, stream, 3)
    assert stream.writes == [3]
    assert [r.reason for r in stream.published] == ["A", "B", "C"]


async def test_the_fake_bus_appends_a_batch_in_one_write() -> None:
    bus = FakeBus()
    events = bus.stream("events:syncloop", EventRecord)
    queue = EventQueue(events, cap=10)
    for reason in ("A", "B", "C"):
        queue.emit(node_reference("n1"), "Normal", reason, "m")
    task = asyncio.create_task(queue.run())
    try:
        await asyncio.wait_for(queue.published(), 2.0)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert bus.writes == [3]
    await events.ensure_group("g")
    entries = await events.read("g", "c", block_ms=0)
    assert [e.record.reason for e in entries if e.record] == ["A", "B", "C"]


async def test_records_dropped_while_their_write_was_out_count_as_written() -> None:
    class Crowded(Stream):
        async def publish_many(self, records: Sequence[EventRecord]) -> list[str]:
            if not self.writes:  # a burst fills the queue while the first write is out
                queue.emit(node_reference("n1"), "Normal", "C", "m")
            return await super().publish_many(records)

    stream = Crowded()
    queue = EventQueue(stream, cap=2)
    queue.emit(node_reference("n1"), "Normal", "A", "m")
    queue.emit(node_reference("n1"), "Normal", "B", "m")
    await drain(queue, stream, 3)
    assert [r.reason for r in stream.published] == ["A", "B", "C"]
    assert stream.writes == [2, 1]
    assert queue.dropped == 0
    assert not queue.queue


async def test_a_record_the_bus_refuses_is_dropped_alone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Refusing(Stream):
        async def publish_many(self, records: Sequence[EventRecord]) -> list[str]:
            if any(r.reason == "Huge" for r in records):
                raise WriteTooLarge("MAX_ENTRY_BYTES", "entry too large")
            return await super().publish_many(records)

    stream = Refusing()
    queue = EventQueue(stream, cap=10)
    for reason in ("A", "Huge", "C", "D"):
        queue.emit(node_reference("n1"), "Normal", reason, "m")
    with caplog.at_level(logging.WARNING, logger="klet.bus.eventqueue"):
        await drain(queue, stream, 3)
    assert [r.reason for r in stream.published] == ["A", "C", "D"]
    assert stream.writes == [1, 1, 1]  # the refused batch's records, one at a time
    assert queue.refused == 1
    assert [r.message for r in caplog.records] == ["event refused by the bus, dropped"]
