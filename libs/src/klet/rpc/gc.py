"""GarbageCollector over a unix socket: the server adapter image-gc runs and the client
the eviction service uses.

The backend is a three-method protocol implemented by image-gc's collector; this module
only translates between protobuf messages and `FreeSpaceResult` / `CollectResult` /
`CollectionPlan` (PlanCollection, the dry-run `klet gc --dry-run` asks for). The
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
from klet.cancellation import raise_if_cancelled
from klet.rpc.gen.klet.gc.v1 import gc_pb2 as pb
from klet.rpc.gen.klet.gc.v1 import gc_pb2_grpc as pb_grpc
from klet.rpc.podcontrol import RpcUnavailable
from klet.rpc.unixserver import serve_unix

log = logging.getLogger(__name__)

__all__ = [
    "CollectResult",
    "CollectionPlan",
    "FreeSpaceResult",
    "GarbageCollectorBackend",
    "GarbageCollectorClient",
    "InvalidRequest",
    "PlannedRemoval",
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


@dataclass(frozen=True)
class PlannedRemoval:
    """One thing a GC pass would remove, and the bytes that frees."""

    kind: str
    """"container", "sandbox", "log-dir" or "image"."""
    id: str
    name: str
    """Image: its first tag; container: its name; sandbox, log-dir: the pod directory."""
    pod: str = ""
    """namespace/name of the pod a container, sandbox or log directory belongs to."""
    reason: str = ""
    bytes: int | None = None
    """None when the runtime reported no size."""


@dataclass(frozen=True)
class CollectionPlan:
    """What one container GC pass and one image GC pass would remove now (a dry-run)."""

    sources_ready: bool
    high_threshold_percent: int
    low_threshold_percent: int
    image_fs_capacity: int = 0
    image_fs_available: int = 0
    image_fs_usage_percent: int = 0
    image_fs_mountpoint: str = ""
    bytes_to_free: int = 0
    """Bytes the image pass must free to reach the low threshold (0 below the high one)."""
    removals: tuple[PlannedRemoval, ...] = ()
    problem: str = ""
    """Why the image pass would not do all it must (upstream's wording), else ""."""


class InvalidRequest(ValueError):
    """A request the backend refuses (answered INVALID_ARGUMENT with its text)."""


class GarbageCollectorBackend(Protocol):
    async def free_space(self, bytes_to_free: int) -> FreeSpaceResult: ...

    async def collect_now(self) -> CollectResult: ...

    async def plan_collection(self, high_threshold_percent: int | None) -> CollectionPlan: ...


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

    async def PlanCollection(self, request: Any, context: Any) -> Any:  # noqa: N802
        high = (
            int(request.high_threshold_percent)
            if request.HasField("high_threshold_percent")
            else None
        )
        try:
            plan = await self.backend.plan_collection(high)
        except InvalidRequest as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        except Exception as err:  # noqa: BLE001
            log.exception("PlanCollection failed")
            await context.abort(grpc.StatusCode.INTERNAL, f"PlanCollection: {err}")
        return _plan_to_pb(plan)


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

    async def plan_collection(
        self, *, high_threshold_percent: int | None = None, timeout_s: float | None = None
    ) -> CollectionPlan:
        request = pb.PlanCollectionRequest()
        if high_threshold_percent is not None:
            request.high_threshold_percent = high_threshold_percent
        reply = await self._call(self._stub.PlanCollection, request, timeout_s)
        return _plan_from_pb(reply)

    async def _call(self, method: Any, request: Any, timeout_s: float | None) -> Any:
        try:
            return await method(request, timeout=timeout_s or self._timeout)
        except grpc.aio.AioRpcError as err:
            raise_if_cancelled(err)
            if err.code() == grpc.StatusCode.INVALID_ARGUMENT:
                raise InvalidRequest(err.details()) from err
            raise RpcUnavailable(f"{err.code().name}: {err.details()}") from err

    async def close(self) -> None:
        await self._channel.close(None)


def _plan_to_pb(plan: CollectionPlan) -> Any:
    return pb.PlanCollectionResponse(
        sources_ready=plan.sources_ready,
        high_threshold_percent=plan.high_threshold_percent,
        low_threshold_percent=plan.low_threshold_percent,
        image_fs_capacity=plan.image_fs_capacity,
        image_fs_available=plan.image_fs_available,
        image_fs_usage_percent=plan.image_fs_usage_percent,
        image_fs_mountpoint=plan.image_fs_mountpoint,
        bytes_to_free=plan.bytes_to_free,
        removals=[
            pb.PlannedRemoval(
                kind=r.kind,
                id=r.id,
                name=r.name,
                pod=r.pod,
                reason=r.reason,
                bytes=r.bytes or 0,
                bytes_known=r.bytes is not None,
            )
            for r in plan.removals
        ],
        problem=plan.problem,
    )


def _plan_from_pb(reply: Any) -> CollectionPlan:
    return CollectionPlan(
        sources_ready=bool(reply.sources_ready),
        high_threshold_percent=int(reply.high_threshold_percent),
        low_threshold_percent=int(reply.low_threshold_percent),
        image_fs_capacity=int(reply.image_fs_capacity),
        image_fs_available=int(reply.image_fs_available),
        image_fs_usage_percent=int(reply.image_fs_usage_percent),
        image_fs_mountpoint=str(reply.image_fs_mountpoint),
        bytes_to_free=int(reply.bytes_to_free),
        removals=tuple(
            PlannedRemoval(
                kind=str(r.kind),
                id=str(r.id),
                name=str(r.name),
                pod=str(r.pod),
                reason=str(r.reason),
                bytes=int(r.bytes) if r.bytes_known else None,
            )
            for r in reply.removals
        ),
        problem=str(reply.problem),
    )
