"""What several status-reporter test modules share: the `settings.klet` part that
build_deps reads (over an unreachable Redis, so nothing leaves the process) and a wait
for the service's own loops to reach a state."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from klet.config import RedisAuth


@dataclass(frozen=True)
class KletCfg:
    redis_url: str = "redis://127.0.0.1:1/0"
    redis_auth: RedisAuth = RedisAuth()
    node_name: str = "node1"
    service_port: int | None = None  # the default port
    service_bind_address: str = "127.0.0.1"
    service_port_file: Path | None = None
    run_dir: Path = Path("/run/klet")  # the lease slot is not used: the tests name the holder


async def until(condition: Callable[[], bool], *, what: str) -> None:
    """Let the service's loops run until `condition` holds (the tests' back-offs are
    milliseconds); the 5 s bound only turns a hang into a failure naming `what`."""
    try:
        async with asyncio.timeout(5):
            while True:
                if condition():
                    return
                await asyncio.sleep(0.005)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None
