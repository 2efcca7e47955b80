"""A private OCI registry (distribution 2.8, Debian's docker-registry) on loopback.

Plain HTTP on 127.0.0.1: containerd is told through its hosts.toml to use HTTP for the
test registry host name, so no certificates are involved. Storage is a directory under
the stack's own directory, with deletion enabled so image-GC tests can remove tags.

A registry given `users` requires HTTP basic authentication (the registry's `htpasswd`
auth, bcrypt entries written by Apache's `htpasswd -B`) for every request, pushes
included, and keeps an access log so a test can count the pulls it served. Image pull
credentials are tested against such a second registry; `write_hosts_toml` tells a
running containerd about it (containerd reads its `config_path` at every pull).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping
from pathlib import Path

import httpx
import yaml
from klet.devstack.procs import ManagedProcess, StartError, free_port

REGISTRY_BINARY = "/usr/bin/docker-registry"
HTPASSWD_BINARY = "/usr/bin/htpasswd"  # Debian's apache2-utils


class Registry:
    """One docker-registry process serving ``dir/data`` on 127.0.0.1:``port``."""

    def __init__(
        self, dir: Path, port: int | None = None, *, users: Mapping[str, str] | None = None
    ) -> None:
        self.dir = dir
        self.port = port if port is not None else free_port()
        self.config_path = dir / "config.yml"
        self.users = dict(users or {})
        self.htpasswd_path = dir / "htpasswd"
        self._proc: ManagedProcess | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.alive

    @property
    def log_path(self) -> Path:
        return self.dir / "registry.log"

    def write_config(self) -> None:
        config = {
            "version": 0.1,
            # An authenticating registry logs every request, so tests can count pulls.
            "log": {"level": "warn", "accesslog": {"disabled": not self.users}},
            "storage": {
                "filesystem": {"rootdirectory": str(self.dir / "data")},
                "delete": {"enabled": True},
                # Without a cache the registry logs a warning at every start.
                "cache": {"blobdescriptor": "inmemory"},
            },
            "http": {
                "addr": self.address,
                # A fixed secret silences the "generated random secret" warning; it only
                # signs upload state across instances, of which there is one.
                "secret": "klet-devstack",
            },
        }
        if self.users:
            config["auth"] = {"htpasswd": {"realm": "klet", "path": str(self.htpasswd_path)}}
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.users:
            self.write_htpasswd()
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))

    def write_htpasswd(self) -> None:
        """One bcrypt entry per user (the only hash distribution's htpasswd accepts)."""
        lines = []
        for user, password in self.users.items():
            res = subprocess.run(
                [HTPASSWD_BINARY, "-n", "-b", "-B", user, password],
                capture_output=True,
                text=True,
                check=False,
            )
            if res.returncode != 0:
                raise StartError(f"htpasswd failed for {user}: {res.stderr.strip()}")
            lines.append(res.stdout.strip())
        self.htpasswd_path.write_text("\n".join(lines) + "\n")

    def start(self, *, timeout_s: float = 15.0) -> None:
        self.write_config()
        proc = ManagedProcess(
            "registry", [REGISTRY_BINARY, "serve", str(self.config_path)], dir=self.dir
        )
        proc.start()
        self._proc = proc
        try:
            proc.wait_ready(self._ready, timeout_s, f"GET {self.url}/v2/ answering 200")
        except StartError:
            proc.stop()
            self._proc = None
            raise

    def _ready(self) -> bool:
        status = httpx.get(f"{self.url}/v2/", timeout=1.0, trust_env=False).status_code
        return status == (401 if self.users else 200)

    def write_hosts_toml(self, certs_dir: Path) -> Path:
        """Tell a containerd whose registry `config_path` is `certs_dir` to reach this
        registry (images named `127.0.0.1:<port>/...`) over plain HTTP."""
        host_dir = certs_dir / self.address
        host_dir.mkdir(parents=True, exist_ok=True)
        path = host_dir / "hosts.toml"
        path.write_text(
            f'server = "{self.url}"\n\n[host."{self.url}"]\n  capabilities = ["pull", "resolve"]\n'
        )
        return path

    def manifest_requests(self, repository: str, *, tag: str | None = None) -> dict[int, int]:
        """How many HEAD/GET requests for a manifest of `repository` (by `tag`, or any
        reference) the registry answered, by HTTP status, from the access log (a registry
        without `users` keeps none). containerd resolves a tag with one request for its
        manifest, so each pull of a tag counts once under 200; it asks without
        credentials first, so an authenticated pull also counts a 401."""
        reference = re.escape(tag) if tag is not None else '[^ "]+'
        pattern = re.compile(
            rf'"(?:HEAD|GET) /v2/{re.escape(repository)}/manifests/{reference} HTTP/[0-9.]+" '
            r"(\d{3})"
        )
        counts: dict[int, int] = {}
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return counts
        for match in pattern.finditer(text):
            status = int(match.group(1))
            counts[status] = counts.get(status, 0) + 1
        return counts

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.stop()
            self._proc = None
