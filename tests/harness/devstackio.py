"""One CRI call or one registry GET against the dev stack, from a synchronous test (and
`wait_for`): the image tiers' shared helpers."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import httpx
from klet.cri import CRISettings, RuntimeClient
from klet.devstack import DevStack

T = TypeVar("T")


def cri_call(devstack: DevStack, call: Callable[[RuntimeClient], Awaitable[T]]) -> T:
    """`call` with a fresh client of klet's CRI client on the dev stack's containerd."""

    async def run() -> T:
        client = RuntimeClient(CRISettings(runtime_endpoint=devstack.runtime_endpoint))
        try:
            return await call(client)
        finally:
            await client.close()

    return asyncio.run(run())


def registry_get(devstack: DevStack, path: str, *, accept: str) -> httpx.Response:
    """GET `path` of the dev stack's registry (plain HTTP), asking for `accept`; raises
    on an error status."""
    resp = httpx.get(
        f"http://{devstack.registry_address}{path}",
        headers={"Accept": accept},
        trust_env=False,
        timeout=30,
    )
    resp.raise_for_status()
    return resp
