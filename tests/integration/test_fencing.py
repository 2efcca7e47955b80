"""Leader fencing against a real Redis: a leader's writes happen only while its lease
token is current (refused by Redis itself once another replica holds the lease, and
locally once the last renewal is a TTL old), a refused write ends leadership, the leader
loop steps down when Redis has been unreachable for a whole TTL or when somebody else
held the lease meanwhile, a Redis restarted empty does not end leadership (the loop,
told by the bus's failed calls, takes the lease back at Redis's first answer and tells
the service), and — with
two real replica processes — a leader stalled by SIGSTOP past its TTL writes nothing
after the standby took over and steps down when it is continued. A fenced write that
one of its writes would be refused (a key of the wrong type, a grant the service lacks,
with pod-source's real credential) writes nothing at all: a key the same call already
made a stream is not then written as a table, and the call's first write, whose key
type is not looked up beforehand (issue 42), fails alone with nothing written."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from klet.bus import Bus, BusError, Fenced, LeaseLapsed, NodeBus, functions
from klet.bus.leader import LeaseLost, hold
from klet.devstack import ManagedProcess, RedisServer
from klet.model.records import NodeConditionRecord, PodStatusRecord, SourceState
from klet.model.types import PodUID
from redis.exceptions import RedisError

REPO = Path(__file__).resolve().parents[2]


def rec(name: str, n: float = 1.0) -> NodeConditionRecord:
    return NodeConditionRecord(type="Fencing", status="True", at=n, reason=name)


@pytest.fixture
async def buses(redis_server: RedisServer) -> AsyncIterator[Callable[[], Bus]]:
    """Bus factory: one Bus (one process's connection pool) per replica."""
    made: list[Bus] = []

    def make() -> Bus:
        made.append(Bus.from_url(redis_server.url, "n1", auth=redis_server.admin, timeout_s=0.5))
        return made[-1]

    yield make
    for b in made:
        await b.close()


async def test_leader_writes_are_conditional_on_the_current_token(
    buses: Callable[[], Bus],
) -> None:
    bus_a, bus_b, reader = buses(), buses(), buses()
    a = bus_a.lease("svc", "host:1:aaaaaaaaaaaa", ttl_ms=300)
    b = bus_b.lease("svc", "host:2:bbbbbbbbbbbb", ttl_ms=300)
    table_a, stream_a = (
        bus_a.table("t", NodeConditionRecord),
        bus_a.stream("s", NodeConditionRecord),
    )

    assert await a.try_acquire()
    assert not await b.try_acquire()
    with pytest.raises(Fenced):  # a standby writes nothing
        await bus_b.table("t", NodeConditionRecord).put("k", rec("b"))

    entry = await stream_a.publish(rec("a"))
    await table_a.put("k", rec("a"))
    async with bus_a.transaction() as tx:
        tx.put(table_a, "k2", rec("a"))
        tx.publish(stream_a, rec("a", 2))
    await table_a.delete("k2")
    assert entry and await reader.stream("s", NodeConditionRecord).length() == 2
    assert set(await reader.table("t", NodeConditionRecord).all()) == {"k"}

    # A stalls: its lease expires and B takes it. A's own clock is held back, as for a
    # write that was already on its way when the process stopped: only Redis can refuse.
    a.clock = lambda: a.renewed_at
    await wait_for(b.try_acquire, "a's lease to expire and B to take it", timeout_s=5)
    assert b.token is not None and a.token is not None
    assert b.token > a.token
    with pytest.raises(Fenced, match="another replica"):
        await table_a.put("k", rec("stale"))
    assert a.lost.is_set() and not a.held
    with pytest.raises(Fenced):
        await stream_a.publish(rec("stale"))
    with pytest.raises(Fenced):
        async with bus_a.transaction() as tx:
            tx.delete(table_a, "k")
    assert await reader.table("t", NodeConditionRecord).get("k") == rec("a")
    assert await reader.stream("s", NodeConditionRecord).length() == 2


async def test_redis_refuses_a_stale_token_even_when_the_local_check_passes(
    buses: Callable[[], Bus],
) -> None:
    bus_a, bus_b = buses(), buses()
    a = bus_a.lease("svc", "host:1:aaaaaaaaaaaa", ttl_ms=10_000)
    b = bus_b.lease("svc", "host:2:bbbbbbbbbbbb", ttl_ms=10_000)
    assert await a.try_acquire()
    await bus_a.client.delete(a.key)  # as if expired
    assert await b.try_acquire()
    assert a.current_value() is not None  # A still believes it leads
    with pytest.raises(Fenced):
        await bus_a.stream("s", NodeConditionRecord).publish(rec("a"))
    assert await bus_b.client.xlen(bus_b.key("s")) == 0


async def test_a_write_after_a_whole_ttl_without_renewal_is_refused_locally(
    buses: Callable[[], Bus],
) -> None:
    bus_a = buses()
    a = bus_a.lease("svc", "host:1:aaaaaaaaaaaa", ttl_ms=10_000)
    assert await a.try_acquire()
    now = time.monotonic()
    a.clock = lambda: now + 10.0  # ten seconds later, never renewed
    with pytest.raises(Fenced, match="too old"):
        await bus_a.table("t", NodeConditionRecord).put("k", rec("a"))
    assert a.lost.is_set()
    assert await bus_a.client.hlen(bus_a.key("t")) == 0  # nothing reached Redis


async def test_the_leader_steps_down_when_redis_is_unreachable_for_a_ttl(
    redis_server: RedisServer, buses: Callable[[], Bus]
) -> None:
    bus_a = buses()
    lease = bus_a.lease("svc", "host:1:aaaaaaaaaaaa", ttl_ms=900)
    elected = asyncio.Event()
    task = asyncio.create_task(hold(lease, elected))
    try:
        await asyncio.wait_for(elected.wait(), 5)
        redis_server.stop()
        started = time.monotonic()
        with pytest.raises(LeaseLost, match="whole TTL"):
            await asyncio.wait_for(task, 10)
        # Not before the lease could have expired in Redis, and not long after.
        assert 0.3 < time.monotonic() - started < 4.0
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_refused_write_wakes_the_leader_loop_at_once(
    buses: Callable[[], Bus],
) -> None:
    bus_a, bus_b = buses(), buses()
    lease = bus_a.lease("svc", "host:1:aaaaaaaaaaaa", ttl_ms=30_000)
    b = bus_b.lease("svc", "host:2:bbbbbbbbbbbb", ttl_ms=30_000)
    elected = asyncio.Event()
    task = asyncio.create_task(hold(lease, elected))
    try:
        await asyncio.wait_for(elected.wait(), 5)
        await bus_a.client.delete(lease.key)
        assert await b.try_acquire()
        with pytest.raises(Fenced):
            await bus_a.table("t", NodeConditionRecord).put("k", rec("a"))
        # The renewal interval is 10 s; the refusal ends leadership right away.
        with pytest.raises(LeaseLost, match="write was refused"):
            await asyncio.wait_for(task, 3)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_leader_keeps_leading_when_redis_restarts_empty(
    redis_server: RedisServer, buses: Callable[[], Bus]
) -> None:
    bus_a = buses()
    # A renewal every 200 s: none comes within the test, so only the bus's failed
    # calls can tell the leader loop that Redis went away.
    lease = bus_a.lease("svc", "host:1:aaaaaaaaaaaa", ttl_ms=600_000)
    told: list[int | None] = []
    lease.on_restored(lambda: told.append(lease.token))
    table = bus_a.table("t", NodeConditionRecord)
    elected = asyncio.Event()
    task = asyncio.create_task(hold(lease, elected))
    try:
        await asyncio.wait_for(elected.wait(), 5)
        redis_server.restart()  # everything is gone, the lease and its counter too
        await wait_for(_answers(bus_a), "Redis back")  # its first ping finds Redis gone
        # The loop takes the lease back at Redis's first answer, as the first grant since
        # the counter was lost (nobody else can have led), and tells the service once,
        # without a write having to be refused first.
        await wait_for(_true(lambda: bool(told)), "the lease taken back")
        assert told == [1]
        await table.put("k", rec("a"))
        assert not task.done() and lease.token == 1 and not lease.lost.is_set()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_write_prepared_before_the_leader_took_its_lease_back_is_retried(
    redis_server: RedisServer, buses: Callable[[], Bus]
) -> None:
    """Redis restarted empty; the leader took the lease back under a new token while a
    write carrying the old one was on its way: that write is lapsed (nothing written,
    retried), never fenced, which would make the only leader step down."""
    bus_a = buses()
    lease = bus_a.lease("svc", "host:1:aaaaaaaaaaaa", ttl_ms=30_000)
    assert await lease.try_acquire()
    await lease.release()
    assert await lease.try_acquire() and lease.token == 2
    old_value = lease.value
    redis_server.restart()  # the counter restarts too: the lease comes back as token 1
    await wait_for(_answers(bus_a), "Redis back")
    assert await lease.try_acquire() and lease.value != old_value
    table = bus_a.table("t", NodeConditionRecord)
    real = lease.current_value
    lease.current_value = lambda: old_value  # type: ignore[method-assign]
    with pytest.raises(LeaseLapsed):
        await table.put("k", rec("stale"))
    lease.current_value = real  # type: ignore[method-assign]
    assert lease.held and not lease.lost.is_set()
    await table.put("k", rec("fresh"))


async def test_a_leader_whose_lease_was_granted_to_another_meanwhile_steps_down(
    buses: Callable[[], Bus],
) -> None:
    bus_a, bus_b = buses(), buses()
    lease = bus_a.lease("svc", "host:1:aaaaaaaaaaaa", ttl_ms=30_000)
    b = bus_b.lease("svc", "host:2:bbbbbbbbbbbb", ttl_ms=30_000)
    elected = asyncio.Event()
    task = asyncio.create_task(hold(lease, elected))
    try:
        await asyncio.wait_for(elected.wait(), 5)
        await bus_a.client.delete(lease.key)
        assert await b.try_acquire()  # b leads for a moment and gives it back
        await b.release()
        with pytest.raises(LeaseLapsed):
            await bus_a.table("t", NodeConditionRecord).put("k", rec("a"))
        with pytest.raises(LeaseLost, match="lapsed"):
            await asyncio.wait_for(task, 3)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def _true(check: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    async def awaited() -> bool:
        return check()

    return awaited


def _answers(bus: Bus) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        try:
            await bus.ping()
        except BusError:
            return False
        return True

    return check


async def test_predecessor_takeover_and_unique_holders(buses: Callable[[], Bus]) -> None:
    dead = buses().lease("svc", "h:10:aaaaaaaaaaaa", ttl_ms=10_000)
    assert await dead.try_acquire()
    # Another replica on the same host: its own identity, no claim on the lease.
    sibling = buses().lease("svc", "h:11:bbbbbbbbbbbb", ttl_ms=10_000)
    assert not await sibling.try_acquire()
    # A process that knows it succeeds a dead holder takes over without waiting...
    heir = buses().lease("svc", "h:12:cccccccccccc", ttl_ms=10_000, predecessor=dead.holder)
    assert await heir.try_acquire()
    assert heir.token is not None and dead.token is not None and heir.token > dead.token
    # ... and the dead holder's writes are refused from then on.
    with pytest.raises(Fenced):
        await dead.bus.table("t", NodeConditionRecord).put("k", rec("dead"))


# -- two replica processes ---------------------------------------------------------------


def replica(
    tmp: Path, redis: RedisServer, name: str, ttl_ms: int, *, run_dir: Path | None = None
) -> ManagedProcess:
    """A replica process (tests/harness/leader_replica.py); with `run_dir`, its lease is a
    service's, with the replica and leader slots there."""
    # The repository for `tests.harness`, before whatever path this run has (a worktree's
    # sources ahead of the installed ones).
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PYTHONPATH=path)
    # The replicas write keys of their own (not a service's), so they connect as the admin.
    admin = redis.admin
    argv = [sys.executable, "-m", "tests.harness.leader_replica", redis.url, "n1", name]
    argv += [str(ttl_ms), admin.username, str(admin.password_file)]
    if run_dir is not None:
        argv.append(str(run_dir))
    return ManagedProcess(f"replica-{name}", argv, dir=tmp / name, env=env)


async def writes(bus: Bus) -> list[tuple[str, str]]:
    """(entry id, writer) of every entry in the replicas' stream, in Redis order."""
    raw = await bus.client.xrange(bus.key("fencing-writes"))
    return [(eid, NodeConditionRecord.decode(fields["r"]).reason) for eid, fields in raw]


async def wait_for(
    check: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 20.0
) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def test_a_stalled_leader_writes_nothing_after_the_takeover(
    tmp_path: Path, redis_server: RedisServer, buses: Callable[[], Bus]
) -> None:
    bus = buses()
    ttl_ms = 1500
    a = replica(tmp_path, redis_server, "a", ttl_ms)
    b = replica(tmp_path, redis_server, "b", ttl_ms)
    a.start()
    try:

        async def a_writes() -> bool:
            return any(w == "a" for _, w in await writes(bus))

        await wait_for(a_writes, "replica a leading and writing")
        b.start()

        async def b_standing_by() -> bool:
            return "standing by for the lease" in b.log_path.read_text()

        await wait_for(b_standing_by, "replica b standing by")
        assert b.alive and all(w == "a" for _, w in await writes(bus))

        assert a.pid is not None
        os.kill(a.pid, signal.SIGSTOP)
        stopped_at = time.monotonic()

        async def b_writes() -> bool:
            return any(w == "b" for _, w in await writes(bus))

        await wait_for(b_writes, "replica b taking over")
        assert time.monotonic() - stopped_at > ttl_ms / 1000 * 0.9  # not before the TTL
        await asyncio.sleep(0.5)  # a stays stopped well past its TTL
        takeover = next(eid for eid, w in await writes(bus) if w == "b")

        os.kill(a.pid, signal.SIGCONT)

        async def a_exited() -> bool:
            return not a.alive

        await wait_for(a_exited, "the stalled leader stepping down", timeout_s=10)
        await asyncio.sleep(0.5)  # anything a still had in flight has landed by now

        after = [(eid, w) for eid, w in await writes(bus) if w == "a" and _later(eid, takeover)]
        assert after == [], f"the stalled leader wrote after the takeover: {after[:5]}"
        assert (
            await bus.table("fencing-leader", NodeConditionRecord).get("leader") or rec("")
        ).reason == "b"
        code = a.stop()
        assert code not in (0, None)
        log = a.log_path.read_text()
        assert "stepping down" in log or "write refused" in log, log[-2000:]
        assert b.alive
    finally:
        if a.pid is not None and a.alive:
            os.kill(a.pid, signal.SIGCONT)
        a.stop()
        b.stop()


def _later(eid: str, than: str) -> bool:
    ms, seq = (int(x) for x in eid.split("-"))
    ms2, seq2 = (int(x) for x in than.split("-"))
    return (ms, seq) > (ms2, seq2)


async def test_a_write_refused_half_way_writes_nothing(
    buses: Callable[[], Bus], redis_server: RedisServer
) -> None:
    bus, reader = buses(), buses()
    lease = bus.lease("svc", "host:1:aaaaaaaaaaaa", ttl_ms=10_000)
    assert await lease.try_acquire()
    await reader.client.hset(reader.key("s"), "not", "a stream")
    with pytest.raises(BusError, match="WRONGTYPE"):
        async with bus.transaction() as tx:
            tx.put(bus.table("t", NodeConditionRecord), "k", rec("first"))
            tx.publish(bus.stream("s", NodeConditionRecord), rec("second"))
            tx.put(bus.table("t", NodeConditionRecord), "k2", rec("third"))
    assert await reader.table("t", NodeConditionRecord).all() == {}
    assert await reader.client.hgetall(reader.key("s")) == {"not": "a stream"}
    assert not lease.lost.is_set()  # a refused write is no reason to step down


async def test_a_key_the_call_made_a_stream_is_not_then_written_as_a_table(
    buses: Callable[[], Bus],
) -> None:
    # The key's type is looked up once a call and what each write makes of it kept:
    # looking at the key alone found it absent before both writes and let the call
    # write the stream, then fail on the table.
    bus, reader = buses(), buses()
    lease = bus.lease("svc", "host:1:aaaaaaaaaaaa", ttl_ms=10_000)
    assert await lease.try_acquire()
    table, stream = bus.table("t", NodeConditionRecord), bus.stream("s", NodeConditionRecord)
    for first in (True, False):
        with pytest.raises(BusError, match=f"WRONGTYPE {stream.key} holds a stream, not a hash"):
            async with bus.transaction() as tx:
                if first:
                    tx.put(table, "k", rec("first"))
                tx.publish(stream, rec("second"))
                tx.put(bus.table("s", NodeConditionRecord), "k", rec("third"))
    assert await reader.client.exists(table.key, stream.key) == 0


async def test_a_first_write_to_a_key_of_another_type_writes_nothing(
    buses: Callable[[], Bus],
) -> None:
    # The call's first write is not looked up beforehand: it fails with nothing written.
    bus, reader = buses(), buses()
    lease = bus.lease("svc", "host:1:aaaaaaaaaaaa", ttl_ms=10_000)
    assert await lease.try_acquire()
    await reader.client.hset(reader.key("s"), "not", "a stream")
    with pytest.raises(BusError, match=f"WRONGTYPE {reader.key('s')} holds a hash, not a stream"):
        async with bus.transaction() as tx:
            tx.publish(bus.stream("s", NodeConditionRecord), rec("first"))
            tx.put(bus.table("t", NodeConditionRecord), "k", rec("second"))
    assert await reader.table("t", NodeConditionRecord).all() == {}
    assert await reader.client.hgetall(reader.key("s")) == {"not": "a stream"}
    assert not lease.lost.is_set()


async def test_a_write_the_service_may_not_make_writes_nothing(redis_server: RedisServer) -> None:
    redis_server.add_node("n1")
    bus = Bus.from_url(
        redis_server.url, "n1", auth=redis_server.credentials("n1", "pod-source"), timeout_s=2
    )
    reader = Bus.from_url(redis_server.url, "n1", auth=redis_server.admin, timeout_s=2)
    try:
        nb = NodeBus.of(bus, service="pod-source")
        assert await bus.lease("pod-source", "host:1:cccccccccccc").try_acquire()
        ready = SourceState(source="file", ready=True, at=1.0)
        await nb.sources.put("file", ready)  # what it owns, it writes
        # The status table is syncloop's: Redis refuses the script for its keys.
        with pytest.raises(BusError, match="permission"):
            async with bus.transaction() as tx:
                tx.put(nb.sources, "api", SourceState(source="api", ready=True, at=2.0))
                tx.put(
                    nb.status,
                    "uid",
                    PodStatusRecord(
                        uid=PodUID("uid"),
                        namespace="default",
                        name="p",
                        version=1,
                        epoch=1.0,
                        status={},
                        updated_at=1.0,
                    ),
                )
        assert await NodeBus.of(reader, service="pod-source").sources.all() == {"file": ready}
        # A key the script may touch but not write so (a stream it publishes to, not
        # created yet): refused by the script's own check before its first write (it used
        # to leave the first HSET applied).
        junk = bus.table("pods", SourceState)
        lease = bus.key("lease:pod-source")
        with pytest.raises(RedisError, match="may not HSET"):
            await bus.client.fcall(
                functions.FENCED_WRITE,
                3,
                lease,
                nb.sources.key,
                junk.key,
                await bus.client.get(lease),
                *("hset", "2", "api", ready.encode(), "hset", "3", "k", "v"),
            )
        # Through the bus the call also names the generation counter of each table it
        # writes (`gen:pods`, which pod-source is granted nothing of): refused by Redis
        # before the function runs, nothing written either.
        with pytest.raises(BusError, match="may not HSET|no permissions to access"):
            async with bus.transaction() as tx:
                tx.put(nb.sources, "api", SourceState(source="api", ready=True, at=2.0))
                tx.put(junk, "k", ready)
        assert await NodeBus.of(reader, service="pod-source").sources.all() == {"file": ready}
    finally:
        await bus.close()
        await reader.close()
