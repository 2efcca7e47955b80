"""serve_service_port (klet.obs.serviceport): with port 0 two replicas get distinct ports
on one host and publish them under one run directory; each writes its own private port
file; a stale private file is removed before binding (a failing bind leaves none
behind); cancelling the task removes both files; a private file that cannot be written
fails the task and releases the port."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest
from klet.obs import ServicePort, create_health_app, serve_service_port
from klet.portfiles import PortRecord, live_replicas, read_port_file
from prometheus_client import CollectorRegistry


@pytest.fixture
def app() -> Any:
    return create_health_app(registry=CollectorRegistry(), checks={}, ready=lambda: True)


def where(tmp_path: Path, replica: str, port: int = 0) -> ServicePort:
    (tmp_path / replica).mkdir(exist_ok=True)
    return ServicePort(
        "image-gc",
        "127.0.0.1",
        port,
        run_dir=tmp_path / "run",
        port_file=tmp_path / replica / "port.json",
    )


async def test_two_replicas_on_port_zero(app: Any, tmp_path: Path) -> None:
    ready = [asyncio.Event(), asyncio.Event()]
    tasks = [
        asyncio.create_task(serve_service_port(app, where(tmp_path, f"r{i}"), ready=ready[i]))
        for i in range(2)
    ]
    try:
        await asyncio.wait_for(asyncio.gather(*(r.wait() for r in ready)), 5)
        own = [read_port_file(tmp_path / f"r{i}" / "port.json") for i in range(2)]
        assert own[0].port != own[1].port
        # One process, one hostname and pid: each replica's published file is its own.
        published = live_replicas(tmp_path / "run", "image-gc")
        assert sorted(r.port for r in published) == sorted(r.port for r in own)
        async with httpx.AsyncClient() as client:
            for record in own:
                response = await client.get(f"http://127.0.0.1:{record.port}/healthz")
                assert (response.status_code, response.text) == (200, "ok")
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert not (tmp_path / "r0" / "port.json").exists()
    assert not (tmp_path / "r1" / "port.json").exists()
    assert live_replicas(tmp_path / "run", "image-gc") == []


async def test_publishes_once_listening(app: Any, tmp_path: Path) -> None:
    ready = asyncio.Event()
    task = asyncio.create_task(serve_service_port(app, where(tmp_path, "r"), ready=ready))
    try:
        await asyncio.wait_for(ready.wait(), 5)
        record = read_port_file(tmp_path / "r" / "port.json")
        assert (record.service, record.host) == ("image-gc", "127.0.0.1")
        assert live_replicas(tmp_path / "run", "image-gc") == [record]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_stale_private_file_is_gone_even_when_binding_fails(
    app: Any, tmp_path: Path
) -> None:
    stale = tmp_path / "r" / "port.json"
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        stale.parent.mkdir()
        stale.write_text(PortRecord("image-gc", "127.0.0.1", port, 1, "old").to_json())
        with pytest.raises(OSError, match="cannot listen"):
            await serve_service_port(app, where(tmp_path, "r", port))
    assert not stale.exists()
    assert live_replicas(tmp_path / "run", "image-gc") == []


async def test_an_unwritable_port_file_fails_and_releases_the_port(
    app: Any, tmp_path: Path
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    spec = ServicePort("image-gc", "127.0.0.1", port, port_file=tmp_path / "no" / "port.json")
    with pytest.raises(FileNotFoundError):
        await serve_service_port(app, spec)
    with socket.create_server(("127.0.0.1", port)):
        pass  # released: a restart can bind it again
