"""Events syncloop records (Pulling, Created, Started, Killing, BackOff, ...).

`EventSink` is the interface the managers use; `BusEventSink` queues records and a root
task appends them to the `events` stream, so recording an event never blocks a pod
worker and a Redis outage only delays (or, past the queue cap, drops) events.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Protocol

from klet.bus import BusUnavailable, NodeBus
from klet.model.records import EventRecord
from klet.model.types import JSON

log = logging.getLogger(__name__)


class EventSink(Protocol):
    def emit(
        self, pod: JSON, type_: str, reason: str, message: str, *, field_path: str = ""
    ) -> None: ...


def event_record(
    pod: JSON, type_: str, reason: str, message: str, field_path: str, now: float
) -> EventRecord:
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
    return EventRecord(
        type=type_, reason=reason, message=message, involved=involved, component="kubelet", at=now
    )


class BusEventSink:
    def __init__(self, bus: NodeBus, *, cap: int = 1000) -> None:
        self.bus = bus
        self._queue: deque[EventRecord] = deque(maxlen=cap)
        self._wake = asyncio.Event()
        self.dropped = 0

    def emit(
        self, pod: JSON, type_: str, reason: str, message: str, *, field_path: str = ""
    ) -> None:
        if len(self._queue) == self._queue.maxlen:
            self.dropped += 1
        self._queue.append(event_record(pod, type_, reason, message, field_path, time.time()))
        self._wake.set()

    async def run(self) -> None:
        down = False
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                record = self._queue[0]
                try:
                    await self.bus.events.publish(record)
                except BusUnavailable as err:
                    if not down:
                        log.warning("cannot publish events, will retry", extra={"error": str(err)})
                        down = True
                    await asyncio.sleep(1.0)
                    continue
                down = False
                self._queue.popleft()
