"""Events syncloop records (Pulling, Created, Started, Killing, BackOff, ...).

`EventSink` is the interface the managers use; `BusEventSink` puts a pod's events on
the shared `klet.bus.eventqueue.EventQueue`, whose root task appends them to the `events`
stream, so recording an event never blocks a pod worker and a Redis outage only delays
(or, past the queue cap, drops) events.

The queue gathers for `COALESCE_S` after an Event before it writes: a pod start's
Events (Pulled, Created, Started) come a CRI call or two apart, and with the window they
reach the bus in one fenced write instead of one each (issue 42). The cost is latency:
each Event is on the stream up to `COALESCE_S` later, so posted to the apiserver and
shown by `klet why` that much later.
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


COALESCE_S = 0.25
"""Seconds the queue gathers Events after the first before one write carries them."""


class BusEventSink:
    def __init__(self, bus: NodeBus, *, cap: int = 1000, coalesce_s: float = COALESCE_S) -> None:
        self.queue = EventQueue(bus.events, cap=cap, coalesce_s=coalesce_s)

    def emit(
        self, pod: JSON, type_: str, reason: str, message: str, *, field_path: str = ""
    ) -> None:
        self.queue.emit(pod_reference(pod, field_path=field_path), type_, reason, message)

    async def run(self) -> None:
        await self.queue.run()
