"""The Redis bus against a real Redis: tables (one and many records read, a burst of
concurrent calls waiting for a connection rather than failing), consumer
groups (delivery, ack, claiming what a dead consumer left pending, a bad entry
surfacing as an error instead of a record, the group re-created after a flush, dead
consumers removed from the group; every service's Events stream read as one; a batch of
Events appended by one fenced call, all or nothing), atomic transactions, the lease
(one holder, a dead predecessor's lease taken over at once, takeover after expiry, fencing tokens
increase), and BusUnavailable when Redis is gone. Redis is bounded (maxmemory, noeviction):
a write past the bound is refused with OOM, which the bus reports as BusUnavailable (the
writer retries), and nothing already written is evicted."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
from klet.bus import Bus, BusError, BusUnavailable, Fenced, NodeBus, WriteTooLarge
from klet.bus.functions import MAX_ENTRY_BYTES
from klet.devstack import RedisServer
from klet.model.records import EventRecord, PodChange, SourceState
from klet.model.types import PodUID

from tests.harness.busroles import admin, leader

T = TypeVar("T")


def change(uid: str) -> PodChange:
    return PodChange(op="ADD", uid=PodUID(uid), source="file")


def event(reason: str) -> EventRecord:
    return EventRecord(
        type="Normal",
        reason=reason,
        message="m",
        involved={"kind": "Node", "name": "n1"},
        component="kubelet",
        at=1.0,
    )


async def test_tables_and_transaction(redis_server: Any) -> None:
    bus = Bus.from_url(redis_server.url, "n1", auth=redis_server.admin)
    nb = NodeBus.of(bus, service="syncloop")
    try:
        async with bus.transaction() as tx:
            tx.put(nb.sources, "file", SourceState(source="file", ready=True, at=1.0))
            tx.publish(nb.pods, change("a"))
        assert (await nb.sources.get("file")) == SourceState(source="file", ready=True, at=1.0)
        assert await nb.pods.length() == 1
        await bus.client.hset(nb.sources.key, "bad", "{garbage")
        assert set(await nb.sources.all()) == {"file"}  # the bad entry is logged and left out
        assert await nb.sources.get("bad") is None
        # many keys in one HMGET: missing and bad ones None, a repeated key once
        assert await nb.sources.get_many(["file", "bad", "none", "file"]) == {
            "file": SourceState(source="file", ready=True, at=1.0),
            "bad": None,
            "none": None,
        }
        assert await nb.sources.get_many([]) == {}
        await nb.sources.delete("file")
        assert await nb.sources.get("file") is None
        assert nb.sources.key == "klet:n1:sources"
    finally:
        await bus.close()


async def test_a_burst_of_concurrent_calls_waits_for_connections(redis_server: Any) -> None:
    # 110 pod workers woken at once each read a table; past the pool's size the calls
    # wait for a connection instead of failing with "Too many connections".
    bus = Bus.from_url(redis_server.url, "n1", auth=redis_server.admin)
    nb = NodeBus.of(bus, service="syncloop")
    try:
        await nb.sources.put("file", SourceState(source="file", ready=True, at=1.0))
        got = await asyncio.gather(*(nb.sources.get("file") for _ in range(300)))
        assert all(g is not None and g.ready for g in got)
    finally:
        await bus.close()


async def test_consumer_group_ack_claim_and_bad_entries(redis_server: Any) -> None:
    bus = Bus.from_url(redis_server.url, "n1", auth=redis_server.admin)
    stream = NodeBus.of(bus, service="syncloop").pods
    try:
        await stream.ensure_group("g")
        await stream.ensure_group("g")  # idempotent
        await stream.publish(change("a"))
        await bus.client.xadd(stream.key, {"r": '{"v": 9}'})
        await stream.publish(change("b"))
        got = await stream.read("g", "c1", block_ms=100)
        assert [e.record.uid if e.record else e.error for e in got][0] == "a"
        assert got[1].record is None and "unsupported version 9" in (got[1].error or "")
        await stream.ack("g", got[0].id, got[1].id)  # c1 dies before acking "b"
        assert await stream.read("g", "c2", block_ms=100) == []  # nothing new
        claimed = await stream.claim_stale("g", "c2", min_idle_ms=0)
        assert [e.record.uid for e in claimed if e.record] == ["b"]
        await stream.ack("g", claimed[0].id)
        assert await stream.claim_stale("g", "c2", min_idle_ms=0) == []

        await bus.client.flushall()  # Redis lost everything, the group included
        await stream.publish(change("c"))
        again = await stream.read("g", "c2", block_ms=100)
        assert again == [] or [e.record.uid for e in again if e.record] == ["c"]
        await stream.publish(change("d"))
        assert [e.record.uid for e in await stream.read("g", "c2", block_ms=100) if e.record] == [
            "d"
        ]
    finally:
        await bus.close()


async def test_every_services_events_are_consumed_as_one_stream(redis_server: Any) -> None:
    # Each service appends to its own stream with its own credential; status-reporter
    # reads them all in one blocking read, acks each in its stream, claims stale ones.
    buses = {
        s: Bus.from_url(redis_server.url, "n1", auth=redis_server.credentials("n1", s))
        for s in ("syncloop", "eviction", "status-reporter")
    }
    try:
        nbs = {s: NodeBus.of(b, service=s) for s, b in buses.items()}
        feed = nbs["status-reporter"].event_feed
        await feed.ensure_group("g")
        reader = asyncio.create_task(feed.read("g", "c1", block_ms=5000))
        await asyncio.sleep(0.1)
        await nbs["eviction"].events.publish(event("EvictionThresholdMet"))
        first = await reader  # woken by the one stream that grew
        assert [e.record.reason for e in first if e.record] == ["EvictionThresholdMet"]
        assert first[0].id.startswith("events:eviction ")
        await nbs["syncloop"].events.publish(event("Pulled"))
        await nbs["eviction"].events.publish(event("Evicted"))
        second = await feed.read("g", "c1", block_ms=100)
        assert sorted(e.record.reason for e in second if e.record) == ["Evicted", "Pulled"]
        await feed.ack("g", *(e.id for e in first + second[:1]))
        stale = await feed.claim_stale("g", "c2", min_idle_ms=0)
        assert [e.id for e in stale] == [second[1].id]
        with pytest.raises(BusError, match="not an entry"):
            await feed.ack("g", "pods 1-0")
    finally:
        for b in buses.values():
            await b.close()


async def test_a_batch_of_events_is_one_fenced_call_all_or_nothing(
    redis_server: RedisServer,
) -> None:
    async def fcalls(root: Bus) -> int:
        stats = await root.client.info("commandstats")
        return int(stats.get("cmdstat_fcall", {}).get("calls", 0))

    async with leader(redis_server, "n1", "syncloop") as nb, admin(redis_server, "n1") as root:
        stored = root.stream("events:syncloop", EventRecord)
        before = await fcalls(root)
        ids = await nb.events.publish_many([event("Pulled"), event("Created"), event("Started")])
        assert await fcalls(root) == before + 1
        entries = await stored.latest(10)
        assert [e.id for e in entries] == ids
        assert [e.record.reason for e in entries if e.record] == ["Pulled", "Created", "Started"]
        # One entry over the cap refuses the whole call: the first is not written either.
        with pytest.raises(WriteTooLarge):
            await nb.events.publish_many([event("Killing"), event("x" * MAX_ENTRY_BYTES)])
        assert await stored.length() == 3
        # Another replica holds the lease: the batch is refused whole, before any write.
        await root.client.set(root.key("lease:syncloop"), "host:2:other:9")
        with pytest.raises(Fenced):
            await nb.events.publish_many([event("Killing"), event("BackOff")])
        assert await stored.length() == 3
        assert await nb.events.publish_many([]) == []


async def test_dead_consumers_are_removed_from_the_group(redis_server: Any) -> None:
    bus = Bus.from_url(redis_server.url, "n1", auth=redis_server.admin)
    stream = NodeBus.of(bus, service="syncloop").pods

    async def consumers() -> dict[str, int]:
        info = await bus.client.xinfo_consumers(stream.key, "g")
        return {c["name"]: int(c["pending"]) for c in info}

    try:
        await stream.ensure_group("g")
        await stream.publish(change("a"))
        await stream.publish(change("b"))
        done = await stream.read("g", "host-100", count=1, block_ms=100)
        await stream.ack("g", done[0].id)  # host-100 handled "a", then died
        await stream.read("g", "host-200", count=1, block_ms=100)  # died handling "b"
        await until(lambda: idle_ms(bus, stream.key, "host-200"), lambda ms: ms > 200)
        await stream.publish(change("c"))
        fresh = await stream.read("g", "host-300", block_ms=100)  # alive: just got "c"
        await stream.ack("g", fresh[0].id)
        claimed = await stream.claim_stale("g", "host-400", min_idle_ms=200)
        assert [e.record.uid for e in claimed if e.record] == ["b"]
        # The dead ones are gone (host-200 once its entry was claimed); the live ones stay.
        # (Deleting a live consumer with nothing pending would be harmless anyway: its
        # next read creates it again.)
        assert await consumers() == {"host-300": 0, "host-400": 1}
    finally:
        await bus.close()


async def until(probe: Callable[[], Awaitable[T]], accept: Callable[[T], bool]) -> T:
    """Poll `probe` until `accept` holds (within 5 s)."""
    async with asyncio.timeout(5):
        while True:
            value = await probe()
            if accept(value):
                return value
            await asyncio.sleep(0.02)


async def idle_ms(bus: Bus, key: str, consumer: str) -> int:
    """How long (by Redis's clock) the entry pending for `consumer` has gone unacknowledged."""
    (entry,) = await bus.client.xpending_range(key, "g", "-", "+", 1, consumer)
    return int(entry["time_since_delivered"])


async def test_lease(redis_server: Any) -> None:
    buses = [Bus.from_url(redis_server.url, "n1", auth=redis_server.admin) for _ in range(4)]
    try:
        a = buses[0].lease("svc", "host:1:aaaaaaaaaaaa", ttl_ms=500)
        b = buses[1].lease("svc", "host:2:bbbbbbbbbbbb", ttl_ms=500)
        assert await a.try_acquire()
        assert not await b.try_acquire()
        first_token = a.token
        assert await a.try_acquire() and a.token == first_token  # renewal
        # The next process of a's slot, knowing a is dead, takes over at once.
        restarted = buses[2].lease(
            "svc", "host:3:cccccccccccc", ttl_ms=500, predecessor="host:1:aaaaaaaaaaaa"
        )
        assert await restarted.try_acquire() and restarted.token is not None
        assert first_token is not None and restarted.token == first_token + 1
        assert not await a.try_acquire()  # a is fenced off
        await until(b.try_acquire, bool)  # nobody renews: it expires, and b takes it
        assert not await restarted.try_acquire()
        await b.release()
        assert await a.try_acquire()
        with pytest.raises(ValueError, match="one lease per bus"):
            buses[0].lease("other", "host:1:aaaaaaaaaaaa")
    finally:
        for bus in buses:
            await bus.close()


async def test_unavailable(redis_server: Any) -> None:
    bus = Bus.from_url(redis_server.url, "n1", auth=redis_server.admin, timeout_s=1)
    nb = NodeBus.of(bus, service="syncloop")
    try:
        redis_server.stop()
        with pytest.raises(BusUnavailable):
            await nb.desired.all()
        with pytest.raises(BusUnavailable):
            await nb.pods.publish(change("x"))
    finally:
        await bus.close()


async def test_a_full_redis_refuses_writes_as_unavailable_and_evicts_nothing(
    redis_server: Any,
) -> None:
    bus = Bus.from_url(redis_server.url, "n1", auth=redis_server.admin)
    try:
        assert await bus.client.config_get("maxmemory") == {"maxmemory": str(256 << 20)}
        assert await bus.client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
        nb = NodeBus.of(bus, service="syncloop")
        first = SourceState(source="file", ready=True, at=1.0)
        await nb.sources.put("file", first)
        used = int((await bus.client.info("memory"))["used_memory"])
        await bus.client.config_set("maxmemory", used + 64 * 1024)
        with pytest.raises(BusUnavailable, match="OOM|maxmemory"):
            await nb.pods.publish(change("x" * (256 * 1024)))
        assert await nb.sources.get("file") == first
    finally:
        await bus.client.config_set("maxmemory", 256 << 20)
        await bus.close()
