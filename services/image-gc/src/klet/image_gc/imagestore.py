"""The bus's `images` table as image GC's `ImageUseStore`: first-detected and last-used
times by image ID, written in one MULTI/EXEC per detection (only what changed)."""

from __future__ import annotations

from collections.abc import Sequence

from klet.bus import NodeBus
from klet.model.records import ImageUseRecord


class BusImageUseStore:
    def __init__(self, bus: NodeBus) -> None:
        self.bus = bus

    async def load(self) -> dict[str, ImageUseRecord]:
        return await self.bus.images.all()

    async def save(self, changed: Sequence[ImageUseRecord], removed: Sequence[str]) -> None:
        async with self.bus.bus.transaction() as tx:
            for record in changed:
                tx.put(self.bus.images, record.id, record)
            for key in removed:
                tx.delete(self.bus.images, key)
