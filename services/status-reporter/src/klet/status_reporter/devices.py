"""The device plugins' resources as syncloop recorded them (the bus `devices` table),
for the Node's capacity and allocatable.

A root task reads the table every `period_s` into memory, so a node status update never
waits on the bus. While the bus is down the last copy stays; before the first read
`amounts()` is None and the node status adds no device resource (the Node keeps what it
has: its status is merged, not replaced). A resource whose plugin went stays in the
table with its counts at 0, so the Node shows it at 0, as upstream's kubelet does.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from klet.bus import BusError
from klet.model.records import DeviceResourceRecord
from klet.obs import OnceLogger

log = logging.getLogger(__name__)

PERIOD_S = 2.0


class DeviceTable(Protocol):
    async def all(self) -> dict[str, DeviceResourceRecord]: ...


class DeviceView:
    """The last read of the `devices` table."""

    def __init__(self, table: DeviceTable) -> None:
        self.table = table
        self._records: dict[str, DeviceResourceRecord] | None = None
        self._once = OnceLogger(log, level=logging.WARNING)

    async def run(self, period_s: float = PERIOD_S) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(period_s)

    async def refresh(self) -> None:
        try:
            records = await self.table.all()
        except BusError as err:
            self._once.error("bus", "devices table not read", cause=str(err), error=str(err))
            return
        self._once.clear("bus", "devices table read again")
        self._records = records

    def amounts(self) -> dict[str, tuple[int, int]] | None:
        """Resource -> (capacity, allocatable): all devices, the healthy ones; None
        before the first read."""
        if self._records is None:
            return None
        return {
            r.resource: (r.healthy + r.unhealthy, r.healthy)
            for key, r in sorted(self._records.items())
            if key == r.resource
        }
