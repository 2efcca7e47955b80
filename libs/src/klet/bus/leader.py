"""Leader election on a bus lease: only the holder of a service's lease acts.

A standby replica serves its health endpoints and waits; the leader renews every third
of the TTL. Stepping down ends the process (`LeaseLost`; its supervisor restarts it as
a standby), which is the only way to be sure that none of its tasks acts any more. It
happens when:

- another replica holds the lease;
- a write was refused because the lease is no longer ours (`klet.bus.Fenced`);
- renewals have failed for a whole TTL (Redis unreachable from here). A standby that
  can reach Redis may hold the lease by then, and this replica cannot know; its writes
  are already refused locally at that moment (`Lease.current_value`);
- the lease lapsed and had to be acquired again, and somebody else may have been
  granted it in between (the token grew by more than one, or our lease had expired):
  this replica's view may be stale. When Redis restarted empty while the lease was
  valid, the first grant after it continues the leadership (a write in between is
  refused with `LeaseLapsed` and retried, it does not end leadership).

Stepping down stops a service acting, it kills nothing: every service re-adopts its
state when it leads again, and pods keep running. A short Redis outage (shorter than
the TTL) changes nothing; a longer one makes the leaders restart as standbys, and one
of them leads again as soon as Redis answers.

The decision is the pure `decide`; `hold` is the loop around it.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from klet.bus.redisbus import BusUnavailable, Lease

log = logging.getLogger(__name__)


class LeaseLost(Exception):
    """This replica must stop acting as the leader."""


class Attempt(enum.Enum):
    """The outcome of one acquire-or-renew call."""

    RENEWED = "renewed"
    ACQUIRED = "acquired"
    """Taken anew, with a new token (a standby's election, or after the lease lapsed)."""
    REFUSED = "refused"
    UNREACHABLE = "unreachable"


class Role(enum.Enum):
    STANDBY = "standby"
    LEADER = "leader"
    STEP_DOWN = "step-down"


@dataclass(frozen=True)
class Observation:
    """What one round of the leader loop saw (times are monotonic seconds)."""

    attempt: Attempt
    token_before: int | None
    token_after: int | None
    valid_until: float
    """The lease's local deadline before this attempt (last successful renewal + TTL)."""
    now: float
    fenced: bool
    """A write was refused since the lease was taken (`Lease.lost`)."""
    counter_reset: bool = False
    """For ACQUIRED: Redis had lost the fence counter (restart, flush): this is the
    first grant since."""


def decide(*, leading: bool, seen: Observation) -> tuple[Role, str]:
    """The role to take after an attempt, with the reason for a step-down."""
    held = seen.attempt in (Attempt.RENEWED, Attempt.ACQUIRED)
    if not leading:
        return (Role.LEADER, "") if held else (Role.STANDBY, "")
    if seen.fenced:
        return Role.STEP_DOWN, "a write was refused: another replica holds the lease"
    if seen.attempt is Attempt.REFUSED:
        return Role.STEP_DOWN, "another replica holds the lease"
    if seen.attempt is Attempt.UNREACHABLE:
        if seen.now < seen.valid_until:
            return Role.LEADER, ""
        return Role.STEP_DOWN, "the lease was not renewed for a whole TTL"
    if seen.attempt is Attempt.RENEWED:
        return Role.LEADER, ""
    # Taken anew while leading: the key was gone. Leadership goes on only if nobody else
    # can have been granted it in between: our lease was still valid (so nobody could
    # take it before it vanished) and this grant is the next one, or the first since
    # Redis lost the counter (a restart or flush emptied it while we held it).
    before, after = seen.token_before, seen.token_after
    next_grant = before is not None and after == before + 1
    if seen.now < seen.valid_until and (next_grant or seen.counter_reset):
        return Role.LEADER, ""
    return Role.STEP_DOWN, "the lease lapsed and another replica may have led meanwhile"


async def hold(
    lease: Lease,
    elected: asyncio.Event,
    *,
    decided: asyncio.Event | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Acquire and renew `lease` forever; set `elected` once held, raise LeaseLost when
    this replica must stop acting. `decided`, when given, is set once Redis answered a
    first attempt: from then on an unset `elected` means "standing by", not "not yet
    known" (pod-source drops what only the leader sends)."""
    interval = lease.ttl_ms / 3000
    while True:
        before, valid_until = lease.token, lease.valid_until
        lease.wake.clear()
        try:
            if await lease.try_acquire():
                attempt = Attempt.ACQUIRED if lease.reacquired else Attempt.RENEWED
            else:
                attempt = Attempt.REFUSED
        except BusUnavailable:
            attempt = Attempt.UNREACHABLE
        seen = Observation(
            attempt=attempt,
            token_before=before,
            token_after=lease.token,
            valid_until=valid_until,
            now=clock(),
            fenced=lease.lost.is_set(),
            counter_reset=lease.counter_reset,
        )
        role, why = decide(leading=elected.is_set(), seen=seen)
        if decided is not None and attempt is not Attempt.UNREACHABLE:
            decided.set()
        if role is Role.STEP_DOWN:
            log.warning(
                "stepping down as leader",
                extra={"lease": lease.key, "holder": lease.holder, "why": why},
            )
            raise LeaseLost(f"{lease.key}: {why}")
        if role is Role.LEADER and not elected.is_set():
            log.info("acting as leader", extra={"holder": lease.holder, "token": lease.token})
            elected.set()
        elif role is Role.STANDBY:
            log.debug("standing by for the lease", extra={"holder": lease.holder})
        wait = interval
        if elected.is_set():
            # Wake at the deadline at the latest, so an unreachable leader steps down
            # as soon as a standby could have taken over.
            wait = min(interval, max(0.0, lease.valid_until - clock()))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait):
                await lease.wake.wait()  # a write was refused: look at the lease now


async def release_quietly(lease: Lease) -> None:
    """At shutdown: give the lease back so a standby takes over at once (a failure only
    costs the standby the rest of the TTL)."""
    if not lease.held:
        return
    try:
        await lease.release()
    except Exception as err:  # noqa: BLE001 - shutting down; the TTL frees it anyway
        log.warning("could not release the lease", extra={"error": str(err)})
