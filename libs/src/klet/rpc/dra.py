"""The DRA kubelet plugin API (dra v1 / v1beta1) on the wire: the client of a DRA
driver's own socket.

Only translation between protobuf messages and `klet.model.dra`, on the service the
driver's registration chose (v1 and v1beta1 have the same messages, under two package
names); what a claim is and when it is prepared is syncloop's (`klet.syncloop.dra`).
Every call has a deadline, upstream's default client call timeout (45 s), so a hung
driver cannot hold a pod worker for ever. A failed call, or an answer that leaves out a
claim asked for (upstream's "left out N claims"), raises `DRAPluginError` naming the
driver, the call and the cause; a cancellation of the calling task that grpc.aio
reports as an error of its own is raised as the cancellation.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
from klet.cancellation import raise_if_cancelled
from klet.model.dra import (
    SERVICE_V1,
    SERVICE_V1BETA1,
    ClaimRef,
    PreparedDevice,
    PrepareResult,
)
from klet.rpc.gen.klet.dra.v1 import api_pb2 as pb_v1
from klet.rpc.gen.klet.dra.v1 import api_pb2_grpc as grpc_v1
from klet.rpc.gen.klet.dra.v1beta1 import api_pb2 as pb_v1beta1
from klet.rpc.gen.klet.dra.v1beta1 import api_pb2_grpc as grpc_v1beta1

CALL_TIMEOUT_S = 45.0
"""upstream's defaultClientCallTimeout of a DRA plugin's calls."""

_API: dict[str, tuple[Any, Any]] = {
    SERVICE_V1: (pb_v1, grpc_v1),
    SERVICE_V1BETA1: (pb_v1beta1, grpc_v1beta1),
}


class DRAPluginError(Exception):
    """A call to a DRA driver failed; the message says which driver, call and why."""


def _device(d: Any) -> PreparedDevice:
    return PreparedDevice(
        pool_name=d.pool_name,
        device_name=d.device_name,
        request_names=tuple(d.request_names),
        cdi_device_ids=tuple(d.cdi_device_ids),
    )


def _left_out(asked: Sequence[ClaimRef], answered: Any) -> list[str]:
    return [f"{c.namespace}/{c.name} ({c.uid})" for c in asked if c.uid not in answered]


class GrpcDRAPlugin:
    """One registered DRA driver's DRAPlugin service on its endpoint."""

    def __init__(
        self,
        endpoint: Path,
        *,
        driver: str,
        service: str = SERVICE_V1,
        timeout_s: float = CALL_TIMEOUT_S,
    ) -> None:
        if service not in _API:
            raise ValueError(f"DRA service {service!r} is not one of {', '.join(_API)}")
        self.endpoint = endpoint
        self.driver = driver
        self.service = service
        self.timeout_s = timeout_s
        self._pb, stubs = _API[service]
        self.channel = grpc.aio.insecure_channel(f"unix://{endpoint}")
        self.stub = stubs.DRAPluginStub(self.channel)

    def _claims(self, claims: Sequence[ClaimRef]) -> list[Any]:
        return [self._pb.Claim(namespace=c.namespace, name=c.name, uid=c.uid) for c in claims]

    def _error(self, call: str, cause: str) -> DRAPluginError:
        return DRAPluginError(
            f"DRA driver {self.driver} at {self.endpoint}: {call} failed: {cause}"
        )

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        """NodePrepareResources: each claim's result, by claim UID."""
        request = self._pb.NodePrepareResourcesRequest(claims=self._claims(claims))
        try:
            response = await self.stub.NodePrepareResources(request, timeout=self.timeout_s)
        except grpc.aio.AioRpcError as err:
            raise_if_cancelled(err)
            raise self._error("NodePrepareResources", str(err.details())) from err
        missing = _left_out(claims, response.claims)
        if missing:
            raise self._error(
                "NodePrepareResources", f"the answer left out claims {', '.join(missing)}"
            )
        return {
            uid: PrepareResult(
                devices=tuple(_device(d) for d in result.devices), error=result.error
            )
            for uid, result in response.claims.items()
        }

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """NodeUnprepareResources: each claim's error ("" when unprepared), by claim UID."""
        request = self._pb.NodeUnprepareResourcesRequest(claims=self._claims(claims))
        try:
            response = await self.stub.NodeUnprepareResources(request, timeout=self.timeout_s)
        except grpc.aio.AioRpcError as err:
            raise_if_cancelled(err)
            raise self._error("NodeUnprepareResources", str(err.details())) from err
        missing = _left_out(claims, response.claims)
        if missing:
            raise self._error(
                "NodeUnprepareResources", f"the answer left out claims {', '.join(missing)}"
            )
        return {uid: result.error for uid, result in response.claims.items()}

    async def close(self) -> None:
        await self.channel.close(None)
