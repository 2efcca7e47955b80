"""Serving one of the project's gRPC APIs on a unix socket under the run directory.

DESIGN.md: internal gRPC listens on unix sockets, mode 0600. The socket is created
under a 0177 umask (so it is never reachable by others, not even for a moment) and a
stale socket file from a crashed process is replaced.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

import grpc


async def serve_unix(
    add_servicer: Callable[[grpc.aio.Server], None],
    socket_path: Path,
    *,
    ready: asyncio.Event | None = None,
) -> None:
    """Serve until cancelled; `add_servicer` registers the API on the server."""
    # Start-up only, on a local directory: not worth a thread.
    socket_path.parent.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240
    socket_path.unlink(missing_ok=True)  # noqa: ASYNC240
    server = grpc.aio.server()
    add_servicer(server)
    server.add_insecure_port(f"unix://{socket_path}")
    old_umask = os.umask(0o177)
    try:
        await server.start()
    finally:
        os.umask(old_umask)
    os.chmod(socket_path, 0o600)
    if ready is not None:
        ready.set()
    try:
        await server.wait_for_termination()
    finally:
        await server.stop(grace=1.0)
