"""Table generations on a real Redis, with klet's ACL file and function library and each
service's own credential (issue 42: three services decoded the `desired` and `status`
tables in full every 5 s while nothing changed).

Covers: every service's fenced write of each table it writes moves that table's
`gen:<table>` by one per call, however many rows the call writes, in the same atomic
call (a call refused by a cap moves nothing); a counter that does not exist yet starts
from the Redis server's clock in microseconds, and so does one that is not a number or
not a string any more (the write still goes through); an unfenced write (the admin's) moves it
the same way; each service may read the counters of the tables it reads or writes in
one MGET and may not move a counter of a table it only reads. A `TableWatch` over the
real bus: an idle refresh is one MGET and no HGETALL (the server's command statistics),
a write by pod-source is read at the next refresh, and a Redis restart (the counters
lost with the data) reads every table again, the counter made anew at another value.
"""

from __future__ import annotations

import time

import pytest
from klet.bus import Bus, BusError, BusUnavailable, NodeBus, WriteTooLarge
from klet.bus.acl import ACCESS, SERVICES
from klet.bus.redisbus import _Op
from klet.bus.tablecopy import TableCopy, TableWatch
from klet.devstack import RedisServer
from klet.model.records import DesiredPod, SourceState
from klet.model.types import PodUID
from redis.exceptions import NoPermissionError

from tests.harness.busroles import admin, leader

NODE = "gens"


def desired(uid: str) -> DesiredPod:
    pod = {"metadata": {"name": uid, "namespace": "default", "uid": uid}, "spec": {}}
    return DesiredPod(uid=PodUID(uid), pod=pod, source="file", hash="h", seen_at=0)


async def counter(server: RedisServer, table: str) -> str | None:
    async with admin(server, NODE) as bus:
        value = await bus.client.get(bus.key(f"gen:{table}"))
    return None if value is None else str(value)


async def hgetalls(server: RedisServer) -> int:
    async with admin(server, NODE) as bus:
        stats = await bus.client.info("commandstats")
    return int(stats.get("cmdstat_hgetall", {}).get("calls", 0))


@pytest.mark.parametrize("service", SERVICES)
async def test_each_fenced_write_moves_its_tables_generation_once(
    redis_server: RedisServer, service: str
) -> None:
    table = ACCESS[service].writes[0]
    assert await counter(redis_server, table) is None
    row = "{}"
    if table.startswith("node:"):  # a condition row the service owns
        row = '{"v": 1, "type": "DiskPressure", "status": "True", "at": 1.0}'
        key = "DiskPressure"
    else:
        key = "k"
    before_us = time.time_ns() // 1000
    async with leader(redis_server, NODE, service) as nb:
        t = nb.bus.key(table)
        await nb.bus.write([_Op.hset(t, key, row)])
        first = await counter(redis_server, table)
        assert first is not None and int(first) >= before_us  # started from the clock
        await nb.bus.write([_Op.hset(t, key, row), _Op.hset(t, key, row), _Op.hdel(t, "x")])
        assert await counter(redis_server, table) == str(int(first) + 1)  # once per call
        with pytest.raises(WriteTooLarge):
            await nb.bus.write([_Op.hset(t, key, "x" * (4 * 1024 * 1024 + 1))])
        assert await counter(redis_server, table) == str(int(first) + 1)  # refused: no move


async def test_a_broken_counter_is_started_again_and_the_write_goes_through(
    redis_server: RedisServer,
) -> None:
    async with admin(redis_server, NODE) as bus:
        await bus.client.set(bus.key("gen:desired"), "not a number")
        await bus.client.hset(bus.key("gen:sources"), "a", "hash")  # another type
    before_us = time.time_ns() // 1000
    async with leader(redis_server, NODE, "pod-source") as nb:
        async with nb.bus.transaction() as tx:
            tx.put(nb.desired, "u1", desired("u1"))
            tx.put(nb.sources, "file", SourceState(source="file", ready=True, at=0))
        assert await nb.desired.get("u1") == desired("u1")
    for table in ("desired", "sources"):
        value = await counter(redis_server, table)
        assert value is not None and int(value) >= before_us


async def test_an_unfenced_write_moves_the_generation_too(redis_server: RedisServer) -> None:
    async with admin(redis_server, NODE) as bus:
        nb = NodeBus.of(bus, service="pod-source")
        await nb.desired.put("u1", desired("u1"))
        first = await counter(redis_server, "desired")
        assert first is not None and int(first) > 1_000_000_000_000_000
        await nb.desired.delete("u1")
        assert await counter(redis_server, "desired") == str(int(first) + 1)


async def test_readers_read_the_generations_and_may_not_move_them(
    redis_server: RedisServer,
) -> None:
    async with leader(redis_server, NODE, "pod-source") as source:
        await source.desired.put("u1", desired("u1"))
    async with leader(redis_server, NODE, "eviction") as nb:
        [d, s] = await nb.bus.generations([nb.desired.generation_key, nb.status.generation_key])
        assert d == await counter(redis_server, "desired") and s is None
        with pytest.raises(BusError, match="may not HSET"):
            await nb.bus.write([_Op.hset(nb.desired.key, "u2", "{}")])
        with pytest.raises(NoPermissionError):
            await nb.bus.client.incr(nb.desired.generation_key)
    assert await counter(redis_server, "desired") == d


async def refreshed(watch: TableWatch) -> bool:
    """`watch.refresh()`, through the one failed call a pooled connection to a Redis
    that restarted may cost (the bus never sends a call twice)."""
    for _ in range(3):
        try:
            return await watch.refresh()
        except BusUnavailable:
            continue
    raise AssertionError("the bus did not come back")


async def test_a_watch_reads_a_table_only_when_it_moved_and_after_a_restart(
    redis_server: RedisServer,
) -> None:
    async with leader(redis_server, NODE, "pod-source") as source:
        await source.desired.put("u1", desired("u1"))
        await source.sources.put("file", SourceState(source="file", ready=True, at=0))
    # syncloop reads both tables (no lease needed to read).
    reader = Bus.from_url(
        redis_server.url, NODE, auth=redis_server.credentials(NODE, "syncloop"), timeout_s=10
    )
    try:
        nb = NodeBus.of(reader, service="syncloop")
        copy, sources = TableCopy(nb.desired), TableCopy(nb.sources)
        watch = TableWatch(copy, sources)
        assert await watch.refresh()
        assert set(copy.records) == {"u1"}
        old = copy.generation
        read = await hgetalls(redis_server)
        for _ in range(5):
            assert not await watch.refresh()
        assert await hgetalls(redis_server) == read  # idle: no table read
        async with leader(redis_server, NODE, "pod-source") as source:
            await source.desired.put("u2", desired("u2"))
        assert await watch.refresh()  # pod-source's write
        assert set(copy.records) == {"u1", "u2"} and copy.decoded == 2
        assert await hgetalls(redis_server) == read + 1  # desired only

        redis_server.restart()
        assert await refreshed(watch)  # the counters were lost: every table read again
        assert copy.records == {} and sources.records == {}
        async with leader(redis_server, NODE, "pod-source") as source:
            await source.desired.put("u1", desired("u1"))
        assert await watch.refresh()
        assert set(copy.records) == {"u1"}
        assert copy.generation is not None and copy.generation != old
    finally:
        await reader.close()
