"""The node's pods as this service sees them: desired pods joined with their latest status.

A manager (state + two loops) around the pure rules in `listing.py`:

- the **consumer** tails the `podstatus` stream with plain XREAD, from its own cursor
  (no consumer group): every replica sees every entry, and none takes an entry away
  from another. Each entry names a pod whose status changed, and the pod's current
  `status` and `desired` entries are fetched by UID and applied (each batch read is
  fetched in two HMGETs and the listeners told once); the stream is only a
  wake-up, the tables are the truth, so nothing is acknowledged and a malformed entry is
  logged and skipped. The cursor starts at the stream's newest entry and a reload
  is asked for right after it was taken, so nothing published before is missed either;
  after a bus failure the cursor is taken afresh the same way;
- the **reloader** looks at both tables every `reload_interval_s`, which is how the
  view catches up with everything the stream cannot tell it: desired pods added or
  removed (pod-source's `pods` stream belongs to syncloop), an entry missed while the
  bus was away, and a Redis restart or flush. It reads both tables' generation counters
  in one round trip and reads a table again only when its counter moved, decoding only
  the rows whose text changed (klet.bus.tablecopy), and merges them into the view only
  when something changed: an idle node's reload reads two counters, where it read and
  decoded every desired pod and status every 5 s (issue 42: 40% of this service's idle
  CPU). Every `full_reload_interval_s` both tables are read in full anyway (still
  decoding only changed rows), for a write that did not go through the fenced write.

A reload and a stream refresh can interleave (both await Redis). A UID refreshed
from the stream after a reload began is left as the stream set it when that reload's
snapshot is merged, so an older snapshot never undoes a newer refresh; statuses are in
addition protected by the version rule.

Redis down: the last view keeps being served (it is "stale", see `stale`), both loops
retry with exponential back-off (`klet.retry`), the outage is logged once when it starts and once
when it ends, and the end triggers an immediate reload (which reads every table
whose generation moved meanwhile). A table whose generation counter Redis lost (restarted
empty) is kept as it was until its writer has written it again, for at most
`CachePolicy.keep_lost_s` (klet.bus.tablecopy): `/pods` and the apiserver's statuses do
not empty and fill again pod by pod while pod-source and syncloop republish, and the
statuses syncloop publishes meanwhile reach the view through the stream as always.

Cluster mode reads the same view (`desired_pods`, `known_pod`, `statuses`) and
subscribes to its changes, so a new status reaches the apiserver as soon as the stream
delivers it; subscribers must copy what they iterate across an await. The pods'
history (history.py) takes the status records each stream batch fetched
(`subscribe_statuses`) instead of reading the stream and the table a second time.

The PodList (`pod_list`) and its JSON body (`pod_list_json`) are built on the first read
after a change and kept until the next: the bench's `/pods` polls of a 250-pod burst
were most of this service's CPU when every request built and encoded the list afresh
(issue 42). Every change goes through `_changed`, which drops them; a periodic reload
that found the same pods and statuses keeps them.

Every replica of the service keeps its own complete view (see app.py): reading is not
gated on the lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

from klet.bus import BusError, Entry
from klet.bus.tablecopy import KEEP_LOST_S, CopiedTable, TableCopy, TableWatch
from klet.model.flowcontrol import BackoffPolicy
from klet.model.records import DesiredPod, PodStatusChange, PodStatusRecord
from klet.model.types import JSON, PodUID
from klet.obs import OnceLogger
from klet.retry import call_retrying
from klet.status_reporter.metrics.instruments import Metrics
from klet.status_reporter.pods import listing

log = logging.getLogger(__name__)


class DesiredTable(CopiedTable[DesiredPod], Protocol):
    """The `desired` table, as far as this service reads it: rows by key, and what a
    copy of it reads (klet.bus.tablecopy)."""

    async def get(self, key: str) -> DesiredPod | None: ...

    async def get_many(self, keys: Sequence[str]) -> dict[str, DesiredPod | None]: ...


class StatusTable(CopiedTable[PodStatusRecord], Protocol):
    """The `status` table, as far as this service reads it (as `DesiredTable`)."""

    async def get(self, key: str) -> PodStatusRecord | None: ...

    async def get_many(self, keys: Sequence[str]) -> dict[str, PodStatusRecord | None]: ...


class StatusFeed(Protocol):
    """The `podstatus` stream, read without a consumer group (`klet.bus.Stream`)."""

    async def last_id(self) -> str: ...

    async def tail(
        self, after: str, *, count: int, block_ms: int
    ) -> Sequence[Entry[PodStatusChange]]: ...


@dataclass(frozen=True)
class CachePolicy:
    """Timings of the pod view's loops (tests shrink them)."""

    reload_interval_s: float = 5.0
    """Seconds between looks at both tables (their generations; a table whose
    generation moved is read again)."""
    full_reload_interval_s: float = 60.0
    """Seconds between reads of both tables in full whatever their generations say
    (upstream's syncFrequency): a write that bypassed the fenced write shows within it."""
    read_count: int = 100
    """Stream entries read per call."""
    read_block_ms: int = 1000
    """How long one stream read waits for new entries, in milliseconds."""
    backoff_initial_s: float = 0.2
    """First retry delay after a bus failure, doubled per failure."""
    backoff_max_s: float = 5.0
    """Upper bound of the retry delay."""
    stale_after_s: float = 15.0
    """The view counts as stale when the last reload (a look at the generations counts)
    is older than this."""
    keep_lost_s: float = KEEP_LOST_S
    """Seconds a table Redis lost is kept as it was, waiting for its writer to write it
    again (klet.bus.tablecopy)."""

    def __post_init__(self) -> None:
        if self.full_reload_interval_s <= 0:
            raise ValueError(
                f"CachePolicy.full_reload_interval_s: must be > 0, got "
                f"{self.full_reload_interval_s!r}"
            )
        for name in (
            "reload_interval_s",
            "backoff_initial_s",
            "backoff_max_s",
            "stale_after_s",
            "keep_lost_s",
        ):
            value = getattr(self, name)
            if value < 0:
                raise ValueError(f"CachePolicy.{name}: must be >= 0, got {value!r}")
        for name in ("read_count", "read_block_ms"):
            value = getattr(self, name)
            if value < (1 if name == "read_count" else 0):
                raise ValueError(f"CachePolicy.{name}: out of range: {value!r}")

    @property
    def backoff(self) -> BackoffPolicy:
        return BackoffPolicy(self.backoff_initial_s, self.backoff_max_s)


class PodCache:
    """The in-memory pod view, its two refresh loops and their single-step drivers."""

    def __init__(
        self,
        *,
        desired: DesiredTable,
        status: StatusTable,
        feed: StatusFeed,
        metrics: Metrics,
        policy: CachePolicy = CachePolicy(),
        clock: Callable[[], float] = time.monotonic,
        encode: Callable[[JSON], bytes] = listing.encode_pod_list,
    ) -> None:
        self._desired_table = desired
        self._status_table = status
        self._desired_copy = TableCopy(desired)
        self._status_copy = TableCopy(status)
        self._tables = TableWatch(
            self._desired_copy,
            self._status_copy,
            full_every_s=policy.full_reload_interval_s,
            keep_lost_s=policy.keep_lost_s,
            clock=clock,
        )
        self._feed = feed
        self._metrics = metrics
        self._policy = policy
        self._clock = clock
        self._desired: dict[PodUID, JSON] = {}
        self._departed: dict[PodUID, JSON] = {}
        self._statuses: dict[PodUID, PodStatusRecord] = {}
        # The PodList and its encoding, built on the first read after a change and
        # dropped by `_changed`: every reader between two changes shares them.
        self._encode = encode
        self._list: JSON | None = None
        self._list_json: bytes | None = None
        # Sequence numbers of stream refreshes, so a reload knows what changed under it.
        self._seq = 0
        self._refreshed_at: dict[PodUID, int] = {}
        self._last_reload: float | None = None
        self._outage: str | None = None
        self._once = OnceLogger(log, level=logging.WARNING)
        self._cursor: str | None = None  # id of the last stream entry seen; None: take one
        self._wake = asyncio.Event()
        self._listeners: list[Callable[[], None]] = []
        self._status_listeners: list[Callable[[Sequence[PodStatusRecord]], None]] = []
        self.loaded = asyncio.Event()
        """Set after the first successful reload, a full read (readiness)."""
        self.settled = asyncio.Event()
        """Set once the view has loaded, or the bus failed before it could: from then on
        this replica has no better view to wait for. The ports that answer from the view
        open only then (app.py), so a replica that has just started never answers a
        reader with an empty pod list while another replica holds the full one."""

    # -- reading the view ---------------------------------------------------------------

    def desired_pods(self) -> Mapping[PodUID, JSON]:
        """The desired pods by UID (read-only; replaced, never mutated, on refresh)."""
        return MappingProxyType(self._desired)

    def known_pod(self, uid: PodUID) -> JSON | None:
        """The desired pod, or the last seen spec of one that left the desired set."""
        return self._desired.get(uid) or self._departed.get(uid)

    def statuses(self) -> Mapping[PodUID, PodStatusRecord]:
        """The latest status record of every pod that has one."""
        return MappingProxyType(self._statuses)

    def subscribe(self, callback: Callable[[], None]) -> None:
        """Call `callback` (synchronously, so keep it cheap) whenever the view changes."""
        self._listeners.append(callback)

    def subscribe_statuses(self, callback: Callable[[Sequence[PodStatusRecord]], None]) -> None:
        """Call `callback` (synchronously, so keep it cheap) with the status records
        fetched for the pods each stream batch named, as fetched (an older one the view
        drops included), once the batch is applied. Full reloads are not passed on."""
        self._status_listeners.append(callback)

    def pod_list(self) -> JSON:
        """The v1 PodList of the node's pods as of the latest refresh.

        Built once per change of the view and shared by every caller until the next
        one: read it, never mutate it.
        """
        if self._list is None:
            self._list = listing.pod_list(
                desired=self._desired, departed=self._departed, statuses=self._statuses
            )
        return self._list

    def pod_list_json(self) -> bytes:
        """`pod_list()` encoded as a `/pods` body, encoded once per change of the view:
        the read-only port and the kubelet API serve these bytes to every reader, so a
        poll of `/pods` costs no serialization while nothing changed (issue 42)."""
        if self._list_json is None:
            self._list_json = self._encode(self.pod_list())
        return self._list_json

    @property
    def bus_available(self) -> bool:
        return self._outage is None

    @property
    def stale(self) -> bool:
        """Whether the view may be behind: never loaded, bus down, or reload overdue."""
        if self._last_reload is None or self._outage is not None:
            return True
        return self._clock() - self._last_reload > self._policy.stale_after_s

    # -- single steps ---------------------------------------------------------------------

    async def reload(self) -> None:
        """Bring both tables' copies up to date (reading again only a table whose
        generation moved) and, if either changed, make them the view. Raises BusError."""
        start_seq = self._seq
        if await self._tables.refresh() or not self.loaded.is_set():
            self._merge(start_seq)
        else:
            # The tables are what the copies hold, and the stream refreshes since read
            # the same rows: nothing to merge, nothing an older snapshot could undo.
            self._refreshed_at = {u: s for u, s in self._refreshed_at.items() if s > start_seq}
        self._last_reload = self._clock()
        self._metrics.reloaded()
        if not self.loaded.is_set():
            log.info(
                "pod view loaded",
                extra={"desired": len(self._desired), "statuses": len(self._statuses)},
            )
            self.loaded.set()
            self.settled.set()

    def _merge(self, start_seq: int) -> None:
        """Make the copies the view, leaving the pods the stream refreshed since the
        reload began (stream sequence > `start_seq`) as the stream set them."""
        desired_snapshot = self._desired_copy.records
        status_snapshot = self._status_copy.records
        refreshed = frozenset(uid for uid, seq in self._refreshed_at.items() if seq > start_seq)

        desired = {PodUID(k): rec.pod for k, rec in desired_snapshot.items() if k not in refreshed}
        for uid in refreshed:
            if uid in self._desired:
                desired[uid] = self._desired[uid]
        old_desired, old_statuses = self._desired, self._statuses
        self._set_desired(desired)
        self._statuses = listing.merge_statuses(
            self._statuses,
            {PodUID(k): rec for k, rec in status_snapshot.items()},
            keep=refreshed,
        )
        self._refreshed_at = {u: s for u, s in self._refreshed_at.items() if s > start_seq}
        # Most reloads find what the stream already brought: the PodList built from the
        # same pods and statuses is the same, so its encoding is kept.
        self._changed(
            listing_changed=self._desired != old_desired or self._statuses != old_statuses
        )

    async def consume_once(self) -> int:
        """Read one batch from the stream (blocking up to read_block_ms) and apply it.

        Returns the number of entries handled. Raises BusError; the next call then takes
        a fresh cursor (the reload it asks for covers what was missed meanwhile).
        """
        if self._cursor is None:
            self._cursor = await self._feed.last_id()
            # Anything published before the cursor is in the tables: reload them now
            # rather than at the next interval.
            self._wake.set()
        entries = await self._feed.tail(
            self._cursor, count=self._policy.read_count, block_ms=self._policy.read_block_ms
        )
        uids: list[PodUID] = []
        for entry in entries:
            if entry.record is None:
                log.error(
                    "bad podstatus entry, skipped",
                    extra={"entry": entry.id, "error": entry.error},
                )
            else:
                uids.append(entry.record.uid)
        await self.refresh_pods(uids)
        if entries:  # only once the batch is applied: a failed read takes a fresh cursor
            self._cursor = entries[-1].id
        return len(entries)

    async def refresh_pod(self, uid: PodUID) -> None:
        """Fetch one pod's desired and status entries and apply them. Raises BusError."""
        await self.refresh_pods([uid])

    async def refresh_pods(self, uids: Sequence[PodUID]) -> None:
        """Fetch the desired and status entries of `uids` (two round trips for the whole
        batch: a burst of status changes is not read one pod after the other) and apply
        them, then tell the listeners once. Raises BusError."""
        unique = list(dict.fromkeys(uids))
        if not unique:
            return
        records = await self._status_table.get_many(unique)
        desireds = await self._desired_table.get_many(unique)
        for uid in unique:
            self._apply_pod(uid, records.get(uid), desireds.get(uid))
        self._changed()
        if self._status_listeners:
            fetched = [r for r in records.values() if r is not None]
            for listener in self._status_listeners:
                listener(fetched)

    def _apply_pod(
        self, uid: PodUID, record: PodStatusRecord | None, desired: DesiredPod | None
    ) -> None:
        self._seq += 1
        self._refreshed_at[uid] = self._seq
        if desired is None:
            gone = self._desired.pop(uid, None)
            if gone is not None:
                self._departed[uid] = gone
        else:
            self._desired[uid] = desired.pod
            self._departed.pop(uid, None)
        current = self._statuses.get(uid)
        if record is None:
            self._statuses.pop(uid, None)
        elif listing.supersedes(record, current):
            self._statuses[uid] = record
        elif current is not None and record.version != current.version:
            log.debug(
                "dropped stale status",
                extra={"uid": uid, "version": record.version, "have": current.version},
            )

    # -- loops ----------------------------------------------------------------------------

    async def run_consumer(self) -> None:
        """Consume the podstatus stream until cancelled, surviving bus outages."""
        while True:
            await call_retrying(
                self.consume_once, self._policy.backoff, on=BusError, on_failure=self._stream_failed
            )
            self._bus_ok()

    def _stream_failed(self, err: BaseException | None) -> None:
        # The stream may be gone with the data (restart, flush): start afresh.
        self._cursor = None
        self._bus_failed("stream", err)

    async def run_reloader(self) -> None:
        """Reload both tables every reload_interval_s until cancelled."""
        while True:
            await call_retrying(
                self._reload_after_wake,
                self._policy.backoff,
                on=BusError,
                on_failure=lambda err: self._bus_failed("reload", err),
                sleep=self._until_woken,
            )
            self._bus_ok()
            await self._until_woken(self._policy.reload_interval_s)

    async def _reload_after_wake(self) -> None:
        # Cleared before the reload: a wake-up asked for while it runs (a new stream
        # cursor, the bus back) may need a newer snapshot, so it is kept.
        self._wake.clear()
        await self.reload()

    async def _until_woken(self, delay: float) -> None:
        """Wait `delay`, or less when a reload is asked for."""
        # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation
        # that races with the event being set, and the task would never stop.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await self._wake.wait()

    # -- internals ------------------------------------------------------------------------

    def _set_desired(self, desired: dict[PodUID, JSON]) -> None:
        """Replace the desired pods, remembering the spec of those that left."""
        for uid, pod in self._desired.items():
            if uid not in desired:
                self._departed[uid] = pod
        for uid in desired:
            self._departed.pop(uid, None)
        self._desired = desired

    def _changed(self, *, listing_changed: bool = True) -> None:
        if listing_changed:
            self._list = None
            self._list_json = None
        # A departed spec is only useful while the union rule still lists its pod.
        listed = listing.listed_uids(self._desired, self._statuses)
        self._departed = {u: p for u, p in self._departed.items() if u in listed}
        self._metrics.observe(rec.status for uid, rec in self._statuses.items() if uid in listed)
        self._metrics.observe_pods(
            (pod, _phase(self._statuses.get(uid))) for uid, pod in self._desired.items()
        )
        for callback in self._listeners:
            callback()

    def _bus_failed(self, where: str, err: BaseException | None) -> None:
        self._metrics.bus_error()
        reason = f"{type(err).__name__}: {err}"
        # One line per outage, whatever each retry's error says; details at DEBUG.
        if not self._once.error("bus", "bus unavailable, serving the last pod view", op=where):
            log.debug("bus still unavailable", extra={"op": where, "error": reason})
        self._outage = reason
        self.settled.set()

    def _bus_ok(self) -> None:
        if self._outage is not None:
            self._once.clear("bus", "bus available again, reloading the pod view")
            self._outage = None
            self._wake.set()


def _phase(record: PodStatusRecord | None) -> str | None:
    phase = record.status.get("phase") if record is not None else None
    return phase if isinstance(phase, str) else None
