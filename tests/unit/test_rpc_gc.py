"""The GarbageCollector gRPC adapter in-process: FreeSpace and CollectNow carry their
numbers both ways over a unix socket created with mode 0600, a backend error reaches
the client as RpcUnavailable naming the call, and an absent server is RpcUnavailable."""

from __future__ import annotations

import asyncio
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from klet.rpc.gc import (
    CollectResult,
    FreeSpaceResult,
    GarbageCollectorClient,
    RpcUnavailable,
    serve_garbage_collector,
)


class Backend:
    def __init__(self) -> None:
        self.asked: list[int] = []
        self.fail = False

    async def free_space(self, bytes_to_free: int) -> FreeSpaceResult:
        if self.fail:
            raise RuntimeError("runtime unreachable")
        self.asked.append(bytes_to_free)
        return FreeSpaceResult(
            bytes_freed=bytes_to_free + 7, containers_removed=2, images_removed=3
        )

    async def collect_now(self) -> CollectResult:
        return CollectResult(containers_removed=4, images_removed=5, bytes_freed=1 << 40)


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[Backend, GarbageCollectorClient, Path]]:
    backend = Backend()
    sock = tmp_path / "run" / "gc.sock"
    ready = asyncio.Event()
    server = asyncio.create_task(serve_garbage_collector(backend, sock, ready=ready))
    await asyncio.wait_for(ready.wait(), 10)
    client = GarbageCollectorClient(sock, timeout_s=10)
    try:
        yield backend, client, sock
    finally:
        await client.close()
        server.cancel()
        await asyncio.gather(server, return_exceptions=True)


async def test_free_space_and_collect_now_round_trip(
    served: tuple[Backend, GarbageCollectorClient, Path],
) -> None:
    backend, client, sock = served
    assert stat.S_IMODE(sock.stat().st_mode) == 0o600
    assert await client.free_space(3 << 30) == FreeSpaceResult(
        bytes_freed=(3 << 30) + 7, containers_removed=2, images_removed=3
    )
    assert backend.asked == [3 << 30]
    assert await client.collect_now() == CollectResult(
        containers_removed=4, images_removed=5, bytes_freed=1 << 40
    )


async def test_backend_error_reaches_the_client(
    served: tuple[Backend, GarbageCollectorClient, Path],
) -> None:
    backend, client, _ = served
    backend.fail = True
    with pytest.raises(RpcUnavailable, match="INTERNAL: FreeSpace: runtime unreachable"):
        await client.free_space(1)


async def test_no_server_is_unavailable(tmp_path: Path) -> None:
    client = GarbageCollectorClient(tmp_path / "absent.sock", timeout_s=1)
    try:
        with pytest.raises(RpcUnavailable):
            await client.collect_now()
    finally:
        await client.close()
