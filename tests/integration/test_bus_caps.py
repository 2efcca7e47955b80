"""Bounded bus calls, against the real Redis the harness runs with klet's ACL file and
function library, each service with its own real credential (issue 39, items 2 and 10).

One FCALL of the fenced write used to run as long as its caller liked (450k ops passed
the 5 s busy threshold and stalled every client of every node) and to apply its first
writes before a malformed argument (a MAXLEN that is not an integer) failed it. Now:
a call over a cap (ops, bytes, a value, a stream entry, a MAXLEN, an expiry) is refused
before anything is read or written, as `WriteTooLarge` naming the cap; a malformed
argument anywhere in the call is refused as `BadWrite` with nothing written; a call at
the caps goes through. Taking or renewing a lease with a TTL that is not a positive
integer (or above the longest expiry) draws no token and changes nothing. Also: a
function acts only within its caller's ACL, so it is no way around a grant the user
lacks (what keeps the direct commands granted, see klet.bus.functions).

What a writer owns (items 2 and 9): eviction's and syncloop's fenced writes of a node
condition type they do not own (syncloop's pressure, eviction's Ready other than the
shutdown's, a record keyed by another type than its own) are refused as `NotOwned`
with nothing of the call written, where they used to be stored and left to the
readers; status-reporter's append to a pod's `history:<uid>` without that stream's
expiry in the same call is refused, so no history key it writes through the bus lives
without end. A write larger than one call may take (pod-source's 3,000 pods) goes
through as a split transaction, with pod-source's credential.

What a call costs inside Redis (issue 42: 15 TYPE of `history:<uid>` per pod start):
the key types are looked up once a key per call and never for the call's first write,
so a history append with its expiry looks up no type of its stream, and one TYPE per
other key is what a call pays (counted by the server's command statistics).
"""

from __future__ import annotations

import pytest
from klet.bus import BadWrite, Bus, BusError, NotOwned, WriteTooLarge, functions
from klet.bus.acl import ACCESS, SERVICES
from klet.bus.redisbus import Transaction, _Op
from klet.devstack import RedisServer
from klet.model.records import EventRecord, HistoryEntry, NodeConditionRecord
from redis.exceptions import RedisError

from tests.harness.busroles import admin, leader

NODE = "capped"


def own_table(service: str) -> str:
    """A table `service` may write (every service but pod-source's first is its own)."""
    return ACCESS[service].writes[0]


def event(message: str) -> EventRecord:
    return EventRecord(
        type="Normal",
        reason="Test",
        message=message,
        involved={"kind": "Node", "name": NODE},
        component="kubelet",
        at=1.0,
    )


async def left(server: RedisServer, service: str) -> tuple[dict[str, str], int]:
    """What the attempts left: the service's table, and its Events stream's length."""
    async with admin(server, NODE) as bus:
        return (
            await bus.client.hgetall(bus.key(own_table(service))),
            await bus.client.xlen(bus.key(f"events:{service}")),
        )


@pytest.mark.parametrize("service", SERVICES)
async def test_a_call_over_each_cap_is_refused_naming_it_and_writes_nothing(
    redis_server: RedisServer, service: str
) -> None:
    async with leader(redis_server, NODE, service) as nb:
        bus, table = nb.bus, nb.bus.key(own_table(service))
        events = nb.events.key
        first = _Op.hset(table, "first", "applied?")
        calls = {
            "MAX_WRITE_OPS": [_Op.hset(table, f"k{i}", "v") for i in range(5001)],
            "MAX_WRITE_BYTES": [
                first,
                *(_Op.hset(table, f"big{i}", "x" * (4 * 1024 * 1024)) for i in range(8)),
            ],
            "MAX_VALUE_BYTES": [first, _Op.hset(table, "k", "x" * (4 * 1024 * 1024 + 1))],
            "MAX_ENTRY_BYTES": [first, _Op.xadd(events, 100, "x" * (64 * 1024 + 1))],
            "MAX_STREAM_LEN": [first, _Op.xadd(events, 100_001, event("long").encode())],
            "MAX_EXPIRE_MS": [first, _Op.pexpire(events, 90 * 24 * 3600 * 1000 + 1)],
        }
        assert set(calls) == set(functions.CAPS)
        for cap, ops in calls.items():
            with pytest.raises(WriteTooLarge, match=cap) as refused:
                await bus.write(ops)
            assert refused.value.cap == cap
        assert not bus._fence.lost.is_set()  # type: ignore[union-attr]
    assert await left(redis_server, service) == ({}, 0)


@pytest.mark.parametrize("service", SERVICES)
async def test_a_call_at_the_caps_goes_through(redis_server: RedisServer, service: str) -> None:
    async with leader(redis_server, NODE, service) as nb:
        bus, table = nb.bus, nb.bus.key(own_table(service))
        if own_table(service).startswith("node:"):
            # A condition table holds only its writer's types: one row, written 4999 times.
            row = condition("MemoryPressure").encode()
            ops = [_Op.hset(table, "MemoryPressure", row) for _ in range(4999)]
        else:
            ops = [_Op.hset(table, f"k{i}", "v") for i in range(4999)]
        ops.append(_Op.xadd(nb.events.key, 100_000, event("x" * 60_000).encode()))
        assert len(await bus.write(ops)) == 5000
    rows, length = await left(redis_server, service)
    assert (len(rows), length) == (len({op.args[0] for op in ops[:-1]}), 1)


MALFORMED = {
    "a MAXLEN that is not an integer": ("xadd", "{events}", "ten", "r"),
    "a MAXLEN in Lua's other number forms": ("xadd", "{events}", "1e3", "r"),
    "a negative expiry": ("pexpire", "{events}", "-5"),
    "a zero MAXLEN": ("xadd", "{events}", "0", "r"),
    "an op naming the lease": ("pexpire", "1", "99999999"),
    "an op naming no key": ("hset", "7", "f", "v"),
    "an unknown verb": ("del", "{table}"),
    "an op without its arguments": ("hset", "{table}", "f"),
}


@pytest.mark.parametrize("service", SERVICES)
@pytest.mark.parametrize("malformed", MALFORMED, ids=list(MALFORMED))
async def test_a_malformed_argument_anywhere_writes_nothing(
    redis_server: RedisServer, service: str, malformed: str
) -> None:
    async with leader(redis_server, NODE, service) as nb:
        bus, table = nb.bus, nb.bus.key(own_table(service))
        assert bus._fence is not None
        value = bus._fence.current_value()
        assert value is not None
        # KEYS: the lease, the table, the Events stream. Good writes before the bad one.
        keys = [bus._fence.key, table, nb.events.key]
        where = {"{table}": "2", "{events}": "3"}
        bad = [where.get(a, a) for a in MALFORMED[malformed]]
        argv = [value, "hset", "2", "first", "v", "xadd", "3", "10", event("e").encode(), *bad]
        with pytest.raises(RedisError) as refused:
            await bus.client.fcall(functions.FENCED_WRITE, len(keys), *keys, *argv)
        assert str(refused.value).startswith("KLETARG")
        # The same through Bus.write: our exception, naming the argument.
        if malformed == "a MAXLEN that is not an integer":
            ops = [_Op.hset(table, "first", "v"), _Op("xadd", nb.events.key, ("ten", "r"))]
            with pytest.raises(BadWrite, match='xadd MAXLEN "ten" is not a positive integer'):
                await bus.write(ops)
    assert await left(redis_server, service) == ({}, 0)


async def test_a_function_cannot_write_what_its_caller_may_not(
    redis_server: RedisServer,
) -> None:
    # eviction reads `desired` but may not write it: not directly, and not through the
    # fenced write either, which runs under eviction's own ACL.
    async with leader(redis_server, NODE, "eviction") as nb:
        other = nb.bus.key("desired")
        with pytest.raises(BusError, match="may not HSET"):
            await nb.bus.write([_Op.hset(other, "Ready", "forged")])
        with pytest.raises(RedisError, match="no permissions"):
            await nb.bus.client.hset(other, "Ready", "forged")
    async with admin(redis_server, NODE) as bus:
        assert await bus.client.hgetall(bus.key("desired")) == {}


@pytest.mark.parametrize("service", SERVICES)
@pytest.mark.parametrize("ttl", ["ten", "1e3", "-1", "", str(90 * 24 * 3600 * 1000 + 1)])
async def test_a_lease_with_a_bad_ttl_draws_no_token(
    redis_server: RedisServer, service: str, ttl: str
) -> None:
    bus = Bus.from_url(
        redis_server.url, NODE, auth=redis_server.credentials(NODE, service), timeout_s=10
    )
    lease, fence = bus.key(f"lease:{service}"), bus.key(f"lease:{service}:fence")
    try:
        with pytest.raises(RedisError, match="^(KLETARG|KLETCAP)"):
            await bus.client.fcall(functions.LEASE_ACQUIRE, 2, lease, fence, "h:", "", ttl)
        with pytest.raises(RedisError, match="^(KLETARG|KLETCAP)"):
            await bus.client.fcall(functions.LEASE_RENEW, 1, lease, "h:1", ttl)
    finally:
        await bus.close()
    async with admin(redis_server, NODE) as reader:
        assert await reader.client.exists(lease, fence) == 0


def condition(type_: str, status: str = "True", message: str = "") -> NodeConditionRecord:
    return NodeConditionRecord(type=type_, status=status, message=message, at=1.0)


# (service, key, record): rows of a service's own `node:<service>` it does not own.
FORGED = {
    "syncloop reports a pressure": ("syncloop", "MemoryPressure", condition("MemoryPressure")),
    "eviction reports another type": (
        "eviction",
        "NetworkUnavailable",
        condition("NetworkUnavailable"),
    ),
    "eviction's Ready for a reason of its choosing": (
        "eviction",
        "Ready",
        condition("Ready", "False", "forged"),
    ),
    "eviction's Ready True": ("eviction", "Ready", condition("Ready", "True")),
    "a record keyed by another type": ("eviction", "DiskPressure", condition("Ready")),
}


@pytest.mark.parametrize("forged", FORGED, ids=list(FORGED))
async def test_a_condition_its_writer_does_not_own_is_refused_and_nothing_written(
    redis_server: RedisServer, forged: str
) -> None:
    service, key, record = FORGED[forged]
    async with leader(redis_server, NODE, service) as nb:
        table = nb.conditions
        # An owned row first in the same call: the refusal comes before any write.
        ops = [
            _Op.hset(
                table.key, "Ready", condition("Ready", "False", "node is shutting down").encode()
            ),
            _Op.xadd(nb.events.key, 100, event("before").encode()),
            _Op.hset(table.key, key, record.encode()),
        ]
        with pytest.raises(NotOwned, match=f"node:{service}"):
            await nb.bus.write(ops)
        with pytest.raises(NotOwned):
            await table.put(key, record)
        assert not nb.bus._fence.lost.is_set()  # type: ignore[union-attr]
    async with admin(redis_server, NODE) as bus:
        assert await bus.client.hgetall(bus.key(f"node:{service}")) == {}
        assert await bus.client.xlen(bus.key(f"events:{service}")) == 0


@pytest.mark.parametrize(
    ("service", "owned"),
    [
        ("syncloop", [condition("Ready", "False", "PLEG is not healthy")]),
        (
            "eviction",
            [
                condition("MemoryPressure"),
                condition("DiskPressure", "False"),
                condition("PIDPressure", "False"),
                condition("Ready", "False", "node is shutting down"),
            ],
        ),
    ],
)
async def test_the_conditions_a_writer_owns_are_written(
    redis_server: RedisServer, service: str, owned: list[NodeConditionRecord]
) -> None:
    async with leader(redis_server, NODE, service) as nb:
        for record in owned:
            await nb.conditions.put(record.type, record)
        await nb.conditions.delete("Ready")
    async with admin(redis_server, NODE) as bus:
        rows = await bus.client.hgetall(bus.key(f"node:{service}"))
    assert set(rows) == {r.type for r in owned} - {"Ready"}


def history_entry() -> HistoryEntry:
    return HistoryEntry(
        at=1.0, source="kubelet", what="event", type="Normal", reason="Test", message="m"
    )


async def test_a_history_append_without_its_expiry_is_refused(
    redis_server: RedisServer,
) -> None:
    async with leader(redis_server, NODE, "status-reporter") as nb:
        stream = nb.history_of("some-uid", maxlen=10)
        other = nb.history_of("other-uid", maxlen=10)
        entry = history_entry().encode()
        for ops in (
            [_Op.xadd(stream.key, 10, entry)],
            # Another history's expiry does not stand for this one's.
            [_Op.xadd(stream.key, 10, entry), _Op.pexpire(other.key, 60_000)],
        ):
            with pytest.raises(BadWrite, match="without its expiry"):
                await nb.bus.write(ops)
        async with admin(redis_server, NODE) as bus:
            assert await bus.client.exists(stream.key, other.key) == 0
        # With its expiry, as the history keeper writes it.
        async with nb.bus.transaction() as tx:
            tx.publish(stream, history_entry())
            tx.expire(stream, 60_000)
    async with admin(redis_server, NODE) as bus:
        assert await bus.client.xlen(stream.key) == 1
        assert 0 < await bus.client.pttl(stream.key) <= 60_000


async def test_a_split_transaction_writes_what_one_call_may_not(
    redis_server: RedisServer,
) -> None:
    # pod-source's snapshot of a node's every pod, as its publisher writes it: a row
    # and a change notice each, 3,000 pods, the source's ready mark last.
    async with leader(redis_server, NODE, "pod-source") as nb:
        rows = [(f"uid-{i}", "x" * 1024) for i in range(3000)]

        def queue(tx: Transaction) -> None:
            for uid, row in rows:
                tx.ops.append(_Op.hset(nb.desired.key, uid, row))
                tx.ops.append(_Op.xadd(nb.pods.key, 10_000, uid))
                tx.mark()
            tx.ops.append(_Op.hset(nb.sources.key, "api", "ready"))

        with pytest.raises(WriteTooLarge, match="MAX_WRITE_OPS"):
            async with nb.bus.transaction() as tx:
                queue(tx)
        async with admin(redis_server, NODE) as bus:
            assert await bus.client.exists(nb.desired.key, nb.pods.key, nb.sources.key) == 0
        async with nb.bus.transaction(split=True) as tx:
            queue(tx)
        assert len(tx.calls()) == 7
    async with admin(redis_server, NODE) as bus:
        assert await bus.client.hlen(nb.desired.key) == 3000
        assert await bus.client.xlen(nb.pods.key) == 3000
        assert await bus.client.hget(nb.sources.key, "api") == "ready"


async def type_lookups(server: RedisServer, ops: list[_Op], service: str) -> int:
    """How many TYPE commands one fenced write of `ops` ran inside Redis (the server's
    command statistics, reset just before the call)."""
    async with leader(server, NODE, service) as nb, admin(server, NODE) as bus:
        await bus.client.config_resetstat()
        await nb.bus.write(ops)
        stats = await bus.client.info("commandstats")
    return int(stats.get("cmdstat_type", {}).get("calls", 0))


async def test_a_history_append_looks_up_no_type_of_its_stream(
    redis_server: RedisServer,
) -> None:
    # issue 42: the fenced write ran TYPE once per op, 15 of history:<uid> per pod start.
    async with leader(redis_server, NODE, "status-reporter") as nb:
        stream, index = nb.history_of("typed-uid", maxlen=10).key, nb.history.key
    entry = history_entry().encode()
    # As the history keeper writes a pod's entries: appends, their expiry, the index
    # row. The appends' key is the call's first write (nothing to undo if it fails)
    # and stays a stream; only the index table is looked at.
    appends = [_Op.xadd(stream, 10, entry)] * 3 + [_Op.pexpire(stream, 60_000)]
    ops = [*appends, _Op.hset(index, "typed-uid", "{}")]
    assert await type_lookups(redis_server, ops, "status-reporter") == 1
    # Once the stream exists, again: its type is still never looked up.
    assert await type_lookups(redis_server, appends, "status-reporter") == 0
    async with admin(redis_server, NODE) as bus:
        assert await bus.client.xlen(stream) == 6


async def test_each_key_is_looked_up_once_a_call(redis_server: RedisServer) -> None:
    async with leader(redis_server, NODE, "syncloop") as nb:
        status, changes = nb.bus.key("status"), nb.bus.key("podstatus")
    ops = [_Op.xadd(changes, 10, "a")]
    ops += [_Op.hset(status, f"uid-{i}", "{}") for i in range(5)]
    ops += [_Op.hdel(status, "uid-0"), _Op.xadd(changes, 10, "b")]
    assert await type_lookups(redis_server, ops, "syncloop") == 1
