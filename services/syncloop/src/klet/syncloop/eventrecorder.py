"""Events syncloop records (Pulling, Created, Started, Killing, BackOff, ...).

`EventSink` is the interface the managers use; `BusEventSink` puts a pod's events on
the shared `klet.bus.eventqueue.EventQueue`, whose root task appends them to the `events`
stream, so recording an event never blocks a pod worker and a Redis outage only delays
(or, past the queue cap, drops) events.

A pod start's Events that are queued when the queue's task wakes go in one bus write
(issue 42); the queue does not wait to gather more (see klet.bus.eventqueue for why).
"""

from __future__ import annotations

from typing import Protocol

from klet.bus import NodeBus
from klet.bus.eventqueue import EventQueue, pod_reference
from klet.model.types import JSON


class EventSink(Protocol):
    def emit(
        self, pod: JSON, type_: str, reason: str, message: str, *, field_path: str = ""
    ) -> None: ...


class BusEventSink:
    def __init__(self, bus: NodeBus, *, cap: int = 1000) -> None:
        self.queue = EventQueue(bus.events, cap=cap)

    def emit(
        self, pod: JSON, type_: str, reason: str, message: str, *, field_path: str = ""
    ) -> None:
        self.queue.emit(pod_reference(pod, field_path=field_path), type_, reason, message)

    async def run(self) -> None:
        await self.queue.run()
