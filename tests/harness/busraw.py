"""Raw reads of the bus for assertions: what a stream holds, straight from Redis."""

from __future__ import annotations

from klet.bus import Bus
from klet.bus.resp import stream_entries


async def stream_fields(bus: Bus, key: str) -> list[tuple[str, dict[str, str]]]:
    """(entry id, fields) of every entry of the stream at `key`, oldest first."""
    raw = await bus.client.execute("XRANGE", key, "-", "+")
    return [(mid, fields or {}) for mid, fields in stream_entries(raw)]
