"""The node's pods as this service sees them: desired pods joined with their latest status.

A manager (state + two loops) around the pure rules in `listing.py`:

- the **consumer** reads the `podstatus` stream in the consumer group "status-reporter";
  each entry names a pod whose status changed, and the pod's current `status` and
  `desired` entries are fetched by UID and applied. The stream is only a wake-up: the
  tables are the truth, so an entry is acknowledged once its pod has been refreshed,
  and a malformed entry is logged and acknowledged (re-reading it would never help).
  Entries a dead consumer left pending are taken over at start and every
  `reclaim_interval_s`, and dead consumers are removed from the group then;
- the **reloader** reads both tables in full every `reload_interval_s`. That is cheap
  (one HGETALL each, at most a few hundred pods) and is how the view catches up with
  everything the stream cannot tell it: desired pods added or removed (pod-source's
  `pods` stream belongs to syncloop), entries another replica consumed, and a Redis
  restart or flush.

A full reload and a stream refresh can interleave (both await Redis). A UID refreshed
from the stream after a reload began is left as the stream set it when that reload's
snapshot is merged, so an older snapshot never undoes a newer refresh; statuses are in
addition protected by the version rule.

Redis down: the last view keeps being served (it is "stale", see `stale`), both loops
retry with exponential back-off, the outage is logged once when it starts and once
when it ends, and the end triggers an immediate full reload.

Cluster mode reads the same view (`desired_pods`, `known_pod`, `statuses`) and
subscribes to its changes, so a new status reaches the apiserver as soon as the stream
delivers it; subscribers must copy what they iterate across an await.

With more than one replica each one reads only part of the stream (that is what a
consumer group does), so a replica's view of the other entries lags by at most one
reload interval. Standalone mode runs one replica; good enough until a replica needs
exact freshness.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

from klet.bus import BusError, Entry, GroupStream
from klet.model.flowcontrol import BackoffPolicy, RetryDelay
from klet.model.records import DesiredPod, PodStatusChange, PodStatusRecord
from klet.model.types import JSON, PodUID
from klet.obs import OnceLogger
from klet.status_reporter import listing
from klet.status_reporter.metrics import Metrics

log = logging.getLogger(__name__)

GROUP = "status-reporter"


class DesiredTable(Protocol):
    """The `desired` table, as far as this service reads it."""

    async def get(self, key: str) -> DesiredPod | None: ...

    async def all(self) -> dict[str, DesiredPod]: ...


class StatusTable(Protocol):
    """The `status` table, as far as this service reads it."""

    async def get(self, key: str) -> PodStatusRecord | None: ...

    async def all(self) -> dict[str, PodStatusRecord]: ...


StatusFeed = GroupStream[PodStatusChange]
"""The `podstatus` stream, consumed in a consumer group."""


@dataclass(frozen=True)
class CachePolicy:
    """Timings of the pod view's loops (tests shrink them)."""

    reload_interval_s: float = 5.0
    """Seconds between full reloads of both tables."""
    read_count: int = 100
    """Stream entries read per call."""
    read_block_ms: int = 1000
    """How long one stream read waits for new entries, in milliseconds."""
    claim_idle_ms: int = 30_000
    """Pending entries idle this long (a consumer died before acking) are taken over."""
    reclaim_interval_s: float = 300.0
    """Seconds between takeovers after the first: a replica that died since is
    reclaimed, and dead consumers are removed from the group (`Stream.claim_stale`)."""
    backoff_initial_s: float = 0.2
    """First retry delay after a bus failure, doubled per failure."""
    backoff_max_s: float = 5.0
    """Upper bound of the retry delay."""
    stale_after_s: float = 15.0
    """The view counts as stale when the last full reload is older than this."""

    def __post_init__(self) -> None:
        for name in (
            "reload_interval_s",
            "reclaim_interval_s",
            "backoff_initial_s",
            "backoff_max_s",
            "stale_after_s",
        ):
            value = getattr(self, name)
            if value < 0:
                raise ValueError(f"CachePolicy.{name}: must be >= 0, got {value!r}")
        for name in ("read_count", "read_block_ms", "claim_idle_ms"):
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
        consumer: str,
        metrics: Metrics,
        policy: CachePolicy = CachePolicy(),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._desired_table = desired
        self._status_table = status
        self._feed = feed
        self._consumer = consumer
        self._metrics = metrics
        self._policy = policy
        self._clock = clock
        self._desired: dict[PodUID, JSON] = {}
        self._departed: dict[PodUID, JSON] = {}
        self._statuses: dict[PodUID, PodStatusRecord] = {}
        # Sequence numbers of stream refreshes, so a reload knows what changed under it.
        self._seq = 0
        self._refreshed_at: dict[PodUID, int] = {}
        self._last_reload: float | None = None
        self._outage: str | None = None
        self._once = OnceLogger(log, level=logging.WARNING)
        self._group_ready = False
        self._reclaim_at = 0.0  # clock time of the next stale-entry takeover
        self._wake = asyncio.Event()
        self._listeners: list[Callable[[], None]] = []
        self.loaded = asyncio.Event()
        """Set after the first successful full reload (readiness)."""

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

    def pod_list(self) -> JSON:
        """The v1 PodList of the node's pods as of the latest refresh."""
        return listing.pod_list(
            desired=self._desired, departed=self._departed, statuses=self._statuses
        )

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
        """Read both tables in full and make them the view. Raises BusError."""
        start_seq = self._seq
        desired_snapshot = await self._desired_table.all()
        status_snapshot = await self._status_table.all()
        refreshed = frozenset(uid for uid, seq in self._refreshed_at.items() if seq > start_seq)

        desired = {PodUID(k): rec.pod for k, rec in desired_snapshot.items() if k not in refreshed}
        for uid in refreshed:
            if uid in self._desired:
                desired[uid] = self._desired[uid]
        self._set_desired(desired)
        self._statuses = listing.merge_statuses(
            self._statuses,
            {PodUID(k): rec for k, rec in status_snapshot.items()},
            keep=refreshed,
        )
        self._refreshed_at = {u: s for u, s in self._refreshed_at.items() if s > start_seq}
        self._changed()
        self._last_reload = self._clock()
        self._metrics.reloaded()
        if not self.loaded.is_set():
            log.info(
                "pod view loaded",
                extra={"desired": len(self._desired), "statuses": len(self._statuses)},
            )
            self.loaded.set()

    async def consume_once(self) -> int:
        """Read one batch from the stream (blocking up to read_block_ms) and apply it.

        Returns the number of entries handled. Raises BusError, leaving the batch
        unacknowledged (it is taken over again later, and the reload covers it anyway).
        """
        now = self._clock()
        if not self._group_ready or now >= self._reclaim_at:
            if not self._group_ready:
                await self._feed.ensure_group(GROUP)
            stale = await self._feed.claim_stale(
                GROUP, self._consumer, min_idle_ms=self._policy.claim_idle_ms
            )
            self._group_ready = True
            self._reclaim_at = now + self._policy.reclaim_interval_s
            await self._apply(stale)
        entries = await self._feed.read(
            GROUP,
            self._consumer,
            count=self._policy.read_count,
            block_ms=self._policy.read_block_ms,
        )
        await self._apply(entries)
        return len(entries)

    async def refresh_pod(self, uid: PodUID) -> None:
        """Fetch one pod's desired and status entries and apply them. Raises BusError."""
        record = await self._status_table.get(uid)
        desired = await self._desired_table.get(uid)
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
        self._changed()

    # -- loops ----------------------------------------------------------------------------

    async def run_consumer(self) -> None:
        """Consume the podstatus stream until cancelled, surviving bus outages."""
        backoff = RetryDelay(self._policy.backoff)
        while True:
            try:
                await self.consume_once()
            except BusError as err:
                # The group may be gone with the data (restart, flush): set it up again.
                self._group_ready = False
                self._bus_failed("stream", err)
                await asyncio.sleep(backoff.next())
                continue
            backoff.reset()
            self._bus_ok()

    async def run_reloader(self) -> None:
        """Reload both tables every reload_interval_s until cancelled."""
        backoff = RetryDelay(self._policy.backoff)
        while True:
            try:
                await self.reload()
            except BusError as err:
                self._bus_failed("reload", err)
                delay = backoff.next()
            else:
                backoff.reset()
                self._bus_ok()
                delay = self._policy.reload_interval_s
            self._wake.clear()
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation
            # that races with the event being set, and the task would never stop.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._wake.wait()

    # -- internals ------------------------------------------------------------------------

    async def _apply(self, entries: Iterable[Entry[PodStatusChange]]) -> None:
        done: list[str] = []
        for entry in entries:
            if entry.record is None:
                log.error(
                    "bad podstatus entry, acknowledging without applying",
                    extra={"entry": entry.id, "error": entry.error},
                )
            else:
                await self.refresh_pod(entry.record.uid)
            done.append(entry.id)
        if done:
            await self._feed.ack(GROUP, *done)

    def _set_desired(self, desired: dict[PodUID, JSON]) -> None:
        """Replace the desired pods, remembering the spec of those that left."""
        for uid, pod in self._desired.items():
            if uid not in desired:
                self._departed[uid] = pod
        for uid in desired:
            self._departed.pop(uid, None)
        self._desired = desired

    def _changed(self) -> None:
        # A departed spec is only useful while the union rule still lists its pod.
        listed = listing.listed_uids(self._desired, self._statuses)
        self._departed = {u: p for u, p in self._departed.items() if u in listed}
        self._metrics.observe(rec.status for uid, rec in self._statuses.items() if uid in listed)
        for callback in self._listeners:
            callback()

    def _bus_failed(self, where: str, err: BusError) -> None:
        self._metrics.bus_error()
        reason = f"{type(err).__name__}: {err}"
        # One line per outage, whatever each retry's error says; details at DEBUG.
        if not self._once.error("bus", "bus unavailable, serving the last pod view", op=where):
            log.debug("bus still unavailable", extra={"op": where, "error": reason})
        self._outage = reason

    def _bus_ok(self) -> None:
        if self._outage is not None:
            self._once.clear("bus", "bus available again, reloading the pod view")
            self._outage = None
            self._wake.set()
