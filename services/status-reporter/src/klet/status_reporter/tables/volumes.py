"""The pods' volumes as syncloop recorded them (the bus `volumes` table), for the
Node's `volumesInUse` (the CSI ones: the records with a unique name), the `volume`
entries of /stats/summary (every measured one: CSI, memory-backed emptyDir, configMap,
secret, projected, downwardAPI) and the `kubelet_volume_stats_*` metrics (those of a
claim).

A root task reads the table every `period_s` into memory; the three readers use that
copy, so a scrape or a node status update never waits on the bus. While the bus is
down the last copy stays (a Redis outage must not empty `volumesInUse`, which would let
the attach-detach controller detach volumes still mounted); before the first read
`in_use()` is None and the node status keeps what the Node already says.

The metrics are upstream's: one series per PersistentVolumeClaim (inline volumes have
none), labelled `namespace` and `persistentvolumeclaim`, set from the last usage the
driver gave.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from klet.model.records import VolumeRecord
from klet.status_reporter.tables.tableview import TableView
from prometheus_client import CollectorRegistry, Gauge

PERIOD_S = 5.0

# metric name suffix -> the Summary API usage key it shows
STATS_METRICS = {
    "capacity_bytes": ("capacityBytes", "Capacity in bytes of the volume"),
    "available_bytes": ("availableBytes", "Number of available bytes in the volume"),
    "used_bytes": ("usedBytes", "Number of used bytes in the volume"),
    "inodes": ("inodes", "Maximum number of inodes in the volume"),
    "inodes_free": ("inodesFree", "Number of free inodes in the volume"),
    "inodes_used": ("inodesUsed", "Number of used inodes in the volume"),
}


class VolumeTable(Protocol):
    async def all(self) -> dict[str, VolumeRecord]: ...


class VolumeView(TableView[VolumeRecord]):
    """The last read of the `volumes` table."""

    def __init__(
        self, table: VolumeTable, registry: CollectorRegistry, period_s: float = PERIOD_S
    ) -> None:
        super().__init__(table, what="volumes", period_s=period_s)
        self._gauges = {
            suffix: Gauge(
                f"kubelet_volume_stats_{suffix}",
                help_text,
                ["namespace", "persistentvolumeclaim"],
                registry=registry,
            )
            for suffix, (_, help_text) in STATS_METRICS.items()
        }

    def loaded(self, records: dict[str, VolumeRecord]) -> None:
        self._set_gauges(records)

    def _set_gauges(self, records: Mapping[str, VolumeRecord]) -> None:
        for gauge in self._gauges.values():
            gauge.clear()
        for r in records.values():
            if not r.claim or not r.measured_at:
                continue
            for suffix, (key, _) in STATS_METRICS.items():
                value = r.usage.get(key)
                if isinstance(value, int):
                    self._gauges[suffix].labels(r.namespace, r.claim).set(value)

    def in_use(self) -> tuple[str, ...] | None:
        """The unique names of the volumes in use (those something attaches: a record
        without one is a volume of the node's own), sorted; None before the first read."""
        if self.records is None:
            return None
        return tuple(sorted({r.unique_name for r in self.records.values() if r.unique_name}))

    def measured(self, pod_uid: str) -> list[VolumeRecord]:
        """The pod's volumes with a usage, by name (the Summary API's `volume` list)."""
        found = [r for r in (self.records or {}).values() if r.pod_uid == pod_uid and r.measured_at]
        return sorted(found, key=lambda r: r.volume)
