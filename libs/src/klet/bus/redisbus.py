"""The Redis bus: tables (hashes, the truth), streams (wake-ups) and leases.

This is the only module that imports `redis`. Keys are `klet:<node>:<name>` so one Redis
can serve several nodes. Every failure to reach Redis surfaces as `BusUnavailable`
(raised from the redis error), which callers treat as "retry later, keep the last
state" — never as a reason to change what runs on the node.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar
from urllib.parse import urlsplit

import redis.asyncio as aioredis
from klet.model.records import BadRecord, Record
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

log = logging.getLogger(__name__)

R = TypeVar("R", bound=Record)
R_co = TypeVar("R_co", bound=Record, covariant=True)


class BusError(Exception):
    """Base of the bus's own errors."""


class BusUnavailable(BusError):
    """Redis could not be reached or did not answer in time."""


def _wrap(err: Exception) -> BusError:
    if isinstance(err, RedisConnectionError | RedisTimeoutError | OSError):
        return BusUnavailable(str(err) or type(err).__name__)
    return BusError(str(err))


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


class Bus:
    """All of one node's keys in one Redis."""

    def __init__(self, client: aioredis.Redis, node: str) -> None:
        self._r = client
        self.node = node

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
        client = aioredis.Redis.from_url(
            url,
            decode_responses=True,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            health_check_interval=10,
            **options,
        )
        return cls(client, node)

    def key(self, name: str) -> str:
        return f"klet:{self.node}:{name}"

    def table(self, name: str, record_type: type[R]) -> Table[R]:
        return Table(self, name, record_type)

    def stream(self, name: str, record_type: type[R], *, maxlen: int = 10_000) -> Stream[R]:
        return Stream(self, name, record_type, maxlen=maxlen)

    def lease(self, name: str, holder: str, *, ttl_ms: int = 15_000) -> Lease:
        return Lease(self, name, holder, ttl_ms=ttl_ms)

    async def ping(self) -> None:
        try:
            await self._r.ping()
        except (RedisError, OSError) as err:
            raise _wrap(err) from err

    async def close(self) -> None:
        await self._r.aclose()

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Transaction]:
        """Collect writes and apply them atomically (MULTI/EXEC) on exit."""
        tx = Transaction(self._r.pipeline(transaction=True))
        yield tx
        if tx.empty:
            return
        try:
            await tx.pipe.execute()
        except (RedisError, OSError) as err:
            raise _wrap(err) from err

    @property
    def client(self) -> aioredis.Redis:
        return self._r


class Transaction:
    """Writes queued for one MULTI/EXEC; see `Bus.transaction`."""

    def __init__(self, pipe: Any) -> None:
        self.pipe = pipe
        self.empty = True

    def put(self, table: Table[R], key: str, record: R) -> None:
        self.pipe.hset(table.key, key, record.encode())
        self.empty = False

    def delete(self, table: Table[R], key: str) -> None:
        self.pipe.hdel(table.key, key)
        self.empty = False

    def publish(self, stream: Stream[R], record: R) -> None:
        self.pipe.xadd(stream.key, {"r": record.encode()}, maxlen=stream.maxlen, approximate=True)
        self.empty = False


class Table(Generic[R]):
    """A Redis hash of versioned records keyed by pod UID (or source name)."""

    def __init__(self, bus: Bus, name: str, record_type: type[R]) -> None:
        self.bus = bus
        self.name = name
        self.key = bus.key(name)
        self.record_type = record_type

    async def get(self, key: str) -> R | None:
        try:
            raw = await self.bus.client.hget(self.key, key)
        except (RedisError, OSError) as err:
            raise _wrap(err) from err
        if raw is None:
            return None
        try:
            return self.record_type.decode(raw)
        except BadRecord as err:
            log.error(
                "bad record in table", extra={"table": self.name, "key": key, "error": str(err)}
            )
            return None

    async def all(self) -> dict[str, R]:
        """Every decodable record; undecodable ones are logged and left out."""
        try:
            raw = await self.bus.client.hgetall(self.key)
        except (RedisError, OSError) as err:
            raise _wrap(err) from err
        out: dict[str, R] = {}
        for key, value in raw.items():
            key = str(key)  # decode_responses=True: keys are str at run time
            try:
                out[key] = self.record_type.decode(value)
            except BadRecord as err:
                log.error(
                    "bad record in table", extra={"table": self.name, "key": key, "error": str(err)}
                )
        return out

    async def put(self, key: str, record: R) -> None:
        try:
            await self.bus.client.hset(self.key, key, record.encode())
        except (RedisError, OSError) as err:
            raise _wrap(err) from err

    async def delete(self, key: str) -> None:
        try:
            await self.bus.client.hdel(self.key, key)
        except (RedisError, OSError) as err:
            raise _wrap(err) from err


class Stream(Generic[R]):
    """A capped Redis stream consumed through consumer groups (at-least-once)."""

    def __init__(self, bus: Bus, name: str, record_type: type[R], *, maxlen: int) -> None:
        self.bus = bus
        self.name = name
        self.key = bus.key(name)
        self.record_type = record_type
        self.maxlen = maxlen

    async def publish(self, record: R) -> str:
        try:
            entry_id = str(
                await self.bus.client.xadd(
                    self.key, {"r": record.encode()}, maxlen=self.maxlen, approximate=True
                )
            )
        except (RedisError, OSError) as err:
            raise _wrap(err) from err
        return entry_id

    async def ensure_group(self, group: str, *, start: str = "0") -> None:
        try:
            await self.bus.client.xgroup_create(self.key, group, id=start, mkstream=True)
        except ResponseError as err:
            if "BUSYGROUP" not in str(err):
                raise _wrap(err) from err
        except (RedisError, OSError) as err:
            raise _wrap(err) from err

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
                raise _wrap(err) from err
            except (RedisError, OSError) as err:
                raise _wrap(err) from err
        return []

    async def claim_stale(self, group: str, consumer: str, *, min_idle_ms: int) -> list[Entry[R]]:
        """Take over entries another (dead) consumer read but never acknowledged."""
        try:
            reply = await self.bus.client.xautoclaim(
                self.key, group, consumer, min_idle_time=min_idle_ms, start_id="0-0", count=1000
            )
        except ResponseError as err:
            if "NOGROUP" in str(err):
                await self.ensure_group(group)
                return []
            raise _wrap(err) from err
        except (RedisError, OSError) as err:
            raise _wrap(err) from err
        messages = reply[1] if len(reply) > 1 else []
        return [self._entry(mid, fields) for mid, fields in messages if fields is not None]

    async def ack(self, group: str, *ids: str) -> None:
        if not ids:
            return
        try:
            await self.bus.client.xack(self.key, group, *ids)
        except (RedisError, OSError) as err:
            raise _wrap(err) from err

    async def length(self) -> int:
        try:
            return int(await self.bus.client.xlen(self.key))
        except (RedisError, OSError) as err:
            raise _wrap(err) from err

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


_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

# Take the lease when it is free or held under our own identity (a restarted process of
# the same replica slot), so a crash-restart does not wait out the TTL.
_ACQUIRE = """
local cur = redis.call('GET', KEYS[1])
if (not cur) or string.sub(cur, 1, string.len(ARGV[1])) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class Lease:
    """Leader election with SET NX PX and a fencing token.

    A replica that cannot reach Redis keeps the role it had (no other replica can take
    the lease while Redis is unreachable either), so a Redis outage never stops the
    leader from keeping pods alive. When Redis answers again the leader renews, or
    re-acquires if the key was lost (restart, flush), or steps down if another replica
    holds it.
    """

    def __init__(self, bus: Bus, name: str, holder: str, *, ttl_ms: int) -> None:
        self.bus = bus
        self.key = bus.key(f"lease:{name}")
        self.fence_key = bus.key(f"lease:{name}:fence")
        self.holder = holder
        self.ttl_ms = ttl_ms
        self.token: int | None = None
        self.held = False
        self.renewed_at = 0.0

    @property
    def value(self) -> str:
        return f"{self.holder}:{self.token}"

    async def try_acquire(self) -> bool:
        """Acquire or renew; returns whether this replica holds the lease now."""
        client = self.bus.client
        try:
            if self.held and self.token is not None:
                renewed = await client.eval(_RENEW, 1, self.key, self.value, str(self.ttl_ms))
                if renewed:
                    self.renewed_at = time.monotonic()
                    return True
            token = int(await client.incr(self.fence_key))
            ok = await client.eval(
                _ACQUIRE, 1, self.key, f"{self.holder}:", f"{self.holder}:{token}", str(self.ttl_ms)
            )
        except (RedisError, OSError) as err:
            raise _wrap(err) from err
        if ok:
            if not self.held:
                log.info("lease acquired", extra={"lease": self.key, "token": token})
            self.token, self.held, self.renewed_at = token, True, time.monotonic()
        elif self.held:
            log.warning("lease lost to another replica", extra={"lease": self.key})
            self.held = False
        return self.held

    async def release(self) -> None:
        if not self.held:
            return
        try:
            await self.bus.client.eval(_RELEASE, 1, self.key, self.value)
        except (RedisError, OSError) as err:
            raise _wrap(err) from err
        finally:
            self.held = False
