"""Keeps each pod's history on the bus for `klet why` (the manager around
klet.model.podhistory).

The leader only (a root task started at election, in both modes), from two feeds:

- every service's Events streams, in a consumer group of its own ("pod-history", beside
  the "status-reporter" group that posts them), so each Event about a pod becomes one
  history entry whether or not, and however slowly, it is posted; its first read at
  election takes over whatever a previous leader left unacknowledged;
- the status changes the pod view (podcache.py) fetches as the `podstatus` stream names
  them, handed over by the view (`StatusChanges`) rather than read again: one XREAD and
  one HMGET of `status` per change serve both (issue 42: each change was read twice in
  this process), plus a full pass over the `status` table at election and every
  `full_pass_s`, which is what a keeper that was not leading, or whose write failed,
  relies on. Each status is compared with what the `history` index last recorded of
  that pod, so only changes are written, and a restarted or new leader neither repeats
  nor misses one; a record older than the one last recorded of its pod (the view's,
  fetched before the pass read a newer one) is left out.

Whose history an Event joins is decided by what the writers own, not by the Event: any
service can name any UID, namespace and name in an Event it records, so an Event only
adds to the history of a pod this node has (an index row already, else a row of the
`desired` table, pod-source's, or of `status`, syncloop's), and the index row's
namespace and name come from those tables, never from the Event. An Event about any
other UID is acknowledged and left out: it can neither create a row that a `klet why`
of a real pod's name finds first, nor a `history:<uid>` key of its choosing.

Each pod's entries go to `history:<uid>`, capped at `max_entries` and given an expiry of
`max_age_s` by the same fenced write (so a deleted pod's history goes by itself), and
its index row (`history`, keyed by UID) names the pod for `klet why <ns>/<name>`. Both
feeds stage what they found and one write, `coalesce_s` after the first of them, carries
everything staged by then (issue 42: a pod start's Events and its statuses, one
transaction per feed read, were about six fenced writes per pod; the Events are
acknowledged only once that write succeeded, and a failed write drops the keeper's copy
of the index, so the next compare reads what the bus really holds). The
full pass also drops index rows older than `max_age_s` and, past `max_pods`, those
whose last entry is oldest (their streams are given a 1 ms expiry), and renews the
expiry of the pods still on the node once a quarter of `max_age_s` has passed, so a
quiet running pod keeps its history.

A Redis outage stops nothing: the loops log it once and retry; Events stay pending in
the group and statuses are compared again by the next full pass.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from klet.bus import BusError, Entry, NodeBus
from klet.bus.functions import MAX_EXPIRE_MS, MAX_STREAM_LEN
from klet.model import podhistory
from klet.model.flowcontrol import BackoffPolicy
from klet.model.records import EventRecord, HistoryEntry, HistoryIndexRecord, PodStatusRecord
from klet.obs import OnceLogger
from klet.retry import call_retrying

log = logging.getLogger(__name__)

GROUP = "pod-history"


@dataclass(frozen=True)
class HistoryPolicy:
    max_entries: int = 256
    """--pod-history-max-entries: entries per pod (the oldest go first)."""
    max_age_s: float = 86400.0
    """--pod-history-max-age: a history is kept this long after its last entry."""
    max_pods: int = 1000
    """--pod-history-max-pods: pods with a history."""
    full_pass_s: float = 60.0
    """Seconds between full passes over the status table (and trims)."""
    coalesce_s: float = 0.25
    """Seconds both feeds' findings are gathered before one write carries them: `klet
    why` is at most this much behind, for one fenced call where a pod start made six."""
    read_count: int = 200
    read_block_ms: int = 1000
    claim_idle_ms: int = 30_000
    bus_backoff: BackoffPolicy = field(default_factory=lambda: BackoffPolicy(0.2, 5.0))

    def __post_init__(self) -> None:
        # The bus refuses a longer stream or expiry (klet.bus.functions): refused here,
        # naming the flag, instead of every history write failing later.
        if not 1 <= self.max_entries <= MAX_STREAM_LEN:
            raise ValueError(
                f"--pod-history-max-entries {self.max_entries}: must be 1 to {MAX_STREAM_LEN}"
            )
        if not 0 < self.max_age_s * 1000 <= MAX_EXPIRE_MS:
            raise ValueError(
                f"--pod-history-max-age {self.max_age_s}s: must be positive and at most "
                f"{MAX_EXPIRE_MS // 1000}s ({MAX_EXPIRE_MS // 86_400_000} days)"
            )


class StatusChanges(Protocol):
    """Where the status changes come from (podcache.PodCache): `callback` is called,
    synchronously, with the status records fetched for the pods the `podstatus` stream
    named, each time a batch of them is applied."""

    def subscribe_statuses(self, callback: Callable[[Sequence[PodStatusRecord]], None]) -> None: ...


class HistoryKeeper:
    """Writes pods' histories; `events_once`, `statuses_once` and `full_pass` are steps."""

    def __init__(
        self,
        *,
        bus: NodeBus,
        consumer: str,
        changes: StatusChanges,
        policy: HistoryPolicy = HistoryPolicy(),
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._bus = bus
        self._sleep = sleep  # the write's gathering wait (tests hold it open)
        self._consumer = consumer
        self._policy = policy
        self._clock = clock
        self._index: dict[str, HistoryIndexRecord] | None = None
        self._refreshed: dict[str, float] = {}  # uid -> when its expiry was last renewed
        self._recorded: dict[str, tuple[float, int]] = {}  # uid -> newest (epoch, version)
        self._lock = asyncio.Lock()  # one read-modify-write of the index at a time
        self._group_ready = False
        self._need_pass = True  # at election and after a failed write: a full pass first
        # The view's changes since the last step, newest per pod: bounded by the pods.
        self._pending: dict[str, PodStatusRecord] = {}
        self._offered = asyncio.Event()
        # What both feeds staged for the next write (already in the loaded index), and
        # that write, gathering until `coalesce_s` after the first stage.
        self._staged: dict[str, list[HistoryEntry]] = {}
        self._staged_rows: dict[str, HistoryIndexRecord] = {}
        self._writing: asyncio.Task[None] | None = None
        self._last_write: asyncio.Task[None] | None = None
        changes.subscribe_statuses(self._offer)
        self._once = OnceLogger(log, level=logging.WARNING)
        self.written = 0
        """Entries written (tests)."""

    # -- steps ----------------------------------------------------------------------------

    async def events_once(self) -> int:
        """Read one batch of Events (blocking up to read_block_ms), record and ack it."""
        feed = self._bus.event_feed
        if not self._group_ready:
            await feed.ensure_group(GROUP)
            stale = await feed.claim_stale(GROUP, self._consumer, min_idle_ms=0)
            self._group_ready = True
            await self._record_events(stale)
        entries = await feed.read(
            GROUP,
            self._consumer,
            count=self._policy.read_count,
            block_ms=self._policy.read_block_ms,
        )
        await self._record_events(entries)
        return len(entries)

    async def statuses_once(self) -> int:
        """The full pass when one is owed (the first step, and after a failure), else
        wait for the view's next changes and compare them; the statuses compared from
        the view (0 for a pass)."""
        if self._need_pass:
            self._pending.clear()  # the pass reads them as new or newer
            await self.full_pass()
            self._need_pass = False
            return 0
        await self._offered.wait()
        self._offered.clear()
        records, self._pending = list(self._pending.values()), {}
        await self._record_statuses(records)
        return len(records)

    def _offer(self, records: Sequence[PodStatusRecord]) -> None:
        """The view applied these statuses (called by it: cheap, never raises)."""
        for record in records:
            self._pending[record.uid] = record
        if records:
            self._offered.set()

    async def full_pass(self) -> None:
        """Every status compared, expiries of pods on the node renewed, old rows dropped."""
        statuses = await self._bus.status.all()
        await self._record_statuses(statuses.values())
        await self._trim(present=set(statuses))

    # -- loops ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Both feeds and the periodic full pass, until cancelled."""
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._loop("events", self.events_once))
                group.create_task(self._loop("statuses", self.statuses_once))
                group.create_task(self._periodic())
        finally:
            # The writes' waiters are gone (their Events stay unacknowledged, for the
            # next leader): stop them with the loops.
            writes = {w for w in (self._writing, self._last_write) if w is not None}
            for write in writes:
                write.cancel()
            await asyncio.gather(*writes, return_exceptions=True)

    async def _loop(self, name: str, step: Callable[[], Awaitable[int]]) -> None:
        def failed(err: BaseException | None) -> None:
            if name == "events":
                self._group_ready = False
            else:
                self._need_pass = True  # what the failed write held is compared again
            self._once.error(name, f"cannot keep pods' histories ({name})", error=str(err))

        while True:
            await call_retrying(step, self._policy.bus_backoff, on=BusError, on_failure=failed)
            self._once.clear(name, f"keeping pods' histories again ({name})")

    async def _periodic(self) -> None:
        while True:
            await asyncio.sleep(self._policy.full_pass_s)
            try:
                await self.full_pass()
            except BusError as err:
                self._once.error("pass", "cannot keep pods' histories (pass)", error=str(err))

    # -- internals ------------------------------------------------------------------------

    async def _loaded(self) -> dict[str, HistoryIndexRecord]:
        if self._index is None:
            self._index = await self._bus.history.all()
        return self._index

    async def _record_events(self, entries: Iterable[Entry[EventRecord]]) -> None:
        batch: dict[str, list[HistoryEntry]] = {}
        ids: list[str] = []
        for entry in entries:
            ids.append(entry.id)
            if entry.record is None:
                log.error(
                    "bad events entry, left out of the pods' histories",
                    extra={"entry": entry.id, "error": entry.error},
                )
                continue
            source = entry.id.partition(" ")[0].rpartition(":")[2] or "kubelet"
            found = podhistory.from_event(entry.record, source=source)
            if found is None:
                continue
            uid, item = found
            batch.setdefault(uid, []).append(item)
        if batch:
            async with self._lock:
                index = await self._loaded()
                names = await self._names([uid for uid in batch if uid not in index])
                for uid in [u for u in batch if u not in index and u not in names]:
                    log.debug(
                        "Events about a pod this node does not have, left out of the histories",
                        extra={"uid": uid, "events": len(batch.pop(uid))},
                    )
                now = self._clock()
                rows = {}
                for uid in batch:
                    old = index.get(uid)
                    ns, name = names.get(uid, ("", ""))
                    rows[uid] = HistoryIndexRecord(
                        namespace=old.namespace if old is not None else ns,
                        name=old.name if old is not None else name,
                        first_at=old.first_at if old is not None else now,
                        last_at=now,
                        phase=old.phase if old is not None else "",
                        containers=old.containers if old is not None else {},
                    )
                written = self._stage(batch, rows, index=index, now=now)
            await self._written(written)
        if ids:
            await self._bus.event_feed.ack(GROUP, *ids)

    async def _names(self, uids: list[str]) -> dict[str, tuple[str, str]]:
        """(namespace, name) of each of `uids` the node has, as pod-source's `desired`
        or else syncloop's `status` names it; a UID in neither is left out."""
        if not uids:
            return {}
        out: dict[str, tuple[str, str]] = {}
        for uid, desired in (await self._bus.desired.get_many(uids)).items():
            if desired is not None:
                meta = desired.pod.get("metadata") or {}
                out[uid] = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        rest = [uid for uid in uids if uid not in out]
        if rest:
            for uid, status in (await self._bus.status.get_many(rest)).items():
                if status is not None:
                    out[uid] = (status.namespace, status.name)
        return out

    async def _record_statuses(self, records: Iterable[PodStatusRecord]) -> None:
        async with self._lock:
            index = await self._loaded()
            now = self._clock()
            batch: dict[str, list[HistoryEntry]] = {}
            rows: dict[str, HistoryIndexRecord] = {}
            for record in records:
                seen = self._recorded.get(record.uid)
                if seen is not None and (record.epoch, record.version) < seen:
                    continue  # older than what was compared already
                self._recorded[record.uid] = (record.epoch, record.version)
                old = index.get(record.uid)
                items, row = podhistory.observe(old, record, now=now)
                renew = now - self._refreshed.get(record.uid, 0.0) >= self._policy.max_age_s / 4
                if items or old is None or renew or row.containers != old.containers:
                    batch[record.uid] = items
                    rows[record.uid] = row
            written = self._stage(batch, rows, index=index, now=now)
        await self._written(written)

    def _stage(
        self,
        batch: dict[str, list[HistoryEntry]],
        rows: dict[str, HistoryIndexRecord],
        *,
        index: dict[str, HistoryIndexRecord],
        now: float,
    ) -> asyncio.Task[None] | None:
        """Stage `batch` and `rows` for the next write (under the lock) and record the rows
        in the loaded `index` as of `now`; the write to wait for, None if nothing was
        staged. The write starts gathering at the first stage after the last one."""
        if not rows:
            return None
        for uid, row in rows.items():
            self._staged.setdefault(uid, []).extend(batch.get(uid, []))
            self._staged_rows[uid] = row
            index[uid] = row
            self._refreshed[uid] = now
        if self._writing is None:
            self._writing = asyncio.get_running_loop().create_task(
                self._write_staged(after=self._last_write), name="pod-history-write"
            )
            self._last_write = self._writing
        return self._writing

    async def _written(self, write: asyncio.Task[None] | None) -> None:
        """Wait for `write` (shielded: the other feed waits for it too); its error, a
        BusError, is this caller's."""
        if write is not None:
            await asyncio.shield(write)

    async def _write_staged(self, *, after: asyncio.Task[None] | None) -> None:
        """After `coalesce_s`, append what is staged, renew the streams' expiry and put
        the rows: one call for a burst's worth (several for a pass over many pods).
        Writes go one after the other (`after`, the write before), so a pod's entries
        keep their order."""
        await self._sleep(self._policy.coalesce_s)
        batch, rows = self._staged, self._staged_rows
        self._staged, self._staged_rows, self._writing = {}, {}, None
        if after is not None:
            await asyncio.gather(after, return_exceptions=True)  # its waiters take its error
        ttl_ms = int(self._policy.max_age_s * 1000)
        try:
            for chunk in _chunks(rows, lambda uid: len(batch.get(uid, [])) + 2):
                async with self._bus.bus.transaction() as tx:
                    for uid in chunk:
                        stream = self._bus.history_of(uid, maxlen=self._policy.max_entries)
                        for item in batch.get(uid, []):
                            tx.publish(stream, item)
                        tx.expire(stream, ttl_ms)
                        tx.put(self._bus.history, uid, rows[uid])
                self.written += sum(len(batch.get(uid, [])) for uid in chunk)
        except BaseException:
            # The index holds rows that were not all written: read it again before the
            # next compare (the statuses loop's failure also owes a full pass).
            self._index = None
            for uid in rows:
                self._refreshed.pop(uid, None)
            raise

    async def _trim(self, *, present: set[str]) -> None:
        async with self._lock:
            index = await self._loaded()
            now = self._clock()
            old = [
                u
                for u, r in index.items()
                if u not in present and now - r.last_at > self._policy.max_age_s
            ]
            keep = sorted(
                (u for u in index if u not in old), key=lambda u: index[u].last_at, reverse=True
            )
            old += keep[self._policy.max_pods :]
            if not old:
                return
            for chunk in _chunks(old, lambda _uid: 2):
                async with self._bus.bus.transaction() as tx:
                    for uid in chunk:
                        tx.expire(self._bus.history_of(uid), 1)
                        tx.delete(self._bus.history, uid)
                for uid in chunk:
                    index.pop(uid, None)
                    self._refreshed.pop(uid, None)
                    self._recorded.pop(uid, None)
            log.info("pods' histories dropped", extra={"pods": len(old)})


WRITE_OPS = 1000
"""Writes per bus call at most: a pass over many pods goes as several calls, each well
under the bus's cap (klet.bus.functions.MAX_WRITE_OPS); a pod's writes stay in one."""


def _chunks(uids: Iterable[str], ops: Callable[[str], int]) -> list[list[str]]:
    """`uids` in runs of at most WRITE_OPS writes (`ops(uid)` each; a pod with more
    goes alone)."""
    out: list[list[str]] = []
    size = 0
    for uid in uids:
        n = ops(uid)
        if not out or size + n > WRITE_OPS:
            out.append([])
            size = 0
        out[-1].append(uid)
        size += n
    return out
