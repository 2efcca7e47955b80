"""The device plugins' resources as syncloop recorded them (the bus `devices` table),
for the Node's capacity and allocatable.

A root task reads the table every `period_s` into memory, so a node status update never
waits on the bus. While the bus is down the last copy stays; before the first read
`amounts()` is None and the node status adds no device resource (the Node keeps what it
has: its status is merged, not replaced). A resource whose plugin went stays in the
table with its counts at 0, so the Node shows it at 0, as upstream's kubelet does.
"""

from __future__ import annotations

from typing import Protocol

from klet.model.records import DeviceResourceRecord
from klet.status_reporter.tables.tableview import TableView

PERIOD_S = 2.0


class DeviceTable(Protocol):
    async def all(self) -> dict[str, DeviceResourceRecord]: ...


class DeviceView(TableView[DeviceResourceRecord]):
    """The last read of the `devices` table."""

    def __init__(self, table: DeviceTable, period_s: float = PERIOD_S) -> None:
        super().__init__(table, what="devices", period_s=period_s)

    def amounts(self) -> dict[str, tuple[int, int]] | None:
        """Resource -> (capacity, allocatable): all devices, the healthy ones; None
        before the first read."""
        if self.records is None:
            return None
        return {
            r.resource: (r.healthy + r.unhealthy, r.healthy)
            for key, r in sorted(self.records.items())
            if key == r.resource
        }
