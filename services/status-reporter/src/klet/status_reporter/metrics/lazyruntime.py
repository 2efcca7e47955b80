"""A CRI client for `/metrics/cadvisor` that comes into being at the first scrape.

With the kubelet API off (a standalone node's usual set-up) the read-only port's
`/metrics/cadvisor` needs a CRI client of its own. Opening it at start loads gRPC and
the CRI stubs, about 13 MB resident (issue 42), in a process whose nodes mostly never
ask for that page. `LazyRuntime` is the page's `StatsRuntime`: the first CRI read calls
`open` (which imports and builds the real client), every later one reuses that client.

Opening is synchronous (building a gRPC channel does not wait on the network), so the
check and the assignment happen with no await between them: concurrent first scrapes on
the one event loop cannot open two clients. After `close` (shutdown) nothing is opened
again: a late scrape gets a CRIError, which the stats provider turns into the page's
runtime error as for a runtime that is down.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from klet.cri.errors import CRIError
from klet.cri.types import Container, ContainerStatsInfo, FilesystemUsageInfo, Sandbox
from klet.model.types import SandboxID
from klet.stats import StatsRuntime


class ClosableRuntime(StatsRuntime, Protocol):
    """The CRI reads of a stats pass, and closing the channel (`klet.cri.RuntimeClient`)."""

    async def close(self) -> None: ...


class LazyRuntime:
    """A `StatsRuntime` opening its client through `open` on the first read."""

    def __init__(self, open: Callable[[], ClosableRuntime]) -> None:
        self._open = open
        self._client: ClosableRuntime | None = None
        self._closed = False

    @property
    def opened(self) -> bool:
        """Whether the client has been opened (and not yet closed)."""
        return self._client is not None

    def _runtime(self) -> ClosableRuntime:
        if self._closed:
            raise CRIError("the runtime client is closed (shutting down)", code="UNAVAILABLE")
        if self._client is None:
            self._client = self._open()
        return self._client

    async def list_pod_sandboxes(
        self, *, label_selector: dict[str, str] | None = None
    ) -> list[Sandbox]:
        return await self._runtime().list_pod_sandboxes(label_selector=label_selector)

    async def list_containers(
        self, *, sandbox_id: SandboxID | None = None, label_selector: dict[str, str] | None = None
    ) -> list[Container]:
        return await self._runtime().list_containers(
            sandbox_id=sandbox_id, label_selector=label_selector
        )

    async def list_container_stats(self) -> list[ContainerStatsInfo]:
        return await self._runtime().list_container_stats()

    async def image_fs_info(
        self,
    ) -> tuple[list[FilesystemUsageInfo], list[FilesystemUsageInfo]]:
        return await self._runtime().image_fs_info()

    async def close(self) -> None:
        """Close the client if it was opened; nothing is opened after this."""
        self._closed = True
        client, self._client = self._client, None
        if client is not None:
            await client.close()
