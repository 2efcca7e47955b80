"""One worker task per pod UID: syncs for one pod never overlap, pods run in parallel.

A worker sleeps until woken or until the time its last sync asked for (a back-off
ending). Wake-ups that arrive during a sync collapse into one further sync, which
always reads the latest desired state, so only the newest update is ever acted on.

Two kinds of wake-up, as upstream's pod workers tell an update from a periodic one:
`wake` is a change of the pod (a new spec, a deletion, a kill) and acts at once;
`nudge` is the runtime changing under it (PLEG) or the periodic resync. After a failed
sync the worker backs off, and a nudge waits for the back-off to end: the runtime
events a failed attempt causes itself must not bring the next attempt forward, which
is how a pod whose container cannot be created made ~12 CreateContainer calls a second
(issue 37).

A sync that reports the pod gone (`Outcome.done`) ends its worker unless a change of
the pod came while it ran (the pod desired again). Nudges that came meanwhile do not
keep it: in a mass removal each kill lasts seconds to minutes under load, a relist or
the resync lands in nearly every one and saw the pod going, and a further sync of each
removed pod only read CRI again to find it gone (about one list pair per pod in the
110-pod teardowns of issue 42). Whatever the runtime still holds of the pod is found
by the next relist, which starts a new worker.

A sync fails in two ways. It raises (a CRI outage, a bug): retried with a capped
exponential back-off, logged once per distinct error. Or it reports the failure in
the pod's status (`Outcome.failed`: a container that could not be created or started,
a sandbox that could not be made), as upstream's SyncPod returns an error beside the
status it already wrote: retried after upstream's `backOffPeriod` (10 s) with its
jitter factor 0.5 (`workerBackOffPeriodJitterFactor`), so 10 to 15 s later.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from klet.model.flowcontrol import jittered

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outcome:
    done: bool = False  # the pod is gone: end the worker
    wake_at: float | None = None  # wall-clock time for the next sync without a wake-up
    failed: bool = False  # the sync failed and said why in the status: back off


BACKOFF_PERIOD_S = 10.0
"""upstream's pod worker backOffPeriod: a failed sync is retried this long after..."""
BACKOFF_JITTER = 0.5
"""...plus up to this fraction of it at random (workerBackOffPeriodJitterFactor)."""


SyncFn = Callable[[str], Awaitable[Outcome]]


class _Worker:
    def __init__(self) -> None:
        self.wake = asyncio.Event()
        self.urgent = False  # a change of the pod is among the wake-ups
        self.backoff_until = 0.0  # a failed sync's back-off: nudges wait for it
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
        backoff_period_s: float = BACKOFF_PERIOD_S,
        rand: Callable[[], float] = random.random,
        on_wake: Callable[[str], None] | None = None,
    ) -> None:
        self._sync = sync
        self._on_wake = on_wake  # told of each change of a pod, before its worker wakes
        self._clock = clock
        self._workers: dict[str, _Worker] = {}
        self._initial = error_backoff_initial_s
        self._max = error_backoff_max_s
        self.backoff_period_s = backoff_period_s  # the retry after a failed sync (jittered)
        self._rand = rand
        self.idle = asyncio.Event()

    def uids(self) -> list[str]:
        return list(self._workers)

    def wake(self, uid: str) -> None:
        """A change of the pod (an update, a deletion, a kill): sync it at once."""
        if self._on_wake is not None:
            self._on_wake(uid)
        worker = self._worker(uid)
        worker.urgent = True
        worker.wake.set()

    def nudge(self, uid: str) -> None:
        """The runtime changed under the pod, or it is time to resync it: sync it now,
        or once the back-off of its last failed sync ends."""
        self._worker(uid).wake.set()

    def wake_all(self) -> None:
        """The periodic resync: nudge every pod."""
        for uid in list(self._workers):
            self.nudge(uid)

    def _worker(self, uid: str) -> _Worker:
        worker = self._workers.get(uid)
        if worker is None:
            worker = _Worker()
            self._workers[uid] = worker
            worker.task = asyncio.create_task(self._run(uid, worker), name=f"podworker-{uid}")
        return worker

    async def _run(self, uid: str, worker: _Worker) -> None:
        try:
            while True:
                timeout = None
                if worker.wake_at is not None:
                    timeout = max(0.0, worker.wake_at - self._clock())
                timed_out = False
                try:
                    async with asyncio.timeout(timeout):
                        await worker.wake.wait()
                except TimeoutError:
                    timed_out = True
                if not timed_out and not worker.urgent and self._clock() < worker.backoff_until:
                    # Only nudges so far: they wait for the failed sync's back-off.
                    worker.wake.clear()
                    due = worker.backoff_until
                    worker.wake_at = due if worker.wake_at is None else min(worker.wake_at, due)
                    continue
                worker.wake.clear()
                worker.urgent = False
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
                    worker.wake_at = worker.backoff_until = self._clock() + worker.error_delay
                    continue
                if worker.last_error:
                    log.info("pod sync recovered", extra={"uid": uid})
                worker.last_error, worker.error_delay = "", 0.0
                worker.backoff_until = 0.0
                if outcome.done:
                    if not worker.urgent:
                        # The pod is gone; the nudges that came meanwhile (a relist or
                        # the resync seeing it go) are about what this sync removed.
                        return
                    continue
                worker.wake_at = outcome.wake_at
                if outcome.failed:
                    retry = self._clock() + jittered(
                        self.backoff_period_s, BACKOFF_JITTER, rand=self._rand
                    )
                    worker.backoff_until = retry
                    worker.wake_at = (
                        retry if outcome.wake_at is None else min(outcome.wake_at, retry)
                    )
        finally:
            if self._workers.get(uid) is worker:
                del self._workers[uid]

    async def stop(self) -> None:
        tasks = [w.task for w in self._workers.values() if w.task is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
