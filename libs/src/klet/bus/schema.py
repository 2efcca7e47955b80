"""The node's tables and streams by name, typed by their records (DESIGN.md, "The bus")."""

from __future__ import annotations

from dataclasses import dataclass

from klet.bus.redisbus import Bus, Stream, Table
from klet.model.records import (
    DesiredPod,
    EventRecord,
    ImageUseRecord,
    NodeConditionRecord,
    PodChange,
    PodStatusChange,
    PodStatusRecord,
    SourceState,
)


@dataclass(frozen=True)
class NodeBus:
    """Every table and stream of one node, built once from a `Bus`."""

    bus: Bus
    desired: Table[DesiredPod]
    sources: Table[SourceState]
    status: Table[PodStatusRecord]
    pods: Stream[PodChange]
    podstatus: Stream[PodStatusChange]
    events: Stream[EventRecord]
    node: Table[NodeConditionRecord]
    """Node condition contributions by service, keyed `<service>:<conditionType>`."""
    images: Table[ImageUseRecord]
    """Image GC's first-detected and last-used times, keyed by image ID."""

    @classmethod
    def of(cls, bus: Bus) -> NodeBus:
        return cls(
            bus=bus,
            desired=bus.table("desired", DesiredPod),
            sources=bus.table("sources", SourceState),
            status=bus.table("status", PodStatusRecord),
            pods=bus.stream("pods", PodChange),
            podstatus=bus.stream("podstatus", PodStatusChange),
            events=bus.stream("events", EventRecord),
            node=bus.table("node", NodeConditionRecord),
            images=bus.table("images", ImageUseRecord),
        )
