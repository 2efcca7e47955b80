"""Events syncloop records (Pulling, Created, Started, Killing, BackOff, ...).

`EventSink` is the interface the managers use; `BusEventSink` puts a pod's events on
the shared `klet.bus.events.EventQueue`, whose root task appends them to the `events`
stream, so recording an event never blocks a pod worker and a Redis outage only delays
(or, past the queue cap, drops) events.
"""

from __future__ import annotations

from typing import Protocol

from klet.bus import NodeBus
from klet.bus.events import EventQueue
from klet.model.types import JSON


class EventSink(Protocol):
    def emit(
        self, pod: JSON, type_: str, reason: str, message: str, *, field_path: str = ""
    ) -> None: ...


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


class BusEventSink:
    def __init__(self, bus: NodeBus, *, cap: int = 1000) -> None:
        self.queue = EventQueue(bus.events, cap=cap)

    def emit(
        self, pod: JSON, type_: str, reason: str, message: str, *, field_path: str = ""
    ) -> None:
        self.queue.emit(pod_reference(pod, field_path=field_path), type_, reason, message)

    async def run(self) -> None:
        await self.queue.run()
