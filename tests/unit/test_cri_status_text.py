"""klet.cri.client.go_status_text: a gRPC error printed as grpc-go prints a status error
(`rpc error: code = <CamelCase name> desc = <details>`), which the kubelet API passes on
in /checkpoint's 500 and upstream's clients match on; Canceled is Go's spelling."""

from __future__ import annotations

import grpc
from grpc.aio import AioRpcError, Metadata
from klet.cri.client import go_status_text


def error(code: grpc.StatusCode, details: str) -> AioRpcError:
    return AioRpcError(code, Metadata(), Metadata(), details=details)


def test_codes_as_go_names_them() -> None:
    unimplemented = error(
        grpc.StatusCode.UNIMPLEMENTED,
        "unknown method CheckpointContainer for service runtime.v1.RuntimeService",
    )
    assert go_status_text(unimplemented) == (
        "rpc error: code = Unimplemented desc = unknown method CheckpointContainer "
        "for service runtime.v1.RuntimeService"
    )
    cases = {
        grpc.StatusCode.NOT_FOUND: "NotFound",
        grpc.StatusCode.DEADLINE_EXCEEDED: "DeadlineExceeded",
        grpc.StatusCode.CANCELLED: "Canceled",
        grpc.StatusCode.UNKNOWN: "Unknown",
        grpc.StatusCode.FAILED_PRECONDITION: "FailedPrecondition",
    }
    for code, name in cases.items():
        assert go_status_text(error(code, "x")) == f"rpc error: code = {name} desc = x"
