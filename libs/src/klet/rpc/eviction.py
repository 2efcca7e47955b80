"""Eviction over a unix socket: the server adapter the eviction service runs and the
client `klet evict --dry-run` uses.

One method, DryRun: what the next monitoring pass would do now, decided by the
eviction manager's own functions and not acted on. This module only translates between
protobuf messages and `DryRunResult`; the backend is a one-method protocol implemented
by the eviction manager. Thresholds the backend refuses answer INVALID_ARGUMENT (raised
by the client as `InvalidRequest`), any other failure INTERNAL (`RpcUnavailable`).
The socket is 0600 in a 0700 directory, like the other klet sockets.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import grpc
from klet.cancellation import raise_if_cancelled
from klet.rpc.gc import InvalidRequest
from klet.rpc.gen.klet.eviction.v1 import eviction_pb2 as pb
from klet.rpc.gen.klet.eviction.v1 import eviction_pb2_grpc as pb_grpc
from klet.rpc.podcontrol import RpcUnavailable
from klet.rpc.unixserver import serve_unix

log = logging.getLogger(__name__)

__all__ = [
    "DryRunResult",
    "EvictionBackend",
    "EvictionClient",
    "InvalidRequest",
    "RankedPod",
    "RpcUnavailable",
    "SignalReading",
    "serve_eviction",
]


@dataclass(frozen=True)
class SignalReading:
    """One signal as measured, against one of its thresholds (none: `threshold` "")."""

    signal: str
    available: int
    capacity: int
    threshold: str = ""
    threshold_value: int = 0
    crossed: bool = False
    met: bool = False
    """Crossed and past its grace period: it drives reclaim and eviction."""


@dataclass(frozen=True)
class RankedPod:
    """A pod in eviction order, why it is there, and whether the pass evicts it."""

    pod: str
    uid: str
    reason: str
    critical: bool = False
    evict: bool = False
    message: str = ""
    grace_period_s: int = 0


@dataclass(frozen=True)
class DryRunResult:
    """What one monitoring pass would do now."""

    signals: tuple[SignalReading, ...]
    conditions: tuple[str, ...]
    signal: str
    """The signal the pass acts on ("" when none)."""
    reclaim_bytes: int
    """Bytes image-gc would be asked to free before evicting (0: no node-level reclaim)."""
    pods: tuple[RankedPod, ...]
    summary: str
    thresholds: tuple[str, ...]


class EvictionBackend(Protocol):
    async def dry_run(self, thresholds: Sequence[str]) -> DryRunResult: ...


class _Servicer(pb_grpc.EvictionServicer):
    def __init__(self, backend: EvictionBackend) -> None:
        self.backend = backend

    async def DryRun(self, request: Any, context: Any) -> Any:  # noqa: N802 (gRPC names)
        try:
            result = await self.backend.dry_run(list(request.thresholds))
        except InvalidRequest as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        except Exception as err:  # noqa: BLE001 - reported to the caller, logged here
            log.exception("DryRun failed")
            await context.abort(grpc.StatusCode.INTERNAL, f"DryRun: {err}")
        return pb.DryRunResponse(
            signals=[
                pb.SignalReading(
                    signal=s.signal,
                    available=s.available,
                    capacity=s.capacity,
                    threshold=s.threshold,
                    threshold_value=s.threshold_value,
                    crossed=s.crossed,
                    met=s.met,
                )
                for s in result.signals
            ],
            conditions=list(result.conditions),
            signal=result.signal,
            reclaim_bytes=result.reclaim_bytes,
            pods=[
                pb.RankedPod(
                    pod=p.pod,
                    uid=p.uid,
                    reason=p.reason,
                    critical=p.critical,
                    evict=p.evict,
                    message=p.message,
                    grace_period_s=p.grace_period_s,
                )
                for p in result.pods
            ],
            summary=result.summary,
            thresholds=list(result.thresholds),
        )


async def serve_eviction(
    backend: EvictionBackend, socket_path: Path, *, ready: asyncio.Event | None = None
) -> None:
    """Serve until cancelled; the socket file is replaced if a stale one exists."""

    def add(server: grpc.aio.Server) -> None:
        pb_grpc.add_EvictionServicer_to_server(_Servicer(backend), server)  # type: ignore[no-untyped-call]

    await serve_unix(add, socket_path, ready=ready)


class EvictionClient:
    """Client of the eviction service's Eviction API; every call has a deadline."""

    def __init__(self, socket_path: Path, *, timeout_s: float = 30.0) -> None:
        self._channel = grpc.aio.insecure_channel(f"unix://{socket_path}")
        self._stub = pb_grpc.EvictionStub(self._channel)  # type: ignore[no-untyped-call]
        self._timeout = timeout_s

    async def dry_run(self, thresholds: Sequence[str] = ()) -> DryRunResult:
        try:
            r = await self._stub.DryRun(
                pb.DryRunRequest(thresholds=list(thresholds)), timeout=self._timeout
            )
        except grpc.aio.AioRpcError as err:
            raise_if_cancelled(err)
            if err.code() == grpc.StatusCode.INVALID_ARGUMENT:
                raise InvalidRequest(err.details()) from err
            raise RpcUnavailable(f"{err.code().name}: {err.details()}") from err
        return DryRunResult(
            signals=tuple(
                SignalReading(
                    signal=str(s.signal),
                    available=int(s.available),
                    capacity=int(s.capacity),
                    threshold=str(s.threshold),
                    threshold_value=int(s.threshold_value),
                    crossed=bool(s.crossed),
                    met=bool(s.met),
                )
                for s in r.signals
            ),
            conditions=tuple(str(c) for c in r.conditions),
            signal=str(r.signal),
            reclaim_bytes=int(r.reclaim_bytes),
            pods=tuple(
                RankedPod(
                    pod=str(p.pod),
                    uid=str(p.uid),
                    reason=str(p.reason),
                    critical=bool(p.critical),
                    evict=bool(p.evict),
                    message=str(p.message),
                    grace_period_s=int(p.grace_period_s),
                )
                for p in r.pods
            ),
            summary=str(r.summary),
            thresholds=tuple(str(t) for t in r.thresholds),
        )

    async def close(self) -> None:
        await self._channel.close(None)
