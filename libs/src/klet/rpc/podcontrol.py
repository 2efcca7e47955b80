"""PodControl over a unix socket: the server adapter syncloop runs and the client others use.

The backend is a small protocol implemented by syncloop's managers; this module only
translates between protobuf messages and `PodSummary`. The socket is created with mode
0600 (DESIGN.md: internal gRPC on unix sockets under the run directory).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import grpc
from klet.cancellation import raise_if_cancelled
from klet.model.types import JSON, PodUID
from klet.rpc.gen.klet.podcontrol.v1 import podcontrol_pb2 as pb
from klet.rpc.gen.klet.podcontrol.v1 import podcontrol_pb2_grpc as pb_grpc
from klet.rpc.unixserver import serve_unix


class RpcUnavailable(Exception):
    """The peer service is not reachable on its socket."""


@dataclass(frozen=True)
class PodSummary:
    uid: PodUID
    namespace: str
    name: str
    phase: str
    status: JSON


class PodControlBackend(Protocol):
    async def kill_pod(
        self, uid: PodUID, grace_period_s: int | None, reason: str, message: str
    ) -> bool: ...
    def list_pods(self) -> list[PodSummary]: ...
    def get_pod(self, uid: PodUID) -> PodSummary | None: ...


def _to_pb(p: PodSummary) -> Any:
    return pb.PodSummary(
        uid=p.uid,
        namespace=p.namespace,
        name=p.name,
        phase=p.phase,
        status_json=json.dumps(p.status, separators=(",", ":")),
    )


def _from_pb(m: Any) -> PodSummary:
    return PodSummary(
        uid=PodUID(m.uid),
        namespace=m.namespace,
        name=m.name,
        phase=m.phase,
        status=json.loads(m.status_json or "{}"),
    )


class _Servicer(pb_grpc.PodControlServicer):
    def __init__(self, backend: PodControlBackend) -> None:
        self.backend = backend

    async def KillPod(self, request: Any, context: Any) -> Any:  # noqa: N802 (gRPC names)
        grace = None if request.grace_period_seconds < 0 else int(request.grace_period_seconds)
        found = await self.backend.kill_pod(
            PodUID(request.uid), grace, request.reason, request.message
        )
        return pb.KillPodResponse(found=found)

    async def ListPods(self, request: Any, context: Any) -> Any:  # noqa: N802
        return pb.ListPodsResponse(pods=[_to_pb(p) for p in self.backend.list_pods()])

    async def GetPodStatus(self, request: Any, context: Any) -> Any:  # noqa: N802
        pod = self.backend.get_pod(PodUID(request.uid))
        if pod is None:
            return pb.GetPodStatusResponse(found=False)
        return pb.GetPodStatusResponse(found=True, pod=_to_pb(pod))


async def serve_pod_control(
    backend: PodControlBackend, socket_path: Path, *, ready: asyncio.Event | None = None
) -> None:
    """Serve until cancelled; the socket file is replaced if a stale one exists."""

    def add(server: grpc.aio.Server) -> None:
        pb_grpc.add_PodControlServicer_to_server(_Servicer(backend), server)

    await serve_unix(add, socket_path, ready=ready)


class PodControlClient:
    """Client of syncloop's PodControl; every call has a deadline."""

    def __init__(self, socket_path: Path, *, timeout_s: float = 5.0) -> None:
        self._channel = grpc.aio.insecure_channel(f"unix://{socket_path}")
        self._stub = pb_grpc.PodControlStub(self._channel)
        self._timeout = timeout_s

    async def kill_pod(
        self,
        uid: PodUID,
        *,
        grace_period_s: int | None,
        reason: str,
        message: str,
        timeout_s: float | None = None,
    ) -> bool:
        request = pb.KillPodRequest(
            uid=uid,
            grace_period_seconds=-1 if grace_period_s is None else grace_period_s,
            reason=reason,
            message=message,
        )
        reply = await self._call(self._stub.KillPod, request, timeout_s)
        return bool(reply.found)

    async def list_pods(self) -> list[PodSummary]:
        reply = await self._call(self._stub.ListPods, pb.ListPodsRequest(), None)
        return [_from_pb(m) for m in reply.pods]

    async def get_pod_status(self, uid: PodUID) -> PodSummary | None:
        reply = await self._call(self._stub.GetPodStatus, pb.GetPodStatusRequest(uid=uid), None)
        return _from_pb(reply.pod) if reply.found else None

    async def _call(self, method: Any, request: Any, timeout_s: float | None) -> Any:
        try:
            return await method(request, timeout=timeout_s or self._timeout)
        except grpc.aio.AioRpcError as err:
            raise_if_cancelled(err)
            raise RpcUnavailable(f"{err.code().name}: {err.details()}") from err

    async def close(self) -> None:
        await self._channel.close(None)
