"""A service's private port with its port files: `serve_service_port(app, ServicePort(...))`.

The one way the five services serve their /healthz /readyz /metrics app: `serve_http`
plus the port files of `klet.portfiles`. Before binding it removes the private port
file an earlier run of the same container may have left; once the port listens it
writes the private file and publishes `<run-dir>/ports/<service>/<hostname>-<pid>-<token>.json`;
when the task ends (cancelled at shutdown, or failed) it removes both. With port 0 the
kernel picks a free port, so replicas sharing the host's network never collide and the
port files are how they are found.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from klet.model.layout import resolve_service_port
from klet.obs.health import serve_http
from klet.portfiles import PortFiles

__all__ = ["ServicePort", "serve_service_port"]


class ServicePortSettings(Protocol):
    """The klet-only settings a service's private port comes from."""

    @property
    def service_bind_address(self) -> str: ...  # --service-bind-address

    @property
    def service_port(self) -> int | None: ...  # --service-port; None = the default

    @property
    def run_dir(self) -> Path: ...  # --run-dir

    @property
    def service_port_file(self) -> Path | None: ...  # --service-port-file


@dataclass(frozen=True)
class ServicePort:
    """Where a service serves its private port, and where it says so."""

    service: str  # "syncloop", ...: the port files' directory and record
    host: str  # --service-bind-address
    port: int  # --service-port resolved (klet.model.layout.resolve_service_port); 0 = any free
    run_dir: Path | None = None  # publishes under <run-dir>/ports/<service>/; None = nowhere
    port_file: Path | None = None  # --service-port-file, for `klet healthcheck`; None = none

    @classmethod
    def of(cls, service: str, klet: ServicePortSettings) -> ServicePort:
        """`service`'s private port as the settings say, published under the run dir."""
        return cls(
            service,
            klet.service_bind_address,
            resolve_service_port(service, klet.service_port),
            run_dir=Path(klet.run_dir),
            port_file=klet.service_port_file,
        )


async def serve_service_port(
    app: Any, where: ServicePort, *, ready: asyncio.Event | None = None
) -> None:
    """Serve `app` on `where` until cancelled, with its port files (see the module)."""
    files = PortFiles(where.service, run_dir=where.run_dir, private_file=where.port_file)
    files.clear_private()

    def on_listening(host: str, port: int) -> None:
        files.publish(host, port)

    try:
        await serve_http(
            app,
            host=where.host,
            port=where.port,
            name=where.service,
            ready=ready,
            on_listening=on_listening,
        )
    finally:
        files.withdraw()
