"""Supervised root tasks: the shape of every klet service's event loop (STYLE rule 9).

A service is a handful of named, long-running coroutines (stream consumer, HTTP server,
gRPC server, heartbeat). `run_supervised({...})` runs them as tasks; none is supposed to
end, so when one does, by returning or raising, the others are cancelled and awaited and
`RootTaskFailed(name, exc)` is raised. The entry point lets it escape, the process exits
non-zero, and its supervisor (systemd, the kubelet of a pod, `klet up`) restarts it:
restarting a whole process is simpler and safer than restarting one task with state the
others share.

SIGTERM and SIGINT are a request to stop: every task is cancelled, awaited, and
`run_supervised` returns normally (exit status 0).

Trade-off: a task that ignores cancellation is waited for at most `shutdown_timeout`
seconds, then abandoned with an error log, so a stuck task cannot block a restart forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Coroutine, Iterator, Mapping
from typing import Any

__all__ = ["RootTaskFailed", "awaiting", "run_supervised"]

log = logging.getLogger(__name__)

RECANCEL_S = 5.0
"""How often a root task that has not stopped after its cancellation is cancelled again
while the supervisor waits for it."""


class RootTaskFailed(Exception):
    """A root task ended; `exc` is what it raised, or None when it returned."""

    def __init__(self, name: str, exc: BaseException | None) -> None:
        self.name = name
        self.exc = exc
        how = f"failed: {type(exc).__name__}: {exc}" if exc is not None else "returned"
        super().__init__(f"root task {name!r} {how}")


@contextlib.contextmanager
def _stop_on_signals(stop: asyncio.Event, enabled: bool) -> Iterator[None]:
    """Set `stop` on SIGTERM/SIGINT while inside; a no-op off the main thread."""
    loop = asyncio.get_running_loop()
    installed: list[tuple[signal.Signals, Any]] = []
    if enabled and threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):

            def on_signal(sig: signal.Signals = sig) -> None:
                log.info("stopping on signal", extra={"signal": sig.name})
                stop.set()

            previous = signal.getsignal(sig)
            try:
                loop.add_signal_handler(sig, on_signal)
            except (NotImplementedError, RuntimeError):  # pragma: no cover - non-Unix loops
                continue
            installed.append((sig, previous))
    try:
        yield
    finally:
        for sig, previous in installed:
            loop.remove_signal_handler(sig)
            if previous is not None:  # None: a handler not installed from Python
                signal.signal(sig, previous)


def awaiting(task: asyncio.Task[Any]) -> list[str]:
    """Where a suspended task waits: the file:line of each coroutine down its await chain,
    then what the innermost awaits (a Future, a generator), outermost first. What
    `Task.get_stack` cannot say: it gives only the task's own coroutine frame."""
    out: list[str] = []
    step: Any = task.get_coro()
    for _ in range(64):  # an await chain is never this deep; a cycle would be
        frame = getattr(step, "cr_frame", None) or getattr(step, "gi_frame", None)
        if frame is not None:
            out.append(f"{frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}")
        inner = getattr(step, "cr_await", None)
        if inner is None:
            inner = getattr(step, "gi_yieldfrom", None)
        if inner is None:
            break
        if not (hasattr(inner, "cr_frame") or hasattr(inner, "gi_frame")):
            out.append(repr(inner)[:200])
            break
        step = inner
    return out


async def _cancel_all(tasks: Mapping[str, asyncio.Task[Any]], grace: float) -> None:
    """Cancel every task and wait up to `grace` seconds for them, cancelling the ones
    still running again every RECANCEL_S: a cancellation a client library swallows (one
    that lands as its own timeout fires, in a read or a call) leaves the task running its
    loop, and the next cancellation reaches it at its next await. Seen in syncloop's
    pods-consumer, 30 s past its one cancellation in a Redis read (a cluster test here)."""
    for task in tasks.values():
        task.cancel()
    still = {t for t in tasks.values() if not t.done()}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace
    while still and (left := deadline - loop.time()) > 0:
        _, still = await asyncio.wait(still, timeout=min(RECANCEL_S, left))
        for task in still:
            task.cancel()
    if still:
        for task in still:
            log.error(
                "root task did not stop after cancellation",
                extra={"task": task.get_name(), "awaiting": awaiting(task)},
            )
    for name, task in tasks.items():
        if task.done() and not task.cancelled() and task.exception() is not None:
            log.error(
                "root task failed while stopping",
                extra={"task": name},
                exc_info=task.exception(),
            )


async def _discard(task: asyncio.Task[Any]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def run_supervised(
    tasks: Mapping[str, Coroutine[Any, Any, Any]],
    *,
    handle_signals: bool = True,
    shutdown_timeout: float = 30.0,
) -> None:
    """Run the named coroutines until one ends or a stop signal arrives.

    Raises RootTaskFailed (from the task's exception) when a task returns or raises;
    returns normally after SIGTERM/SIGINT (when handle_signals). Cancelling the caller
    cancels every task too. shutdown_timeout: seconds to wait for cancelled tasks.
    """
    if not tasks:
        raise ValueError("run_supervised needs at least one task")
    stop = asyncio.Event()
    running = {name: asyncio.create_task(coro, name=name) for name, coro in tasks.items()}
    by_task = {task: name for name, task in running.items()}
    stopper = asyncio.create_task(stop.wait(), name="stop-signal")
    log.info("root tasks started", extra={"tasks": list(running)})
    try:
        with _stop_on_signals(stop, handle_signals):
            done, _ = await asyncio.wait(
                [*running.values(), stopper], return_when=asyncio.FIRST_COMPLETED
            )
    except asyncio.CancelledError:
        await _discard(stopper)
        await _cancel_all(running, shutdown_timeout)
        raise
    await _discard(stopper)
    ended = [t for t in done if t is not stopper]
    if not ended:
        await _cancel_all(running, shutdown_timeout)
        log.info("root tasks stopped")
        return
    first = ended[0]
    name = by_task[first]
    exc: BaseException | None
    if first.cancelled():
        exc = asyncio.CancelledError()
    else:
        exc = first.exception()
    others = {n: t for n, t in running.items() if t is not first}
    log.error(
        "root task ended, stopping the others",
        extra={"task": name},
        exc_info=exc if exc is not None and not isinstance(exc, asyncio.CancelledError) else None,
    )
    await _cancel_all(others, shutdown_timeout)
    raise RootTaskFailed(name, exc) from exc
