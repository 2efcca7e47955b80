"""Reading the bus: the `pods` stream consumer and the periodic table resync.

The stream is only a wake-up; the tables are the truth. The consumer (group "syncloop")
claims entries a dead replica left pending (at start and every `reclaim_s`, which also
removes dead consumers from the group: every process reads under a name of its own),
hands each batch read to the controller at once (one read of the desired table for
the whole batch) and acknowledges it afterwards in one XACK; a bad entry is logged,
counted and acknowledged so it never blocks the stream. The resync looks at the
`desired` and `sources` tables every few seconds, which also repairs anything missed
while Redis was away: it reads their generation counters (one round trip) and reads a
table again only when its counter moved, decoding only the rows that changed
(klet.bus.tablecopy), and hands the controller the tables only when they changed. Both
are read in full anyway every `full_resync_s` (syncFrequency), for a write that did not
go through the fenced write. An idle node therefore decodes nothing here, where it
decoded every desired pod every 5 s (issue 42). Redis being down only delays both: the
controller keeps its last view and every pod keeps running.

Redis restarted empty: the tables' copies are kept while their generation counters are
gone (`KEEP_LOST_S`, klet.bus.tablecopy), so the controller is not handed an empty
desired set and unready sources while pod-source republishes them. When the leader loop
has taken the lease back (`restored`, a `Lease.on_restored` callback) the resync runs at
once, and with it the statuses' reconcile that publishes every status Redis lost, and
the consumer reads again (re-creating its group) without finishing its retry sleep: the
statuses no longer wait for the next 5-second resync (issue 42).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from klet.bus import BusError, BusUnavailable, Entry, GroupStream
from klet.bus.tablecopy import KEEP_LOST_S, CopiedTable, TableCopy, TableWatch
from klet.model.records import DesiredPod, PodChange, SourceState
from klet.obs import OnceLogger

log = logging.getLogger(__name__)

GROUP = "syncloop"


class IntakeBus(Protocol):
    """The bus tables and stream the intake reads (`NodeBus` is one)."""

    @property
    def desired(self) -> CopiedTable[DesiredPod]: ...

    @property
    def sources(self) -> CopiedTable[SourceState]: ...

    @property
    def pods(self) -> GroupStream[PodChange]: ...


class DesiredPods(Protocol):
    """Where the intake hands the desired pods (the pod controller)."""

    @property
    def generation(self) -> int: ...

    def apply_desired(
        self,
        table: Mapping[str, DesiredPod],
        sources: Mapping[str, SourceState],
        *,
        read_from: int,
    ) -> None: ...

    async def on_changes(self, changes: Sequence[PodChange]) -> None: ...

    async def reconcile_statuses(self) -> None: ...


class BusIntake:
    def __init__(
        self,
        bus: IntakeBus,
        controller: DesiredPods,
        *,
        consumer: str,
        resync_s: float = 5.0,
        full_resync_s: float = 60.0,
        reclaim_s: float = 300.0,
        retry_s: float = 1.0,
        on_bad: Callable[[str], None] = lambda _e: None,
        on_error: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.bus = bus
        self.controller = controller
        self.consumer = consumer
        self.resync_s = resync_s
        self.reclaim_s = reclaim_s
        self.retry_s = retry_s  # how soon the consumer reads again after a bus error
        self.clock = clock
        self.desired = TableCopy(bus.desired)
        self.sources = TableCopy(bus.sources)
        self.tables = TableWatch(
            self.desired,
            self.sources,
            full_every_s=full_resync_s,
            keep_lost_s=KEEP_LOST_S,
            clock=clock,
        )
        self._reclaim_at = 0.0  # clock time of the next stale-entry takeover
        self.on_bad = on_bad
        self.on_error = on_error
        self.synced = asyncio.Event()  # set after the first full read of the tables
        self._resync_wake = asyncio.Event()
        self._consumer_wake = asyncio.Event()
        self._once = OnceLogger(log, level=logging.WARNING)

    def _report(self, err: Exception) -> None:
        self.on_error()
        self._once.error(
            "bus", "bus unavailable, keeping the last state", cause=str(err), error=str(err)
        )

    def _recovered(self) -> None:
        self._once.clear("bus", "bus available again")

    async def resync_once(self) -> None:
        """Hand the controller the tables if they changed since the last resync (the
        first resync always does), then reconcile the published statuses."""
        read_from = self.controller.generation
        if await self.tables.refresh():
            self.controller.apply_desired(
                self.desired.records, self.sources.records, read_from=read_from
            )
        await self.controller.reconcile_statuses()
        self.synced.set()

    def restored(self) -> None:
        """The lease is back after Redis lost its data: resync and read now."""
        self._resync_wake.set()
        self._consumer_wake.set()

    async def run_resync(self) -> None:
        while True:
            self._resync_wake.clear()
            try:
                await self.resync_once()
                self._recovered()
            except BusError as err:
                self._report(err)
            await _pause(self._resync_wake, self.resync_s)

    async def run_consumer(self) -> None:
        stream = self.bus.pods
        started = False
        while True:
            self._consumer_wake.clear()  # a restore during the next attempt cuts its pause
            try:
                if not started or self.clock() >= self._reclaim_at:
                    if not started:
                        await stream.ensure_group(GROUP)
                    pending = await stream.claim_stale(GROUP, self.consumer, min_idle_ms=30_000)
                    self._reclaim_at = self.clock() + self.reclaim_s
                    await self._handle(pending)
                    started = True
                await self._handle(
                    await stream.read(GROUP, self.consumer, count=100, block_ms=1000)
                )
                self._recovered()
            except BusUnavailable as err:
                self._report(err)
                started = False
                await _pause(self._consumer_wake, self.retry_s)
            except BusError as err:
                self._report(err)
                await asyncio.sleep(self.retry_s)

    async def _handle(self, entries: Sequence[Entry[PodChange]]) -> None:
        """Hand a batch to the controller at once, then acknowledge all of it in one
        XACK: two round trips per batch instead of two per entry, which serialised a
        burst of new pods (a crash in between leaves the batch pending, to be claimed
        and handled again, as before)."""
        changes: list[PodChange] = []
        for entry in entries:
            if entry.record is None:
                log.error(
                    "bad entry on the pods stream", extra={"id": entry.id, "error": entry.error}
                )
                self.on_bad(entry.error or "")
            else:
                changes.append(entry.record)
        if changes:
            await self.controller.on_changes(changes)
        if entries:
            await self.bus.pods.ack(GROUP, *(entry.id for entry in entries))


async def _pause(wake: asyncio.Event, delay_s: float) -> None:
    """Wait `delay_s`, or less when `wake` is set."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(delay_s):
            await wake.wait()
