"""Posts the bus's EventRecords to the apiserver as core/v1 Events (the manager around
`eventbodies.py`).

Every service's `events:<service>` stream is consumed, as one (`NodeBus.event_feed`), in
the consumer group "status-reporter", by the lease holder only (see app.py), under a
consumer name of its own process (its lease holder ID). Its first takeover, when it is
elected, claims every pending entry whatever its idle time: only a leader consumes, so
whatever is pending was read by a previous leader
that is gone (dead, or stepped down) and may never be posted otherwise. Later takeovers
(every few minutes) claim entries idle for `claim_idle_ms`, and dead consumers are
removed from the group each time. An entry is acknowledged once its Event exists, or
once it is given up on:

- a malformed entry is logged and acknowledged (reading it again would never help);
- a record for a pod's history only (`klet.model.podhistory.HISTORY_ONLY`) is acknowledged
  unposted;
- an Event the apiserver refuses (Invalid, Forbidden, ...) is logged and dropped;
- an unavailable apiserver is retried with back-off (`klet.retry`) up to `max_tries`
  times (upstream's recorder gives up after 12), the outage logged once, so a short
  outage loses nothing and a long one does not hold the stream forever.

Each record goes through `eventbodies.Correlator` (client-go's EventCorrelator: similar
events combined, identical ones counted into one Event by PATCH, a spam filter per
involved object) before the node-wide eventRecordQPS limit. A record the spam filter
holds back is acknowledged unposted; its occurrence is in the count of the next Event
posted for it.

Redelivery after a crash or a handover is harmless for a new Event: its name derives
from the record's time, so creating it again answers AlreadyExists, which counts as
done. The correlation memory is per process, as upstream's: an entry the old leader
had already counted into an existing Event (a PATCH) and not yet acknowledged when it
died becomes an Event of its own when redelivered, and a new leader starts with full
spam buckets.

A static pod's events are posted against its mirror pod (`mirror_uid`), as the
apiserver knows no object with the static pod's UID; before a mirror exists they keep
the static UID.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from klet.bus import BusError, Entry, GroupStream
from klet.kube import Conflict, KubeError, NotFound, Unavailable
from klet.model.flowcontrol import BackoffPolicy, TokenBucket
from klet.model.podhistory import history_only
from klet.model.records import EventRecord
from klet.model.types import PodUID
from klet.obs import OnceLogger
from klet.retry import call_retrying
from klet.status_reporter.cluster import eventbodies
from klet.status_reporter.cluster.kubeapi import KubeApi

log = logging.getLogger(__name__)

GROUP = "status-reporter"

MirrorLookup = Callable[[PodUID], "str | None"]


EventFeed = GroupStream[EventRecord]
"""The services' Events streams, consumed as one in a consumer group."""


@dataclass(frozen=True)
class EventPolicy:
    qps: float = 50.0
    """eventRecordQPS (0 = unlimited)."""
    burst: int = 100
    """eventBurst."""
    window_s: float = eventbodies.AGGREGATION_WINDOW_S
    spam_burst: int = eventbodies.SPAM_BURST
    """Events one object may have posted at once (client-go's spam filter)..."""
    spam_qps: float = eventbodies.SPAM_QPS
    """...refilled at this rate (one every 5 minutes)."""
    max_tries: int = 12
    """Tries of one Event while the apiserver is unavailable, then it is dropped."""
    retry: BackoffPolicy = field(default_factory=lambda: BackoffPolicy(0.5, 5.0))
    bus_backoff: BackoffPolicy = field(default_factory=lambda: BackoffPolicy(0.2, 5.0))
    read_count: int = 100
    read_block_ms: int = 1000
    claim_idle_ms: int = 30_000
    """Pending entries idle this long are claimed by the periodic takeovers (the first
    one, at election, claims them all)."""
    reclaim_interval_s: float = 300.0
    """Seconds between takeovers of a dead consumer's entries after the first; dead
    consumers are removed from the group at the same time (`Stream.claim_stale`)."""


class EventSink:
    """Consumes the Events streams and posts each record; `post` is one step."""

    def __init__(
        self,
        *,
        feed: EventFeed,
        api: KubeApi,
        node_name: str,
        mirror_uid: MirrorLookup,
        consumer: str,
        policy: EventPolicy = EventPolicy(),
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._feed = feed
        self._api = api
        self._node = node_name
        self._mirror_uid = mirror_uid
        self._consumer = consumer
        self._policy = policy
        self._monotonic = monotonic
        self._correlator = eventbodies.Correlator(
            window_s=policy.window_s,
            spam_burst=policy.spam_burst,
            spam_qps=policy.spam_qps,
        )
        self._bucket = TokenBucket(policy.qps, policy.burst, now=monotonic())
        self._group_ready = False
        self._taken_over = False  # the takeover at election is done
        self._reclaim_at = 0.0  # monotonic time of the next stale-entry takeover
        self._once = OnceLogger(log, level=logging.WARNING)
        self.posted = 0
        """Events created or counted (tests and metrics)."""
        self.filtered = 0
        """Records the spam filter held back (counted into their Events, not posted)."""

    async def post(self, record: EventRecord) -> None:
        """Correlate the record (eventbodies.Correlator), then create its Event, raise the
        count of the one it joins, or, held back by the spam filter, only count it.
        Raises KubeError."""
        ref = eventbodies.involved_object(record.involved)
        if ref.get("kind") == "Pod" and ref.get("uid"):
            mirror = self._mirror_uid(PodUID(ref["uid"]))
            if mirror:
                ref["uid"] = mirror
        namespace = eventbodies.event_namespace(ref)
        found = self._correlator.correlate(record, ref)
        if found.skip:
            self.filtered += 1
            return
        decision = found.post
        await self._throttle()
        if decision.kind == "patch":
            try:
                await self._api.patch_event(
                    namespace,
                    decision.name,
                    eventbodies.count_patch(
                        decision.count, record.at, found.message if found.combined else None
                    ),
                )
            except NotFound:
                pass  # gone (the apiserver's TTL): created again, as upstream, with its count
            else:
                self._correlator.posted(found, decision, at=record.at)
                self.posted += 1
                return
        body = eventbodies.new_event(
            record,
            ref,
            node_name=self._node,
            name=decision.name,
            message=found.message,
            count=decision.count,
        )
        try:
            await self._api.create_event(body)
        except Conflict:
            pass  # created by an earlier delivery of the same record
        self._correlator.posted(found, decision, at=record.at)
        self.posted += 1

    async def _throttle(self) -> None:
        delay = self._bucket.take(self._monotonic())
        if delay > 0:
            await asyncio.sleep(delay)

    async def handle(self, entry: Entry[EventRecord]) -> None:
        """Post one entry's event, retrying an unavailable apiserver (bounded)."""
        record = entry.record
        if record is None:
            log.error(
                "bad events entry, acknowledging without posting",
                extra={"entry": entry.id, "error": entry.error},
            )
            return
        if history_only(record):
            return  # for `klet why` only: upstream posts no such Event
        try:
            await call_retrying(
                lambda: self.post(record),
                self._policy.retry,
                on=Unavailable,
                attempts=self._policy.max_tries,
                on_failure=self._post_failed,
            )
        except Unavailable:
            log.error(
                "event dropped after retries",
                extra={"reason": record.reason, "tries": self._policy.max_tries},
            )
            return
        except KubeError as err:
            log.error(
                "event refused by the apiserver, dropping it",
                extra={"reason": record.reason, "error": str(err)},
            )
            return
        self._once.clear("api", "posting events again")

    def _post_failed(self, err: BaseException | None) -> None:
        self._once.error("api", "cannot post events, apiserver unavailable", error=str(err))

    async def consume_once(self) -> int:
        """Read one batch (blocking up to read_block_ms), post and acknowledge it.

        Raises BusError, leaving unacknowledged entries pending (claimed again later).
        """
        now = self._monotonic()
        if not self._group_ready or now >= self._reclaim_at:
            if not self._group_ready:
                await self._feed.ensure_group(GROUP)
            stale = await self._feed.claim_stale(
                GROUP,
                self._consumer,
                min_idle_ms=self._policy.claim_idle_ms if self._taken_over else 0,
            )
            self._taken_over = True
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

    async def _apply(self, entries: Iterable[Entry[EventRecord]]) -> None:
        for entry in entries:
            await self.handle(entry)
            await self._feed.ack(GROUP, entry.id)

    async def run(self) -> None:
        """Consume the stream until cancelled, surviving bus outages."""
        while True:
            await call_retrying(
                self.consume_once,
                self._policy.bus_backoff,
                on=BusError,
                on_failure=self._consume_failed,
            )
            self._once.clear("bus", "reading the events stream again")

    def _consume_failed(self, err: BaseException | None) -> None:
        self._group_ready = False
        self._once.error("bus", "cannot read the events stream", error=str(err))
