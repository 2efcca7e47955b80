"""The hand-off between the source loops and the publisher.

Sources never wait for the bus: they drop their latest full snapshot here and go back
to polling. Only the newest snapshot of each source is kept, which is correct because
each one is complete (upstream's SET): merging B after A gives the same state as
merging B alone, and the publisher reports the net difference. A poll that found
nothing new still rings the bell, because each poll also triggers the publisher's cheap
table check (how a flushed Redis gets repopulated).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from klet.model.records import SourceName
from klet.model.types import JSON


class Inbox:
    """Latest pending snapshot per source, plus a "some source polled" flag."""

    def __init__(self) -> None:
        self._pending: dict[SourceName, list[JSON]] = {}
        self._polled = False
        self._bell = asyncio.Event()

    def offer(self, source: SourceName, pods: Sequence[JSON]) -> None:
        """A full snapshot of `source` (replaces one not yet taken)."""
        self._pending[source] = list(pods)
        self.polled()

    def polled(self) -> None:
        """A source finished a poll, whether or not it produced a snapshot."""
        self._polled = True
        self._bell.set()

    def ring(self) -> None:
        """Wake the publisher with nothing offered (it has work of its own to do)."""
        self._bell.set()

    def take(self) -> tuple[dict[SourceName, list[JSON]], bool]:
        """Pending snapshots (in arrival order) and whether any poll happened since."""
        pending, polled = self._pending, self._polled
        self._pending, self._polled = {}, False
        self._bell.clear()
        return pending, polled

    async def wait(self, timeout_s: float) -> None:
        """Until something is offered or polled, or `timeout_s` passes."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, timeout_s)):
                await self._bell.wait()
