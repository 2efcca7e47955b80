"""Cancellation that a client library reports as its own error.

Client libraries can turn a cancellation of the calling task into an error of theirs:
grpc.aio answers a cancel that lands as the call completes with an AioRpcError (its
invocation task swallows the cancel and the call's own status is raised), and redis-py
can turn a cancel that lands in a read into a connection error. Mapped to one of our
errors, it reaches a loop that handles that error and carries on, and the task outlives
its cancellation (seen in CI: status-reporter's node-status task, 30 s past its cancel,
abandoned by the supervisor). Every adapter that maps a library's error asks
`being_cancelled()` first and raises the cancellation instead (`raise_if_cancelled`).

A leaf module: the adapters of every layer (bus, cri, rpc, csi) import it.
"""

from __future__ import annotations

import asyncio

__all__ = ["being_cancelled", "raise_if_cancelled"]


def being_cancelled() -> bool:
    """Whether the calling task has a cancellation pending (False off a running loop)."""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running loop
        return False
    return task is not None and task.cancelling() > 0


def raise_if_cancelled(err: BaseException) -> None:
    """Raise CancelledError (chained to the library error `err`) when the calling task
    is being cancelled; return, for `err` to be mapped as usual, when it is not."""
    if being_cancelled():
        raise asyncio.CancelledError() from err
