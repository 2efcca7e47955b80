"""A private OCI registry (distribution 2.8, Debian's docker-registry) on loopback.

Plain HTTP on 127.0.0.1: containerd is told through its hosts.toml to use HTTP for the
test registry host name, so no certificates are involved. Storage is a directory under
the stack's own directory, with deletion enabled so image-GC tests can remove tags.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import yaml
from klet.devstack.procs import ManagedProcess, StartError, free_port

REGISTRY_BINARY = "/usr/bin/docker-registry"


class Registry:
    """One docker-registry process serving ``dir/data`` on 127.0.0.1:``port``."""

    def __init__(self, dir: Path, port: int | None = None) -> None:
        self.dir = dir
        self.port = port if port is not None else free_port()
        self.config_path = dir / "config.yml"
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

    def write_config(self) -> None:
        config = {
            "version": 0.1,
            "log": {"level": "warn", "accesslog": {"disabled": True}},
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
        self.dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))

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
        return httpx.get(f"{self.url}/v2/", timeout=1.0, trust_env=False).status_code == 200

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.stop()
            self._proc = None
