"""The queue every service records Kubernetes Events through, onto its own bus stream
`events:<service>` (status-reporter posts them all to the apiserver).

`emit` only queues, so recording an Event never blocks a pod worker or a GC or eviction
pass on Redis; the `run` root task publishes in order. Everything queued when it wakes
goes in one bus write (`publish_many`, up to `BATCH` records a write; issue 42: one
write per Event was about four fenced calls per pod start). There is no gathering
window: with one (0.25 s, tried 2026-11-29) a pod start's Events went in one or two
writes instead of three or four, but each Event then reached the stream after the status
change that follows it, and readers that see the status and look for its Event (`klet
why`, the apiserver's Events, the tests) found none yet. A write
is all or nothing (one fenced call on a leader bus, MULTI/EXEC otherwise), so a batch
is taken off the queue only once written, never half. While Redis is away (or a write
is fenced) it retries every `retry_s`, logging the outage once; a full queue drops the
oldest record, counted in `dropped`. Fencing needs nothing here: a fenced write marks
the lease lost and the service's lease loop stops the process. A write the bus refuses
for what it holds (`WriteTooLarge`, `BadWrite`: retrying cannot help) is tried again
one record at a time, and the record refused alone is logged, dropped and counted in
`refused`, so one bad Event cannot stop those behind it.

The reasons and messages stay with the services that record them; this module only
builds the record (component "kubelet", as upstream's recorder) and the Node reference
upstream's kubelet uses for node Events (the node name as its UID).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from klet.bus.redisbus import BadWrite, BusError, WriteTooLarge
from klet.model.records import EventRecord
from klet.model.types import JSON

log = logging.getLogger(__name__)


BATCH = 100
"""Records in one write at most: 100 Events of the largest entry the bus takes
(klet.bus.functions.MAX_ENTRY_BYTES, 64 KiB) are 6.4 MB, well under one call's
MAX_WRITE_BYTES."""


class EventStream(Protocol):
    async def publish_many(self, records: Sequence[EventRecord]) -> list[str]: ...


def node_reference(node_name: str) -> JSON:
    """The involved object of an Event about this node."""
    return {"kind": "Node", "name": node_name, "uid": node_name, "apiVersion": "v1"}


def pod_reference(pod: JSON, *, field_path: str = "") -> JSON:
    """The involved object of an Event about `pod` (or one of its containers)."""
    meta = pod.get("metadata") or {}
    involved: JSON = {
        "kind": "Pod",
        "namespace": meta.get("namespace", "default"),
        "name": meta.get("name", ""),
        "uid": meta.get("uid", ""),
        "apiVersion": "v1",
    }
    if field_path:
        involved["fieldPath"] = field_path
    return involved


class EventQueue:
    """Events waiting for the service's `events:<service>` stream, at most `cap` of them."""

    def __init__(
        self,
        stream: EventStream,
        *,
        cap: int,
        retry_s: float = 1.0,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.stream = stream
        self.retry_s = retry_s
        self.clock = clock
        self.sleep = sleep
        self.queue: deque[EventRecord] = deque(maxlen=cap)
        self.dropped = 0
        self.refused = 0
        self._wake = asyncio.Event()
        self._empty = asyncio.Event()  # set while nothing waits to be published
        self._empty.set()

    def emit(
        self, involved: JSON, type_: str, reason: str, message: str, *, extra: JSON | None = None
    ) -> None:
        """Queue an Event (`type_` Normal or Warning) about `involved`; `extra` as
        `EventRecord.extra` (klet.model.podhistory.HISTORY_ONLY and its detail)."""
        if len(self.queue) == self.queue.maxlen:
            self.dropped += 1
        self.queue.append(
            EventRecord(
                type=type_,
                reason=reason,
                message=message,
                involved=involved,
                component="kubelet",
                at=self.clock(),
                extra=extra or {},
            )
        )
        self._empty.clear()
        self._wake.set()

    async def published(self) -> None:
        """Return once every Event queued so far has reached the stream (a service
        about to exit waits for its last Warning with this, under a timeout)."""
        await self._empty.wait()

    async def run(self) -> None:
        down = False
        alone = 0  # records still to write one at a time, after a refused batch
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self.queue:
                batch = list(itertools.islice(self.queue, 1 if alone else BATCH))
                dropped = self.dropped
                try:
                    await self.stream.publish_many(batch)
                except (WriteTooLarge, BadWrite) as err:
                    if len(batch) > 1:
                        alone = len(batch)
                        continue
                    log.error(
                        "event refused by the bus, dropped",
                        extra={"reason": batch[0].reason, "error": str(err)},
                    )
                    self.refused += 1
                    self._take(batch, dropped)
                    alone = max(0, alone - 1)
                    continue
                except BusError as err:
                    if not down:
                        log.warning("cannot publish events, will retry", extra={"error": str(err)})
                        down = True
                    await self.sleep(self.retry_s)
                    continue
                down = False
                self._take(batch, dropped)
                alone = max(0, alone - len(batch))
            self._empty.set()

    def _take(self, batch: list[EventRecord], dropped_before: int) -> None:
        """Remove `batch`, the queue's oldest records when its write began, from the
        queue. A full queue may have dropped some of them meanwhile (`emit` drops the
        oldest): those are gone already, and were written after all."""
        lost = min(len(batch), self.dropped - dropped_before)
        self.dropped -= lost
        for _ in range(len(batch) - lost):
            self.queue.popleft()
