"""The leader loop's decision (`klet.bus.leader.decide`): when a replica starts acting,
keeps acting (renewed; the lease re-taken after Redis lost it while it was valid), and
steps down (lease taken, a write refused, renewals failing for a whole TTL, the lease
lapsed and possibly granted to someone else in between)."""

from __future__ import annotations

import pytest
from klet.bus.leader import Attempt, Observation, Role, decide


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
