"""Publishes computed pod statuses to the `status` table and the `podstatus` stream.

Writes are coalesced: `set` only marks a pod dirty when its status really changed (and
bumps its version), and a flush task writes all dirty pods in one transaction. A Redis
outage keeps them dirty until it returns. `reconcile` compares the table with what this
replica last published, which is how a restarted or flushed Redis gets the statuses
back without waiting for any pod to change. It compares against a copy of the table
(klet.bus.tablecopy) read again only when the table's generation counter moved (this
replica's own flushes move it, and decoding then only the rows they wrote) or a
`full_every_s` has passed: an idle node's reconcile, every resync, reads one counter
where it read and decoded every status (issue 42). A Redis that restarted empty lost
the counter with the table, so the copy is read again and every status re-marked. The
copy keeps only what the comparison needs, each row's `(epoch, version)`, not the
statuses (about 0.7 MB of decoded records at 110 pods).

A flush that failed (Redis away, or back but the lease not yet taken back: `LeaseLapsed`)
is tried again at `RETRY`'s pace (50 ms doubling to 1 s), and at once when the leader
loop has the lease back (`resume`, a `Lease.on_restored` callback): a status that
changed during a Redis restart reaches the bus as soon as the service may write again,
where a fixed second's sleep and the next second's wake-up made it wait 1-2 s (issue 42).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from klet.bus import BusUnavailable, NodeBus, Table
from klet.bus.tablecopy import Generations, TableCopy, TableWatch
from klet.model.flowcontrol import BackoffPolicy
from klet.model.records import PodStatusChange, PodStatusRecord
from klet.model.types import JSON, PodUID
from klet.obs import OnceLogger
from klet.retry import delay_after
from klet.syncloop.pods.status import strip_volatile

log = logging.getLogger(__name__)

RETRY = BackoffPolicy(initial_s=0.05, max_s=1.0)
"""Waits between flushes that failed, unless `resume` comes first."""


@dataclass
class _Entry:
    namespace: str
    name: str
    status: JSON
    version: int
    terminated: bool = False


class StatusVersions:
    """The `status` table as `reconcile` compares it: each row's `(epoch, version)`."""

    def __init__(self, table: Table[PodStatusRecord]) -> None:
        self._table = table
        self.bus: Generations = table.bus
        self.name = table.name
        self.generation_key = table.generation_key

    async def raw_all(self) -> dict[str, str]:
        return await self._table.raw_all()

    def decode_row(self, key: str, raw: str) -> tuple[float, int] | None:
        record = self._table.decode_row(key, raw)
        return None if record is None else (record.epoch, record.version)


class StatusPublisher:
    def __init__(
        self,
        bus: NodeBus,
        *,
        clock: Callable[[], float] = time.time,
        full_every_s: float = 60.0,
        monotonic: Callable[[], float] = time.monotonic,
        retry: BackoffPolicy = RETRY,
    ) -> None:
        self.bus = bus
        self.clock = clock
        self.table = TableCopy(StatusVersions(bus.status))
        self._tables = TableWatch(self.table, full_every_s=full_every_s, clock=monotonic)
        self.epoch = clock()
        self._entries: dict[str, _Entry] = {}
        self._dirty: set[str] = set()
        self._removed: set[str] = set()
        self._wake = asyncio.Event()
        self._resume = asyncio.Event()
        self._retry = retry
        self._failures = 0  # consecutive failed flushes
        self._once = OnceLogger(log, level=logging.WARNING)

    def get(self, uid: str) -> JSON | None:
        e = self._entries.get(uid)
        return e.status if e else None

    def items(self) -> list[tuple[str, str, str, JSON]]:
        return [(uid, e.namespace, e.name, e.status) for uid, e in self._entries.items()]

    def set(
        self, uid: str, namespace: str, name: str, status: JSON, *, terminated: bool = False
    ) -> bool:
        """Record a status; returns whether it changed."""
        e = self._entries.get(uid)
        if (
            e is not None
            and e.terminated == terminated
            and strip_volatile(e.status) == strip_volatile(status)
        ):
            return False
        version = (e.version + 1) if e else 1
        self._entries[uid] = _Entry(namespace, name, status, version, terminated)
        self._dirty.add(uid)
        self._removed.discard(uid)
        self._wake.set()
        return True

    def remove(self, uid: str) -> None:
        self._entries.pop(uid, None)
        self._dirty.discard(uid)
        self._removed.add(uid)
        self._wake.set()

    async def flush(self) -> None:
        if not self._dirty and not self._removed:
            return
        dirty, removed = set(self._dirty), set(self._removed)
        now = self.clock()
        async with self.bus.bus.transaction() as tx:
            for uid in dirty:
                e = self._entries.get(uid)
                if e is None:
                    continue
                tx.put(
                    self.bus.status,
                    uid,
                    PodStatusRecord(
                        uid=PodUID(uid),
                        namespace=e.namespace,
                        name=e.name,
                        version=e.version,
                        epoch=self.epoch,
                        status=e.status,
                        updated_at=now,
                        terminated=e.terminated,
                    ),
                )
                tx.publish(self.bus.podstatus, PodStatusChange(uid=PodUID(uid), version=e.version))
            for uid in removed:
                tx.delete(self.bus.status, uid)
                tx.publish(self.bus.podstatus, PodStatusChange(uid=PodUID(uid), version=0))
        self._dirty -= dirty
        self._removed -= removed

    async def reconcile(self, known: Callable[[str], bool]) -> None:
        """Re-mark what the table lacks; drop entries of pods nobody knows any more."""
        await self._tables.refresh()
        table = self.table.records
        for uid, e in self._entries.items():
            if table.get(uid) != (self.epoch, e.version):
                self._dirty.add(uid)
        for uid in table:
            if uid not in self._entries and not known(uid):
                self._removed.add(uid)
        if self._dirty or self._removed:
            self._wake.set()

    def resume(self) -> None:
        """The bus may be written again (the lease taken back after Redis lost it): a
        flush waiting out its retry delay goes now."""
        self._resume.set()
        self._wake.set()

    async def run(self) -> None:
        while True:
            await self.run_once()
            await asyncio.sleep(0.05)  # coalesce bursts of updates into one transaction

    async def run_once(self) -> None:
        """Wait for something to publish (or, after a failed flush, for its retry delay
        or `resume`), then flush; a failure is kept for the next call."""
        if self._failures:
            event, timeout = self._resume, delay_after(self._retry, self._failures)
        else:
            event, timeout = self._wake, 1.0
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await event.wait()
        self._wake.clear()
        self._resume.clear()
        try:
            await self.flush()
        except BusUnavailable as err:
            self._failures += 1
            self._once.error("bus", "cannot publish pod statuses, will retry", error=str(err))
        else:
            self._failures = 0
            self._once.clear("bus", "status publishing resumed")
