"""The leader loop's decision (`klet.bus.leader.decide`): when a replica starts acting,
keeps acting (renewed; the lease re-taken after Redis lost it while it was valid), and
steps down (lease taken, a write refused, renewals failing for a whole TTL, the lease
lapsed and possibly granted to someone else in between); and when the loop (`hold`)
says its role is decided (Redis answered, leading or not)."""

from __future__ import annotations

import asyncio
from typing import cast

import pytest
from klet.bus import BusUnavailable, Lease
from klet.bus.leader import Attempt, Observation, Role, decide, hold


def seen(
    attempt: Attempt,
    *,
    before: int | None = 7,
    after: int | None = 7,
    valid_until: float = 100.0,
    now: float = 90.0,
    fenced: bool = False,
    reset: bool = False,
) -> Observation:
    return Observation(
        attempt=attempt,
        token_before=before,
        token_after=after,
        valid_until=valid_until,
        now=now,
        fenced=fenced,
        counter_reset=reset,
    )


@pytest.mark.parametrize(
    ("leading", "observation", "role", "why"),
    [
        # A standby becomes leader only when it got the lease.
        (False, seen(Attempt.ACQUIRED, before=None, after=3), Role.LEADER, ""),
        (False, seen(Attempt.REFUSED, before=None, after=None), Role.STANDBY, ""),
        (False, seen(Attempt.UNREACHABLE, before=None, after=None), Role.STANDBY, ""),
        (True, seen(Attempt.RENEWED), Role.LEADER, ""),
        # The key vanished while our lease was valid and nobody was granted it since:
        # the next token, or the first one after Redis lost the counter.
        (True, seen(Attempt.ACQUIRED, after=8), Role.LEADER, ""),
        (True, seen(Attempt.ACQUIRED, after=1, reset=True), Role.LEADER, ""),
        # Somebody was granted it in between (or Redis lost the counter and somebody
        # counted up from 1 again), or our lease had expired: a new term.
        (True, seen(Attempt.ACQUIRED, after=10), Role.STEP_DOWN, "lapsed"),
        (True, seen(Attempt.ACQUIRED, after=2), Role.STEP_DOWN, "lapsed"),
        (True, seen(Attempt.ACQUIRED, after=8, now=100.0), Role.STEP_DOWN, "lapsed"),
        (True, seen(Attempt.ACQUIRED, after=1, reset=True, now=101), Role.STEP_DOWN, "lapsed"),
        (True, seen(Attempt.REFUSED, after=None), Role.STEP_DOWN, "another replica"),
        # Redis unreachable: keep acting until the lease's deadline, not a moment longer.
        (True, seen(Attempt.UNREACHABLE, now=99.9), Role.LEADER, ""),
        (True, seen(Attempt.UNREACHABLE, now=100.0), Role.STEP_DOWN, "whole TTL"),
        (True, seen(Attempt.UNREACHABLE, now=500.0), Role.STEP_DOWN, "whole TTL"),
        # A refused write ends leadership whatever the renewal says.
        (True, seen(Attempt.RENEWED, fenced=True), Role.STEP_DOWN, "write was refused"),
        (True, seen(Attempt.UNREACHABLE, fenced=True), Role.STEP_DOWN, "write was refused"),
    ],
)
def test_decide(leading: bool, observation: Observation, role: Role, why: str) -> None:
    got, reason = decide(leading=leading, seen=observation)
    assert got is role
    assert why in reason
    assert (reason == "") == (role is not Role.STEP_DOWN)


class ScriptedLease:
    """The parts of `klet.bus.Lease` that `hold` reads; each attempt answers from
    `answers` (True: held, False: refused, None: Redis unreachable), then refuses."""

    def __init__(self, answers: list[bool | None], *, attempts: int) -> None:
        self.answers = answers
        self.attempts = 0
        self.wanted = attempts
        self.done = asyncio.Event()
        self.key = "klet:n1:lease:test"
        self.holder = "a"
        self.ttl_ms = 30
        self.token: int | None = None
        self.held = False
        self.valid_until = 0.0
        self.reacquired = True
        self.counter_reset = False
        self.lost = asyncio.Event()
        self.wake = asyncio.Event()

    async def try_acquire(self) -> bool:
        answer = self.answers.pop(0) if self.answers else False
        self.attempts += 1
        if self.attempts >= self.wanted:
            self.done.set()  # the caller looks once this attempt is decided
        if answer is None:
            raise BusUnavailable("refused")
        self.held = answer
        return answer


async def run_hold(answers: list[bool | None], attempts: int) -> tuple[bool, bool]:
    lease = ScriptedLease(answers, attempts=attempts)
    elected, decided = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(hold(cast(Lease, lease), elected, decided=decided))
    await asyncio.wait_for(lease.done.wait(), 5.0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return elected.is_set(), decided.is_set()


async def test_hold_decides_on_the_first_answer_not_on_an_unreachable_redis() -> None:
    assert await run_hold([None, None], attempts=2) == (False, False)
    assert await run_hold([None, False], attempts=3) == (False, True)
    assert await run_hold([True], attempts=1) == (True, True)
