"""A private redis-server for the dev stack and the tests.

Bound to 127.0.0.1 on a port of its own, with persistence off: the bus keeps no state
that must outlive a test run, and tests that check resync after a Redis outage restart
it empty on the same port (``restart``), which is what a flushed production Redis looks
like to the services.
"""

from __future__ import annotations

import socket
from pathlib import Path

from klet.devstack.procs import ManagedProcess, StartError, free_port

REDIS_BINARY = "/usr/bin/redis-server"


def redis_ping(host: str, port: int, *, timeout_s: float = 1.0) -> bool:
    """Whether a Redis server answers PING with +PONG (raw RESP, no client library)."""
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        sock.sendall(b"*1\r\n$4\r\nPING\r\n")
        return sock.recv(64).startswith(b"+PONG")


class RedisServer:
    """One redis-server process under ``dir``, on ``port`` (a free one by default)."""

    def __init__(self, dir: Path, port: int | None = None) -> None:
        self.dir = dir
        self.port = port if port is not None else free_port()
        self._proc: ManagedProcess | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.alive

    def start(self, *, timeout_s: float = 10.0) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        argv = [
            REDIS_BINARY,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--dir",
            str(self.dir),
            "--protected-mode",
            "yes",
        ]
        proc = ManagedProcess("redis", argv, dir=self.dir)
        proc.start()
        self._proc = proc
        try:
            proc.wait_ready(
                lambda: redis_ping("127.0.0.1", self.port),
                timeout_s,
                f"PING on 127.0.0.1:{self.port}",
            )
        except StartError:
            proc.stop()
            self._proc = None
            raise

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.stop()
            self._proc = None

    def restart(self) -> None:
        """Stop and start again on the same port, with an empty dataset."""
        self.stop()
        self.start()
