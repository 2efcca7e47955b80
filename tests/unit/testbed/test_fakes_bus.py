"""klet.testbed.fakes.bus: the in-memory bus behaves as the Redis one where consumers can
tell.

Covers: table rows written through `put`, a transaction or `seed` read back decoded, and a
bad record is left out; stream entries reach a consumer group once, stay pending until
acknowledged and are claimed by another consumer once idle long enough; a reader blocks
until an entry arrives or its block time ends; an injected error is raised by every call
before anything changes; a leader bus writes only while its lease is held and current,
a second replica takes the lease only once it expired; `NodeBus.of` a fake bus is a
NodeBus of fakes; entries and rows planted synchronously (a corrupt entry too) are read as
published ones, and every call is logged by name and every acknowledgement by id; errors
injected for the next calls are raised one each, by a blocked read first; several
services' Events streams read as one wake on whichever grows and ack into their own;
a node condition its writer does not own, and an append to a pod's history without its
expiry, are refused with nothing written, as the fenced-write function refuses them,
and so is a call over the byte cap, which a split transaction writes in several calls.
"""

from __future__ import annotations

import asyncio

import pytest
from klet.bus import (
    BadWrite,
    BusUnavailable,
    Fenced,
    LeaseLapsed,
    NodeBus,
    NotOwned,
    WriteTooLarge,
)
from klet.model.records import (
    EventRecord,
    HistoryEntry,
    NodeConditionRecord,
    PodChange,
    SourceState,
)
from klet.model.types import PodUID
from klet.testbed.fakes.bus import FakeBus, FakeStream


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def ready(source: str) -> SourceState:
    return SourceState(source=source, ready=True, at=0.0)


def change(uid: str) -> PodChange:
    return PodChange(op="ADD", uid=PodUID(uid), source="file")


async def test_table_rows_round_trip_and_bad_records_are_left_out() -> None:
    bus = FakeBus()
    node = NodeBus.of(bus, service="syncloop")
    await node.sources.put("file", ready("file"))
    async with bus.transaction() as tx:
        tx.put(node.sources, "api", ready("api"))
    bus.seed(node.sources, "http", ready("http"))
    bus.hashes[node.sources.key]["broken"] = "{not json"
    assert sorted(await node.sources.all()) == ["api", "file", "http"]
    assert await node.sources.get("broken") is None
    await node.sources.delete("api")
    assert sorted(bus.rows(node.sources)) == ["file", "http"]  # broken is no record
    assert await node.sources.get("file") == ready("file")
    assert await node.sources.get_many(["file", "broken", "gone", "file"]) == {
        "file": ready("file"),
        "broken": None,
        "gone": None,
    }


async def test_stream_entries_are_delivered_once_and_pending_until_acked() -> None:
    clock = Clock()
    bus = FakeBus(clock=clock)
    pods = NodeBus.of(bus, service="syncloop").pods
    assert isinstance(pods, FakeStream)
    await pods.ensure_group("g")
    first = await pods.publish(change("u1"))
    await pods.publish(change("u2"))
    read = await pods.read("g", "c1", count=1, block_ms=1)
    assert [(e.id, e.record) for e in read] == [(first, change("u1"))]
    rest = await pods.read("g", "c1", block_ms=1)
    assert [e.record for e in rest] == [change("u2")]
    assert await pods.read("g", "c1", block_ms=1) == []
    await pods.ack("g", first)
    assert pods.pending("g") == [rest[0].id]
    assert await pods.claim_stale("g", "c2", min_idle_ms=1000) == []  # not idle long enough
    clock.t += 2
    [claimed] = await pods.claim_stale("g", "c2", min_idle_ms=1000)
    assert claimed.record == change("u2")
    assert await pods.length() == 2 and bus.entries(pods) == [change("u1"), change("u2")]


async def test_a_group_made_at_the_end_sees_only_new_entries() -> None:
    pods = NodeBus.of(FakeBus(), service="syncloop").pods
    await pods.publish(change("old"))
    await pods.ensure_group("g", start="$")
    await pods.publish(change("new"))
    assert [e.record for e in await pods.read("g", "c", block_ms=1)] == [change("new")]


async def test_a_reader_blocks_until_an_entry_arrives() -> None:
    pods = NodeBus.of(FakeBus(), service="syncloop").pods
    await pods.ensure_group("g")
    reader = asyncio.create_task(pods.read("g", "c", block_ms=10_000))
    await asyncio.sleep(0)
    assert not reader.done()
    await pods.publish(change("u1"))
    assert [e.record for e in await reader] == [change("u1")]


async def test_an_injected_error_is_raised_before_anything_changes() -> None:
    bus = FakeBus()
    node = NodeBus.of(bus, service="syncloop")
    bus.error = BusUnavailable("redis down")
    with pytest.raises(BusUnavailable):
        await node.conditions.put(
            "MemoryPressure", NodeConditionRecord(type="x", status="True", at=0.0)
        )
    with pytest.raises(BusUnavailable):
        await node.pods.read("g", "c", block_ms=1)
    with pytest.raises(BusUnavailable):
        await bus.ping()
    bus.error = None
    assert await node.node.all() == {}


async def test_a_leader_bus_writes_only_while_it_holds_a_current_lease() -> None:
    clock = Clock()
    bus = FakeBus(clock=clock)
    node = NodeBus.of(bus, service="syncloop")
    lease = bus.lease("svc", "a", ttl_ms=10_000)
    with pytest.raises(Fenced):
        await node.sources.put("file", ready("file"))  # not acquired yet
    assert await lease.try_acquire() and lease.token == 1 and lease.counter_reset
    await node.sources.put("file", ready("file"))

    standby = bus.connect()
    other = standby.lease("svc", "b", ttl_ms=10_000)
    assert not await other.try_acquire()  # a holds it
    clock.t += 11
    assert await other.try_acquire() and other.token == 2 and not other.counter_reset
    with pytest.raises(Fenced):
        await node.sources.put("file", ready("file"))  # a's renewal is too old
    await NodeBus.of(standby, service="syncloop").sources.put("api", ready("api"))
    assert sorted(bus.rows(node.sources)) == ["api", "file"]  # one Redis

    await other.release()
    other.held, other.token = True, 2  # as if a's release raced a write in flight
    with pytest.raises(LeaseLapsed):
        await NodeBus.of(standby, service="syncloop").sources.put("api", ready("api"))


async def test_close_is_recorded() -> None:
    bus = FakeBus()
    await bus.close()
    assert bus.closed


async def test_entries_planted_synchronously_are_read_as_published_ones() -> None:
    bus = FakeBus()
    node = NodeBus.of(bus, service="syncloop")
    pods = node.pods
    assert isinstance(pods, FakeStream)
    good = bus.append(pods, change("u1"))
    bad = bus.plant(pods, "{not json")
    await pods.ensure_group("g")
    read = await pods.read("g", "c", block_ms=1)
    assert [(e.id, e.record) for e in read[:1]] == [(good, change("u1"))]
    assert read[1].id == bad and read[1].record is None and read[1].error
    bus.seed(node.sources, "file", ready("file"))
    bus.seed(node.sources, "api", ready("api"))
    bus.seed(node.sources, "http", ready("http"))
    bus.drop(node.sources, "file", "api")
    assert list(await node.sources.all()) == ["http"]


async def test_calls_and_acknowledgements_are_logged() -> None:
    bus = FakeBus()
    pods = NodeBus.of(bus, service="syncloop").pods
    assert isinstance(pods, FakeStream)
    await pods.ensure_group("g")
    first = await pods.publish(change("u1"))
    await pods.read("g", "c", block_ms=1)
    await pods.ack("g", first, "9-0")  # 9-0 was never pending
    await pods.ack("g", first)  # nor is first any more
    assert pods.acked == [first]
    assert bus.calls == ["ensure_group", "write", "read", "ack", "ack"]


async def test_errors_for_the_next_calls_are_raised_one_each_by_a_blocked_read_first() -> None:
    bus = FakeBus()
    node = NodeBus.of(bus, service="syncloop")
    pods = node.pods
    await pods.ensure_group("g")
    reader = asyncio.create_task(pods.read("g", "c", block_ms=10_000))
    await asyncio.sleep(0)
    bus.fail(BusUnavailable("connection dropped"), BusUnavailable("still down"))
    with pytest.raises(BusUnavailable, match="connection dropped"):
        await reader
    with pytest.raises(BusUnavailable, match="still down"):
        await node.sources.all()
    assert await node.sources.all() == {}


def note(reason: str) -> EventRecord:
    return EventRecord(
        type="Normal", reason=reason, message="", involved={}, component="kubelet", at=0.0
    )


async def test_merged_streams_wake_on_any_and_ack_into_their_own() -> None:
    bus = FakeBus()
    feed = NodeBus.of(bus, service="status-reporter").event_feed
    eviction = NodeBus.of(bus.connect(), service="eviction").events
    await feed.ensure_group("g")
    reader = asyncio.create_task(feed.read("g", "c", block_ms=5000))
    await asyncio.sleep(0)
    assert not reader.done()
    await eviction.publish(note("Evicted"))
    [entry] = await reader
    assert entry.record == note("Evicted") and entry.id.startswith("events:eviction ")
    assert isinstance(eviction, FakeStream) and eviction.pending("g") == [entry.id.split()[1]]
    await feed.ack("g", entry.id)
    assert eviction.pending("g") == []
    assert await feed.read("g", "c", block_ms=1) == []


async def test_what_its_writer_does_not_own_is_refused_as_the_function_refuses_it() -> None:
    bus = FakeBus("n1")
    eviction = NodeBus.of(bus, service="eviction").conditions
    syncloop = NodeBus.of(bus, service="syncloop").conditions
    shutdown = NodeConditionRecord(
        type="Ready", status="False", at=1.0, message="node is shutting down"
    )
    await eviction.put("MemoryPressure", NodeConditionRecord("MemoryPressure", "True", 1.0))
    await eviction.put("Ready", shutdown)
    await syncloop.put("Ready", NodeConditionRecord("Ready", "False", 1.0, message="PLEG"))
    for table, key, record in (
        (syncloop, "MemoryPressure", NodeConditionRecord("MemoryPressure", "True", 2.0)),
        (eviction, "Ready", NodeConditionRecord("Ready", "False", 2.0, message="forged")),
        (eviction, "NetworkUnavailable", NodeConditionRecord("NetworkUnavailable", "True", 2.0)),
        (eviction, "DiskPressure", NodeConditionRecord("MemoryPressure", "True", 2.0)),
    ):
        with pytest.raises(NotOwned):
            await table.put(key, record)
    assert set(bus.rows(eviction)) == {"MemoryPressure", "Ready"}
    assert set(bus.rows(syncloop)) == {"Ready"}

    history = NodeBus.of(bus, service="status-reporter").history_of("uid-1")
    entry = HistoryEntry(
        at=1.0, source="kubelet", what="event", type="Normal", reason="R", message="m"
    )
    with pytest.raises(BadWrite, match="without its expiry"):
        async with bus.transaction() as tx:
            tx.publish(history, entry)
    assert bus.entries(history) == []
    async with bus.transaction() as tx:
        tx.publish(history, entry)
        tx.expire(history, 60_000)
    assert bus.entries(history) == [entry]


async def test_a_call_over_the_byte_cap_is_refused_and_a_split_transaction_is_not() -> None:
    bus = FakeBus("n1")
    nb = NodeBus.of(bus, service="pod-source")
    big = "x" * (5 * 1024 * 1024)
    rows = [SourceState(source=f"s{i}{big}", ready=True, at=0.0) for i in range(7)]
    with pytest.raises(WriteTooLarge) as refused:
        async with bus.transaction() as tx:
            for row in rows:
                tx.put(nb.sources, row.source, row)
    assert refused.value.cap == "MAX_WRITE_BYTES"
    assert nb.sources.key not in bus.hashes
    async with bus.transaction(split=True) as tx:
        for row in rows:
            tx.put(nb.sources, row.source, row)
            tx.mark()
    assert len(bus.hashes[nb.sources.key]) == 7
    # A unit over SPLIT_BYTES but within the caps goes in one call of its own.
    assert bus.writes == [1, 1, 1, 1, 1, 1, 1]
