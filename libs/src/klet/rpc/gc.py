"""GarbageCollector over a unix socket: the server adapter image-gc runs and the client
the eviction service uses.

The backend is a two-method protocol implemented by image-gc's collector; this module
only translates between protobuf messages and `FreeSpaceResult` / `CollectResult`. The
socket is created with mode 0600 (DESIGN.md: internal gRPC on unix sockets under the
run directory). A backend that raises answers INTERNAL with the error's text, which the
client raises as `RpcUnavailable`.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import grpc
from klet.rpc.gen.klet.gc.v1 import gc_pb2 as pb
from klet.rpc.gen.klet.gc.v1 import gc_pb2_grpc as pb_grpc
from klet.rpc.podcontrol import RpcUnavailable
from klet.rpc.unixserver import serve_unix

log = logging.getLogger(__name__)

__all__ = [
    "CollectResult",
    "FreeSpaceResult",
    "GarbageCollectorBackend",
    "GarbageCollectorClient",
    "RpcUnavailable",
    "serve_garbage_collector",
]


@dataclass(frozen=True)
class FreeSpaceResult:
    """What one FreeSpace removed: dead containers first, then unused images."""

    bytes_freed: int = 0
    containers_removed: int = 0
    images_removed: int = 0


@dataclass(frozen=True)
class CollectResult:
    """What one container GC pass plus one image GC pass removed."""

    containers_removed: int = 0
    images_removed: int = 0
    bytes_freed: int = 0


class GarbageCollectorBackend(Protocol):
    async def free_space(self, bytes_to_free: int) -> FreeSpaceResult: ...

    async def collect_now(self) -> CollectResult: ...


class _Servicer(pb_grpc.GarbageCollectorServicer):
    def __init__(self, backend: GarbageCollectorBackend) -> None:
        self.backend = backend

    async def FreeSpace(self, request: Any, context: Any) -> Any:  # noqa: N802 (gRPC names)
        try:
            result = await self.backend.free_space(int(request.bytes_to_free))
        except Exception as err:  # noqa: BLE001 - reported to the caller, logged here
            log.exception("FreeSpace failed")
            await context.abort(grpc.StatusCode.INTERNAL, f"FreeSpace: {err}")
        return pb.FreeSpaceResponse(
            bytes_freed=result.bytes_freed,
            containers_removed=result.containers_removed,
            images_removed=result.images_removed,
        )

    async def CollectNow(self, request: Any, context: Any) -> Any:  # noqa: N802
        try:
            result = await self.backend.collect_now()
        except Exception as err:  # noqa: BLE001
            log.exception("CollectNow failed")
            await context.abort(grpc.StatusCode.INTERNAL, f"CollectNow: {err}")
        return pb.CollectNowResponse(
            containers_removed=result.containers_removed,
            images_removed=result.images_removed,
            bytes_freed=result.bytes_freed,
        )


async def serve_garbage_collector(
    backend: GarbageCollectorBackend, socket_path: Path, *, ready: asyncio.Event | None = None
) -> None:
    """Serve until cancelled; the socket file is replaced if a stale one exists."""

    def add(server: grpc.aio.Server) -> None:
        pb_grpc.add_GarbageCollectorServicer_to_server(  # type: ignore[no-untyped-call]
            _Servicer(backend), server
        )

    await serve_unix(add, socket_path, ready=ready)


class GarbageCollectorClient:
    """Client of image-gc's GarbageCollector; every call has a deadline.

    FreeSpace can take as long as removing images does: give it a deadline above the
    server's own bound (`timeout_s`, or per call).
    """

    def __init__(self, socket_path: Path, *, timeout_s: float = 120.0) -> None:
        self._channel = grpc.aio.insecure_channel(f"unix://{socket_path}")
        self._stub = pb_grpc.GarbageCollectorStub(self._channel)  # type: ignore[no-untyped-call]
        self._timeout = timeout_s

    async def free_space(
        self, bytes_to_free: int, *, timeout_s: float | None = None
    ) -> FreeSpaceResult:
        reply = await self._call(
            self._stub.FreeSpace, pb.FreeSpaceRequest(bytes_to_free=bytes_to_free), timeout_s
        )
        return FreeSpaceResult(
            bytes_freed=int(reply.bytes_freed),
            containers_removed=int(reply.containers_removed),
            images_removed=int(reply.images_removed),
        )

    async def collect_now(self, *, timeout_s: float | None = None) -> CollectResult:
        reply = await self._call(self._stub.CollectNow, pb.CollectNowRequest(), timeout_s)
        return CollectResult(
            containers_removed=int(reply.containers_removed),
            images_removed=int(reply.images_removed),
            bytes_freed=int(reply.bytes_freed),
        )

    async def _call(self, method: Any, request: Any, timeout_s: float | None) -> Any:
        try:
            return await method(request, timeout=timeout_s or self._timeout)
        except grpc.aio.AioRpcError as err:
            raise RpcUnavailable(f"{err.code().name}: {err.details()}") from err

    async def close(self) -> None:
        await self._channel.close(None)
