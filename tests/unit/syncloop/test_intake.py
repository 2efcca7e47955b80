"""BusIntake (pods/intake.py): the `pods` stream consumer and the table resync.

Covers: a resync hands the desired and sources tables to the controller with the
generation its read began at, reconciles the published statuses and marks the intake
synced; a bus error during a resync is counted every time, logged once per distinct
error and once more when the bus is back, and the controller keeps its view; the
consumer ensures its group, takes over stale entries before reading, hands every
good entry to the controller and acknowledges it afterwards, while a bad entry is
counted and acknowledged without reaching the controller; stale entries are taken
over again once `reclaim_s` has passed (a fake clock); after an outage the consumer
ensures the group again. In-memory fakes of the bus and the controller; no sleeps.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

import pytest
from klet.bus import BusError, BusUnavailable, Entry
from klet.model.records import DesiredPod, PodChange, SourceState
from klet.model.types import PodUID
from klet.syncloop.pods.intake import GROUP, BusIntake

from .helpers import Clock, pod, running, until


def desired(uid: str) -> DesiredPod:
    return DesiredPod(uid=PodUID(uid), pod=pod("app", uid=uid), source="file", hash="h1", seen_at=0)


READY = {"file": SourceState(source="file", ready=True, at=0.0)}


R = TypeVar("R")


class FakeTable(Generic[R]):
    def __init__(self, rows: dict[str, R]) -> None:
        self.rows = rows
        self.errors: list[BusError] = []  # raised by the next reads, one each
        self.on_read: Callable[[], None] = lambda: None  # what happens while it is read

    async def all(self) -> dict[str, R]:
        self.on_read()
        if self.errors:
            raise self.errors.pop(0)
        return dict(self.rows)


class FakeStream:
    """A consumer-group stream: entries to claim, what the reads return (an entry, or an
    error to raise), what was acknowledged."""

    def __init__(self) -> None:
        self.stale: list[Entry[PodChange]] = []
        self.queue: asyncio.Queue[Entry[PodChange] | BusError] = asyncio.Queue()
        self.calls: list[str] = []
        self.acked: list[str] = []

    async def ensure_group(self, group: str) -> None:
        assert group == GROUP
        self.calls.append("ensure_group")

    async def claim_stale(
        self, group: str, consumer: str, *, min_idle_ms: int
    ) -> Sequence[Entry[PodChange]]:
        self.calls.append("claim_stale")
        stale, self.stale = self.stale, []
        return stale

    async def read(
        self, group: str, consumer: str, *, count: int, block_ms: int
    ) -> Sequence[Entry[PodChange]]:
        self.calls.append("read")
        item = await self.queue.get()  # blocks as XREADGROUP does, until something comes
        if isinstance(item, BusError):
            raise item
        return [item]

    async def ack(self, group: str, *ids: str) -> None:
        self.acked.extend(ids)


class FakeBus:
    def __init__(self) -> None:
        self.desired = FakeTable({"u1": desired("u1")})
        self.sources = FakeTable(READY)
        self.pods = FakeStream()


class FakeController:
    def __init__(self) -> None:
        self.generation = 0
        self.applied: list[tuple[set[str], bool, int]] = []  # (uids, sources ready, read_from)
        self.changes: list[PodChange] = []
        self.reconciled = 0

    def apply_desired(
        self, table: dict[str, DesiredPod], sources: dict[str, SourceState], *, read_from: int
    ) -> None:
        ready = all(s.ready for s in sources.values())
        self.applied.append((set(table), ready, read_from))

    async def on_change(self, change: PodChange) -> None:
        self.changes.append(change)

    async def reconcile_statuses(self) -> None:
        self.reconciled += 1


class World:
    def __init__(self) -> None:
        self.bus = FakeBus()
        self.controller = FakeController()
        self.clock = Clock(100.0)
        self.bad: list[str] = []
        self.errors = 0
        self.intake = BusIntake(
            self.bus,
            self.controller,
            consumer="node1-1",
            resync_s=0,
            reclaim_s=300,
            retry_s=0,
            on_bad=self.bad.append,
            on_error=self.count_error,
            clock=self.clock,
        )

    def count_error(self) -> None:
        self.errors += 1


def change(uid: str) -> PodChange:
    return PodChange(op="ADD", uid=PodUID(uid), source="file")


@pytest.fixture
def w() -> World:
    return World()


async def test_a_resync_hands_the_tables_over_from_the_generation_it_began_at(w: World) -> None:
    w.controller.generation = 7

    def stream_change_lands() -> None:  # a stream change handled while the tables are read
        w.controller.generation = 8

    w.bus.desired.on_read = stream_change_lands
    assert not w.intake.synced.is_set()
    await w.intake.resync_once()
    assert w.controller.applied == [({"u1"}, True, 7)]
    assert w.controller.reconciled == 1
    assert w.intake.synced.is_set()


async def test_a_bus_error_during_resync_keeps_the_last_view_and_is_logged_once(
    w: World, caplog: pytest.LogCaptureFixture
) -> None:
    w.bus.desired.errors = [BusUnavailable("connection refused")] * 3
    with caplog.at_level(logging.INFO, logger="klet.syncloop.pods.intake"):
        async with running(w.intake.run_resync()):
            await until(lambda: len(w.controller.applied) == 1)
    assert w.errors == 3
    assert w.controller.applied == [({"u1"}, True, 0)]
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["bus unavailable, keeping the last state", "bus available again"]


async def test_the_consumer_takes_over_stale_entries_then_reads_and_acks(w: World) -> None:
    w.bus.pods.stale = [Entry("1-0", change("u1"))]
    await w.bus.pods.queue.put(Entry("2-0", change("u2")))
    await w.bus.pods.queue.put(Entry("3-0", None, error="bad json"))
    await w.bus.pods.queue.put(Entry("4-0", change("u3")))
    async with running(w.intake.run_consumer()):
        await until(lambda: len(w.bus.pods.acked) == 4)
    assert w.bus.pods.calls[:3] == ["ensure_group", "claim_stale", "read"]
    assert [c.uid for c in w.controller.changes] == ["u1", "u2", "u3"]
    assert w.bus.pods.acked == ["1-0", "2-0", "3-0", "4-0"]
    assert w.bad == ["bad json"]


async def test_stale_entries_are_taken_over_again_after_reclaim_s(w: World) -> None:
    stream = w.bus.pods
    await stream.queue.put(Entry("1-0", change("u1")))
    async with running(w.intake.run_consumer()):
        await until(lambda: len(stream.acked) == 1)
        assert stream.calls.count("claim_stale") == 1
        w.clock.t += 300  # the next pass takes over what a dead replica left
        stream.stale = [Entry("0-5", change("u9"))]
        await stream.queue.put(Entry("2-0", change("u2")))
        await until(lambda: len(stream.acked) == 3)
    assert stream.calls.count("claim_stale") == 2
    assert stream.calls.count("ensure_group") == 1
    assert stream.acked == ["1-0", "2-0", "0-5"]  # the read waiting when the time came


async def test_after_an_outage_the_consumer_ensures_its_group_again(w: World) -> None:
    stream = w.bus.pods
    await stream.queue.put(Entry("1-0", change("u1")))
    async with running(w.intake.run_consumer()):
        await until(lambda: len(stream.acked) == 1)
        for item in (BusUnavailable("Redis restarted"), BusError("NOGROUP")):
            await stream.queue.put(item)
        await stream.queue.put(Entry("2-0", change("u2")))
        await until(lambda: len(stream.acked) == 2)
    # the group (and the stream) may be gone after an outage; a plain error keeps it
    assert stream.calls.count("ensure_group") == 2
    assert w.errors == 2
    assert [c.uid for c in w.controller.changes] == ["u1", "u2"]
