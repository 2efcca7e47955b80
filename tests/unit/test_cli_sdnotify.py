"""systemd's notify protocol in the `kubelet` entry point (klet.cli.sdnotify, SystemdWatchdog):
`$NOTIFY_SOCKET` and `$WATCHDOG_USEC`/`$WATCHDOG_PID` read as upstream's go-systemd reads
them (bad or too small values refused naming the variable), datagrams delivered to a real
unix datagram socket standing in for systemd's, `WATCHDOG=1` every half period only while
every service runs, and klet up's supervisor in system mode sending `READY=1` once its
services are started, then the pings."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from klet.cli import sdnotify
from klet.cli import up as up_module


@pytest.fixture
def systemd_socket(tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.setblocking(False)
    yield path, sock
    sock.close()


async def _receive(sock: socket.socket, n: int) -> list[str]:
    loop = asyncio.get_running_loop()
    got = []
    async with asyncio.timeout(20):
        while len(got) < n:
            got.append((await loop.sock_recv(sock, 4096)).decode())
    return got


def test_notify_socket_and_watchdog_variables() -> None:
    assert sdnotify.notify_address({}) is None
    assert sdnotify.notify_address({"NOTIFY_SOCKET": "/run/systemd/notify"}) == (
        "/run/systemd/notify"
    )
    assert sdnotify.notify_address({"NOTIFY_SOCKET": "@abstract"}) == "\0abstract"
    assert sdnotify.watchdog_period({}, 7) is None
    assert sdnotify.watchdog_period({"WATCHDOG_USEC": "30000000"}, 7) == 15.0
    assert sdnotify.watchdog_period({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "7"}, 7) == 15.0
    # another process's watchdog is not ours
    assert sdnotify.watchdog_period({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "8"}, 7) is None


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"WATCHDOG_USEC": "x"}, "WATCHDOG_USEC='x': not an integer"),
        ({"WATCHDOG_USEC": "-5"}, "WATCHDOG_USEC='-5': must be a positive number"),
        (
            {"WATCHDOG_USEC": "1000000"},
            "WATCHDOG_USEC='1000000': the watchdog timeout is too small",
        ),
        ({"WATCHDOG_USEC": "9000000", "WATCHDOG_PID": "p"}, "WATCHDOG_PID='p'"),
    ],
)
def test_a_bad_watchdog_setting_is_refused_naming_it(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        sdnotify.watchdog_period(env, 7)


def test_send_reaches_the_socket_and_reports_a_missing_one(
    systemd_socket: tuple[str, socket.socket], tmp_path: Path
) -> None:
    path, sock = systemd_socket
    assert sdnotify.send(path, "READY=1")
    assert sock.recv(100) == b"READY=1"
    assert not sdnotify.send(str(tmp_path / "absent.sock"), "READY=1")


async def test_the_watchdog_pings_only_while_the_node_is_healthy(
    systemd_socket: tuple[str, socket.socket],
) -> None:
    path, sock = systemd_socket
    health = {"ok": True}
    task = asyncio.create_task(
        sdnotify.run_watchdog(address=path, period=0.01, healthy=lambda: health["ok"])
    )
    try:
        assert await _receive(sock, 3) == ["WATCHDOG=1"] * 3
        health["ok"] = False
        await asyncio.sleep(0.05)  # a ping already on its way may still arrive
        while True:
            try:
                sock.recv(100)
            except BlockingIOError:
                break
        await asyncio.sleep(0.1)  # ten periods unhealthy: nothing sent
        with pytest.raises(BlockingIOError):
            sock.recv(100)
        health["ok"] = True
        assert await _receive(sock, 1) == ["WATCHDOG=1"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_failed_ping_is_retried() -> None:
    calls: list[str] = []

    def notify(address: str, message: str) -> bool:
        calls.append(message)
        return len(calls) >= 3  # the first two fail

    task = asyncio.create_task(
        sdnotify.run_watchdog(
            address="x", period=60, healthy=lambda: True, notify=notify, retry_delays=(0, 0)
        )
    )
    await asyncio.sleep(0.05)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert calls == ["WATCHDOG=1"] * 3


async def test_the_supervisor_in_system_mode_sends_ready_then_pings(
    systemd_socket: tuple[str, socket.socket],
) -> None:
    path, sock = systemd_socket
    child = up_module.Child("svc", [sys.executable, "-c", "import time; time.sleep(60)"])
    main = asyncio.create_task(up_module._main([child], (path, 0.02)))
    try:
        got = await _receive(sock, 3)
        assert got == ["READY=1", "WATCHDOG=1", "WATCHDOG=1"]
        assert child.proc is not None and child.proc.returncode is None
    finally:
        os.kill(os.getpid(), signal.SIGTERM)  # _main's own handler: stop the services
        async with asyncio.timeout(30):
            assert await main == 0
        asyncio.get_running_loop().remove_signal_handler(signal.SIGTERM)
        asyncio.get_running_loop().remove_signal_handler(signal.SIGINT)
    assert child.proc.returncode is not None
