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

`observer` is told of every call made (the driver, upstream's full gRPC method
`/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources`, grpc-go's name of the
status code, seconds), where upstream's client interceptor observes
dra_grpc_operations_duration_seconds: an answer leaving out a claim is `OK` there (the
call itself succeeded), a cancelled call `Canceled`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
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
from klet.rpc.statuscodes import go_code

CALL_TIMEOUT_S = 45.0
"""upstream's defaultClientCallTimeout of a DRA plugin's calls."""

_API: dict[str, tuple[Any, Any]] = {
    SERVICE_V1: (pb_v1, grpc_v1),
    SERVICE_V1BETA1: (pb_v1beta1, grpc_v1beta1),
}


CallObserver = Callable[[str, str, str, float], None]
"""Told (driver, full gRPC method, grpc-go's status code name, seconds) after each call."""

PROTO_PACKAGE = "k8s.io.kubelet.pkg.apis.dra"
"""The proto package both services are declared in (`<package>.v1.DRAPlugin`)."""


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
        observer: CallObserver | None = None,
    ) -> None:
        if service not in _API:
            raise ValueError(f"DRA service {service!r} is not one of {', '.join(_API)}")
        self.endpoint = endpoint
        self.driver = driver
        self.service = service
        self.timeout_s = timeout_s
        self.observer = observer
        self._pb, stubs = _API[service]
        self.channel = grpc.aio.insecure_channel(f"unix://{endpoint}")
        self.stub = stubs.DRAPluginStub(self.channel)

    def _claims(self, claims: Sequence[ClaimRef]) -> list[Any]:
        return [self._pb.Claim(namespace=c.namespace, name=c.name, uid=c.uid) for c in claims]

    def _error(self, call: str, cause: str) -> DRAPluginError:
        return DRAPluginError(
            f"DRA driver {self.driver} at {self.endpoint}: {call} failed: {cause}"
        )

    async def _call(self, call: str, method: Callable[..., Awaitable[Any]], request: Any) -> Any:
        """One unary call with the deadline; DRAPluginError naming it when it fails."""
        start, code = time.monotonic(), "Unknown"
        try:
            response = await method(request, timeout=self.timeout_s)
            code = "OK"
            return response
        except grpc.aio.AioRpcError as err:
            code = go_code(err.code().name)
            raise_if_cancelled(err)
            raise self._error(call, str(err.details())) from err
        except asyncio.CancelledError:
            code = "Canceled"
            raise
        finally:
            if self.observer is not None:
                method_name = f"/{PROTO_PACKAGE}.{self.service}/{call}"
                self.observer(self.driver, method_name, code, time.monotonic() - start)

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        """NodePrepareResources: each claim's result, by claim UID."""
        request = self._pb.NodePrepareResourcesRequest(claims=self._claims(claims))
        response = await self._call("NodePrepareResources", self.stub.NodePrepareResources, request)
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
        response = await self._call(
            "NodeUnprepareResources", self.stub.NodeUnprepareResources, request
        )
        missing = _left_out(claims, response.claims)
        if missing:
            raise self._error(
                "NodeUnprepareResources", f"the answer left out claims {', '.join(missing)}"
            )
        return {uid: result.error for uid, result in response.claims.items()}

    async def close(self) -> None:
        await self.channel.close(None)
