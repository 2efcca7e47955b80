"""A private dockerd (Debian's docker.io 20.10) for the compose tests: never the system one.

Everything it keeps is under its directory: `--data-root` (images, containers), the
API socket `docker.sock`, its `--pidfile`, and a `daemon.json` of its own so that
/etc/docker/daemon.json is never read. Its `--exec-root` (runtime state and the socket
of the containerd it starts for itself, as a child) is a short directory under /tmp
when the test directory is too deep for a unix socket path. It touches nothing of the
host's network: no iptables rules (dockerd's set the FORWARD policy to DROP, which
breaks pod networking beside it), no masquerading, no bridge, no ip_forward change; the
compose services use the host network or none.

`stop` removes every container first (dockerd would otherwise give each its stop grace
period), then SIGTERMs dockerd by PID (its containerd goes with it) and detaches any
mount left under its directories.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

from klet.devstack.containerd import unmount_under
from klet.devstack.procs import ManagedProcess, StartError

DOCKERD_BINARY = "/usr/sbin/dockerd"
DOCKER_BINARY = "/usr/bin/docker"  # Debian's client, matching the daemon's API version
# The longest socket dockerd's containerd makes under the exec root; containerd refuses
# a socket path longer than 104 bytes.
_EXEC_ROOT_SOCKET = "containerd/containerd-debug.sock"
_MAX_SOCKET_PATH = 100


class Dockerd:
    """One dockerd under ``dir``; ``env`` points the docker and docker-compose CLIs at it."""

    def __init__(self, dir: Path) -> None:
        self.dir = dir.resolve()
        self.socket = self.dir / "docker.sock"
        if len(str(self.socket)) > _MAX_SOCKET_PATH:
            raise StartError(f"{self.socket}: too long for a unix socket path")
        self.data_root = self.dir / "data"
        self.pidfile = self.dir / "dockerd.pidfile"
        self.config_file = self.dir / "daemon.json"
        exec_root = self.dir / "exec"
        self._own_exec_root = len(str(exec_root / _EXEC_ROOT_SOCKET)) > _MAX_SOCKET_PATH
        self.exec_root = exec_root
        self._proc: ManagedProcess | None = None

    @property
    def host(self) -> str:
        return f"unix://{self.socket}"

    @property
    def env(self) -> dict[str, str]:
        """The environment of a docker or docker-compose command against this daemon."""
        return {**os.environ, "DOCKER_HOST": self.host}

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self, *, timeout_s: float = 60.0) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        if self._own_exec_root:
            self.exec_root = Path(tempfile.mkdtemp(prefix="klet-dockerd-", dir="/tmp"))
        self.config_file.write_text(json.dumps({}))
        argv = [
            DOCKERD_BINARY,
            "--config-file",
            str(self.config_file),
            "--data-root",
            str(self.data_root),
            "--exec-root",
            str(self.exec_root),
            "--pidfile",
            str(self.pidfile),
            "-H",
            self.host,
            "--iptables=false",
            "--ip-masq=false",
            "--ip-forward=false",
            "--bridge=none",
            "--userland-proxy=false",
            "--storage-driver=overlay2",
            "--exec-opt",
            "native.cgroupdriver=cgroupfs",
        ]
        proc = ManagedProcess("dockerd", argv, dir=self.dir)
        proc.start()
        self._proc = proc
        try:
            proc.wait_ready(self._ping, timeout_s, f"GET /_ping on {self.socket}")
        except StartError:
            self.stop()
            raise

    def _ping(self) -> bool:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(2.0)
            sock.connect(str(self.socket))
            sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            reply = sock.recv(4096)
        return reply.startswith(b"HTTP/1.") and reply.rstrip().endswith(b"OK")

    def docker(
        self, args: list[str], *, timeout_s: float = 120.0, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run the docker CLI against this daemon."""
        res = subprocess.run(
            [DOCKER_BINARY, *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        if check and res.returncode != 0:
            raise StartError(f"docker {' '.join(args)}: {res.stderr.strip()}")
        return res

    def stop(self, timeout_s: float = 30.0) -> None:
        if self._proc is not None and self._proc.alive:
            ids = self.docker(["ps", "-aq"], check=False).stdout.split()
            if ids:
                self.docker(["rm", "-f", *ids], check=False)
        if self._proc is not None:
            self._proc.stop(timeout_s)
            self._proc = None
        unmount_under(self.dir)
        unmount_under(self.exec_root)
        if self._own_exec_root:
            shutil.rmtree(self.exec_root, ignore_errors=True)
