"""The Redis bus: tables (hashes, the truth), streams (wake-ups) and leases.

This is the only module that imports `redis` (redis-py's asyncio client). Keys are
`klet:<node>:<name>` so one Redis can serve several nodes. Every failure to reach Redis
surfaces as `BusUnavailable` (raised from the redis error), which callers treat as
"retry later, keep the last state" — never as a reason to change what runs on the
node. So do the replies of a Redis that is there but cannot serve yet or any more:
`LOADING` (restarting with data), `READONLY` (a replica after a failover),
`MASTERDOWN`, `TRYAGAIN` and `OOM` (maxmemory reached), and a Redis that has not had
klet's function library loaded yet (klet.bus.functions: after a restart, the set-up
step loads it again). Every other refusal (`NOPERM`, a wrong type, a function's error)
is a `BusError`: retrying would not help.

The client's policy is spelled out rather than left to redis-py's defaults, which have
changed between releases: a pooled connection idle for 10 s is checked with PING before
use (so one Redis closed while restarting is replaced without the caller seeing it),
and no call is ever sent twice by the client (`Retry(NoBackoff(), 0)`): a write whose
connection broke may have been applied, and the callers' own loops, which already
retry on `BusUnavailable`, decide whether to send it again.

Fencing. A bus that a service's lease was made from (`Bus.lease`) is that service's
leader bus: every write through it (`Table.put/delete`, `Stream.publish`, a
`Transaction`) is one call of a Redis function (klet.bus.functions) that first
compares the lease key with this replica's `holder:token` and only then writes,
atomically. A replica that stalled past its TTL
(a long GC pause, SIGSTOP, a partition) and lost the lease to a standby can therefore
write nothing after the takeover, even a write already on the wire: Redis refuses it
and the writer gets `Fenced`, which also marks the lease lost so the leader loop steps
down. A write is refused locally, without asking Redis, once the last successful
renewal is a whole TTL old. A write that finds the lease held by nobody (Redis restarted
empty) raises `LeaseLapsed` instead and wakes the leader loop to take it back.

Not fenced, on purpose: stream acknowledgements, consumer-group creation, claiming
stale entries and forgetting dead consumers. They change only the group's bookkeeping
of who read what, never a table or a stream's content; an old leader acknowledging an
entry it did handle is correct, and a new leader rebuilds from the tables anyway
(at-least-once, idempotent consumers). Lease renewal and release check the holder
themselves.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar, cast
from urllib.parse import urlsplit

import redis.asyncio as aioredis
from klet.bus import functions
from klet.bus.leaderslot import LeaderSlot
from klet.cancellation import being_cancelled
from klet.model.records import BadRecord, Record
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import (
    ClusterDownError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

log = logging.getLogger(__name__)

R = TypeVar("R", bound=Record)
R_co = TypeVar("R_co", bound=Record, covariant=True)


class BusError(Exception):
    """Base of the bus's own errors."""


class BusUnavailable(BusError):
    """Redis could not be reached or did not answer in time."""


class LeaseLapsed(BusUnavailable):
    """A leader write was refused because nobody holds the lease right now (it expired,
    or Redis restarted empty). Nothing was written; the leader loop tries to take the
    lease back at once, and the write may be retried once it has. It is a kind of
    `BusUnavailable` so every writer keeps its state and retries, as for an outage,
    instead of letting it end a root task (a Redis flush stopped syncloop that way)."""


class WriteTooLarge(BusError):
    """A write larger than one of the function library's caps (klet.bus.functions:
    `MAX_WRITE_OPS`, `MAX_WRITE_BYTES`, ...): refused by Redis before anything was
    written. `cap` names the cap; retrying the same write cannot succeed."""

    def __init__(self, cap: str, message: str) -> None:
        super().__init__(message)
        self.cap = cap


class BadWrite(BusError):
    """A write whose arguments the fenced write refused (a MAXLEN that is not a positive
    integer, an op without its arguments): nothing was written."""


class NotOwned(BadWrite):
    """A write of something its writer does not own (a node condition type another
    service reports, a condition record keyed by another type): nothing was written."""


def _refusal(err: ResponseError) -> BusError | None:
    """Our exception for the fenced write's own refusals, None for any other error."""
    text = str(err)
    if text.startswith(functions.CAP_PREFIX + " "):
        cap = text.split(" ", 2)[1]
        return WriteTooLarge(cap, f"bus write refused by the cap {cap}: {text}")
    if text.startswith(functions.BAD_ARGUMENT_PREFIX + " "):
        return BadWrite(f"bus write refused: {text}")
    if text.startswith(functions.NOT_OWNED_PREFIX + " "):
        return NotOwned(f"bus write refused, not the writer's to write: {text}")
    return None


class Fenced(BusError):
    """A leader write was refused: this replica does not hold its lease (any more).

    Raised before anything is written. It ends this replica's leadership (the lease is
    marked lost, see `Lease.lost`); retrying cannot succeed.
    """


def _wrap(err: Exception) -> BusError | asyncio.CancelledError:
    """Our exception for a Redis client error. A task being cancelled gets its
    cancellation back instead: the client can turn a cancellation that lands in a read
    into a connection error, and a loop that retries on BusError would then never stop."""
    if being_cancelled():
        return asyncio.CancelledError()
    if isinstance(err, _UNAVAILABLE):
        return BusUnavailable(str(err) or type(err).__name__)
    if isinstance(err, ResponseError) and str(err).startswith("Function not found"):
        return BusUnavailable(
            f"klet's Redis functions ({functions.LIBRARY}) are not loaded on this Redis: "
            "they are loaded after each start of the bundled Redis, and on a Redis of "
            "your own by `klet bus-acl --apply`"
        )
    return BusError(str(err))


async def load_functions(client: aioredis.Redis) -> str:
    """Load (or replace) klet's function library into the Redis `client` is connected
    to; needs the admin credential (`FUNCTION LOAD`). Returns the library's name."""
    try:
        return str(await client.function_load(functions.library_code(), replace=True))
    except (RedisError, OSError) as err:
        raise _wrap(err) from err


async def set_user(client: aioredis.Redis, username: str, rules: Sequence[str]) -> None:
    """Create or redefine the ACL user `username` from scratch (`reset`, then `rules`);
    needs the admin credential."""
    try:
        # Raw: the rules are ACL-file words (klet.bus.acl), selectors included, which
        # acl_setuser's keyword form cannot express; redis-py leaves this untyped.
        await client.execute_command(  # type: ignore[no-untyped-call]
            "ACL", "SETUSER", username, "reset", *rules
        )
    except (RedisError, OSError) as err:
        raise _wrap(err) from err


# Redis is not there, or there but not serving (yet): LOADING is a ConnectionError in
# redis-py; MASTERDOWN is a ClusterDownError.
_UNAVAILABLE = (
    RedisConnectionError,
    RedisTimeoutError,
    OSError,
    ReadOnlyError,
    ClusterDownError,
    TryAgainError,
    OutOfMemoryError,
)


@dataclass(frozen=True)
class Entry(Generic[R_co]):
    """One stream entry: its id and either the decoded record or why it is bad."""

    id: str
    record: R_co | None
    error: str | None = None


class GroupStream(Protocol[R_co]):
    """What a consumer-group reader needs of a stream (`Stream` is one; tests fake it)."""

    async def ensure_group(self, group: str) -> None: ...

    async def read(
        self, group: str, consumer: str, *, count: int, block_ms: int
    ) -> Sequence[Entry[R_co]]: ...

    async def ack(self, group: str, *ids: str) -> None: ...

    async def claim_stale(
        self, group: str, consumer: str, *, min_idle_ms: int
    ) -> Sequence[Entry[R_co]]: ...


class BusAuth(Protocol):
    """How a bus client proves who it is: an ACL user and password, and for rediss://
    the CA to check the server against and an optional client certificate."""

    @property
    def username(self) -> str: ...  # "" = Redis's `default` user

    @property
    def password(self) -> str | None: ...

    @property
    def ca_file(self) -> Path | None: ...

    @property
    def cert_file(self) -> Path | None: ...

    @property
    def key_file(self) -> Path | None: ...


LEASE_TTL_MS = 15_000
"""Every service's bus lease TTL: a standby takes a dead leader's role within it (at
once when the dead process's replica or leader slot shows it gone, klet.bus.holder).
klet.wiring hands it to every service; `Bus.lease` defaults to it."""

HEALTH_CHECK_S = 10
"""A pooled connection idle this long is PINGed before it is used again."""

MAX_CONNECTIONS = 32
"""Connections one process keeps to Redis at most; more concurrent calls wait their
turn. A service has a few long blocking reads (stream consumers) and short calls."""


class Bus:
    """All of one node's keys in one Redis."""

    def __init__(self, client: aioredis.Redis, node: str) -> None:
        self._r = client
        self.node = node
        self._fence: Lease | None = None

    @classmethod
    def from_url(
        cls, url: str, node: str, *, auth: BusAuth | None = None, timeout_s: float = 5.0
    ) -> Bus:
        """A bus on the Redis at `url` (redis://, rediss:// with TLS, or unix://),
        authenticated as `auth` (a service's own ACL user, see klet.bus.acl).

        The credentials are passed to the client as arguments, never through the URL, so
        they show up in no URL a log line or an error message may print.
        """
        options: dict[str, Any] = {}
        if auth is not None:
            if auth.username:
                options["username"] = auth.username
            if auth.password:
                options["password"] = auth.password
            if urlsplit(url).scheme == "rediss":
                options["ssl_cert_reqs"] = "required"
                if auth.ca_file is not None:
                    options["ssl_ca_certs"] = str(auth.ca_file)
                if auth.cert_file is not None:
                    options["ssl_certfile"] = str(auth.cert_file)
                if auth.key_file is not None:
                    options["ssl_keyfile"] = str(auth.key_file)
        # A blocking pool: a burst of concurrent calls (110 pod workers woken at once,
        # each reading a table) waits up to `timeout_s` for a free connection, where
        # redis-py's default pool fails every call past its 100th with "Too many
        # connections".
        pool = aioredis.BlockingConnectionPool.from_url(
            url,
            max_connections=MAX_CONNECTIONS,
            timeout=timeout_s,
            decode_responses=True,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            health_check_interval=HEALTH_CHECK_S,
            retry=Retry(NoBackoff(), 0),
            **options,
        )
        return cls(aioredis.Redis.from_pool(pool), node)

    def key(self, name: str) -> str:
        return f"klet:{self.node}:{name}"

    def table(self, name: str, record_type: type[R]) -> Table[R]:
        return Table(self, name, record_type)

    def stream(self, name: str, record_type: type[R], *, maxlen: int = 10_000) -> Stream[R]:
        return Stream(self, name, record_type, maxlen=maxlen)

    def merged_stream(self, streams: Sequence[Stream[R]]) -> MergedStream[R]:
        return MergedStream(streams)

    def lease(
        self,
        name: str,
        holder: str,
        *,
        ttl_ms: int = LEASE_TTL_MS,
        predecessor: str | None = None,
    ) -> Lease:
        """The service's lease; from now on every write through this bus is fenced by it.

        `holder` must be unique to this process (see `klet.bus.holder`); `predecessor`
        is the holder of a dead process of the same replica slot, whose lease this one
        may take over without waiting for it to expire.
        """
        if self._fence is not None:
            raise ValueError(f"bus already fenced by {self._fence.key}; one lease per bus")
        lease = self._new_lease(name, holder, ttl_ms=ttl_ms, predecessor=predecessor)
        self._fence = lease
        return lease

    def _new_lease(self, name: str, holder: str, *, ttl_ms: int, predecessor: str | None) -> Lease:
        return Lease(self, name, holder, ttl_ms=ttl_ms, predecessor=predecessor)

    def failed(self, err: Exception) -> BusError | asyncio.CancelledError:
        """Our exception for a Redis client error of a call through this bus (`_wrap`).
        When Redis could not be reached, the bus's lease is told (`Lease.unreachable`),
        so its leader loop looks at the lease now instead of at its next renewal: a
        Redis that went away may come back empty, and the sooner the lease is taken
        back, the sooner the service republishes what Redis lost."""
        wrapped = _wrap(err)
        lost_connection = isinstance(err, (RedisConnectionError, RedisTimeoutError, OSError))
        if lost_connection and isinstance(wrapped, BusUnavailable) and self._fence is not None:
            self._fence.unreachable()
        return wrapped

    async def ping(self) -> None:
        try:
            await self._r.ping()
        except (RedisError, OSError) as err:
            raise self.failed(err) from err

    async def nodes(self) -> list[str]:
        """Every node with a key on this Redis (`klet:<node>:...`), sorted: what a command
        run without a node name may pick from or name (SCAN, so it needs a user allowed
        to see other nodes' keys: the admin)."""
        found: set[str] = set()
        try:
            async for key in self._r.scan_iter(match="klet:*:*", count=1000):
                text = key.decode() if isinstance(key, bytes) else str(key)
                _, node, rest = text.split(":", 2)
                if node and rest:
                    found.add(node)
        except (RedisError, OSError) as err:
            raise self.failed(err) from err
        return sorted(found)

    async def close(self) -> None:
        await self._r.aclose()

    @asynccontextmanager
    async def transaction(self, *, split: bool = False) -> AsyncIterator[Transaction]:
        """Collect writes and apply them atomically on exit (one fenced function call on a
        leader bus, MULTI/EXEC otherwise).

        With `split`, the writes go in order as several calls when they are too many for
        one (`Transaction.calls`: at most SPLIT_OPS writes and SPLIT_BYTES each, cut only
        at the points the writer marked): each call is atomic and fenced, the whole is
        not, so a failure part-way leaves the earlier calls applied. For a writer whose
        one write can be larger than the function takes (pod-source's snapshot of every
        pod of the node) and that repairs a partial write by itself."""
        tx = Transaction()
        yield tx
        if not tx.ops:
            return
        if not split:
            await self.write(tx.ops)
            return
        for call in tx.calls():
            await self.write(call)

    async def write(self, ops: Sequence[_Op]) -> list[str]:
        """Apply `ops` atomically; returns one result per op (the id of each XADD).

        On a leader bus the writes happen only if the lease is still ours (`Fenced`
        otherwise, with nothing written).
        """
        if self._fence is None:
            return await self._write_unfenced(ops)
        value = self._fence.current_value()
        if value is None:
            raise self._fence.fenced("the lease is not held or its last renewal is too old")
        keys = [self._fence.key]
        argv: list[str] = [value]
        for op in ops:
            if op.key not in keys:
                keys.append(op.key)
            argv += [op.verb, str(keys.index(op.key) + 1), *op.args]
        # The generation counters the function moves, declared as the keys they are.
        keys += self._generation_keys(ops)
        try:
            reply = await self._r.fcall(functions.FENCED_WRITE, len(keys), *keys, *argv)
        except ResponseError as err:
            if str(err).startswith(_FENCED_PREFIX):
                raise self._fence.fenced("another replica holds the lease") from err
            if str(err).startswith(_LAPSED_PREFIX):
                raise self._fence.lapsed() from err
            raise (_refusal(err) or self.failed(err)) from err
        except (RedisError, OSError) as err:
            raise self.failed(err) from err
        return [str(r) for r in reply]

    def _generation_keys(self, ops: Sequence[_Op]) -> list[str]:
        """The generation counter of each table `ops` write, once each, in order."""
        prefix = self.key("")
        return list(
            dict.fromkeys(
                self.key(functions.generation_name(op.key.removeprefix(prefix)))
                for op in ops
                if op.verb in ("hset", "hdel") and op.key.startswith(prefix)
            )
        )

    async def _write_unfenced(self, ops: Sequence[_Op]) -> list[str]:
        generations = self._generation_keys(ops)
        pipe = self._r.pipeline(transaction=len(ops) + len(generations) > 1)
        for op in ops:
            if op.verb == "hset":
                pipe.hset(op.key, op.args[0], op.args[1])
            elif op.verb == "hdel":
                pipe.hdel(op.key, op.args[0])
            elif op.verb == "pexpire":
                pipe.pexpire(op.key, int(op.args[0]))
            else:
                pipe.xadd(op.key, {"r": op.args[1]}, maxlen=int(op.args[0]), approximate=True)
        # As the fenced write moves them: a new counter starts from the clock in
        # microseconds (here the writer's), then every write adds one.
        seed = str(time.time_ns() // 1000)
        for key in generations:
            pipe.set(key, seed, nx=True)
            pipe.incr(key)
        try:
            reply = await pipe.execute()
        except (RedisError, OSError) as err:
            raise self.failed(err) from err
        return [str(r) for r in reply[: len(ops)]]

    async def generations(self, keys: Sequence[str]) -> list[str | None]:
        """The values of the generation counters `keys` (`Table.generation_key`), in one
        round trip (MGET): None for a counter that does not exist (no write through the
        fenced write yet, or Redis lost it)."""
        if not keys:
            return []
        try:
            values = await self._r.mget(list(keys))
        except (RedisError, OSError) as err:
            raise self.failed(err) from err
        return [None if v is None else str(v) for v in values]

    @property
    def client(self) -> aioredis.Redis:
        return self._r


@dataclass(frozen=True)
class _Op:
    """One write: `hset key field value`, `hdel key field`, `xadd key maxlen record` or
    `pexpire key ms`."""

    verb: str
    key: str
    args: tuple[str, ...]

    @staticmethod
    def hset(key: str, field: str, value: str) -> _Op:
        return _Op("hset", key, (field, value))

    @staticmethod
    def hdel(key: str, field: str) -> _Op:
        return _Op("hdel", key, (field,))

    @staticmethod
    def xadd(key: str, maxlen: int, record: str) -> _Op:
        return _Op("xadd", key, (str(maxlen), record))

    @staticmethod
    def pexpire(key: str, ms: int) -> _Op:
        return _Op("pexpire", key, (str(ms),))


SPLIT_OPS = 1000
"""Writes in one call of a split transaction at most, well under the function's cap
(klet.bus.functions.MAX_WRITE_OPS)."""
SPLIT_BYTES = 8 * 1024 * 1024
"""Bytes of keys and values in one call of a split transaction at most, a quarter of
the function's cap (klet.bus.functions.MAX_WRITE_BYTES)."""


class Transaction:
    """Writes queued to be applied together; see `Bus.transaction`."""

    def __init__(self) -> None:
        self.ops: list[_Op] = []
        self._cuts: list[int] = []  # op counts after which a split transaction may cut

    @property
    def empty(self) -> bool:
        return not self.ops

    def mark(self) -> None:
        """The writes so far may go in an earlier call than the ones that follow (a
        split transaction cuts only here): a writer marks after each unit that must be
        applied whole, a pod's table row and its change notice say."""
        if self.ops and (not self._cuts or self._cuts[-1] != len(self.ops)):
            self._cuts.append(len(self.ops))

    def calls(self) -> list[list[_Op]]:
        """The writes in order as calls of at most SPLIT_OPS writes and SPLIT_BYTES
        each, cut only at marks; a unit larger than that goes alone (and the function
        refuses it if it is over the function's own caps)."""
        calls: list[list[_Op]] = []
        size = 0
        start = 0
        for end in [*self._cuts, len(self.ops)]:
            unit = self.ops[start:end]
            start = end
            if not unit:
                continue
            unit_size = sum(_size(op) for op in unit)
            if (
                not calls
                or len(calls[-1]) + len(unit) > SPLIT_OPS
                or size + unit_size > SPLIT_BYTES
            ):
                calls.append([])
                size = 0
            calls[-1].extend(unit)
            size += unit_size
        return calls

    def put(self, table: Table[R], key: str, record: R) -> None:
        self.ops.append(_Op.hset(table.key, key, record.encode()))

    def delete(self, table: Table[R], key: str) -> None:
        self.ops.append(_Op.hdel(table.key, key))

    def publish(self, stream: Stream[R], record: R) -> None:
        self.ops.append(_Op.xadd(stream.key, stream.maxlen, record.encode()))

    def expire(self, stream: Stream[R], ms: int) -> None:
        """Let `stream` (its whole key) go `ms` milliseconds from now unless written
        and given a new expiry meanwhile (a pod's history: klet.bus.schema)."""
        self.ops.append(_Op.pexpire(stream.key, max(1, ms)))


def _size(op: _Op) -> int:
    """Bytes an op adds to a call (its key, verb and arguments), as the function counts."""
    return len(op.key.encode()) + len(op.verb) + sum(len(a.encode()) for a in op.args)


class Table(Generic[R]):
    """A Redis hash of versioned records keyed by pod UID (or source name).

    `generation_key` is its generation counter, which every fenced write of the table
    moves (klet.bus.functions); `raw_all` and `decode_row` let a reader that keeps a
    copy (klet.bus.tablecopy) decode only the rows whose text changed.
    """

    def __init__(self, bus: Bus, name: str, record_type: type[R]) -> None:
        self.bus = bus
        self.name = name
        self.key = bus.key(name)
        self.generation_key = bus.key(functions.generation_name(name))
        self.record_type = record_type

    async def get(self, key: str) -> R | None:
        try:
            raw = await self.bus.client.hget(self.key, key)
        except (RedisError, OSError) as err:
            raise self.bus.failed(err) from err
        return self._decode(key, raw)

    async def get_many(self, keys: Sequence[str]) -> dict[str, R | None]:
        """The records of `keys` in one round trip (HMGET): None for a missing or
        undecodable one, as `get`. A burst of changes costs one read, not one each."""
        unique = list(dict.fromkeys(keys))
        if not unique:
            return {}
        try:
            raws = await self.bus.client.hmget(self.key, unique)
        except (RedisError, OSError) as err:
            raise self.bus.failed(err) from err
        return {key: self._decode(key, raw) for key, raw in zip(unique, raws, strict=True)}

    def _decode(self, key: str, raw: str | bytes | None) -> R | None:
        if raw is None:
            return None
        try:
            return self.record_type.decode(raw)
        except BadRecord as err:
            log.error(
                "bad record in table", extra={"table": self.name, "key": key, "error": str(err)}
            )
            return None

    def decode_row(self, key: str, raw: str) -> R | None:
        """The record of the row `key` from its text; None (logged) when it does not
        decode."""
        return self._decode(key, raw)

    async def raw_all(self) -> dict[str, str]:
        """Every row's text, undecoded (one HGETALL)."""
        try:
            raw = await self.bus.client.hgetall(self.key)
        except (RedisError, OSError) as err:
            raise self.bus.failed(err) from err
        # decode_responses=True: keys and values are str at run time.
        return {str(key): str(value) for key, value in raw.items()}

    async def all(self) -> dict[str, R]:
        """Every decodable record; undecodable ones are logged and left out."""
        out: dict[str, R] = {}
        for key, value in (await self.raw_all()).items():
            record = self._decode(key, value)
            if record is not None:
                out[key] = record
        return out

    async def put(self, key: str, record: R) -> None:
        await self.bus.write([_Op.hset(self.key, key, record.encode())])

    async def delete(self, key: str) -> None:
        await self.bus.write([_Op.hdel(self.key, key)])


class Stream(Generic[R]):
    """A capped Redis stream consumed through consumer groups (at-least-once)."""

    def __init__(self, bus: Bus, name: str, record_type: type[R], *, maxlen: int) -> None:
        self.bus = bus
        self.name = name
        self.key = bus.key(name)
        self.record_type = record_type
        self.maxlen = maxlen

    async def publish(self, record: R) -> str:
        (entry_id,) = await self.publish_many([record])
        return entry_id

    async def publish_many(self, records: Sequence[R]) -> list[str]:
        """Append `records` in order in one bus write (one round trip): one entry each,
        all or none (a leader bus's write is one fenced call,
        refused whole when the lease is not ours). Returns their ids."""
        if not records:
            return []
        return await self.bus.write([_Op.xadd(self.key, self.maxlen, r.encode()) for r in records])

    async def ensure_group(self, group: str, *, start: str = "0") -> None:
        try:
            await self.bus.client.xgroup_create(self.key, group, id=start, mkstream=True)
        except ResponseError as err:
            if "BUSYGROUP" not in str(err):
                raise self.bus.failed(err) from err
        except (RedisError, OSError) as err:
            raise self.bus.failed(err) from err

    async def read(
        self, group: str, consumer: str, *, count: int = 100, block_ms: int = 1000
    ) -> list[Entry[R]]:
        """New entries for this consumer; re-creates the group if Redis lost it."""
        for attempt in (1, 2):
            try:
                reply = await self.bus.client.xreadgroup(
                    group, consumer, {self.key: ">"}, count=count, block=block_ms
                )
                return self._entries(reply)
            except ResponseError as err:
                if "NOGROUP" in str(err) and attempt == 1:
                    log.warning("consumer group missing, re-creating", extra={"stream": self.name})
                    await self.ensure_group(group)
                    continue
                raise self.bus.failed(err) from err
            except (RedisError, OSError) as err:
                raise self.bus.failed(err) from err
        return []

    async def claim_stale(self, group: str, consumer: str, *, min_idle_ms: int) -> list[Entry[R]]:
        """Take over entries another (dead) consumer read but never acknowledged, then
        forget the consumers that are dead: idle for `min_idle_ms` with nothing pending.

        Without the second step every process that ever read the stream stays listed in
        the group (syncloop's consumer names carry the pid), and XINFO and the group's
        memory grow with every restart.
        """
        try:
            reply = await self.bus.client.xautoclaim(
                self.key, group, consumer, min_idle_time=min_idle_ms, start_id="0-0", count=1000
            )
            forgotten = await self.bus.client.fcall(
                functions.FORGET_CONSUMERS, 1, self.key, group, consumer, str(min_idle_ms)
            )
        except ResponseError as err:
            if "NOGROUP" in str(err):
                await self.ensure_group(group)
                return []
            raise self.bus.failed(err) from err
        except (RedisError, OSError) as err:
            raise self.bus.failed(err) from err
        if forgotten:
            log.info(
                "dead consumers removed from the group",
                extra={"stream": self.name, "group": group, "consumers": list(forgotten)},
            )
        messages = reply[1] if len(reply) > 1 else []
        return [self._entry(mid, fields) for mid, fields in messages if fields is not None]

    async def last_id(self) -> str:
        """The id of the newest entry ("0-0" when the stream is empty or missing): where a
        `tail` that wants only what comes next starts."""
        try:
            reply = await self.bus.client.xrevrange(self.key, "+", "-", count=1)
        except (RedisError, OSError) as err:
            raise self.bus.failed(err) from err
        return str(reply[0][0]) if reply else "0-0"

    async def tail(self, after: str, *, count: int = 100, block_ms: int = 1000) -> list[Entry[R]]:
        """Entries newer than the id `after` (XREAD, blocking up to `block_ms`), without
        a consumer group: every reader sees every entry and nothing is acknowledged. For
        readers that only want wake-ups and each keep their own cursor (one per replica)."""
        try:
            reply = await self.bus.client.xread({self.key: after}, count=count, block=block_ms)
        except (RedisError, OSError) as err:
            raise self.bus.failed(err) from err
        return self._entries(reply)

    async def ack(self, group: str, *ids: str) -> None:
        if not ids:
            return
        try:
            await self.bus.client.xack(self.key, group, *ids)
        except (RedisError, OSError) as err:
            raise self.bus.failed(err) from err

    async def length(self) -> int:
        try:
            return int(await self.bus.client.xlen(self.key))
        except (RedisError, OSError) as err:
            raise self.bus.failed(err) from err

    async def latest(self, count: int) -> list[Entry[R]]:
        """The newest `count` entries, oldest first (XREVRANGE: a reader of a whole
        bounded stream, such as a pod's history, without a group)."""
        try:
            reply = await self.bus.client.xrevrange(self.key, "+", "-", count=count)
        except (RedisError, OSError) as err:
            raise self.bus.failed(err) from err
        return self._entries([(self.key, list(reversed(reply or [])))])

    def _entries(self, reply: Any) -> list[Entry[R]]:
        out: list[Entry[R]] = []
        for _stream, messages in reply or []:
            for mid, fields in messages:
                out.append(self._entry(mid, fields))
        return out

    def _entry(self, mid: str, fields: Mapping[str, str]) -> Entry[R]:
        raw = fields.get("r")
        if raw is None:
            return Entry(mid, None, f"{self.name}: entry has no 'r' field")
        try:
            return Entry(mid, self.record_type.decode(raw))
        except BadRecord as err:
            return Entry(mid, None, str(err))


class MergedStream(Generic[R]):
    """Several streams of one record type, consumed as one (a `GroupStream`): the same
    group on each, one blocking XREADGROUP over all of them.

    Why several: a stream has one writer, so that a service can neither forge another's
    entries nor break its stream (an XADD with the largest possible ID makes every later
    XADD to that stream fail); a reader of all of them (status-reporter, which posts
    every service's Events) reads them through this. Entry IDs are `<stream> <id>`, so
    an acknowledgement finds its stream; order holds within each stream, not across.
    """

    def __init__(self, streams: Sequence[Stream[R]]) -> None:
        if not streams:
            raise ValueError("a merged stream needs at least one stream")
        self.streams = {s.name: s for s in streams}
        self._by_key = {s.key: s for s in streams}
        self.bus = streams[0].bus

    async def ensure_group(self, group: str) -> None:
        for stream in self.streams.values():
            await stream.ensure_group(group)

    async def read(
        self, group: str, consumer: str, *, count: int = 100, block_ms: int = 1000
    ) -> list[Entry[R]]:
        """New entries of any of the streams for this consumer (each stream up to
        `count`); re-creates the group where Redis lost it."""
        for attempt in (1, 2):
            try:
                reply = await self.bus.client.xreadgroup(
                    group, consumer, dict.fromkeys(self._by_key, ">"), count=count, block=block_ms
                )
            except ResponseError as err:
                if "NOGROUP" in str(err) and attempt == 1:
                    log.warning(
                        "consumer group missing, re-creating", extra={"streams": list(self.streams)}
                    )
                    await self.ensure_group(group)
                    continue
                raise self.bus.failed(err) from err
            except (RedisError, OSError) as err:
                raise self.bus.failed(err) from err
            return self._entries(reply)
        return []

    def _entries(self, reply: Any) -> list[Entry[R]]:
        """An XREAD/XREADGROUP reply over these streams as tagged entries."""
        out: list[Entry[R]] = []
        batches = cast(list[tuple[str, list[tuple[str, dict[str, str]]]]], reply or [])
        for key, messages in batches:
            stream = self._by_key[key]
            out += [self._tag(stream, stream._entry(mid, fields)) for mid, fields in messages]
        return out

    async def tail(
        self, after: Mapping[str, str], *, count: int = 100, block_ms: int | None = None
    ) -> list[Entry[R]]:
        """Entries newer than `after[name]` ("0-0": from the start) of each stream, by
        one XREAD without a group: a reader beside the group's consumer (`klet events`)
        claims and acknowledges nothing. IDs are tagged as `read`'s. `block_ms` None
        answers at once; otherwise it waits up to that long for a first entry."""
        try:
            reply = await self.bus.client.xread(
                {s.key: after.get(name, "0-0") for name, s in self.streams.items()},
                count=count,
                block=block_ms,
            )
        except (RedisError, OSError) as err:
            raise self.bus.failed(err) from err
        return self._entries(reply)

    async def ack(self, group: str, *ids: str) -> None:
        by_stream: dict[str, list[str]] = {}
        for tagged in ids:
            name, _, entry_id = tagged.partition(" ")
            if name not in self.streams or not entry_id:
                raise BusError(f"{tagged!r} is not an entry of {', '.join(self.streams)}")
            by_stream.setdefault(name, []).append(entry_id)
        for name, entry_ids in by_stream.items():
            await self.streams[name].ack(group, *entry_ids)

    async def claim_stale(self, group: str, consumer: str, *, min_idle_ms: int) -> list[Entry[R]]:
        out: list[Entry[R]] = []
        for stream in self.streams.values():
            claimed = await stream.claim_stale(group, consumer, min_idle_ms=min_idle_ms)
            out += [self._tag(stream, e) for e in claimed]
        return out

    @staticmethod
    def _tag(stream: Stream[R], entry: Entry[R]) -> Entry[R]:
        return Entry(f"{stream.name} {entry.id}", entry.record, entry.error)


_FENCED_PREFIX = "FENCED"
_LAPSED_PREFIX = "LAPSED"


class Lease:
    """Leader election with SET PX, a fencing token and a local deadline.

    The lease value is `<holder>:<token>`; the token comes from the `:fence` counter and
    grows with every grant. While held, the lease is valid locally until a TTL after the
    last successful renewal was *sent* (Redis starts its TTL later, so the local
    deadline never outlives the key). After it, or once a write was refused (`Fenced`),
    writes through the bus are refused and `lost` is set: the leader loop
    (`klet.bus.leader`) then steps down. `reacquired`/`counter_reset` tell it how the
    last grant came about, so it can tell a Redis restart from another replica's term.

    A replica that cannot reach Redis keeps its role until the deadline (nobody else
    can take the lease before the key expires either); past it, it must assume a
    standby took over.

    `leader_slot`, when set (`klet.bus.holder.service_lease` sets it), is the lock file
    by which the leader loop shows standbys on this host that the leader is alive, and
    sees as a standby that it died (`klet.bus.leaderslot`).
    """

    def __init__(
        self, bus: Bus, name: str, holder: str, *, ttl_ms: int, predecessor: str | None = None
    ) -> None:
        self.bus = bus
        self.key = bus.key(f"lease:{name}")
        self.fence_key = bus.key(f"lease:{name}:fence")
        self.holder = holder
        self.predecessor = predecessor
        self.ttl_ms = ttl_ms
        self.token: int | None = None
        self.held = False
        self.renewed_at = 0.0
        """Monotonic time the last successful acquire or renewal was sent."""
        self.lost = asyncio.Event()
        """Set when a write was refused because another replica holds the lease."""
        self.wake = asyncio.Event()
        """Set when the leader loop should look at the lease now (lost, lapsed, or Redis
        no longer reachable: `unreachable`)."""
        self.reacquired = False
        """The last successful attempt took the lease anew (a new token), not renewed it."""
        self.counter_reset = False
        """... and the fence counter had been lost before it (a Redis restart or flush)."""
        self.clock: Callable[[], float] = time.monotonic
        self.leader_slot: LeaderSlot | None = None
        """This lease's leader slot on this host, if it has one."""
        self.answered = True
        """The leader loop's last attempt reached Redis (`klet.bus.leader.hold` keeps it):
        while it did, a call of the bus that cannot reach Redis wakes the loop."""
        self._restored: list[Callable[[], None]] = []

    @property
    def value(self) -> str:
        return f"{self.holder}:{self.token}"

    @property
    def valid_until(self) -> float:
        """Monotonic deadline of the lease as this replica knows it (0 when not held)."""
        return self.renewed_at + self.ttl_ms / 1000 if self.held else 0.0

    def current_value(self) -> str | None:
        """The lease value to fence a write with, or None when this replica must not
        write (not held, or not renewed for a whole TTL)."""
        if not self.held or self.token is None:
            return None
        if self.clock() >= self.valid_until:
            return None
        return self.value

    def fenced(self, why: str) -> Fenced:
        """Record that a write was refused and build the exception to raise."""
        if self.held:
            log.warning(
                "leader write refused, stepping down",
                extra={"lease": self.key, "holder": self.holder, "token": self.token, "why": why},
            )
            self.lost.set()
            self.wake.set()
        self.held = False
        return Fenced(f"{self.key}: write refused for {self.value}: {why}")

    def lapsed(self) -> LeaseLapsed:
        """Record that a write found the lease held by nobody and build the exception."""
        self.wake.set()
        return LeaseLapsed(f"{self.key}: write refused for {self.value}: the lease lapsed")

    def unreachable(self) -> None:
        """A call of this lease's bus could not reach Redis. A leader whose last look
        at the lease reached it looks again now, and then at its reconnect pace
        (`klet.bus.leader`), rather than at its next renewal: Redis may come back
        empty, and the lease is what tells the service so (`on_restored`). Once per
        outage: the loop's own failed attempts keep it from being woken again."""
        if self.held and self.answered:
            self.answered = False
            self.wake.set()

    def on_restored(self, callback: Callable[[], None]) -> None:
        """Call `callback` (synchronously: keep it cheap, e.g. set an event) each time
        the leader loop took this lease back while leading, the key having vanished
        (Redis restarted empty or was flushed): what the service wrote is gone with it,
        so its writers republish at once instead of at their next periodic pass."""
        self._restored.append(callback)

    def restored(self) -> None:
        """Tell the `on_restored` callbacks (the leader loop calls it)."""
        for callback in self._restored:
            callback()

    async def try_acquire(self, *, heir: str | None = None) -> bool:
        """Acquire or renew; returns whether this replica holds the lease now.

        `heir`: the holder ID of a process known to be dead (named by a vacated leader
        slot) whose lease this attempt may take over, in place of `predecessor`.
        """
        sent = self.clock()
        try:
            if self.held and self.token is not None and await self._renew():
                self.renewed_at = sent
                self.reacquired = self.counter_reset = False
                return True
            granted = await self._acquire(heir or self.predecessor)
        except (RedisError, OSError) as err:
            raise _wrap(err) from err
        if granted is not None:
            token, continued = granted
            log.info(
                "lease acquired",
                extra={"lease": self.key, "token": token, "counter_reset": not continued},
            )
            self.token, self.held, self.renewed_at = token, True, sent
            self.reacquired, self.counter_reset = True, not continued
        elif self.held:
            log.warning("lease lost to another replica", extra={"lease": self.key})
            self.held = False
        return self.held

    async def release(self) -> None:
        if not self.held:
            return
        try:
            await self._release()
        except (RedisError, OSError) as err:
            raise _wrap(err) from err
        finally:
            self.held = False

    # The three Redis operations (klet.testbed.fakes.bus's fake lease replaces just these).

    async def _renew(self) -> bool:
        """Extend the key's TTL if it still holds this replica's value."""
        reply = await self.bus.client.fcall(
            functions.LEASE_RENEW, 1, self.key, self.value, str(self.ttl_ms)
        )
        return bool(reply)

    async def _acquire(self, heir_of: str | None) -> tuple[int, bool] | None:
        """Take the key if nobody (or the dead holder `heir_of`) holds it: the new token
        and whether the fence counter survived; None while another replica holds it."""
        heir = f"{heir_of}:" if heir_of else ""
        reply = await self.bus.client.fcall(
            functions.LEASE_ACQUIRE,
            2,
            self.key,
            self.fence_key,
            f"{self.holder}:",
            heir,
            str(self.ttl_ms),
        )
        if isinstance(reply, list):
            return int(reply[0]), bool(int(reply[1]))
        return None

    async def _release(self) -> None:
        await self.bus.client.fcall(functions.LEASE_RELEASE, 1, self.key, self.value)
