"""`FakeBus`: an in-memory Redis bus for unit tests (STYLE rule 7), beside the real one.

`FakeBus` is a `Bus`, and the tables, streams and leases it makes are `Table`, `Stream`
and `Lease` subclasses, so `NodeBus.of(FakeBus("n1"), service=...)` is a real `NodeBus` and every
consumer typed by the real classes takes it; mypy checks the overrides against them.
State is kept as Redis keeps it, encoded: hashes of record JSON, streams of entries with
consumer groups (last delivered entry, pending entries per consumer), lease keys with
fencing tokens. Writes go through the real `Table.put`/`Stream.publish`/`Transaction`
code into `FakeBus.write`, which applies them atomically and, on a leader bus, fences
them by its lease as the fenced-write function does (`Fenced`, `LeaseLapsed`), and
refuses a call of more writes or bytes than the function takes (`WriteTooLarge`,
klet.bus.functions.MAX_WRITE_OPS and MAX_WRITE_BYTES), a node condition row its writer does not own
(`NotOwned`, klet.bus.functions.CONDITION_TYPES) and an append to a pod's history
without its expiry (`BadWrite`), so a writer that would break one of these rules fails
its unit tests as it would fail on Redis. `writes` lists the number of writes of each
call. Every call that writes a table moves the table's generation counter once, as the
function does (`gen:<table>`, klet.bus.functions; a new counter starts at a value no
counter of any fake bus had before, as the function's start from the clock does);
`seed` and `drop` move it too (another service's write), `hset_directly` does not (a
write that bypassed the fenced write), and `restart` loses every key, the counters
with the tables (a Redis restarted empty).

`FakeSlotFile` is one leader slot file shared by replicas (`klet.bus.leaderslot`); each
replica's `FakeLeaderSlot` claims, probes and releases it as the real lock file behaves,
and `die` drops a replica's lock as the kernel does when its process dies.

Failure injection: set `FakeBus.error` (a `BusUnavailable`, say) and every call raises
it, as an unreachable Redis does, before anything changes; `fail` makes only the next
calls raise, one error each (a blocked read too); `calls` lists the calls made,
by name. `seed`, `drop`, `append`, `plant` (a corrupt entry), `rows` and `entries` read
and plant state synchronously for test set-up and assertions; a stream's `acked` lists
what was acknowledged. Nothing here does I/O or sleeps except `Stream.read`,
`MergedStream.read` and `Stream.tail`, which block for new entries as XREADGROUP/XREAD
BLOCK do.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import redis.asyncio as aioredis
from klet.bus.functions import (
    CONDITION_FIXED,
    CONDITION_TYPES,
    JOURNAL_PREFIX,
    MAX_WRITE_BYTES,
    MAX_WRITE_OPS,
    generation_name,
)
from klet.bus.leaderslot import SlotView
from klet.bus.redisbus import (
    BadWrite,
    Bus,
    BusError,
    BusUnavailable,
    Entry,
    Lease,
    LeaseLapsed,
    MergedStream,
    NotOwned,
    R,
    Stream,
    Table,
    WriteTooLarge,
    _Op,
    _size,
)
from klet.model.records import BadRecord

_COUNTER_STARTS = itertools.count(1)
"""Where each new generation counter of any fake bus starts (times 10**9): a counter
lost and made again never comes back to a value a reader holds."""


@dataclass
class _Group:
    delivered: int  # index of the next entry to deliver
    pending: dict[str, tuple[str, float]] = field(default_factory=dict)  # id → consumer, since


@dataclass
class _StreamState:
    entries: list[tuple[str, str]] = field(default_factory=list)  # (id, encoded record)
    groups: dict[str, _Group] = field(default_factory=dict)
    grown: asyncio.Event = field(default_factory=asyncio.Event)


class FakeBus(Bus):
    """One node's keys in an in-memory Redis."""

    def __init__(self, node: str = "node1", *, clock: Callable[[], float] = time.monotonic) -> None:
        self.node = node
        self._fence = None
        self.clock = clock
        """Monotonic seconds: consumer-group idle times and lease deadlines."""
        self.hashes: dict[str, dict[str, str]] = {}
        self.streams: dict[str, _StreamState] = {}
        self.strings: dict[str, str] = {}  # lease keys and fence counters
        self.expiry: dict[str, float] = {}  # key → when Redis drops it (bus clock)
        self.error: BusError | None = None
        """Raised by every call while set (Redis unreachable)."""
        self.failures: list[BusError] = []
        """Raised by the next calls, one each (see `fail`)."""
        self.calls: list[str] = []
        """Every call made, by name ("get", "read", "claim_stale", ...), failed ones too."""
        self.writes: list[int] = []
        """The number of writes of each `write` call applied, in order."""
        self.closed = False
        self._ids = 0

    def connect(self) -> FakeBus:
        """Another connection to the same fake Redis (a second replica's bus)."""
        other = FakeBus(self.node, clock=self.clock)
        other.hashes, other.streams = self.hashes, self.streams
        other.strings, other.expiry = self.strings, self.expiry
        return other

    def table(self, name: str, record_type: type[R]) -> Table[R]:
        return FakeTable(self, name, record_type)

    def stream(self, name: str, record_type: type[R], *, maxlen: int = 10_000) -> Stream[R]:
        return FakeStream(self, name, record_type, maxlen=maxlen)

    def merged_stream(self, streams: Sequence[Stream[R]]) -> MergedStream[R]:
        return FakeMergedStream(streams)

    def _new_lease(self, name: str, holder: str, *, ttl_ms: int, predecessor: str | None) -> Lease:
        lease = FakeLease(self, name, holder, ttl_ms=ttl_ms, predecessor=predecessor)
        lease.clock = self.clock
        return lease

    @property
    def client(self) -> aioredis.Redis:
        raise TypeError("FakeBus has no Redis client; its tables and streams keep the state")

    def check(self, call: str, *, tell_lease: bool = True) -> None:
        """Log `call` and raise the injected error, if any (every call starts here)."""
        self.calls.append(call)
        self.raise_injected(tell_lease=tell_lease)

    def raise_injected(self, *, tell_lease: bool = True) -> None:
        """Raise the next one-shot failure, else the standing error, if any. An injected
        `BusUnavailable` (not `LeaseLapsed`, which Redis answers) stands for a lost
        connection: the bus's lease is told, as `Bus.failed` tells it (not for the
        lease's own calls, which the real lease wraps itself)."""
        err = self.failures.pop(0) if self.failures else self.error
        if err is None:
            return
        if (
            tell_lease
            and isinstance(err, BusUnavailable)
            and not isinstance(err, LeaseLapsed)
            and self._fence is not None
        ):
            self._fence.unreachable()
        raise err

    def fail(self, *errors: BusError) -> None:
        """Make the next calls raise `errors`, one each; a read blocked now fails first,
        as XREADGROUP BLOCK does when its connection drops."""
        self.failures.extend(errors)
        for state in self.streams.values():
            state.grown.set()

    async def ping(self) -> None:
        self.check("ping")

    async def close(self) -> None:
        self.closed = True

    async def write(self, ops: Sequence[_Op]) -> list[str]:
        self.check("write")
        if len(ops) > MAX_WRITE_OPS:
            raise WriteTooLarge(
                "MAX_WRITE_OPS", f"{len(ops)} writes in one call, at most {MAX_WRITE_OPS}"
            )
        size = sum(_size(op) for op in ops)
        if size > MAX_WRITE_BYTES:
            raise WriteTooLarge(
                "MAX_WRITE_BYTES", f"{size} bytes in one call, at most {MAX_WRITE_BYTES}"
            )
        self._check_owned(ops)
        if self._fence is not None:
            value = self._fence.current_value()
            if value is None:
                raise self._fence.fenced("the lease is not held or its last renewal is too old")
            held_by = self.strings.get(self._fence.key)
            if held_by is None:
                raise self._fence.lapsed()
            if held_by != value:
                raise self._fence.fenced("another replica holds the lease")
        self.writes.append(len(ops))
        out = [self._apply(op) for op in ops]
        for key in dict.fromkeys(op.key for op in ops if op.verb in ("hset", "hdel")):
            self._move_generation(key)
        return out

    async def generations(self, keys: Sequence[str]) -> list[str | None]:
        self.check("generations")
        return [self.strings.get(key) for key in keys]

    def _move_generation(self, table_key: str) -> None:
        name = table_key.removeprefix(self.key(""))
        if name == table_key:
            return
        key = self.key(generation_name(name))
        value = self.strings.get(key)
        if value is None or not value.isdigit():
            self.strings[key] = str(next(_COUNTER_STARTS) * 10**9)
        else:
            self.strings[key] = str(int(value) + 1)

    def generation(self, table: Table[R]) -> str | None:
        """The table's generation counter now (None: never written, or lost)."""
        return self.strings.get(table.generation_key)

    def restart(self) -> None:
        """Redis restarted empty (no persistence): every table, stream, generation
        counter and lease is gone."""
        self.hashes.clear()
        self.streams.clear()
        self.strings.clear()
        self.expiry.clear()

    def _check_owned(self, ops: Sequence[_Op]) -> None:
        """The fenced write's rules of what a writer owns, as its Lua applies them."""
        expired = {op.key for op in ops if op.verb == "pexpire"}
        for op in ops:
            if op.verb == "xadd" and op.key.startswith(self.key(JOURNAL_PREFIX)):
                if op.key not in expired:
                    raise BadWrite(f"bus write refused: xadd to {op.key} without its expiry")
        for op in ops:
            service = op.key.removeprefix(self.key("node:"))
            if op.verb != "hset" or service == op.key:
                continue
            type_, raw = op.args
            if type_ not in CONDITION_TYPES.get(service, frozenset()):
                raise NotOwned(f"bus write refused: node:{service} does not hold {type_!r}")
            try:
                record = json.loads(raw)
            except ValueError:
                record = None
            if not isinstance(record, dict) or record.get("type") != type_:
                raise NotOwned(f"bus write refused: node:{service} row {type_!r} is not one")
            fixed = CONDITION_FIXED.get((service, type_))
            if fixed is not None and (record.get("status"), record.get("message")) != fixed:
                raise NotOwned(f"bus write refused: node:{service} may set {type_} only {fixed}")

    def _apply(self, op: _Op) -> str:
        if op.verb == "hset":
            key, value = op.args
            self.hashes.setdefault(op.key, {})[key] = value
            return "1"
        if op.verb == "hdel":
            removed = self.hashes.get(op.key, {}).pop(op.args[0], None)
            return "1" if removed is not None else "0"
        if op.verb == "pexpire":
            self.expiry[op.key] = self.clock() + int(op.args[0]) / 1000
            return ""
        maxlen, record = op.args
        self._ids += 1
        entry_id = f"{self._ids}-0"
        state = self.streams.setdefault(op.key, _StreamState())
        state.entries.append((entry_id, record))
        del state.entries[: max(0, len(state.entries) - int(maxlen))]
        state.grown.set()
        return entry_id

    def seed(self, table: Table[R], key: str, record: R) -> None:
        """Plant a row as if another service had written it (no fencing, no error; the
        table's generation moves, as the writer's fenced write moves it)."""
        self.hashes.setdefault(table.key, {})[key] = record.encode()
        self._move_generation(table.key)

    def hset_directly(self, table: Table[R], key: str, raw: str) -> None:
        """Plant a row's text the way a direct HSET writes it: the generation stays."""
        self.hashes.setdefault(table.key, {})[key] = raw

    def drop(self, table: Table[R], *keys: str) -> None:
        """Remove rows as if another service had deleted them (the generation moves)."""
        for key in keys:
            self.hashes.get(table.key, {}).pop(key, None)
        self._move_generation(table.key)

    def append(self, stream: Stream[R], record: R) -> str:
        """Add an entry as if another service had published it; returns its id."""
        return self.plant(stream, record.encode())

    def plant(self, stream: Stream[R], raw: str) -> str:
        """Add an entry of any text, a corrupt one say, as `append` does."""
        return self._apply(_Op.xadd(stream.key, stream.maxlen, raw))

    def rows(self, table: Table[R]) -> dict[str, R]:
        """The table's decodable rows, now (as `Table.all` returns them)."""
        decoded = (
            (k, _decode(table.record_type, v)) for k, v in self.hashes.get(table.key, {}).items()
        )
        return {k: r for k, r in decoded if r is not None}

    def entries(self, stream: Stream[R]) -> list[R]:
        """The stream's decoded records, oldest first."""
        state = self.streams.get(stream.key, _StreamState())
        return [stream.record_type.decode(raw) for _id, raw in state.entries]


def _id_key(entry_id: str) -> tuple[int, int]:
    """A stream entry id ("<ms>-<seq>") as a sortable pair."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _decode(record_type: type[R], raw: str) -> R | None:
    try:
        return record_type.decode(raw)
    except BadRecord:
        return None


class FakeTable(Table[R]):
    """A hash of the fake Redis, decoded as `Table` decodes (bad records left out)."""

    def __init__(self, bus: FakeBus, name: str, record_type: type[R]) -> None:
        super().__init__(bus, name, record_type)
        self.fake = bus

    async def get(self, key: str) -> R | None:
        self.fake.check("get")
        raw = self.fake.hashes.get(self.key, {}).get(key)
        return None if raw is None else _decode(self.record_type, raw)

    async def get_many(self, keys: Sequence[str]) -> dict[str, R | None]:
        self.fake.check("get_many")
        rows = self.fake.hashes.get(self.key, {})
        return {
            key: None if (raw := rows.get(key)) is None else _decode(self.record_type, raw)
            for key in dict.fromkeys(keys)
        }

    async def all(self) -> dict[str, R]:
        self.fake.check("all")
        return self.fake.rows(self)

    async def raw_all(self) -> dict[str, str]:
        self.fake.check("all")  # the same HGETALL
        return dict(self.fake.hashes.get(self.key, {}))


class FakeStream(Stream[R]):
    """A stream of the fake Redis with consumer groups (at-least-once, as XREADGROUP)."""

    def __init__(self, bus: FakeBus, name: str, record_type: type[R], *, maxlen: int) -> None:
        super().__init__(bus, name, record_type, maxlen=maxlen)
        self.fake = bus
        self.acked: list[str] = []
        """IDs acknowledged while pending, in order (any group)."""

    @property
    def state(self) -> _StreamState:
        return self.fake.streams.setdefault(self.key, _StreamState())

    async def ensure_group(self, group: str, *, start: str = "0") -> None:
        self.fake.check("ensure_group")
        state = self.state
        if group not in state.groups:
            state.groups[group] = _Group(delivered=len(state.entries) if start == "$" else 0)

    async def read(
        self, group: str, consumer: str, *, count: int = 100, block_ms: int = 1000
    ) -> list[Entry[R]]:
        self.fake.check("read")
        state = self.state
        g = state.groups.setdefault(group, _Group(delivered=0))  # NOGROUP: re-created
        if g.delivered >= len(state.entries):
            state.grown.clear()
            try:
                async with asyncio.timeout(block_ms / 1000 if block_ms else None):
                    await state.grown.wait()
            except TimeoutError:
                return []
            self.fake.raise_injected()
        batch = state.entries[g.delivered : g.delivered + count]
        g.delivered += len(batch)
        now = self.fake.clock()
        for entry_id, _raw in batch:
            g.pending[entry_id] = (consumer, now)
        return [self._entry(entry_id, {"r": raw}) for entry_id, raw in batch]

    async def last_id(self) -> str:
        self.fake.check("last_id")
        entries = self.state.entries
        return entries[-1][0] if entries else "0-0"

    async def tail(self, after: str, *, count: int = 100, block_ms: int = 1000) -> list[Entry[R]]:
        self.fake.check("tail")
        state = self.state

        def newer() -> list[tuple[str, str]]:
            return [e for e in state.entries if _id_key(e[0]) > _id_key(after)][:count]

        batch = newer()
        if not batch:
            state.grown.clear()
            try:
                async with asyncio.timeout(block_ms / 1000 if block_ms else None):
                    await state.grown.wait()
            except TimeoutError:
                return []
            self.fake.raise_injected()
            batch = newer()
        return [self._entry(entry_id, {"r": raw}) for entry_id, raw in batch]

    async def claim_stale(self, group: str, consumer: str, *, min_idle_ms: int) -> list[Entry[R]]:
        self.fake.check("claim_stale")
        state = self.state
        g = state.groups.get(group)
        if g is None:
            await self.ensure_group(group)
            return []
        now = self.fake.clock()
        raw_by_id = dict(state.entries)
        claimed: list[Entry[R]] = []
        for entry_id, (_owner, since) in list(g.pending.items()):
            if (now - since) * 1000 >= min_idle_ms and entry_id in raw_by_id:
                g.pending[entry_id] = (consumer, now)
                claimed.append(self._entry(entry_id, {"r": raw_by_id[entry_id]}))
        return claimed

    async def ack(self, group: str, *ids: str) -> None:
        self.fake.check("ack")
        g = self.state.groups.get(group)
        for entry_id in ids:
            if g is not None and g.pending.pop(entry_id, None) is not None:
                self.acked.append(entry_id)

    async def length(self) -> int:
        self.fake.check("length")
        return len(self.state.entries)

    async def latest(self, count: int) -> list[Entry[R]]:
        self.fake.check("latest")
        return [self._entry(mid, {"r": raw}) for mid, raw in self.state.entries[-count:]]

    def pending(self, group: str) -> list[str]:
        """IDs read in `group` but not acknowledged yet."""
        g = self.state.groups.get(group)
        return sorted(g.pending) if g is not None else []


class FakeMergedStream(MergedStream[R]):
    """Fake streams read as one: what any of them has undelivered, else a wait for the
    first to grow (as one XREADGROUP BLOCK over several keys)."""

    async def read(
        self, group: str, consumer: str, *, count: int = 100, block_ms: int = 1000
    ) -> list[Entry[R]]:
        streams = [s for s in self.streams.values() if isinstance(s, FakeStream)]

        def ready() -> list[FakeStream[R]]:
            return [
                s
                for s in streams
                if s.state.groups.setdefault(group, _Group(delivered=0)).delivered
                < len(s.state.entries)
            ]

        if streams:
            streams[0].fake.check("read")
        if not ready():
            for s in streams:
                s.state.grown.clear()
            waits = [asyncio.ensure_future(s.state.grown.wait()) for s in streams]
            try:
                await asyncio.wait(
                    waits,
                    timeout=block_ms / 1000 if block_ms else None,
                    return_when="FIRST_COMPLETED",
                )
            finally:
                for w in waits:
                    w.cancel()
                await asyncio.gather(*waits, return_exceptions=True)
        out: list[Entry[R]] = []
        for s in ready():
            entries = await s.read(group, consumer, count=count, block_ms=block_ms)
            out += [self._tag(s, e) for e in entries]
        return out


class FakeLease(Lease):
    """A lease key with a fencing token in the fake Redis; replicas of one `FakeBus`
    contend for it as they do for the real key (expiry by the bus clock)."""

    def __init__(
        self, bus: FakeBus, name: str, holder: str, *, ttl_ms: int, predecessor: str | None = None
    ) -> None:
        super().__init__(bus, name, holder, ttl_ms=ttl_ms, predecessor=predecessor)
        self.fake = bus

    async def _renew(self) -> bool:
        fake = self.fake
        fake.check("renew", tell_lease=False)
        now = self.clock()
        if fake.strings.get(self.key) != self.value or now >= fake.expiry.get(self.key, 0.0):
            return False
        fake.expiry[self.key] = now + self.ttl_ms / 1000
        return True

    async def _acquire(self, heir_of: str | None) -> tuple[int, bool] | None:
        fake = self.fake
        fake.check("acquire", tell_lease=False)
        now = self.clock()
        current = fake.strings.get(self.key)
        if current is not None and now >= fake.expiry.get(self.key, 0.0):
            current = None  # expired
        if current is not None:  # as the _ACQUIRE script: this holder's own or its heir's
            mine = current.startswith(f"{self.holder}:")
            heir = heir_of is not None and current.startswith(f"{heir_of}:")
            if not (mine or heir):
                return None
        continued = self.fence_key in fake.strings
        token = int(fake.strings.get(self.fence_key, "0")) + 1
        fake.strings[self.fence_key] = str(token)
        fake.strings[self.key] = f"{self.holder}:{token}"
        fake.expiry[self.key] = now + self.ttl_ms / 1000
        return token, continued

    async def _release(self) -> None:
        self.fake.check("release", tell_lease=False)
        if self.fake.strings.get(self.key) == self.value:
            del self.fake.strings[self.key]


@dataclass
class FakeSlotFile:
    """One leader slot file: who holds its lock and the holder ID written in it."""

    locked_by: FakeLeaderSlot | None = None
    holder: str = ""
    """The ID last written by a claim ("" for a file never claimed)."""
    probes: int = 0
    """Probes made, by any replica."""
    error: OSError | None = None
    """Raised by every claim and probe while set (an unusable run directory)."""


class FakeLeaderSlot:
    """One replica's handle on a `FakeSlotFile` (a `klet.bus.leaderslot.LeaderSlot`)."""

    def __init__(self, file: FakeSlotFile, holder: str) -> None:
        self.file = file
        self.holder = holder

    @property
    def held(self) -> bool:
        return self.file.locked_by is self

    def claim(self) -> bool:
        if self.file.error is not None:
            raise self.file.error
        if self.file.locked_by not in (None, self):
            return False
        self.file.locked_by, self.file.holder = self, self.holder
        return True

    def probe(self) -> SlotView | None:
        self.file.probes += 1
        if self.file.error is not None:
            raise self.file.error
        if self.file.locked_by is not None:
            return SlotView(locked=True, holder=None)
        return SlotView(locked=False, holder=self.file.holder or None)

    def release(self) -> None:
        if self.held:
            self.file.locked_by = None

    def die(self) -> None:
        """This replica's process is gone: the kernel drops its lock."""
        self.release()
