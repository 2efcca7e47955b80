"""klet's one retry policy (`klet.retry`): the delay after each consecutive failure
(initial, doubled, capped; from 1 ms when the initial delay is 0), retrying only the
named exceptions or results, until success or for a bounded number of attempts (then
the last exception as it was), each failure told to the caller, a cancellation passed
through; and a check over the shipped sources that no loop writes its own doubling
back-off again outside the few places listed here with their reasons."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from klet.model.flowcontrol import BackoffPolicy
from klet.retry import call_retrying, delay_after

ROOT = Path(__file__).resolve().parents[2]


def test_delay_doubles_to_the_cap() -> None:
    policy = BackoffPolicy(0.5, 3.0)
    assert [delay_after(policy, n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_delay_from_zero_still_grows() -> None:
    policy = BackoffPolicy(0.0, 1.0)
    assert [delay_after(policy, n) for n in range(1, 5)] == [0.0, 0.001, 0.002, 0.004]
    assert delay_after(BackoffPolicy(0.0, 0.0), 3) == 0.0


def test_delay_stays_at_the_cap_for_any_count() -> None:
    assert delay_after(BackoffPolicy(0.2, 5.0), 100_000) == 5.0


def test_delay_refuses_a_count_below_one() -> None:
    with pytest.raises(ValueError, match="failures"):
        delay_after(BackoffPolicy(), 0)


class Flaky:
    """Fails with `error` `failures` times, then returns "ok"."""

    def __init__(self, failures: int, error: BaseException) -> None:
        self.left = failures
        self.error = error
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.left > 0:
            self.left -= 1
            raise self.error
        return "ok"


class Sleeps:
    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)


async def test_retries_until_success_with_the_policy_delays() -> None:
    sleeps, seen = Sleeps(), list[BaseException | None]()
    call = Flaky(4, ConnectionError("down"))
    result = await call_retrying(
        call, BackoffPolicy(0.5, 3.0), on=ConnectionError, on_failure=seen.append, sleep=sleeps
    )
    assert result == "ok"
    assert call.calls == 5
    assert sleeps.delays == [0.5, 1.0, 2.0, 3.0]
    assert [str(e) for e in seen] == ["down"] * 4


async def test_each_wait_is_told_before_it_starts() -> None:
    sleeps, told = Sleeps(), list[tuple[str, float]]()
    await call_retrying(
        Flaky(2, ConnectionError("down")),
        BackoffPolicy(0.5, 3.0),
        on=ConnectionError,
        before_wait=lambda err, wait: told.append((str(err), wait)),
        sleep=sleeps,
    )
    assert told == [("down", 0.5), ("down", 1.0)]
    assert sleeps.delays == [0.5, 1.0]


async def test_a_new_call_starts_over_at_the_initial_delay() -> None:
    sleeps = Sleeps()
    policy = BackoffPolicy(0.5, 3.0)
    for _ in range(2):
        await call_retrying(Flaky(2, ConnectionError()), policy, on=ConnectionError, sleep=sleeps)
    assert sleeps.delays == [0.5, 1.0, 0.5, 1.0]


async def test_a_callable_returning_an_awaitable_is_awaited() -> None:
    call = Flaky(1, ConnectionError())
    result = await call_retrying(
        lambda: call(), BackoffPolicy(0.0, 0.0), on=ConnectionError, sleep=Sleeps()
    )
    assert result == "ok"
    assert call.calls == 2


async def test_a_run_can_continue_a_backoff_already_under_way() -> None:
    sleeps = Sleeps()
    policy = BackoffPolicy(0.1, 0.4)
    await call_retrying(
        Flaky(3, ConnectionError()), policy, on=ConnectionError, sleep=sleeps, after_failures=1
    )
    assert sleeps.delays == [0.2, 0.4, 0.4]


async def test_other_exceptions_are_not_retried() -> None:
    sleeps = Sleeps()
    call = Flaky(1, KeyError("answer"))
    with pytest.raises(KeyError):
        await call_retrying(call, BackoffPolicy(), on=ConnectionError, sleep=sleeps)
    assert call.calls == 1
    assert sleeps.delays == []


async def test_bounded_attempts_raise_the_last_exception_as_it_was() -> None:
    sleeps, seen = Sleeps(), list[BaseException | None]()
    call = Flaky(9, ConnectionError("still down"))
    with pytest.raises(ConnectionError, match="still down"):
        await call_retrying(
            call,
            BackoffPolicy(0.1, 1.0),
            on=ConnectionError,
            attempts=3,
            on_failure=seen.append,
            sleep=sleeps,
        )
    assert call.calls == 3
    assert sleeps.delays == [0.1, 0.2]  # no wait after the last attempt
    assert len(seen) == 3  # ...but every failure is told


async def test_zero_attempts_still_make_one() -> None:
    call = Flaky(9, ConnectionError())
    with pytest.raises(ConnectionError):
        await call_retrying(call, BackoffPolicy(), on=ConnectionError, attempts=0, sleep=Sleeps())
    assert call.calls == 1


async def test_a_result_can_ask_for_a_retry() -> None:
    answers = iter([False, False, True])
    sleeps, seen = Sleeps(), list[BaseException | None]()

    async def register() -> bool:
        return next(answers)

    ok = await call_retrying(
        register,
        BackoffPolicy(0.1, 7.0),
        retry_result=lambda done: not done,
        on_failure=seen.append,
        sleep=sleeps,
    )
    assert ok is True
    assert sleeps.delays == [0.1, 0.2]
    assert seen == [None, None]


async def test_bounded_attempts_on_results_return_the_last_result() -> None:
    async def never() -> bool:
        return False

    result = await call_retrying(
        never, BackoffPolicy(), retry_result=lambda done: not done, attempts=2, sleep=Sleeps()
    )
    assert result is False


async def test_a_cancellation_in_the_wait_is_not_retried() -> None:
    started = asyncio.Event()

    async def slow_sleep(delay: float) -> None:
        started.set()
        await asyncio.Event().wait()

    task = asyncio.create_task(
        call_retrying(
            Flaky(1, ConnectionError()), BackoffPolicy(), on=ConnectionError, sleep=slow_sleep
        )
    )
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


# -- no hand-written back-off comes back ----------------------------------------------------

HAND_WRITTEN_BACKOFF = re.compile(
    r"(?i)\b\w*(delay|backoff|back_off|wait|retry|period)\w*\s*\*=?\s*2\b"  # delay * 2
    r"|\d\s*\*\s*2\s*\*\*|\bfactor\s*\*\*"  # 0.5 * 2 ** n, initial * factor ** n
    r"|\bRetryDelay\b"  # the hand-driven delay klet.retry replaced
)

PERMITTED = {
    "libs/src/klet/retry.py": "the policy itself: the delay sequence tenacity waits",
    "libs/src/klet/model/flowcontrol.py": "upstream's per-container back-off (crash loop, "
    "image pull): a domain rule with its own clock and expiry, not a retry of a call",
    "services/syncloop/src/klet/syncloop/metrics.py": "histogram buckets, not a delay",
    "libs/src/klet/cli/up.py": "the supervisor's restart delay of a child process (a "
    "process restart, not a call); klet.cli was another engineer's during the conversion "
    "(issue 43 item 3 left it)",
    "services/pod-source/src/klet/pod_source/publisher.py": "RetryPolicy.delay(failures), "
    "used by the publisher and sources/api.py: both are driven one step at a time "
    "(run_once returns or schedules the next wait, the failure count lives across steps, "
    "and their tests drive single steps), where a tenacity run owns every attempt inside "
    "one call (issue 43 item 3 left it)",
    "services/syncloop/src/klet/syncloop/pods/podworkers.py": "a pod worker's wait after a "
    "failed sync is cut short by an urgent update (a kill) and merged with the wake-ups of "
    "the pod's own schedule: a rule of the worker's queue, not a sleep a retry library "
    "owns (issue 43 item 3 left it)",
}


def hand_written_backoffs() -> set[str]:
    found: set[str] = set()
    for tree in (ROOT / "libs" / "src", *sorted((ROOT / "services").glob("*/src"))):
        for path in sorted(tree.rglob("*.py")):
            if "gen" in path.relative_to(tree).parts:
                continue  # generated gRPC stubs
            if HAND_WRITTEN_BACKOFF.search(path.read_text()):
                found.add(path.relative_to(ROOT).as_posix())
    return found


def test_no_loop_writes_its_own_backoff() -> None:
    found = hand_written_backoffs()
    unexpected = sorted(found - PERMITTED.keys())
    assert not unexpected, (
        f"{unexpected}: a doubling retry delay written by hand; retry the call through "
        "klet.retry (call_retrying / retrying) instead"
    )
    stale = sorted(PERMITTED.keys() - found)
    assert not stale, f"{stale}: no longer back off by hand; drop them from PERMITTED"


def test_the_check_sees_a_hand_written_backoff() -> None:
    assert HAND_WRITTEN_BACKOFF.search("delay = min(delay * 2, MAX_RETRY_S)")
    assert HAND_WRITTEN_BACKOFF.search("self.backoff_s *= 2")
    assert HAND_WRITTEN_BACKOFF.search("wait = min(30.0, 0.5 * 2 ** restarts)")
    assert HAND_WRITTEN_BACKOFF.search("backoff = RetryDelay(policy)")
    assert not HAND_WRITTEN_BACKOFF.search("await asyncio.sleep(self.retry_s)")
