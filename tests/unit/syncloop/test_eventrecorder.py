"""syncloop's Event recorder (`klet.syncloop.eventrecorder.BusEventSink`): a pod's
Events queued together reach the bus in one write (issue 42: one fenced write each
before), and the reader of every service's events (status-reporter's event feed) still
gets one entry per Event, in order."""

from __future__ import annotations

import asyncio

from klet.bus import NodeBus
from klet.model.types import JSON
from klet.syncloop.eventrecorder import BusEventSink
from klet.testbed.fakes.bus import FakeBus

POD: JSON = {"metadata": {"name": "web", "namespace": "default", "uid": "u1"}}


async def test_a_pod_starts_events_go_in_one_write_and_read_back_one_each() -> None:
    fake = FakeBus()
    node_bus = NodeBus.of(fake, service="syncloop")
    sink = BusEventSink(node_bus)
    field_path = "spec.containers{main}"
    sink.emit(POD, "Normal", "Pulled", "already present", field_path=field_path)
    sink.emit(POD, "Normal", "Created", "Created container: main", field_path=field_path)
    sink.emit(POD, "Normal", "Started", "Started container main", field_path=field_path)
    assert fake.writes == []  # queued, not written: the queue's task is not running yet
    task = asyncio.create_task(sink.run())
    try:
        await asyncio.wait_for(sink.queue.published(), 5.0)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert fake.writes == [3]

    feed = node_bus.event_feed
    await feed.ensure_group("status-reporter")
    entries = await feed.read("status-reporter", "c1", block_ms=0)
    records = [e.record for e in entries if e.record is not None]
    assert [r.reason for r in records] == ["Pulled", "Created", "Started"]
    assert {r.involved["fieldPath"] for r in records} == {field_path}
    assert len({e.id for e in entries}) == 3
