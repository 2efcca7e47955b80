"""Pod sources: adapters that read manifests and hand full snapshots to the `Inbox`.

Each source is a loop with a `run()` coroutine (supervised by the app) and a
`run_once()` step for tests. A source emits a snapshot only when it has a complete,
trustworthy view; when it cannot read (a URL that errors, a directory it may not list)
it emits nothing, so the merge keeps the last good set instead of removing pods.
"""

from __future__ import annotations

from typing import Protocol

from klet.model.records import SourceName


class PodSource(Protocol):
    """What the app needs of a source: its name and its loop."""

    @property
    def name(self) -> SourceName: ...

    async def run(self) -> None: ...
