"""Serving one of the project's gRPC APIs on a unix socket under the run directory.

DESIGN.md: internal gRPC listens on unix sockets, mode 0600. Whoever can connect to
syncloop's socket can kill pods, and to image-gc's can delete images, so each socket
lives in a directory of its server's own, `<run-dir>/grpc/<service>`
(`klet.model.layout.grpc_socket`; one per server, so a deployment mounts each client
only the directories of the sockets it calls), mode 0700 and owned by the serving
user: no other user can reach a socket there, not
even in the moment between bind(2) (which creates it with the umask's mode) and the
chmod to 0600 that follows. The directory is chmodded explicitly after it is made, so
the umask does not matter, and the process umask is never changed (it is process-wide:
changing it around an await would apply to whatever else the event loop creates
meanwhile). A directory that is a
symbolic link or belongs to another user is refused, naming it. A stale socket file
from a crashed process is replaced.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Callable
from pathlib import Path

import grpc

DIR_MODE = 0o700
SOCKET_MODE = 0o600


class SocketDirError(OSError):
    """The sockets' directory is not private and cannot be made so."""


def private_dir(directory: Path) -> None:
    """Make `directory` (and its parents) exist, with `directory` itself 0700 and ours."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(directory, DIR_MODE)
    except FileExistsError:
        pass
    info = os.lstat(directory)
    if not stat.S_ISDIR(info.st_mode):
        raise SocketDirError(f"socket directory {directory}: exists and is not a directory")
    if info.st_uid != os.geteuid():
        raise SocketDirError(
            f"socket directory {directory}: owned by uid {info.st_uid}, not by this "
            f"process (uid {os.geteuid()}); remove it or choose another --run-dir"
        )
    if stat.S_IMODE(info.st_mode) != DIR_MODE:
        os.chmod(directory, DIR_MODE)  # mkdir honours the umask; an old one may be wider


async def serve_unix(
    add_servicer: Callable[[grpc.aio.Server], None],
    socket_path: Path,
    *,
    ready: asyncio.Event | None = None,
) -> None:
    """Serve until cancelled; `add_servicer` registers the API on the server."""
    # Start-up only, on a local directory: not worth a thread.
    private_dir(socket_path.parent)
    socket_path.unlink(missing_ok=True)  # noqa: ASYNC240
    server = grpc.aio.server()
    add_servicer(server)
    server.add_insecure_port(f"unix://{socket_path}")
    await server.start()
    os.chmod(socket_path, SOCKET_MODE)
    if ready is not None:
        ready.set()
    try:
        await server.wait_for_termination()
    finally:
        await server.stop(grace=1.0)
