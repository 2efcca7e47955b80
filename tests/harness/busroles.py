"""The two buses integration tests of the Redis bus open on a real server: a service's
(`leader`: its own ACL credential, holding its lease, so its writes are fenced) and the
admin's (`admin`: unfenced, may read and write every key, for looking behind the bus).

Helpers only; the tests live in tests/integration.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from klet.bus import Bus, NodeBus
from klet.devstack import RedisServer


@asynccontextmanager
async def leader(server: RedisServer, node: str, service: str) -> AsyncIterator[NodeBus]:
    """`service`'s bus on `node` with its real credential, holding its lease."""
    bus = Bus.from_url(server.url, node, auth=server.credentials(node, service), timeout_s=10)
    try:
        assert await bus.lease(service, f"host:1:{service[:4]}aaaaaaaa").try_acquire()
        yield NodeBus.of(bus, service=service)
    finally:
        await bus.close()


@asynccontextmanager
async def admin(server: RedisServer, node: str) -> AsyncIterator[Bus]:
    """The admin's bus on `node`."""
    bus = Bus.from_url(server.url, node, auth=server.admin, timeout_s=10)
    try:
        yield bus
    finally:
        await bus.close()
