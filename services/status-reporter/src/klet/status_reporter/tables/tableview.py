"""A bus table polled into memory: the shared part of status-reporter's `volumes` and
`devices` views.

A root task reads the whole table every `period_s`, so a node status update or a stats
request never waits on the bus. While the bus is down the last copy stays (logged once
per outage); before the first read `records` is None. A subclass says what the table is
for and reacts to each new copy in `loaded`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Generic, Protocol, TypeVar

from klet.bus import BusError
from klet.obs import OnceLogger

log = logging.getLogger(__name__)

R = TypeVar("R")


class Table(Protocol[R]):
    async def all(self) -> dict[str, R]: ...


class TableView(Generic[R]):
    """The last read of one bus table (`what` names it in the log)."""

    def __init__(self, table: Table[R], *, what: str, period_s: float) -> None:
        self.table = table
        self.records: dict[str, R] | None = None
        self._what = what
        self._period_s = period_s
        self._once = OnceLogger(log, level=logging.WARNING)

    async def run(self, period_s: float | None = None) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(self._period_s if period_s is None else period_s)

    async def refresh(self) -> None:
        try:
            records = await self.table.all()
        except BusError as err:
            self._once.error("bus", f"{self._what} table not read", cause=str(err), error=str(err))
            return
        self._once.clear("bus", f"{self._what} table read again")
        self.records = records
        self.loaded(records)

    def loaded(self, records: dict[str, R]) -> None:
        """Called with each new copy; nothing by default."""
