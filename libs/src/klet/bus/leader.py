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

Redis restarted empty (issue 42: the soak's slowest fault). The leader does not wait
for its next renewal to find out: the first call of its bus that cannot reach Redis
wakes the loop (`Lease.unreachable`), which then tries every `RECONNECT` delay (50 ms
doubling to 250 ms) until Redis answers. The first answer takes the vanished lease back
(fencing unchanged: `decide` keeps the leadership only for the first grant since the
counter was lost, or the next token), and the loop tells the service at once
(`Lease.on_restored`): its writers republish what Redis lost then, not at their next
periodic pass. A write refused meanwhile (`LeaseLapsed`) wakes the loop as before.

Fast failover on one host (`klet.bus.leaderslot`, when the lease has a leader slot):
the leader holds the slot's lock while it leads and a standby probes it every
`PROBE_INTERVAL_S`. When the lock is found free (the leader died, or gave the slot back
at shutdown), the standby asks for the lease at once, as heir of the holder named in
the slot, instead of waiting for its next attempt or for the lease to expire. Redis
grants it only if the key still holds that holder's value (or is gone), so the fencing
above is unchanged: a live leader loses nothing to a stale slot. A leader that cannot
take the slot at once (a standby probing it that instant, a stopped former leader still
holding it) retries at the same pace. The slot is given back by `release_quietly`, once
the process's tasks have stopped, never while it may still act.

The decisions are the pure `decide` and `vacated`; `hold` is the loop around them.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from klet.bus.leaderslot import LeaderSlot, SlotView
from klet.bus.redisbus import BusUnavailable, Lease
from klet.model.flowcontrol import BackoffPolicy
from klet.retry import delay_after

log = logging.getLogger(__name__)

PROBE_INTERVAL_S = 0.15
"""Seconds between a standby's looks at the leader slot (and a leader's retries to take
it): half of it is the mean wait before a standby notices its leader died."""

RECONNECT = BackoffPolicy(initial_s=0.05, max_s=0.25)
"""A leader's waits between attempts while Redis does not answer: a Redis that restarts
is back within a second or so, and the lease taken back at once is what tells the
service to republish what Redis lost, so the lease is back at most 250 ms after Redis
(a soak with 1 s had it up to 1 s late). An attempt that finds nobody listening costs a
failed connect: four a second per leader while Redis is away."""

SLOT_WARN_AFTER_S = 2.0
"""Seconds a leader may fail to take its slot before it says so (a standby's probe
holds the lock for microseconds; longer means a stopped former leader holds it)."""


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


def vacated(before: SlotView | None, now: SlotView | None) -> bool:
    """Whether a standby should try for the lease at once: the leader slot is free and
    was not free in this same state at the last probe (a leader died or gave it back
    since; or, at the first probe, one died before this standby looked). A slot that
    stays free (the leader runs on another host) is tried once, not at every probe."""
    return now is not None and not now.locked and now != before


class _SlotWatch:
    """The leader loop's use of the lease's leader slot between two attempts."""

    def __init__(self, slot: LeaderSlot, lease: Lease, interval_s: float) -> None:
        self.slot = slot
        self.lease = lease
        self.interval_s = interval_s
        self.usable = True
        self.last: SlotView | None = None
        self.unclaimed_since: float | None = None
        self.warned = False

    async def wait(self, *, leading: bool) -> SlotView | None:
        """Until the lease wakes the loop (None) or, standing by, the slot is vacated
        (what the probe saw). Leading, take the slot first, retrying until it is ours."""
        while self.usable:
            if leading:
                if self.claim():
                    break
            else:
                seen = self.probe()
                if vacated(self.last, seen):
                    self.last = seen
                    return seen
                self.last = seen
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval_s):
                    await self.lease.wake.wait()
                    return None
        await self.lease.wake.wait()
        return None

    def claim(self) -> bool:
        if self.slot.held:
            return True
        try:
            claimed = self.slot.claim()
        except OSError as err:
            self.give_up(err)
            return False
        now = time.monotonic()
        if claimed:
            log.info("leader slot taken", extra={"holder": self.lease.holder})
            self.unclaimed_since = None
            return True
        if self.unclaimed_since is None:
            self.unclaimed_since = now
        elif now - self.unclaimed_since >= SLOT_WARN_AFTER_S and not self.warned:
            self.warned = True
            log.warning(
                "another process holds the leader slot (a stopped former leader?); "
                "until this leader takes it, standbys wait for the lease TTL if it dies",
                extra={"lease": self.lease.key, "holder": self.lease.holder},
            )
        return False

    def probe(self) -> SlotView | None:
        try:
            return self.slot.probe()
        except OSError as err:
            self.give_up(err)
            return None

    def give_up(self, err: OSError) -> None:
        log.warning(
            "leader slot unusable; failover waits for the lease TTL",
            extra={"lease": self.lease.key, "error": str(err)},
        )
        self.usable = False


async def hold(
    lease: Lease,
    elected: asyncio.Event,
    *,
    decided: asyncio.Event | None = None,
    clock: Callable[[], float] = time.monotonic,
    probe_interval_s: float = PROBE_INTERVAL_S,
) -> None:
    """Acquire and renew `lease` forever; set `elected` once held, raise LeaseLost when
    this replica must stop acting. `decided`, when given, is set once Redis answered a
    first attempt: from then on an unset `elected` means "standing by", not "not yet
    known" (pod-source drops what only the leader sends). With a leader slot
    (`lease.leader_slot`) the leader holds it and a standby watches it, every
    `probe_interval_s`, to take over at once from a leader that died."""
    interval = lease.ttl_ms / 3000
    slot = lease.leader_slot
    watch = _SlotWatch(slot, lease, probe_interval_s) if slot is not None else None
    heir: str | None = None
    unanswered = 0  # consecutive attempts Redis did not answer
    while True:
        before, valid_until = lease.token, lease.valid_until
        lease.wake.clear()
        try:
            if await lease.try_acquire(heir=heir):
                attempt = Attempt.ACQUIRED if lease.reacquired else Attempt.RENEWED
            else:
                attempt = Attempt.REFUSED
        except BusUnavailable:
            attempt = Attempt.UNREACHABLE
        unanswered = unanswered + 1 if attempt is Attempt.UNREACHABLE else 0
        lease.answered = unanswered == 0
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
        elif role is Role.LEADER and attempt is Attempt.ACQUIRED:
            # Leading on after the key vanished (decide allowed it): Redis lost what
            # this service wrote, so its writers are told to republish now.
            log.info(
                "lease taken back after Redis lost it: republishing",
                extra={"lease": lease.key, "token": lease.token},
            )
            lease.restored()
        elif role is Role.STANDBY:
            log.debug("standing by for the lease", extra={"holder": lease.holder})
        wait = interval
        if elected.is_set():
            # Wake at the deadline at the latest, so an unreachable leader steps down
            # as soon as a standby could have taken over.
            wait = min(interval, max(0.0, lease.valid_until - clock()))
            if unanswered:
                # Redis away: try again soon, so the lease is back (and the service
                # told, `Lease.on_restored`) as soon as Redis answers again.
                wait = min(wait, delay_after(RECONNECT, unanswered))
        heir = None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait):
                if watch is None:
                    await lease.wake.wait()  # a write was refused: look at the lease now
                elif (vacancy := await watch.wait(leading=elected.is_set())) is not None:
                    log.info(
                        "the leader slot is free: trying for the lease at once",
                        extra={"holder": lease.holder, "heir_of": vacancy.holder},
                    )
                    heir = vacancy.holder


async def release_quietly(lease: Lease) -> None:
    """At shutdown, once this process stopped acting: give the lease back, then the
    leader slot, so a standby takes over at once (a failure only costs the standby the
    rest of the TTL; with the slot given back, not even that on this host)."""
    try:
        if lease.held:
            await lease.release()
    except Exception as err:  # noqa: BLE001 - shutting down; the TTL frees it anyway
        log.warning("could not release the lease", extra={"error": str(err)})
    finally:
        if lease.leader_slot is not None:
            lease.leader_slot.release()
