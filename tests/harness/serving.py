"""Serving an ASGI app the way the services do (`klet.obs.serve_http`), on a free port of
127.0.0.1, for the unit tests of the apps and of klet's HTTP server."""

from __future__ import annotations

import asyncio
from typing import Any

from klet.obs import serve_http


async def serve_on_free_port(app: Any, *, name: str = "test") -> tuple[asyncio.Task[None], int]:
    """Start serving `app`; (the serving task, its port) once it listens. Cancel the task
    to stop it."""
    ready = asyncio.Event()
    bound: list[int] = []
    task = asyncio.create_task(
        serve_http(
            app,
            host="127.0.0.1",
            port=0,
            name=name,
            ready=ready,
            on_listening=lambda _host, port: bound.append(port),
        )
    )
    await asyncio.wait_for(ready.wait(), 5)
    return task, bound[0]
