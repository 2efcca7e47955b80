"""Publisher: merges source snapshots and writes the result to the bus.

The stateful shell around the pure merge (`podconfig`) and repair (`reconcile`):

- Each snapshot's changes go out in one transaction: desired puts/deletes with their
  `pods` stream records in upstream's order, FailedValidation events for newly dropped
  duplicates, then the source's `sources` entry (ready). syncloop therefore never sees
  a source marked ready before its pods are in the table. The bus takes a bounded call
  (klet.bus.functions caps its writes and bytes), and a node's whole set of pods can be
  larger, so the transaction is split (`Bus.transaction(split=True)`): in order, each
  pod's row and change notice in the same call, the `sources` entry in the last; a
  failure part-way is repaired by the reconcile every bus error leads to.
- Only the holder of the "pod-source" lease writes. The lease is held by the shared
  leader loop (`klet.bus.leader.hold`, an app root task), which sets `elected`; a
  standby replica runs the same sources and merge, so on takeover it needs only a
  reconcile, not a re-read.
- At start the `desired` table is loaded and seeded into the merge, so the first
  snapshot after a restart is diffed against what was published: unchanged pods
  produce no traffic and pods removed while the service was down get a REMOVE.
  Snapshots wait in the inbox until that load succeeds.
- After every source poll the tables are compared with the merged state and the
  difference rewritten in one transaction (`reconcile.plan_reconcile`). This is also
  the recovery path: after a bus error, or on taking the lease, pending per-snapshot
  writes are dropped and a reconcile is done instead, which publishes their net effect.
  The comparison is against copies of `desired` and `sources` (klet.bus.tablecopy),
  read again only when a table's generation counter moved (this replica's own writes
  move it; so does a write lost with Redis's data: the counters go with it) and in full
  every `full_read_s`, for a write that bypassed the fenced write. An idle node's poll
  reads two counters where it read and decoded both tables (issue 42).
- Redis down (`BusUnavailable`) never stops the merge and never crashes the loop: the
  error is logged once per outage, counted, and retried with exponential back-off.
  Redis restarted empty: once the leader loop has the lease back (`restored`, a
  `Lease.on_restored` callback) the tables are reconciled at once, ending the back-off,
  instead of at the next source poll (up to `fileCheckFrequency`, 20 s by default).

- Every write is fenced by the lease (`klet.bus.Bus.lease`): a leader that stalled past
  the TTL while a standby took over cannot write after the takeover. A refused write
  (`Fenced`) marks the lease lost; the leader loop then steps down, which ends the
  process as in every service, and it comes back as a standby.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from klet.bus import BusError, Fenced, NodeBus, Transaction
from klet.bus.tablecopy import TableCopy, TableWatch
from klet.model.records import EventRecord, PodChange, SourceName, SourceState
from klet.model.types import JSON
from klet.pod_source.inbox import Inbox
from klet.pod_source.metrics import Metrics
from klet.pod_source.podconfig import Changes, Dropped, PodConfigState, merge_snapshot, seed
from klet.pod_source.reconcile import Plan, from_record, plan_reconcile, to_record

log = logging.getLogger(__name__)

Clock = Callable[[], float]

LEASE_NAME = "pod-source"

# Events are best effort: during a long outage only the first ones are kept.
MAX_PENDING_EVENTS = 100


@dataclass(frozen=True)
class RetryPolicy:
    """Back-off between bus attempts during an outage (seconds)."""

    initial_s: float = 0.5
    max_s: float = 10.0
    factor: float = 2.0

    def delay(self, failures: int) -> float:
        return float(min(self.max_s, self.initial_s * self.factor ** max(0, failures - 1)))


class Publisher:
    """Owns the merged state; writes it to the bus while holding the lease."""

    def __init__(
        self,
        *,
        bus: NodeBus,
        inbox: Inbox,
        configured: frozenset[SourceName],
        metrics: Metrics,
        idle_s: float,
        retry: RetryPolicy = RetryPolicy(),
        clock: Clock = time.time,
        full_read_s: float = 60.0,
    ) -> None:
        self._bus = bus
        self._desired = TableCopy(bus.desired)
        self._sources = TableCopy(bus.sources)
        self._tables = TableWatch(self._desired, self._sources, full_every_s=full_read_s)
        self._inbox = inbox
        self._configured = configured
        self._metrics = metrics
        self._idle_s = idle_s
        self._retry = retry
        self._clock = clock
        self._state = PodConfigState()
        self._loaded = False
        self._held = False
        self._outbox: list[Changes] = []
        self._events: list[EventRecord] = []  # FailedValidation events not yet written
        self._needs_reconcile = True
        self._reconcile_requested = False
        self._failures = 0
        self._retry_at = 0.0  # monotonic
        self.last_run = 0.0  # monotonic; for the liveness check
        self.elected = asyncio.Event()
        """Set by the leader loop once this replica holds the "pod-source" lease."""
        self.decided = asyncio.Event()
        """Set by the leader loop once Redis answered its first attempt (leader or not)."""

    @property
    def state(self) -> PodConfigState:
        return self._state

    @property
    def ready(self) -> bool:
        """Every configured source has delivered a snapshot and the bus answered last time."""
        return self._loaded and self._failures == 0 and self._state.all_ready(self._configured)

    @property
    def leading(self) -> bool:
        return self._held

    def restored(self) -> None:
        """The lease is back after Redis lost its data: write the merged state back now."""
        self._needs_reconcile = True
        self._retry_at = 0.0
        self._inbox.ring()

    async def run(self) -> None:
        while True:
            await self.run_once()
            await self._wait(self._sleep_s())

    async def run_once(self) -> bool:
        """One pass: lease, load, merge, write. Returns True (the loop never ends itself)."""
        self.last_run = time.monotonic()
        if time.monotonic() < self._retry_at:
            # Backing off from an outage: keep merging so state and metrics stay current.
            if self._loaded:
                self._merge(*self._inbox.take())
            return True
        try:
            self._follow_lease()
            if not self._loaded:
                await self._load()
            self._merge(*self._inbox.take())
            if self._held:
                await self._flush()
            elif self.decided.is_set() and not self.elected.is_set():
                self._outbox.clear()
                self._events.clear()  # standing by: the leader posts them
            # else the lease's first answer is pending, or this replica was elected during
            # this pass (after _follow_lease looked): keep them for the next pass.
        except Fenced as err:
            # The lease is marked lost: the leader loop steps down and ends the process.
            log.warning("a write was refused, the lease is lost", extra={"error": str(err)})
            self._needs_reconcile = True
            self._outbox.clear()
        except BusError as err:
            # Unreachable (BusUnavailable) or refusing writes (read-only replica, out of
            # memory): either way keep the state and retry; neither is worth a restart.
            self._on_failure(err)
        else:
            self._on_success()
        return True

    # -- steps ---------------------------------------------------------------

    def _follow_lease(self) -> None:
        if self.elected.is_set() and not self._held:
            log.info("leading: this replica now writes the desired set")
            self._needs_reconcile = True
            self._held = True

    async def _load(self) -> None:
        published = await self._bus.desired.all()
        self._state = seed(
            self._state,
            (from_record(r) for r in published.values() if r.source in self._configured),
        )
        self._loaded = True
        log.info("loaded the published desired set", extra={"pods": len(published)})

    def _merge(self, pending: dict[SourceName, list[JSON]], polled: bool) -> None:
        now = self._clock()
        for source, pods in pending.items():
            self._state, changes = merge_snapshot(self._state, source, pods, now)
            self._metrics.pods.labels(source=source).set(len(self._state.source_pods(source)))
            self._log_changes(changes)
            if not changes.empty:
                self._outbox.append(changes)
            for dropped in changes.dropped:
                if len(self._events) < MAX_PENDING_EVENTS:
                    self._events.append(_failed_validation(dropped, now))
        if polled:
            self._reconcile_requested = True

    async def _flush(self) -> None:
        if self._needs_reconcile:
            # Whatever was queued is covered by the reconcile's diff.
            self._outbox.clear()
            await self._reconcile()
            self._needs_reconcile = False
            self._reconcile_requested = False
        while self._outbox:
            await self._write_changes(self._outbox[0])
            self._outbox.pop(0)
        if self._reconcile_requested:
            await self._reconcile()
            self._reconcile_requested = False
        if self._events:
            async with self._bus.bus.transaction() as tx:
                sent = self._add_events(tx)
            del self._events[:sent]

    def _add_events(self, tx: Transaction) -> int:
        """Queue the pending events on `tx`; returns how many to forget once it commits."""
        for event in self._events:
            tx.publish(self._bus.events, event)
            tx.mark()
        return len(self._events)

    async def _write_changes(self, changes: Changes) -> None:
        now = self._clock()
        nb = self._bus
        async with nb.bus.transaction(split=True) as tx:
            for op, pod in changes.ops():
                if op == "REMOVE":
                    tx.delete(nb.desired, pod.uid)
                else:
                    tx.put(nb.desired, pod.uid, to_record(pod))
                tx.publish(nb.pods, PodChange(op=op, uid=pod.uid, source=pod.source))
                tx.mark()
            sent = self._add_events(tx)
            tx.put(
                nb.sources, changes.source, SourceState(source=changes.source, ready=True, at=now)
            )
        del self._events[:sent]

    async def _reconcile(self) -> None:
        await self._tables.refresh()
        plan = plan_reconcile(
            self._state,
            configured=self._configured,
            desired=self._desired.records,
            sources=self._sources.records,
            now=self._clock(),
        )
        if plan.empty:
            return
        await self._write_plan(plan)
        log.info(
            "bus tables brought in line with the merged state",
            extra={
                "written": len(plan.puts),
                "removed": len(plan.removes),
                "sources": [s.source for s in plan.source_puts],
            },
        )

    async def _write_plan(self, plan: Plan) -> None:
        nb = self._bus
        async with nb.bus.transaction(split=True) as tx:
            sent = self._add_events(tx)
            for key, rec in plan.removes:
                tx.delete(nb.desired, key)
                tx.publish(nb.pods, PodChange(op="REMOVE", uid=rec.uid, source=rec.source))
                tx.mark()
            for op, rec in plan.puts:
                tx.put(nb.desired, rec.uid, rec)
                if op is not None:
                    tx.publish(nb.pods, PodChange(op=op, uid=rec.uid, source=rec.source))
                tx.mark()
            for state in plan.source_puts:
                tx.put(nb.sources, state.source, state)
            for key in plan.source_deletes:
                tx.delete(nb.sources, key)
        del self._events[:sent]

    # -- bookkeeping ---------------------------------------------------------

    def _on_failure(self, err: BusError) -> None:
        self._metrics.bus_errors.inc()
        self._failures += 1
        self._needs_reconcile = True
        self._outbox.clear()
        delay = self._retry.delay(self._failures)
        self._retry_at = time.monotonic() + delay
        if self._failures == 1:
            log.warning(
                "bus unavailable; keeping the merged state and retrying",
                extra={"error": str(err), "retry_in_s": delay},
            )
        else:
            log.debug("bus still unavailable", extra={"error": str(err), "retry_in_s": delay})

    def _on_success(self) -> None:
        if self._failures:
            log.info("bus available again", extra={"failed_attempts": self._failures})
        self._failures = 0
        self._retry_at = 0.0

    def _sleep_s(self) -> float:
        """Until the end of the outage back-off, or at most `idle_s`."""
        now = time.monotonic()
        wake = self._retry_at if self._retry_at > now else now + self._idle_s
        return max(0.0, wake - now)

    async def _wait(self, timeout_s: float) -> None:
        """Until a source rings the inbox, `timeout_s` passes or, standing by, this
        replica is elected (so a takeover reconciles at once)."""
        if self._held:
            await self._inbox.wait(timeout_s)
            return
        waits = (
            asyncio.create_task(self._inbox.wait(timeout_s)),
            asyncio.create_task(self.elected.wait()),
        )
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waits:
                task.cancel()
            await asyncio.gather(*waits, return_exceptions=True)

    def _log_changes(self, changes: Changes) -> None:
        if changes.first:
            log.info("source ready", extra={"source": changes.source})
        for op, pod in changes.ops():
            log.info(
                "pod %s",
                op.lower(),
                extra={"op": op, "pod": pod.full_name, "uid": pod.uid, "source": pod.source},
            )
        for dropped in changes.dropped:
            log.warning(
                "pod dropped",
                extra={
                    "source": dropped.source,
                    "pod": dropped.full_name,
                    "reason": dropped.reason,
                },
            )
            self._metrics.manifest_errors.labels(source=dropped.source, reason="duplicate").inc()


def _failed_validation(dropped: Dropped, now: float) -> EventRecord:
    namespace, _, name = dropped.full_name.partition("/")
    return EventRecord(
        type="Warning",
        reason="FailedValidation",
        message=(
            f"Error validating pod {dropped.full_name} from {dropped.source}, "
            f"ignoring: {dropped.reason}"
        ),
        involved={"kind": "Pod", "namespace": namespace, "name": name, "uid": dropped.uid},
        component="kubelet",
        at=now,
    )
