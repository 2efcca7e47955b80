"""The DRA kubelet plugin client (klet.rpc.dra) against an in-process DRAPlugin server on
a unix socket, for both services a driver may offer (v1.DRAPlugin, v1beta1.DRAPlugin: the
same messages under two package names, so a server of one does not answer the other):
NodePrepareResources carries the claims (namespace, name, UID) and answers each claim's
devices with their pool, name, requests and CDI device IDs, or the driver's error for
that claim; NodeUnprepareResources answers each claim's error; an answer leaving out a
claim, a failed call (the server's status message) and a call past the deadline raise
DRAPluginError naming the driver, the call and the cause; a call to the wrong service
fails as UNIMPLEMENTED; a cancelled caller gets CancelledError, not DRAPluginError; each
call observed by full method and grpc-go's status code, through syncloop's
dra_grpc_operations_duration_seconds."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from klet.model.dra import SERVICE_V1, SERVICE_V1BETA1, ClaimRef, PreparedDevice, PrepareResult
from klet.rpc.dra import DRAPluginError, GrpcDRAPlugin
from klet.rpc.gen.klet.dra.v1 import api_pb2 as pb_v1
from klet.rpc.gen.klet.dra.v1 import api_pb2_grpc as grpc_v1
from klet.rpc.gen.klet.dra.v1beta1 import api_pb2 as pb_v1beta1
from klet.rpc.gen.klet.dra.v1beta1 import api_pb2_grpc as grpc_v1beta1
from klet.syncloop.metrics import dra_grpc_operations
from prometheus_client import CollectorRegistry

API = {SERVICE_V1: (pb_v1, grpc_v1), SERVICE_V1BETA1: (pb_v1beta1, grpc_v1beta1)}
CLAIM = ClaimRef(namespace="default", name="gpu", uid="uid-1")
OTHER = ClaimRef(namespace="default", name="nic", uid="uid-2")


@dataclass
class Driver:
    """A DRAPlugin servicer: records the claims asked, answers what `prepared` says."""

    pb: Any
    asked: list[tuple[str, list[tuple[str, str, str]]]] = field(default_factory=list)
    leave_out: bool = False
    abort: str = ""
    hang: bool = False
    called: asyncio.Event = field(default_factory=asyncio.Event)

    def _claims(self, call: str, request: Any) -> list[str]:
        self.asked.append((call, [(c.namespace, c.name, c.uid) for c in request.claims]))
        self.called.set()
        uids = [c.uid for c in request.claims]
        return uids[1:] if self.leave_out else uids

    async def NodePrepareResources(self, request: Any, context: Any) -> Any:  # noqa: N802
        uids = self._claims("prepare", request)
        if self.abort:
            await context.abort(grpc.StatusCode.INTERNAL, self.abort)
        if self.hang:
            await asyncio.Event().wait()
        answer = self.pb.NodePrepareResourcesResponse()
        for uid in uids:
            if uid == OTHER.uid:
                answer.claims[uid].error = "no such device"
                continue
            answer.claims[uid].devices.append(
                self.pb.Device(
                    request_names=["gpu"],
                    pool_name="node-1",
                    device_name="gpu-0",
                    cdi_device_ids=["example.com/gpu=gpu-0"],
                )
            )
        return answer

    async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:  # noqa: N802
        answer = self.pb.NodeUnprepareResourcesResponse()
        for uid in self._claims("unprepare", request):
            answer.claims[uid].error = "busy" if uid == OTHER.uid else ""
        return answer


@dataclass
class Served:
    driver: Driver
    socket: Path
    service: str


@pytest.fixture(params=[SERVICE_V1, SERVICE_V1BETA1])
async def served(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Served]:
    pb, stubs = API[request.param]
    driver = Driver(pb)
    server = grpc.aio.server()
    handler = type("Servicer", (stubs.DRAPluginServicer,), {})()
    handler.NodePrepareResources = driver.NodePrepareResources
    handler.NodeUnprepareResources = driver.NodeUnprepareResources
    stubs.add_DRAPluginServicer_to_server(handler, server)
    socket = tmp_path / "dra.sock"
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    yield Served(driver, socket, request.param)
    await server.stop(grace=None)


def client(served: Served, **kw: Any) -> GrpcDRAPlugin:
    return GrpcDRAPlugin(served.socket, driver="gpu.example.com", service=served.service, **kw)


async def test_prepare_and_unprepare_carry_claims_and_answers(served: Served) -> None:
    plugin = client(served)
    try:
        got = await plugin.prepare([CLAIM, OTHER])
        assert got == {
            CLAIM.uid: PrepareResult(
                devices=(
                    PreparedDevice(
                        pool_name="node-1",
                        device_name="gpu-0",
                        request_names=("gpu",),
                        cdi_device_ids=("example.com/gpu=gpu-0",),
                    ),
                )
            ),
            OTHER.uid: PrepareResult(error="no such device"),
        }
        assert await plugin.unprepare([CLAIM, OTHER]) == {CLAIM.uid: "", OTHER.uid: "busy"}
    finally:
        await plugin.close()
    claims = [("default", "gpu", "uid-1"), ("default", "nic", "uid-2")]
    assert served.driver.asked == [("prepare", claims), ("unprepare", claims)]


async def test_an_answer_leaving_out_a_claim_is_an_error(served: Served) -> None:
    served.driver.leave_out = True
    plugin = client(served)
    try:
        with pytest.raises(
            DRAPluginError,
            match=r"NodePrepareResources failed: the answer "
            r"left out claims default/gpu \(uid-1\)",
        ):
            await plugin.prepare([CLAIM, OTHER])
        with pytest.raises(DRAPluginError, match="NodeUnprepareResources failed: the answer"):
            await plugin.unprepare([CLAIM, OTHER])
    finally:
        await plugin.close()


async def test_a_failed_call_names_driver_call_and_cause(served: Served) -> None:
    served.driver.abort = "claim not allocated to this node"
    plugin = client(served)
    try:
        with pytest.raises(DRAPluginError) as err:
            await plugin.prepare([CLAIM])
    finally:
        await plugin.close()
    assert str(err.value) == (
        f"DRA driver gpu.example.com at {served.socket}: NodePrepareResources failed: "
        "claim not allocated to this node"
    )


async def test_a_call_past_its_deadline_fails(served: Served) -> None:
    served.driver.hang = True
    plugin = client(served, timeout_s=0.2)
    try:
        with pytest.raises(DRAPluginError, match="Deadline Exceeded"):
            await plugin.prepare([CLAIM])
    finally:
        await plugin.close()


async def test_the_other_service_is_not_answered(served: Served) -> None:
    other = SERVICE_V1BETA1 if served.service == SERVICE_V1 else SERVICE_V1
    plugin = GrpcDRAPlugin(served.socket, driver="gpu.example.com", service=other)
    try:
        with pytest.raises(DRAPluginError, match="NodePrepareResources failed"):
            await plugin.prepare([CLAIM])
    finally:
        await plugin.close()


async def test_a_cancelled_caller_is_cancelled(served: Served) -> None:
    served.driver.hang = True
    plugin = client(served)
    try:
        task = asyncio.create_task(plugin.prepare([CLAIM]))
        await served.driver.called.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        await plugin.close()


def test_an_unknown_service_is_refused() -> None:
    with pytest.raises(ValueError, match="'v2.DRAPlugin' is not one of"):
        GrpcDRAPlugin(Path("/x.sock"), driver="d", service="v2.DRAPlugin")


async def test_each_call_is_observed_by_method_and_grpc_go_status_code(served: Served) -> None:
    """What syncloop serves as dra_grpc_operations_duration_seconds (upstream's client
    interceptor): every call, its full method, OK when the call returned (an answer
    leaving out a claim too: the call succeeded), else grpc-go's name of the code."""
    registry = CollectorRegistry()
    plugin = client(served, timeout_s=0.5, observer=dra_grpc_operations(registry))
    try:
        await plugin.prepare([CLAIM])
        await plugin.unprepare([CLAIM])
        served.driver.leave_out = True
        with pytest.raises(DRAPluginError):
            await plugin.prepare([CLAIM, OTHER])
        served.driver.leave_out, served.driver.abort = False, "no"
        with pytest.raises(DRAPluginError):
            await plugin.prepare([CLAIM])
        served.driver.abort, served.driver.hang = "", True
        with pytest.raises(DRAPluginError):
            await plugin.prepare([CLAIM])
    finally:
        await plugin.close()
    package = f"/k8s.io.kubelet.pkg.apis.dra.{served.service}"

    def count(method: str, code: str) -> float | None:
        return registry.get_sample_value(
            "dra_grpc_operations_duration_seconds_count",
            {
                "driver_name": "gpu.example.com",
                "method_name": f"{package}/{method}",
                "grpc_status_code": code,
            },
        )

    assert count("NodePrepareResources", "OK") == 2.0
    assert count("NodeUnprepareResources", "OK") == 1.0
    assert count("NodePrepareResources", "Internal") == 1.0
    assert count("NodePrepareResources", "DeadlineExceeded") == 1.0
