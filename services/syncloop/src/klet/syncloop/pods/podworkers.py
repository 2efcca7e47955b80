"""One worker task per pod UID: syncs for one pod never overlap, pods run in parallel.

A worker sleeps until woken (a change from the bus, a PLEG event, a resync) or until
the time its last sync asked for (a back-off ending). Wake-ups that arrive during a
sync collapse into one further sync, which always reads the latest desired state, so
only the newest update is ever acted on. A failing sync is retried with a capped
back-off and logged once per distinct error.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outcome:
    done: bool = False  # the pod is gone: end the worker
    wake_at: float | None = None  # wall-clock time for the next sync without a wake-up


SyncFn = Callable[[str], Awaitable[Outcome]]


class _Worker:
    def __init__(self) -> None:
        self.wake = asyncio.Event()
        self.wake_at: float | None = None
        self.task: asyncio.Task[None] | None = None
        self.last_error = ""
        self.error_delay = 0.0


class PodWorkers:
    def __init__(
        self,
        sync: SyncFn,
        *,
        clock: Callable[[], float] = time.time,
        error_backoff_initial_s: float = 1.0,
        error_backoff_max_s: float = 10.0,
    ) -> None:
        self._sync = sync
        self._clock = clock
        self._workers: dict[str, _Worker] = {}
        self._initial = error_backoff_initial_s
        self._max = error_backoff_max_s
        self.idle = asyncio.Event()

    def uids(self) -> list[str]:
        return list(self._workers)

    def wake(self, uid: str) -> None:
        worker = self._workers.get(uid)
        if worker is None:
            worker = _Worker()
            self._workers[uid] = worker
            worker.task = asyncio.create_task(self._run(uid, worker), name=f"podworker-{uid}")
        worker.wake.set()

    def wake_all(self) -> None:
        for uid in list(self._workers):
            self.wake(uid)

    async def _run(self, uid: str, worker: _Worker) -> None:
        try:
            while True:
                timeout = None
                if worker.wake_at is not None:
                    timeout = max(0.0, worker.wake_at - self._clock())
                try:
                    async with asyncio.timeout(timeout):
                        await worker.wake.wait()
                except TimeoutError:
                    pass
                worker.wake.clear()
                worker.wake_at = None
                try:
                    outcome = await self._sync(uid)
                except asyncio.CancelledError:
                    raise
                except Exception as err:  # noqa: BLE001 - a pod's failure must not end its worker
                    text = f"{type(err).__name__}: {err}"
                    if text != worker.last_error:
                        log.warning(
                            "pod sync failed, will retry", extra={"uid": uid, "error": text}
                        )
                        worker.last_error = text
                    worker.error_delay = min(self._max, max(self._initial, worker.error_delay * 2))
                    worker.wake_at = self._clock() + worker.error_delay
                    continue
                if worker.last_error:
                    log.info("pod sync recovered", extra={"uid": uid})
                worker.last_error, worker.error_delay = "", 0.0
                if outcome.done:
                    if not worker.wake.is_set():
                        return
                    continue
                worker.wake_at = outcome.wake_at
        finally:
            if self._workers.get(uid) is worker:
                del self._workers[uid]

    async def stop(self) -> None:
        tasks = [w.task for w in self._workers.values() if w.task is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
