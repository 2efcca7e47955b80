"""The node's tables and streams by name, typed by their records (DESIGN.md, "The bus").

One writer per key: what more than one service wrote once is now one key per service,
so a service's credential can neither forge another's records nor break another's key.
Each service appends its Events to its own `events:<service>` stream (status-reporter
reads them all as one, `event_feed`) and writes its node conditions to its own
`node:<service>` table, keyed by condition type (readers see them all through `node`,
keyed `<service>:<type>` as before). A service's own key is not yet a limit on what it
says there: the fenced write refuses a row of a type its service does not own
(klet.bus.functions.CONDITION_TYPES), but the direct HSET the same grant allows does
not, so `node` also gives its readers only the condition types each service owns, and
eviction's Ready only as the graceful shutdown's ("False", "node is shutting down"):
eviction cannot mark the node not Ready for a reason of its choosing through a row its
grants let it write, nor syncloop report a pressure.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from klet.bus.acl import CONDITION_WRITERS, SERVICES, owns_condition
from klet.bus.redisbus import Bus, MergedStream, Stream, Table
from klet.model.node import NODE_SHUTTING_DOWN
from klet.model.records import (
    CSIDriverRecord,
    DesiredPod,
    DeviceResourceRecord,
    EventRecord,
    HistoryEntry,
    HistoryIndexRecord,
    ImageUseRecord,
    NodeConditionRecord,
    PodChange,
    PodStatusChange,
    PodStatusRecord,
    SourceState,
    VolumeRecord,
)

log = logging.getLogger(__name__)


def admissible(service: str, key: str, record: NodeConditionRecord) -> bool:
    """Whether `record`, keyed `key` in `node:<service>`, is a condition `service` may
    contribute (klet.bus.acl.CONDITION_TYPES; eviction's Ready only while shutting down)."""
    if not owns_condition(service, key, record.type):
        return False
    if service == "eviction" and record.type == "Ready":
        return (record.status, record.message) == ("False", NODE_SHUTTING_DOWN)
    return True


class NodeConditions:
    """Every service's node conditions, read as one table keyed `<service>:<type>`:
    only the types each service owns; any other row is left out and logged, once per
    row as long as it stays."""

    def __init__(self, tables: Mapping[str, Table[NodeConditionRecord]]) -> None:
        self.tables = dict(tables)
        self._refused: set[tuple[str, str, str]] = set()

    async def all(self) -> dict[str, NodeConditionRecord]:
        out: dict[str, NodeConditionRecord] = {}
        refused: set[tuple[str, str, str]] = set()
        for service, table in self.tables.items():
            for key, record in (await table.all()).items():
                if admissible(service, key, record):
                    out[f"{service}:{key}"] = record
                else:
                    refused.add((service, key, record.type))
        for service, key, type_ in sorted(refused - self._refused):
            log.error(
                "node condition left out: not one its service may contribute",
                extra={"table": f"node:{service}", "key": key, "type": type_},
            )
        self._refused = refused
        return out


@dataclass(frozen=True)
class NodeBus:
    """Every table and stream of one node as one service sees it, built once from a
    `Bus`: `events` and `conditions` are that service's own."""

    bus: Bus
    service: str
    desired: Table[DesiredPod]
    sources: Table[SourceState]
    status: Table[PodStatusRecord]
    pods: Stream[PodChange]
    podstatus: Stream[PodStatusChange]
    events: Stream[EventRecord]
    """This service's Events (`events:<service>`)."""
    event_feed: MergedStream[EventRecord]
    """Every service's Events, consumed as one (status-reporter posts them)."""
    conditions: Table[NodeConditionRecord]
    """This service's node conditions (`node:<service>`), keyed by condition type."""
    node: NodeConditions
    """Node condition contributions of every service, keyed `<service>:<type>`."""
    images: Table[ImageUseRecord]
    """Image GC's first-detected and last-used times, keyed by image ID."""
    csidrivers: Table[CSIDriverRecord]
    """The CSI drivers registered on this node, keyed by driver name (syncloop)."""
    volumes: Table[VolumeRecord]
    """The CSI volumes published for pods, keyed `<pod uid>/<volume>` (syncloop)."""
    devices: Table[DeviceResourceRecord]
    """Device plugin resources and their device counts, keyed by resource (syncloop)."""
    history: Table[HistoryIndexRecord]
    """Which pods have a history, keyed by pod UID (status-reporter, `klet why`)."""

    def history_of(self, uid: str, *, maxlen: int = 1000) -> Stream[HistoryEntry]:
        """The history of one pod (`history:<uid>`), capped at about `maxlen` entries;
        its writer also gives it an expiry (klet.model.podhistory)."""
        return self.bus.stream(f"history:{uid}", HistoryEntry, maxlen=maxlen)

    @classmethod
    def of(cls, bus: Bus, *, service: str) -> NodeBus:
        if service not in SERVICES:
            raise ValueError(f"unknown service {service!r} (one of {', '.join(SERVICES)})")
        return cls(
            bus=bus,
            service=service,
            desired=bus.table("desired", DesiredPod),
            sources=bus.table("sources", SourceState),
            status=bus.table("status", PodStatusRecord),
            pods=bus.stream("pods", PodChange),
            podstatus=bus.stream("podstatus", PodStatusChange),
            events=bus.stream(f"events:{service}", EventRecord),
            event_feed=bus.merged_stream(
                [bus.stream(f"events:{s}", EventRecord) for s in SERVICES]
            ),
            conditions=bus.table(f"node:{service}", NodeConditionRecord),
            node=NodeConditions(
                {s: bus.table(f"node:{s}", NodeConditionRecord) for s in CONDITION_WRITERS}
            ),
            images=bus.table("images", ImageUseRecord),
            csidrivers=bus.table("csidrivers", CSIDriverRecord),
            volumes=bus.table("volumes", VolumeRecord),
            devices=bus.table("devices", DeviceResourceRecord),
            history=bus.table("history", HistoryIndexRecord),
        )
