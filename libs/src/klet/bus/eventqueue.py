"""The queue every service records Kubernetes Events through, onto its own bus stream
`events:<service>` (status-reporter posts them all to the apiserver).

`emit` only queues, so recording an Event never blocks a pod worker or a GC or eviction
pass on Redis; the `run` root task publishes in order. While Redis is away (or a write
is fenced) it retries every `retry_s`, logging the outage once; a full queue drops the
oldest record, counted in `dropped`. Fencing needs nothing here: a fenced write marks
the lease lost and the service's lease loop stops the process.

The reasons and messages stay with the services that record them; this module only
builds the record (component "kubelet", as upstream's recorder) and the Node reference
upstream's kubelet uses for node Events (the node name as its UID).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

from klet.bus.redisbus import BusError
from klet.model.records import EventRecord
from klet.model.types import JSON

log = logging.getLogger(__name__)


class EventStream(Protocol):
    async def publish(self, record: EventRecord) -> str: ...


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
    ) -> None:
        self.stream = stream
        self.retry_s = retry_s
        self.clock = clock
        self.queue: deque[EventRecord] = deque(maxlen=cap)
        self.dropped = 0
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
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self.queue:
                try:
                    await self.stream.publish(self.queue[0])
                except BusError as err:
                    if not down:
                        log.warning("cannot publish events, will retry", extra={"error": str(err)})
                        down = True
                    await asyncio.sleep(self.retry_s)
                    continue
                down = False
                self.queue.popleft()
            self._empty.set()
