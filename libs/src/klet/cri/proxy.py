"""The CRI allow-list proxy: one unix socket per reading service, forwarding only the
calls klet.cri.allowlist grants that service to the real runtime.

status-reporter, eviction and image-gc get `<run-dir>/cri/<service>.sock` as their
container runtime (and image service) endpoint instead of the runtime's own socket,
which they no longer mount. The proxy is a gRPC server with one generic handler per
socket: every method name is looked up in that service's list; an allowed call is
forwarded as raw bytes (no deserialization: identity serializers on both sides, so a
CRI version the stubs do not know passes unchanged) with the caller's remaining
deadline, and the runtime's status code and details come back as they are; a refused
call gets PERMISSION_DENIED naming the method and is logged. The answer never depends
on the bytes, only on the method name, so a malformed request is the runtime's to
refuse.

One process serves all three sockets: `klet cri-proxy`, a container of its own in
compose and the chart; `klet up`'s supervisor, on its own event loop (a separate
interpreter cost ~20 MB PSS; klet.cli.up weighs the trade). It imports gRPC and the
allow-list only, never the CRI stubs or klet.cri.client, so serving it inside another
process costs little. It holds no state: a restarted proxy
removes the stale socket files and binds them again, and the services' gRPC channels,
which reconnect to a unix path within a second (klet.cri.client's back-off), carry on;
a call made while it is down fails UNAVAILABLE and is retried like any runtime outage.
The runtime restarting is the same from the other side: the proxy's channel to it
reconnects, and calls meanwhile get the runtime's UNAVAILABLE.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from klet.cri.allowlist import ALLOWED, IMAGE, refusal
from klet.cri.endpoint import channel_target

log = logging.getLogger(__name__)

# As klet.cri.client's: a runtime that restarted is reached again within a second.
_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 16 * 1024 * 1024),
    ("grpc.max_send_message_length", 16 * 1024 * 1024),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
_SERVER_OPTIONS = [
    ("grpc.max_receive_message_length", 16 * 1024 * 1024),
    ("grpc.max_send_message_length", 16 * 1024 * 1024),
]


def _identity(b: bytes) -> bytes:
    return b


@dataclass(frozen=True)
class Owner:
    """Who may connect to one service's socket: its file is chowned to uid:gid, 0660.
    None leaves it the proxy's own, 0600 (everything runs as one user)."""

    uid: int
    gid: int


class _Filter(grpc.GenericRpcHandler):  # type: ignore[type-arg]  # generic in the stubs only
    """Every method of one service's socket: forwarded when its list allows it."""

    def __init__(
        self, service: str, upstream: Callable[[str], grpc.aio.Channel], refused: Callable[[], None]
    ) -> None:
        self._service = service
        self._upstream = upstream
        self._refused = refused

    def service(
        self, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[bytes, bytes]:
        method: str = handler_call_details.method
        why = refusal(self._service, method)
        if why is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._refuse(method, why),
                request_deserializer=_identity,
                response_serializer=_identity,
            )
        return grpc.unary_unary_rpc_method_handler(
            self._forward(method),
            request_deserializer=_identity,
            response_serializer=_identity,
        )

    def _refuse(self, method: str, why: str) -> Callable[..., Any]:
        async def refuse(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
            self._refused()
            log.warning("refused CRI call %s for %s", method, self._service)
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, why)
            raise AssertionError("abort returned")  # pragma: no cover: abort raises

        return refuse

    def _forward(self, method: str) -> Callable[..., Any]:
        call = self._upstream(method).unary_unary(
            method, request_serializer=_identity, response_deserializer=_identity
        )

        async def forward(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
            try:
                answer: bytes = await call(request, timeout=context.time_remaining())
            except grpc.aio.AioRpcError as err:
                await context.abort(err.code(), err.details() or "")
                raise AssertionError("abort returned") from err  # pragma: no cover
            return answer

        return forward


class CRIProxy:
    """The filtering sockets in front of one runtime: `sockets` maps each service served
    to its socket's path (a directory of its own may hold it: a volume only that
    service's container shares with the proxy, as compose and the chart do)."""

    def __init__(
        self,
        *,
        runtime_endpoint: str,
        image_endpoint: str = "",
        sockets: Mapping[str, Path],
        owners: Mapping[str, Owner] | None = None,
    ) -> None:
        self.runtime_endpoint = runtime_endpoint
        self.image_endpoint = image_endpoint or runtime_endpoint
        self.sockets = dict(sockets)
        self.services = tuple(self.sockets)
        self.owners = dict(owners or {})
        unknown = [s for s in self.services if s not in ALLOWED]
        if unknown:
            raise ValueError(f"CRI proxy: no allow-list for {', '.join(unknown)}")
        self.refused_calls = 0
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._servers: list[grpc.aio.Server] = []

    def _channel(self, method: str) -> grpc.aio.Channel:
        endpoint = self.image_endpoint if method.startswith(f"/{IMAGE}/") else self.runtime_endpoint
        if endpoint not in self._channels:
            self._channels[endpoint] = grpc.aio.insecure_channel(
                channel_target(endpoint), options=_CHANNEL_OPTIONS
            )
        return self._channels[endpoint]

    def _count_refusal(self) -> None:
        self.refused_calls += 1

    async def start(self) -> None:
        """Bind every service's socket (a stale file from a dead proxy is replaced)."""
        for service, path in self.sockets.items():
            if not path.parent.is_dir():
                path.parent.mkdir(parents=True)
                # Others need to reach the socket inside; its own mode says who may.
                os.chmod(path.parent, 0o755)
            path.unlink(missing_ok=True)
            server = grpc.aio.server(options=_SERVER_OPTIONS)
            server.add_generic_rpc_handlers((_Filter(service, self._channel, self._count_refusal),))
            if server.add_insecure_port(f"unix://{path}") == 0:
                raise OSError(f"CRI proxy: cannot bind {path}")
            await server.start()
            owner = self.owners.get(service)
            if owner is None:
                os.chmod(path, 0o600)
            else:
                os.chown(path, owner.uid, owner.gid)
                os.chmod(path, 0o660)
            self._servers.append(server)
            log.info("serving %s's CRI on %s (runtime %s)", service, path, self.runtime_endpoint)

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop serving (calls in flight get `grace_s`), remove the sockets, close."""
        await asyncio.gather(*(s.stop(grace_s) for s in self._servers))
        self._servers.clear()
        for path in self.sockets.values():
            path.unlink(missing_ok=True)
        await asyncio.gather(*(c.close(None) for c in self._channels.values()))
        self._channels.clear()

    async def serve(self, stop: asyncio.Event, ready: asyncio.Event | None = None) -> None:
        """Serve until `stop` is set."""
        await self.start()
        if ready is not None:
            ready.set()
        try:
            await stop.wait()
        finally:
            await self.stop()
