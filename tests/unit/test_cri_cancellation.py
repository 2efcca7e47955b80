"""klet.cri.client: a cancellation that grpc.aio reports as an AioRpcError (the race
where the cancel lands as the call completes) reaches the caller as CancelledError, never
as a CRIError a retry or status loop would swallow; without a pending cancel the same
error is still mapped as before."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc.aio import AioRpcError, Metadata
from klet.cri import CRISettings, RuntimeClient
from klet.cri.errors import CRIError


def rpc_error() -> AioRpcError:
    return AioRpcError(
        grpc.StatusCode.CANCELLED, Metadata(), Metadata(), details="Locally cancelled"
    )


async def test_an_rpc_error_during_a_cancellation_is_the_cancellation(tmp_path: Path) -> None:
    client = RuntimeClient(CRISettings(runtime_endpoint=f"unix://{tmp_path}/none.sock"))

    async def cancelled_as_it_completes(request: Any, **_: Any) -> Any:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()  # what the supervisor does; grpc then answers with its status
        raise rpc_error()

    async def failing(request: Any, **_: Any) -> Any:
        raise rpc_error()

    try:
        caller = asyncio.create_task(client._call("Status", cancelled_as_it_completes, None))
        with pytest.raises(asyncio.CancelledError):
            await caller
        assert caller.cancelled()
        with pytest.raises(CRIError, match="Status: CANCELLED"):
            await client._call("Status", failing, None)
    finally:
        await client.close()
