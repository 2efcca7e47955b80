"""A private redis-server for `klet up`, the dev stack and the tests: safe by default.

It listens on a unix socket only (`port 0`), mode 0600 inside a 0700 directory, so only
root reaches it; a TCP listener with TLS is opt-in (`tls=`), for tests of remote Redis.
The unauthenticated `default` user is off. Users come from an ACL file this class
writes from `klet.bus.acl`: an admin (`klet-admin`, for set-up and tests only) and, per
node added with `add_node`, one user per service limited to that node's keys and that
service's commands. Passwords are random, written 0600 into `secrets/` (a 0700
directory), and reach services as file paths only; the ACL file holds their hashes.

Persistence is off: the bus keeps no state that must outlive a run, and tests that
check resync after a Redis outage restart it empty (``restart``), which is what a
flushed production Redis looks like to the services. The users survive a restart (they
live in the ACL file, not in the dataset); klet's function library, which the services'
fenced writes and leases call, is loaded again at every start.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path

from klet.bus.acl import (
    ADMIN_USER,
    SERVICES,
    Credentials,
    acl_file_lines,
    check_node,
    user_name,
)
from klet.bus.functions import library_code
from klet.devstack.procs import ManagedProcess, StartError, free_port
from klet.model.layout import REDIS_SOCKET

REDIS_BINARY = "/usr/bin/redis-server"
MAXMEMORY = "256mb"
"""Redis's bound (noeviction: writes past it fail, the services retry); as in
docker-compose.yml and the chart's `redis.maxmemory`."""
_MAX_SOCKET_PATH = 100  # sun_path holds 107 bytes; keep a margin


@dataclass(frozen=True)
class RedisTLS:
    """A TLS listener on 127.0.0.1 beside the unix socket (`rediss://`)."""

    cert_file: Path
    key_file: Path
    ca_file: Path  # clients' certificates are checked against it when required
    client_certs: bool = False  # require a client certificate


def write_secret(path: Path, text: str) -> None:
    """Write `text` to `path`, mode 0600 from its first byte, in a 0700 directory."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")


def _resp(*args: str) -> bytes:
    out = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        raw = arg.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(raw), raw))
    return b"".join(out)


def redis_command(
    socket_path: Path, *args: str, auth: Credentials | None = None, timeout_s: float = 2.0
) -> bytes:
    """Send one command (after AUTH, if given) over the unix socket and return the first
    line of the reply (raw RESP, no client library: `klet.bus` is the one Redis client)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(str(socket_path))
        replies = 1
        if auth is not None:
            sock.sendall(_resp("AUTH", auth.username, auth.password))
            replies += 1
        sock.sendall(_resp(*args))
        data = b""
        while data.count(b"\r\n") < replies:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    lines = data.split(b"\r\n")
    if auth is not None and not lines[0].startswith(b"+OK"):
        return lines[0]
    return lines[replies - 1]


def redis_ping(socket_path: Path, auth: Credentials | None = None) -> bool:
    """Whether the server on `socket_path` answers PING with +PONG."""
    return redis_command(socket_path, "PING", auth=auth).startswith(b"+PONG")


class RedisServer:
    """One redis-server process under ``dir`` (made 0700), on a unix socket."""

    def __init__(self, dir: Path, *, tls: RedisTLS | None = None) -> None:
        self.dir = dir.resolve()
        socket_path = self.dir / REDIS_SOCKET
        self._own_socket_dir = len(str(socket_path)) > _MAX_SOCKET_PATH
        if self._own_socket_dir:
            # pytest's tmp_path can be too long for a unix socket: a short private one.
            socket_path = Path(tempfile.mkdtemp(prefix="klet-redis-", dir="/tmp")) / REDIS_SOCKET
        self.socket_path = socket_path
        self.secrets_dir = self.dir / "secrets"
        self.acl_file = self.dir / "users.acl"
        self.tls = tls
        self.tls_port = free_port() if tls is not None else 0
        self._admin_password = secrets.token_urlsafe(32)
        self._passwords: dict[str, dict[str, str]] = {}
        self._proc: ManagedProcess | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}"

    @property
    def tls_url(self) -> str:
        if self.tls is None:
            raise RuntimeError("this RedisServer was created without tls=")
        return f"rediss://127.0.0.1:{self.tls_port}/0"

    @property
    def admin(self) -> Credentials:
        """Every key and command: for set-up and tests, never for a service."""
        return Credentials(ADMIN_USER, self.secrets_dir / "admin", self._admin_password)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.alive

    def add_node(self, node: str) -> None:
        """Create the service users of `node` (a no-op if they exist), live if running."""
        check_node(node)
        if node in self._passwords:
            return
        passwords = {s: secrets.token_urlsafe(32) for s in SERVICES}
        for service, password in passwords.items():
            write_secret(self._password_file(node, service), password)
        self._passwords[node] = passwords
        self._write_acl_file()
        if self.alive:
            reply = redis_command(self.socket_path, "ACL", "LOAD", auth=self.admin)
            if not reply.startswith(b"+OK"):
                raise StartError(f"redis ACL LOAD of {self.acl_file} failed: {reply!r}")

    def credentials(self, node: str, service: str) -> Credentials:
        """The credentials of `service` on `node` (created on first use)."""
        self.add_node(node)
        return Credentials(
            user_name(node, service),
            self._password_file(node, service),
            self._passwords[node][service],
        )

    def service_flags(self, node: str, service: str) -> list[str]:
        """The flags that connect `service` of `node` to this server: URL, user and the
        path of its password file (no secret on the command line)."""
        cred = self.credentials(node, service)
        return [
            "--redis-url",
            self.url,
            "--redis-username",
            cred.username,
            "--redis-password-file",
            str(cred.password_file),
        ]

    def _password_file(self, node: str, service: str) -> Path:
        return self.secrets_dir / node / service

    def _write_acl_file(self) -> None:
        lines = acl_file_lines(self._admin_password, self._passwords)
        write_secret(self.acl_file, "\n".join(lines))

    def start(self, *, timeout_s: float = 10.0) -> None:
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        self.socket_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.socket_path.parent, 0o700)
        write_secret(self.secrets_dir / "admin", self._admin_password)
        self._write_acl_file()
        argv = [
            REDIS_BINARY,
            "--port",
            "0",
            "--unixsocket",
            str(self.socket_path),
            "--unixsocketperm",
            "600",
            "--aclfile",
            str(self.acl_file),
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--maxmemory",
            MAXMEMORY,
            "--maxmemory-policy",
            "noeviction",
            "--dir",
            str(self.dir),
        ]
        if self.tls is not None:
            argv += [
                "--bind",
                "127.0.0.1",
                "--tls-port",
                str(self.tls_port),
                "--tls-cert-file",
                str(self.tls.cert_file),
                "--tls-key-file",
                str(self.tls.key_file),
                "--tls-ca-cert-file",
                str(self.tls.ca_file),
                "--tls-auth-clients",
                "yes" if self.tls.client_certs else "no",
            ]
        proc = ManagedProcess("redis", argv, dir=self.dir)
        proc.start()
        self._proc = proc
        try:
            proc.wait_ready(
                lambda: redis_ping(self.socket_path, self.admin),
                timeout_s,
                f"PING on {self.socket_path}",
            )
            self.load_functions()
        except StartError:
            proc.stop()
            self._proc = None
            raise

    def load_functions(self) -> None:
        """Load klet's function library (klet.bus.functions) as the admin: the services
        may call its functions and run no Lua of their own. Done at every start (no
        persistence: a restarted Redis has none)."""
        reply = redis_command(
            self.socket_path, "FUNCTION", "LOAD", "REPLACE", library_code(), auth=self.admin
        )
        if reply.startswith(b"-"):
            raise StartError(f"redis FUNCTION LOAD failed: {reply.decode(errors='replace')}")

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.stop()
            self._proc = None
        if self._own_socket_dir:
            with contextlib.suppress(OSError):  # start() makes it again
                self.socket_path.unlink(missing_ok=True)
                self.socket_path.parent.rmdir()

    def restart(self) -> None:
        """Stop and start again on the same socket, with an empty dataset (same users)."""
        self.stop()
        self.start()
