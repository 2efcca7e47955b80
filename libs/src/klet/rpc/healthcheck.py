"""A client for the standard gRPC health protocol (`grpc.health.v1.Health/Check`).

Used by syncloop's gRPC probes; services reach grpc only through libs adapters, so the
channel handling and the translation of gRPC failures into upstream's probe messages
live here. Each check opens its own insecure channel (upstream probes carry no
credentials), waits for it to connect within the probe's timeout (a refused port keeps
being retried until then, as a blocking Go dial does), calls Check with the remaining
time, and closes the channel.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from klet.cancellation import raise_if_cancelled
from klet.rpc.statuscodes import go_code


@dataclass(frozen=True)
class HealthCheck:
    """The outcome of one check; `message` is the text upstream's gRPC prober reports."""

    serving: bool
    message: str


def go_duration(seconds: float) -> str:
    """A duration as Go's time.Duration prints it (`1s`, `1.5s`, `500ms`, `2m0s`)."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        ms = seconds * 1000
        return f"{ms:g}ms"
    minutes, rest = divmod(seconds, 60)
    secs = f"{rest:.9f}".rstrip("0").rstrip(".") + "s"
    if minutes >= 60:
        hours, minutes = divmod(minutes, 60)
        return f"{int(hours)}h{int(minutes)}m{secs}"
    if minutes:
        return f"{int(minutes)}m{secs}"
    return secs


def _join_host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def check_health(
    host: str, *, port: int, service: str, timeout_s: float, user_agent: str
) -> HealthCheck:
    """Check `service` on `host:port` within `timeout_s` seconds."""
    addr = _join_host_port(host, port)
    deadline = time.monotonic() + timeout_s
    channel = grpc.aio.insecure_channel(addr, options=[("grpc.primary_user_agent", user_agent)])
    try:
        try:
            async with asyncio.timeout(timeout_s):
                await channel.channel_ready()
        except TimeoutError:
            return HealthCheck(
                False,
                f'timeout: failed to connect service "{addr}" within {go_duration(timeout_s)}: '
                "context deadline exceeded",
            )
        stub = health_pb2_grpc.HealthStub(channel)
        remaining = max(0.001, deadline - time.monotonic())
        try:
            response = await stub.Check(
                health_pb2.HealthCheckRequest(service=service), timeout=remaining
            )
        except grpc.aio.AioRpcError as err:
            raise_if_cancelled(err)
            code = err.code()
            if code == grpc.StatusCode.UNIMPLEMENTED:
                return HealthCheck(
                    False,
                    "error: this server does not implement the grpc health protocol "
                    f"(grpc.health.v1.Health): {err.details()}",
                )
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                return HealthCheck(
                    False, f"timeout: health rpc did not complete within {go_duration(timeout_s)}"
                )
            return HealthCheck(
                False,
                f"error: health rpc probe failed: rpc error: code = {go_code(code.name)} "
                f"desc = {err.details()}",
            )
        if response.status != health_pb2.HealthCheckResponse.SERVING:
            name = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
            return HealthCheck(False, f'service unhealthy (responded with "{name}")')
        return HealthCheck(True, "service healthy")
    finally:
        await channel.close(None)
