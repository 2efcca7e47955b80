"""klet.csi.client's node client tells its observer of every call (the driver it was
made for, upstream's full gRPC method name, grpc-go's status code name, seconds), and
syncloop's csi_operations_seconds (klet.syncloop.metrics.csi_operations) records them
under upstream's labels: a stage that succeeds is `OK`, a publish the driver refuses is
its code (`FailedPrecondition`), one past its deadline `DeadlineExceeded`; `migrated` is
always "false". The client is driven over a stand-in for its generated stub (no socket)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from grpc.aio import AioRpcError, Metadata
from klet.csi.client import Capability, CSIClient, CSIError, DriverUnavailable, Volume, go_code
from klet.syncloop.metrics import csi_operations
from prometheus_client import CollectorRegistry


def _error(code: grpc.StatusCode) -> AioRpcError:
    return AioRpcError(code, Metadata(), Metadata(), details="no", debug_error_string="")


async def test_every_node_call_is_timed_by_driver_method_and_code() -> None:
    registry = CollectorRegistry()
    client = CSIClient(
        "/nonexistent/csi.sock", driver="hostpath.csi.k8s.io", observer=csi_operations(registry)
    )

    async def ok(request: Any, **_: Any) -> Any:
        return SimpleNamespace()

    async def refused(request: Any, **_: Any) -> Any:
        raise _error(grpc.StatusCode.FAILED_PRECONDITION)

    async def late(request: Any, **_: Any) -> Any:
        raise _error(grpc.StatusCode.DEADLINE_EXCEEDED)

    client._node = SimpleNamespace(  # type: ignore[assignment]
        NodeStageVolume=ok, NodePublishVolume=refused, NodeUnpublishVolume=late
    )
    volume = Volume("v1", Capability("SINGLE_NODE_WRITER"))
    try:
        await client.stage(volume, staging_path="/s")
        await client.stage(volume, staging_path="/s")
        with pytest.raises(CSIError) as refusal:
            await client.publish(volume, target_path="/t")
        assert refusal.value.code == "FAILED_PRECONDITION"
        with pytest.raises(DriverUnavailable):
            await client.unpublish("v1", target_path="/t")
    finally:
        await client.close()

    def count(method: str, code: str) -> float | None:
        labels = {
            "driver_name": "hostpath.csi.k8s.io",
            "method_name": f"/csi.v1.Node/{method}",
            "grpc_status_code": code,
            "migrated": "false",
        }
        return registry.get_sample_value("csi_operations_seconds_count", labels)

    assert count("NodeStageVolume", "OK") == 2
    assert count("NodePublishVolume", "FailedPrecondition") == 1
    assert count("NodeUnpublishVolume", "DeadlineExceeded") == 1
    assert count("NodePublishVolume", "OK") is None


def test_go_code_names() -> None:
    assert [go_code(n) for n in ("OK", "CANCELLED", "DEADLINE_EXCEEDED", "UNAVAILABLE")] == [
        "OK",
        "Canceled",
        "DeadlineExceeded",
        "Unavailable",
    ]
