"""PodWorkers (pods/podworkers.py): one worker task per pod UID.

Covers: a wake-up syncs the pod; syncs of one pod never overlap and the wake-ups that
arrive during a sync collapse into one further sync, while another pod syncs in
parallel; a sync that reports the pod done ends its worker unless it was woken
meanwhile by a change of the pod (nudges do not keep it), and a later wake-up starts a
new one; the time a sync asks to be called
again is kept (a time already past syncs at once, a later one waits for it or for a
wake-up); a failing sync is retried after its back-off, or at once when woken, logged
once per distinct error and once when it recovers; a sync that reports a failure
(`Outcome.failed`) is retried after upstream's 10 s back-off with up to half of it
again as jitter, and within any back-off a nudge (PLEG, the resync) waits for its end
while a wake-up (a change of the pod) syncs at once; stop() ends every worker. The sync
function is a scripted fake and the clock a fake one, so every step is explicit.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
from klet.syncloop.pods.podworkers import Outcome, PodWorkers

from .helpers import Clock, until


class Script:
    """The sync function: records each call, and may be held (a gate per pod) or told
    what to return or raise."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.active: set[str] = set()
        self.overlapped = False
        self.gates: dict[str, asyncio.Event] = {}
        self.outcomes: dict[str, Callable[[], Outcome]] = {}

    async def __call__(self, uid: str) -> Outcome:
        if uid in self.active:
            self.overlapped = True
        self.active.add(uid)
        self.calls.append(uid)
        try:
            gate = self.gates.get(uid)
            if gate is not None:
                await gate.wait()
            return self.outcomes.get(uid, Outcome)()
        finally:
            self.active.discard(uid)

    def count(self, uid: str) -> int:
        return self.calls.count(uid)


async def settle(steps: int = 20) -> None:
    """Let every runnable task take its steps (no time passes)."""
    for _ in range(steps):
        await asyncio.sleep(0)


class World:
    def __init__(self) -> None:
        self.clock = Clock()
        self.sync = Script()
        self.workers = PodWorkers(
            self.sync, clock=self.clock, error_backoff_initial_s=60, error_backoff_max_s=600
        )


@pytest.fixture
async def w() -> AsyncIterator[World]:
    world = World()
    yield world
    await world.workers.stop()


async def test_wake_ups_during_a_sync_collapse_into_one_more(w: World) -> None:
    w.sync.gates["a"] = asyncio.Event()
    w.workers.wake("a")
    await until(lambda: w.sync.count("a") == 1)
    for _ in range(3):
        w.workers.wake("a")  # while it syncs
    w.workers.wake("b")
    await until(lambda: w.sync.count("b") == 1)  # another pod is not held up
    assert w.sync.count("a") == 1
    w.sync.gates["a"].set()
    await settle()
    assert w.sync.count("a") == 2 and not w.sync.overlapped
    assert sorted(w.workers.uids()) == ["a", "b"]


async def test_a_done_pod_ends_its_worker_unless_woken_meanwhile(w: World) -> None:
    w.sync.outcomes["a"] = lambda: Outcome(done=True)
    w.workers.wake("a")
    await settle()
    assert w.sync.count("a") == 1 and w.workers.uids() == []

    w.sync.gates["a"] = gate = asyncio.Event()
    w.workers.wake("a")  # a new worker
    await until(lambda: w.sync.count("a") == 2)
    w.workers.wake("a")  # the pod came back while it was being finished
    gate.set()
    await until(lambda: w.sync.count("a") == 3)
    await settle()
    assert w.workers.uids() == []


async def test_nudges_during_the_sync_that_finds_the_pod_gone_do_not_keep_its_worker(
    w: World,
) -> None:
    """issue 42's mass teardowns: a removed pod's kill lasts seconds to minutes, and the
    relist and the resync that land in it nudge its worker. Once the sync reports the
    pod gone, those nudges sync it no more (each such sync read CRI to find it gone:
    three syncs per removed pod in a 110-pod teardown, now one)."""
    w.sync.outcomes["a"] = lambda: Outcome(done=True)
    w.sync.gates["a"] = gate = asyncio.Event()
    w.workers.wake("a")  # the removal
    await until(lambda: w.sync.count("a") == 1)
    w.workers.nudge("a")  # PLEG saw its containers stop
    w.workers.wake_all()  # the periodic resync
    gate.set()
    await settle()
    assert w.sync.count("a") == 1 and w.workers.uids() == []
    w.workers.nudge("a")  # the runtime shows it again later: a new worker
    await until(lambda: w.sync.count("a") == 2)


async def test_the_time_a_sync_asks_for_is_kept(w: World) -> None:
    due = iter([w.clock.t - 1, w.clock.t + 3600])  # already past, then an hour away
    w.sync.outcomes["a"] = lambda: Outcome(wake_at=next(due, None))
    w.workers.wake("a")
    await settle()
    assert w.sync.count("a") == 2  # the past time: at once
    w.workers.wake("a")  # before the hour is up
    await settle()
    assert w.sync.count("a") == 3
    await settle()
    assert w.sync.count("a") == 3  # no time asked for: until woken


async def test_a_failing_sync_backs_off_and_is_logged_once(
    w: World, caplog: pytest.LogCaptureFixture
) -> None:
    errors: Iterator[Exception] = iter([OSError("socket gone"), OSError("socket gone")])

    def fail_then_succeed() -> Outcome:
        err = next(errors, None)
        if err is not None:
            raise err
        return Outcome()

    w.sync.outcomes["a"] = fail_then_succeed
    with caplog.at_level(logging.INFO, logger="klet.syncloop.pods.podworkers"):
        w.workers.wake("a")
        await settle()
        assert w.sync.count("a") == 1  # backing off for a minute, not retrying at once
        w.workers.wake("a")  # a wake-up does not wait for the back-off
        await settle()
        w.workers.wake("a")
        await settle()
    assert w.sync.count("a") == 3
    assert [r.getMessage() for r in caplog.records] == [
        "pod sync failed, will retry",
        "pod sync recovered",
    ]
    assert caplog.records[0].error == "OSError: socket gone"  # type: ignore[attr-defined]


async def test_a_failing_sync_is_retried_when_its_back_off_ends(w: World) -> None:
    workers = PodWorkers(w.sync, clock=w.clock, error_backoff_initial_s=0)
    attempts = iter([RuntimeError("first"), None])

    def fail_once() -> Outcome:
        err = next(attempts)
        if err is not None:
            raise err
        return Outcome()

    w.sync.outcomes["a"] = fail_once
    try:
        workers.wake("a")
        await until(lambda: w.sync.count("a") == 2)  # no wake-up needed
    finally:
        await workers.stop()


async def test_stop_ends_every_worker(w: World) -> None:
    w.sync.gates["a"] = asyncio.Event()  # held mid-sync
    w.workers.wake("a")
    w.workers.wake("b")
    await until(lambda: w.sync.count("a") == 1 and w.sync.count("b") == 1)
    await w.workers.stop()
    assert w.workers.uids() == []


def failed_world(jitter: float) -> World:
    world = World()
    world.workers = PodWorkers(
        world.sync,
        clock=world.clock,
        error_backoff_initial_s=60,
        error_backoff_max_s=600,
        rand=lambda: jitter,
    )
    return world


@pytest.mark.parametrize(("jitter", "retry_after_s"), [(0.0, 10.0), (0.5, 12.5), (1.0, 15.0)])
async def test_a_failed_sync_holds_nudges_until_its_jittered_back_off_ends(
    jitter: float, retry_after_s: float
) -> None:
    w = failed_world(jitter)
    w.sync.outcomes["a"] = lambda: Outcome(failed=True)
    failed_at = w.clock.t
    try:
        w.workers.wake("a")
        await settle()
        assert w.sync.count("a") == 1
        for elapsed in (0.0, 9.9, retry_after_s - 0.1):
            w.clock.t = failed_at + elapsed
            w.workers.nudge("a")  # a PLEG event of its own failed attempt, a resync
            w.workers.wake_all()
            await settle()
            assert w.sync.count("a") == 1, elapsed
        w.clock.t = failed_at + retry_after_s
        w.workers.nudge("a")
        await settle()
        assert w.sync.count("a") == 2  # the back-off is over: the nudge syncs
    finally:
        await w.workers.stop()


async def test_a_change_of_the_pod_is_not_held_by_the_back_off(w: World) -> None:
    outcomes = iter([Outcome(failed=True), Outcome()])
    w.sync.outcomes["a"] = lambda: next(outcomes)
    w.workers.wake("a")
    await settle()
    w.workers.nudge("a")
    await settle()
    assert w.sync.count("a") == 1
    w.workers.wake("a")  # an update or a kill: at once
    await settle()
    assert w.sync.count("a") == 2
    w.workers.nudge("a")  # the sync succeeded: no back-off any more
    await settle()
    assert w.sync.count("a") == 3


async def test_a_raising_sync_holds_nudges_for_its_back_off_too(w: World) -> None:
    attempts = iter([RuntimeError("runtime gone"), None])

    def fail_once() -> Outcome:
        err = next(attempts)
        if err is not None:
            raise err
        return Outcome()

    w.sync.outcomes["a"] = fail_once
    w.workers.wake("a")
    await settle()
    w.workers.nudge("a")  # within the 60 s back-off of this world
    await settle()
    assert w.sync.count("a") == 1
    w.clock.t += 60
    w.workers.nudge("a")
    await settle()
    assert w.sync.count("a") == 2


async def test_a_failed_sync_keeps_an_earlier_time_it_asked_for() -> None:
    """An earlier time (the active deadline, another container's back-off ending) still
    comes first; the back-off only delays nudges."""
    w = World()
    w.workers = PodWorkers(w.sync, clock=w.clock, backoff_period_s=3600, rand=lambda: 0.0)
    outcomes = iter([Outcome(failed=True, wake_at=w.clock.t - 1), Outcome()])
    w.sync.outcomes["a"] = lambda: next(outcomes)
    try:
        w.workers.wake("a")
        await until(lambda: w.sync.count("a") == 2)
    finally:
        await w.workers.stop()
