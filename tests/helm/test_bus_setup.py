"""The chart's bus set-up scripts, rendered by the pinned helm and run on the host against
a private redis-server (Debian's), as their init containers run them on a node.

The bundled Redis's `bus-acl` step writes the ACL file, the admin password and the
function library, gives Redis its files (group 6379, 0640) and its socket directory
(6379, 0750), and copies each service's password to services/<service>/password; a
redis-server started on that ACL file lets each service in with the copied password,
and a second run keeps every password. For an external Redis the chart runs no set-up
step (no pod gets its admin password): the operator's `klet bus-acl --apply`, run with
an admin credential against a Redis that knows only the admin, creates each service
user of the node with the password it writes for that service and loads the function
library; copied where the rendered services read them, each lets its service in.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from klet.bus.acl import SERVICES, user_name
from klet.bus.functions import LIBRARY

from tests.harness.helmbin import render

ROOT = Path(__file__).resolve().parents[2]
NODE = "node-a"
Doc = dict[str, Any]


def init_container(component: str, sets: list[str]) -> Doc:
    """The init container of the rendered workload `component`."""
    for doc in render(sets=sets):
        if doc["metadata"].get("labels", {}).get("app.kubernetes.io/component") == component:
            (init,) = doc["spec"]["template"]["spec"]["initContainers"]
            return dict(init)
    raise AssertionError(f"no {component} workload rendered")


def script_env(init: Doc) -> dict[str, str]:
    """The init container's literal env entries, and this test's node name."""
    return {**{e["name"]: e["value"] for e in init["env"] if "value" in e}, "NODE_NAME": NODE}


def run_script(init: Doc, env: dict[str, str], replace: dict[str, str]) -> str:
    """The init container's `sh -ec` script on the host, with `klet` from the venv, its
    env entries given values by `env`, and container paths replaced by host ones."""
    command = init["command"]
    assert isinstance(command, list) and command[:2] == ["sh", "-ec"]
    script = command[2]
    for old, new in replace.items():
        script = script.replace(old, new)
    res = subprocess.run(
        ["sh", "-ec", script],
        env={"PATH": f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    return res.stdout


class Redis:
    """A private redis-server on a unix socket, stopped by its PID."""

    def __init__(self, socket: Path, *args: str) -> None:
        self.socket = socket
        self.proc = subprocess.Popen(
            ["redis-server", "--port", "0", "--unixsocket", str(socket), "--save", "", *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while not socket.exists():
            assert self.proc.poll() is None, "redis-server exited"
            assert time.monotonic() < deadline, "redis-server did not listen"
            time.sleep(0.05)

    def cli(self, user: str, password: str, *argv: str) -> str:
        res = subprocess.run(
            ["redis-cli", "-s", str(self.socket), "--user", user, "--no-auth-warning", *argv],
            env={**os.environ, "REDISCLI_AUTH": password},
            capture_output=True,
            text=True,
            timeout=30,
        )
        return res.stdout.strip()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=20)


@pytest.fixture
def redis_servers() -> Iterator[list[Redis]]:
    started: list[Redis] = []
    yield started
    for server in started:
        server.stop()


def test_bundled_redis_set_up(tmp_path: Path, redis_servers: list[Redis]) -> None:
    bus, socket_dir = tmp_path / "bus", tmp_path / "sock"
    socket_dir.mkdir()
    init = init_container("redis", [f"paths.busDir={bus}", f"paths.redisSocketDir={socket_dir}"])
    env = script_env(init)
    run_script(init, env, {})

    for name in ("users.acl", "admin-password"):
        st = (bus / name).stat()
        assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (0, 6379, 0o640), name
    assert (bus / "functions.lua").read_text().startswith(f"#!lua name={LIBRARY}\n")
    st = socket_dir.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (6379, 6379, 0o750)
    passwords = {}
    for service in SERVICES:
        copied = bus / "services" / service / "password"
        assert copied.read_text() == (bus / "secrets" / NODE / service).read_text()
        assert copied.stat().st_mode & 0o777 == 0o600
        passwords[service] = copied.read_text().strip()

    redis = Redis(tmp_path / "redis.sock", "--aclfile", str(bus / "users.acl"))
    redis_servers.append(redis)
    for service, password in passwords.items():
        assert redis.cli(user_name(NODE, service), password, "PING") == "PONG", service
    assert redis.cli(user_name(NODE, "syncloop"), passwords["eviction"], "PING") != "PONG"

    run_script(init, env, {})  # every start of the pod: the passwords stay
    for service, password in passwords.items():
        assert (bus / "services" / service / "password").read_text().strip() == password


def test_external_redis_users_from_the_operators_command(
    tmp_path: Path, redis_servers: list[Redis]
) -> None:
    """externalRedis.perNodeUsers: the chart runs nothing with the admin password; the
    operator's command from helm/klet/README.md, run against a Redis that knows only the
    admin, creates each service user of the node with the password it writes for it and
    loads the function library, and a rendered service reads its password where the
    operator copies it."""
    bus, secrets = tmp_path / "bus", tmp_path / "operator"
    admin = tmp_path / "admin"
    admin.write_text("admin-secret\n")
    acl = tmp_path / "users.acl"
    acl.write_text("user default off\nuser root on >admin-secret ~* &* +@all\n")
    redis = Redis(tmp_path / "redis.sock", "--aclfile", str(acl))
    redis_servers.append(redis)
    url = f"unix://{redis.socket}"
    res = subprocess.run(
        [
            str(ROOT / ".venv" / "bin" / "klet"),
            "bus-acl",
            f"--apply={url}",
            f"--node={NODE}",
            f"--secrets-dir={secrets}",
            "--admin-username=root",
            f"--admin-password-file={admin}",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    assert LIBRARY in redis.cli("root", "admin-secret", "FUNCTION", "LIST").splitlines()
    sets = ["redis.enabled=false", f"externalRedis.url={url}", "externalRedis.perNodeUsers=true"]
    for doc in render(sets=[*sets, f"paths.busDir={bus}"]):
        component = doc["metadata"].get("labels", {}).get("app.kubernetes.io/component")
        if component not in SERVICES:
            continue
        volumes = {v["name"]: v for v in doc["spec"]["template"]["spec"]["volumes"]}
        assert volumes["bus-password"]["hostPath"]["path"] == f"{bus}/services/{component}"
    for service in SERVICES:  # the copy README.md asks for
        (bus / "services" / service).mkdir(parents=True)
        (bus / "services" / service / "password").write_text((secrets / NODE / service).read_text())
        password = (bus / "services" / service / "password").read_text().strip()
        assert redis.cli(user_name(NODE, service), password, "PING") == "PONG", service
