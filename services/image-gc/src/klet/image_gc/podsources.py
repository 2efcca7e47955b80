"""What the GC passes need to know of the pods, read from the bus: whether every pod
source has delivered its first full snapshot, which pods are desired, which of those
have terminated, which syncloop still holds.

A bus that cannot be read counts as "sources not ready": the GC then removes nothing
(DESIGN.md: gate destructive work on readiness), the same as after a flushed Redis,
whose empty `sources` table is never ready.
"""

from __future__ import annotations

import logging

from klet.bus import BusError, NodeBus
from klet.image_gc.containergc import terminated_uids
from klet.model.records import sources_ready
from klet.obs import OnceLogger

log = logging.getLogger(__name__)


class BusPods:
    def __init__(self, bus: NodeBus) -> None:
        self.bus = bus
        self._errors = OnceLogger(log, level=logging.WARNING)

    async def sources_ready(self) -> bool:
        try:
            sources = await self.bus.sources.all()
        except BusError as err:
            self._errors.error("sources", f"cannot read the pod sources: {err}")
            return False
        self._errors.clear("sources", "pod sources readable again")
        return sources_ready(sources)

    async def desired_uids(self) -> set[str]:
        return set(await self.bus.desired.all())

    async def terminated_uids(self) -> set[str]:
        return terminated_uids(await self.bus.status.all())

    async def held_uids(self) -> set[str]:
        """The pods syncloop still holds: those with a row in the status table, which
        syncloop drops when it forgets a pod (after removing its sandboxes)."""
        return set(await self.bus.status.all())
