"""The gRPC unix sockets (issue 11, file permissions): each service socket lives in
`<run-dir>/grpc/<service>`, a 0700 directory of the serving user, and is itself 0600, whatever
the umask and whatever mode an older directory had; the process umask is never
touched (it is process-wide, so changing it around an await leaks into whatever else
runs meanwhile); another user cannot connect; a directory that is a symlink or
belongs to someone else is refused by name."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import grpc
import pytest
from klet.model.layout import IMAGE_GC, SYNCLOOP, grpc_socket
from klet.rpc.unixserver import SocketDirError, private_dir, serve_unix

NOBODY = 65534


def no_api(server: grpc.aio.Server) -> None:
    """No servicer: the socket is what is under test."""


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Path], Awaitable[None]]]:
    tasks: list[asyncio.Task[None]] = []

    async def start(sock: Path) -> None:
        ready = asyncio.Event()
        task = asyncio.create_task(serve_unix(no_api, sock, ready=ready))
        tasks.append(task)
        waiter = asyncio.create_task(ready.wait())
        done, _ = await asyncio.wait({task, waiter}, timeout=10, return_when="FIRST_COMPLETED")
        if task in done:
            waiter.cancel()
            task.result()  # raises what serve_unix raised
        assert waiter in done, "the server did not become ready"

    yield start
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_socket_dir_0700_and_socket_0600_whatever_the_umask(
    tmp_path: Path, serve: Callable[[Path], Awaitable[None]]
) -> None:
    sock = grpc_socket(tmp_path / "run", SYNCLOOP)
    sock.parent.mkdir(parents=True, mode=0o755)
    os.chmod(sock.parent, 0o755)  # as an older klet (or a 022 umask) left it
    old = os.umask(0)
    try:
        await serve(sock)
    finally:
        os.umask(old)
    assert oct(mode(sock.parent)) == "0o700"
    assert oct(mode(sock)) == "0o600"
    assert stat.S_ISSOCK(os.lstat(sock).st_mode)


async def test_the_process_umask_is_never_changed(
    tmp_path: Path, serve: Callable[[Path], Awaitable[None]], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    real = os.umask

    def umask(mask: int) -> int:
        calls.append(mask)
        return real(mask)

    monkeypatch.setattr(os, "umask", umask)
    await serve(grpc_socket(tmp_path / "run", IMAGE_GC))
    assert calls == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as nobody")
async def test_another_user_cannot_connect(
    tmp_path: Path, serve: Callable[[Path], Awaitable[None]]
) -> None:
    run_dir = tmp_path / "run"
    sock = grpc_socket(run_dir, SYNCLOOP)
    await serve(sock)
    # so that only the socket's own directory stands in the way
    os.chmod(run_dir, 0o755)
    os.chmod(sock.parent.parent, 0o755)
    connect = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "try:\n"
        "    s.connect(sys.argv[1])\n"
        "except PermissionError:\n"
        "    sys.exit(13)\n"
    )
    argv = [sys.executable, "-c", connect, "grpc/syncloop/syncloop.sock"]

    def run(*prefix: str) -> int:
        # starts in the run directory: no directory above it is on the path
        proc = subprocess.run([*prefix, *argv], cwd=run_dir, timeout=30, check=False)
        return proc.returncode

    nobody = ("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups")
    assert await asyncio.to_thread(run, *nobody) == 13
    assert await asyncio.to_thread(run) == 0  # the same client as root connects


def test_a_symlinked_or_foreign_socket_dir_is_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir(mode=0o755)
    (tmp_path / "run").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / "run" / "grpc")
    with pytest.raises(SocketDirError, match=r"run/grpc: exists and is not a directory"):
        private_dir(tmp_path / "run" / "grpc")
    assert mode(tmp_path / "elsewhere") == 0o755
    if os.geteuid() == 0:
        foreign = tmp_path / "foreign"
        foreign.mkdir()
        os.chown(foreign, 1000, 1000)
        with pytest.raises(SocketDirError, match=r"foreign: owned by uid 1000, not by this"):
            private_dir(foreign)
