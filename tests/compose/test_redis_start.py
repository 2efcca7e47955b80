"""The klet-redis image's start script and health check (tools/image/redis), run on the
host with Debian's redis-server and the files `klet bus-acl` writes, as the compose file
and the chart run them in the container.

klet-redis-check fails while no Redis answers, and until klet's function library is
loaded; klet-redis-server starts redis-server with the arguments given, loads the
library as klet-admin (a service user may then FCALL it), passes SIGTERM on and exits
with the server's status; killed by another hand, the server takes the script down
with a failure, so the container is restarted and the library loaded again. A functions
file without its library name, or an admin password it cannot read, stops the script
before any server starts.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from klet.bus.acl import user_name
from klet.bus.functions import LIBRARY

from tests.harness.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "tools" / "image" / "redis"
NODE = "node-a"


@dataclass
class Bus:
    """The bus-acl files and the environment of the two scripts."""

    dir: Path
    socket: Path

    @property
    def env(self) -> dict[str, str]:
        return {
            "PATH": os.environ["PATH"],
            "KLET_REDIS_SOCKET": str(self.socket),
            "KLET_REDIS_FUNCTIONS_FILE": str(self.dir / "functions.lua"),
            "KLET_REDIS_ADMIN_PASSWORD_FILE": str(self.dir / "admin-password"),
        }

    def server_args(self) -> list[str]:
        return [
            "--port",
            "0",
            "--unixsocket",
            str(self.socket),
            "--unixsocketperm",
            "600",
            "--aclfile",
            str(self.dir / "users.acl"),
            "--save",
            "",
            "--appendonly",
            "no",
        ]

    def start(self, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [str(SCRIPTS / "klet-redis-server"), *self.server_args()],
            env=env or self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def check(self) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(SCRIPTS / "klet-redis-check")],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=30,
        )

    def cli(self, user: str, password_file: Path, *argv: str) -> str:
        res = subprocess.run(
            ["redis-cli", "-s", str(self.socket), "--user", user, "--no-auth-warning", *argv],
            env={**self.env, "REDISCLI_AUTH": password_file.read_text().strip()},
            capture_output=True,
            text=True,
            timeout=30,
        )
        return res.stdout.strip()


@pytest.fixture
def bus(tmp_path: Path) -> Bus:
    subprocess.run(
        [
            str(ROOT / ".venv" / "bin" / "klet"),
            "bus-acl",
            f"--node={NODE}",
            f"--secrets-dir={tmp_path / 'secrets'}",
            f"--acl-file={tmp_path / 'users.acl'}",
            f"--admin-password-file={tmp_path / 'admin-password'}",
            f"--functions-file={tmp_path / 'functions.lua'}",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return Bus(tmp_path, tmp_path / "redis.sock")


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


@pytest.fixture
def running(bus: Bus) -> Iterator[subprocess.Popen[str]]:
    """klet-redis-server started; stopped at the end by SIGTERM, and its server killed
    by PID should it outlive it."""
    proc = bus.start()
    try:
        yield proc
    finally:
        started = children(proc.pid)
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        for pid in started:
            if Path(f"/proc/{pid}").exists():
                os.kill(pid, signal.SIGKILL)
        assert proc.stdout is not None
        proc.stdout.close()


def server_pid(bus: Bus) -> int:
    """redis-server's PID, from its own answer."""
    info = bus.cli("klet-admin", bus.dir / "admin-password", "INFO", "server")
    return next(int(x.split(":")[1]) for x in info.splitlines() if x.startswith("process_id:"))


def test_unhealthy_until_the_library_is_loaded(bus: Bus, running: subprocess.Popen[str]) -> None:
    wait_for(lambda: bus.check().returncode == 0, timeout_s=30, what="klet-redis-check to pass")
    listed = bus.cli("klet-admin", bus.dir / "admin-password", "FUNCTION", "LIST")
    assert LIBRARY in listed.splitlines()
    # A service user may call the library's functions (and nothing else of Lua).
    service = bus.dir / "secrets" / NODE / "syncloop"
    reply = bus.cli(user_name(NODE, "syncloop"), service, "FUNCTION", "LIST")
    assert "NOPERM" in reply
    # Flushing the functions (what a restart without persistence does) fails the check.
    bus.cli("klet-admin", bus.dir / "admin-password", "FUNCTION", "FLUSH")
    failed = bus.check()
    assert failed.returncode == 1
    assert f"function library {LIBRARY} not loaded" in failed.stdout


def test_a_check_without_a_server_fails(bus: Bus) -> None:
    res = bus.check()
    assert res.returncode == 1
    assert "Could not connect" in res.stdout


def test_sigterm_stops_the_server_and_the_script(bus: Bus, running: subprocess.Popen[str]) -> None:
    wait_for(lambda: bus.check().returncode == 0, timeout_s=30, what="the library loaded")
    server = server_pid(bus)
    running.send_signal(signal.SIGTERM)
    out, _ = running.communicate(timeout=30)
    assert running.returncode == 0, out
    assert f"loaded function library {LIBRARY}" in out
    assert not Path(f"/proc/{server}").exists()
    assert not bus.socket.exists()  # redis-server removed it on its way out


def test_a_killed_server_fails_the_script(bus: Bus, running: subprocess.Popen[str]) -> None:
    wait_for(lambda: bus.check().returncode == 0, timeout_s=30, what="the library loaded")
    os.kill(server_pid(bus), signal.SIGKILL)
    running.wait(timeout=30)
    assert running.returncode != 0


@pytest.mark.parametrize("broken", ["functions", "password"])
def test_a_broken_set_up_starts_no_server(bus: Bus, broken: str) -> None:
    env = bus.env
    if broken == "functions":
        (bus.dir / "functions.lua").write_text("return 1\n")
        expected = "the first line is not '#!lua name=<library>'"
    else:
        env["KLET_REDIS_ADMIN_PASSWORD_FILE"] = str(bus.dir / "missing")
        expected = "cannot read the admin password"
    proc = bus.start(env)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert expected in out
    assert not bus.socket.exists()
