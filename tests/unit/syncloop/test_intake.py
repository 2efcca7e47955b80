"""BusIntake (pods/intake.py): the `pods` stream consumer and the table resync.

Covers: a resync hands the desired and sources tables to the controller with the
generation its read began at, reconciles the published statuses and marks the intake
synced; a bus error during a resync is counted every time, logged once per distinct
error and once more when the bus is back, and the controller keeps its view; the
consumer ensures its group, takes over stale entries before reading, hands every
good entry to the controller and acknowledges it afterwards, while a bad entry is
counted and acknowledged without reaching the controller; a batch read at once reaches
the controller in one call and is acknowledged in one XACK; stale entries are taken
over again once `reclaim_s` has passed (a fake clock); after an outage the consumer
ensures the group again. Issue 42: an idle resync reads the tables' generations and
nothing else (no HGETALL, no decode, nothing handed over, the statuses still
reconciled); a write by pod-source is handed over at the next resync with only its row
decoded; a Redis restart (the generations lost with the tables) keeps the last tables
(the controller is not handed an empty desired set) until pod-source has written them
again, then reads them; a write that bypassed the fenced write is seen once
`full_resync_s` has passed. Redis restarted empty: once the lease is back (`restored`)
the resync runs and the consumer reads again at once, whatever their pauses (an hour
here). The in-memory bus (klet.testbed.fakes.bus), a fake controller; no sleeps.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import pytest
from klet.bus import BusError, BusUnavailable, NodeBus
from klet.model.records import DesiredPod, PodChange, SourceState
from klet.model.types import PodUID
from klet.syncloop.pods.intake import GROUP, BusIntake
from klet.testbed.fakes.bus import FakeBus, FakeStream

from .helpers import Clock, pod, running, until


def desired(uid: str) -> DesiredPod:
    return DesiredPod(uid=PodUID(uid), pod=pod("app", uid=uid), source="file", hash="h1", seen_at=0)


READY = {"file": SourceState(source="file", ready=True, at=0.0)}


class FakeController:
    def __init__(self) -> None:
        self.generation = 0
        self.applied: list[tuple[set[str], bool, int]] = []  # (uids, sources ready, read_from)
        self.changes: list[PodChange] = []
        self.batches: list[int] = []  # the size of each on_changes call
        self.reconciled = 0

    def apply_desired(
        self,
        table: Mapping[str, DesiredPod],
        sources: Mapping[str, SourceState],
        *,
        read_from: int,
    ) -> None:
        ready = all(s.ready for s in sources.values())
        self.applied.append((set(table), ready, read_from))

    async def on_changes(self, changes: Sequence[PodChange]) -> None:
        self.batches.append(len(changes))
        self.changes.extend(changes)

    async def reconcile_statuses(self) -> None:
        self.reconciled += 1


class World:
    def __init__(self) -> None:
        self.clock = Clock(100.0)
        self.bus = FakeBus(clock=self.clock)
        self.node = NodeBus.of(self.bus, service="syncloop")
        assert isinstance(self.node.pods, FakeStream)
        self.pods = self.node.pods
        self.bus.seed(self.node.desired, "u1", desired("u1"))
        self.bus.seed(self.node.sources, "file", READY["file"])
        self.controller = FakeController()
        self.bad: list[str] = []
        self.errors = 0
        self.intake = BusIntake(
            self.node,
            self.controller,
            consumer="node1-1",
            resync_s=0,
            full_resync_s=60,
            reclaim_s=300,
            retry_s=0,
            on_bad=self.bad.append,
            on_error=self.count_error,
            clock=self.clock,
        )

    def count_error(self) -> None:
        self.errors += 1

    async def stale(self, record: PodChange) -> str:
        """An entry a dead replica read and never acknowledged; returns its id."""
        entry_id = self.bus.append(self.pods, record)
        [_] = await self.pods.read(GROUP, "node1-0", count=1, block_ms=1)
        return entry_id


def change(uid: str) -> PodChange:
    return PodChange(op="ADD", uid=PodUID(uid), source="file")


@pytest.fixture
def w() -> World:
    return World()


async def test_a_resync_hands_the_tables_over_from_the_generation_it_began_at(w: World) -> None:
    w.controller.generation = 7

    def stream_change_lands() -> None:  # a stream change handled while the tables are read
        w.controller.generation = 8

    read_desired = w.node.desired.raw_all

    async def all_while_a_change_lands() -> dict[str, str]:
        stream_change_lands()
        return await read_desired()

    w.node.desired.raw_all = all_while_a_change_lands  # type: ignore[method-assign]
    assert not w.intake.synced.is_set()
    await w.intake.resync_once()
    assert w.controller.applied == [({"u1"}, True, 7)]
    assert w.controller.reconciled == 1
    assert w.intake.synced.is_set()


async def test_an_idle_resync_reads_the_generations_only(w: World) -> None:
    await w.intake.resync_once()
    assert w.bus.calls.count("all") == 2  # the first resync reads both tables
    w.bus.calls.clear()
    for _ in range(5):
        w.clock.t += 5
        await w.intake.resync_once()
    assert w.bus.calls == ["generations"] * 5  # no HGETALL, nothing decoded
    assert (w.intake.desired.decoded, w.intake.sources.decoded) == (1, 1)
    assert len(w.controller.applied) == 1  # nothing handed over again
    assert w.controller.reconciled == 6  # the statuses are reconciled every time


async def test_a_write_is_handed_over_at_the_next_resync_decoding_only_its_row(
    w: World,
) -> None:
    await w.intake.resync_once()
    w.bus.calls.clear()
    w.bus.seed(w.node.desired, "u2", desired("u2"))  # pod-source's fenced write
    await w.intake.resync_once()
    assert w.bus.calls == ["generations", "all"]  # desired read again, sources not
    assert w.controller.applied[-1] == ({"u1", "u2"}, True, 0)
    assert w.intake.desired.decoded == 2  # u1 once, u2 once
    w.bus.drop(w.node.desired, "u1")
    await w.intake.resync_once()
    assert w.controller.applied[-1] == ({"u2"}, True, 0)
    assert w.intake.desired.decoded == 2  # a removal decodes nothing


async def test_a_redis_restart_keeps_the_tables_until_pod_source_writes_them_again(
    w: World,
) -> None:
    await w.intake.resync_once()
    w.bus.restart()  # the tables and their generations are gone
    w.bus.calls.clear()
    await w.intake.resync_once()
    assert w.bus.calls == ["generations"]  # kept: not read as empty
    assert w.controller.applied == [({"u1"}, True, 0)]  # nothing handed over
    assert w.controller.reconciled == 2  # the statuses' reconcile still runs
    # pod-source writes everything back: the new generations are read again.
    w.bus.seed(w.node.desired, "u1", desired("u1"))
    w.bus.seed(w.node.desired, "u2", desired("u2"))
    w.bus.seed(w.node.sources, "file", READY["file"])
    await w.intake.resync_once()
    assert w.controller.applied[-1] == ({"u1", "u2"}, True, 0)


async def test_once_the_lease_is_back_the_resync_and_the_consumer_go_at_once() -> None:
    w = World()
    hour = BusIntake(
        w.node, w.controller, consumer="node1-1", resync_s=3600, retry_s=3600, clock=w.clock
    )
    w.bus.append(w.pods, change("u1"))
    async with running(hour.run_resync()), running(hour.run_consumer()):
        await until(lambda: w.controller.reconciled == 1 and len(w.pods.acked) == 1)
        w.bus.fail(BusUnavailable("Connection closed by server."))  # the blocked read
        await until(lambda: w.bus.calls[-1] == "read" and not w.bus.failures)
        hour.restored()
        await until(lambda: w.controller.reconciled == 2)
        w.bus.append(w.pods, change("u2"))
        await until(lambda: len(w.pods.acked) == 2)
    assert w.bus.calls.count("ensure_group") == 2  # the group made again after the outage


async def test_a_write_that_bypassed_the_fenced_write_is_seen_within_full_resync_s(
    w: World,
) -> None:
    await w.intake.resync_once()
    w.bus.hset_directly(w.node.desired, "u2", desired("u2").encode())  # no generation moved
    w.clock.t += 59
    await w.intake.resync_once()
    assert len(w.controller.applied) == 1
    w.clock.t += 1
    await w.intake.resync_once()
    assert w.controller.applied[-1] == ({"u1", "u2"}, True, 0)
    assert w.intake.desired.decoded == 2  # the full read decodes only the new row


async def test_a_bus_error_during_resync_keeps_the_last_view_and_is_logged_once(
    w: World, caplog: pytest.LogCaptureFixture
) -> None:
    w.bus.fail(*[BusUnavailable("connection refused")] * 3)
    with caplog.at_level(logging.INFO, logger="klet.syncloop.pods.intake"):
        async with running(w.intake.run_resync()):
            await until(lambda: len(w.controller.applied) == 1)
    assert w.errors == 3
    assert w.controller.applied == [({"u1"}, True, 0)]
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["bus unavailable, keeping the last state", "bus available again"]


async def test_the_consumer_takes_over_stale_entries_then_reads_and_acks(w: World) -> None:
    await w.pods.ensure_group(GROUP)
    await w.stale(change("u1"))
    w.clock.t += 30  # idle long enough to take over
    w.bus.append(w.pods, change("u2"))
    w.bus.plant(w.pods, "bad json")
    w.bus.append(w.pods, change("u3"))
    w.bus.calls.clear()
    async with running(w.intake.run_consumer()):
        await until(lambda: len(w.pods.acked) == 4)
    assert [c for c in w.bus.calls if c != "ack"][:3] == ["ensure_group", "claim_stale", "read"]
    assert [c.uid for c in w.controller.changes] == ["u1", "u2", "u3"]
    assert w.pods.acked == ["1-0", "2-0", "3-0", "4-0"]
    assert w.bad == ["podchange: not JSON: Expecting value: line 1 column 1 (char 0)"]


async def test_stale_entries_are_taken_over_again_after_reclaim_s(w: World) -> None:
    stream = w.pods
    first = w.bus.append(stream, change("u1"))
    async with running(w.intake.run_consumer()):
        await until(lambda: len(stream.acked) == 1)
        assert w.bus.calls.count("claim_stale") == 1
        stale = await w.stale(change("u9"))
        w.clock.t += 300  # the next pass takes over what a dead replica left
        second = w.bus.append(stream, change("u2"))
        await until(lambda: len(stream.acked) == 3)
    assert w.bus.calls.count("claim_stale") == 2
    assert w.bus.calls.count("ensure_group") == 1
    assert stream.acked == [first, second, stale]  # the read waiting when the time came


async def test_after_an_outage_the_consumer_ensures_its_group_again(w: World) -> None:
    stream = w.pods
    w.bus.append(stream, change("u1"))
    async with running(w.intake.run_consumer()):
        await until(lambda: len(stream.acked) == 1)
        w.bus.fail(BusUnavailable("Redis restarted"))  # fails the read blocked now
        await until(lambda: w.bus.calls[-2:] == ["claim_stale", "read"])  # reading again
        w.bus.fail(BusError("NOGROUP"))
        w.bus.append(stream, change("u2"))
        await until(lambda: len(stream.acked) == 2)
    # the group (and the stream) may be gone after an outage; a plain error keeps it
    assert w.bus.calls.count("ensure_group") == 2
    assert w.errors == 2
    assert [c.uid for c in w.controller.changes] == ["u1", "u2"]


async def test_a_burst_is_handed_over_in_one_call_and_acked_in_one_xack(w: World) -> None:
    await w.pods.ensure_group(GROUP)
    ids = [w.bus.append(w.pods, change(f"u{i}")) for i in range(5)]
    w.bus.plant(w.pods, "bad json")
    async with running(w.intake.run_consumer()):
        await until(lambda: len(w.pods.acked) == 6)
    assert w.controller.batches == [5]
    assert [c.uid for c in w.controller.changes] == [f"u{i}" for i in range(5)]
    assert w.bus.calls.count("ack") == 1
    assert w.pods.acked[:5] == ids
    assert len(w.bad) == 1
