"""The leader loop's decision (`klet.bus.leader.decide`): when a replica starts acting,
keeps acting (renewed; the lease re-taken after Redis lost it while it was valid), and
steps down (lease taken, a write refused, renewals failing for a whole TTL, the lease
lapsed and possibly granted to someone else in between); and when the loop (`hold`)
says its role is decided (Redis answered, leading or not).

Redis restarted empty (`hold` on a fake Redis, under a TTL so long that its renewal
never comes within a test): the leader's first bus call that cannot reach Redis wakes
the loop, which tries again at its reconnect pace and takes the lease back at Redis's
first answer, telling the service once (`Lease.on_restored`); the lease is told of an
unreachable Redis once per outage, and only while it is held.

The leader slot (`vacated`, and `hold` with fake replicas on a fake Redis and a fake slot
file, under a TTL too long to explain any takeover): the leader takes the slot, a
standby takes the lease at once when the leader dies or shuts down cleanly, never from
a stopped leader or from a slot naming somebody who no longer holds the lease, tries a
slot that stays free only once, and a leader takes the slot once a former leader lets
it go; an unusable slot changes nothing."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import cast

import pytest
from klet.bus import BusUnavailable, Lease, NodeBus
from klet.bus.leader import Attempt, Observation, Role, decide, hold, release_quietly, vacated
from klet.bus.leaderslot import SlotView
from klet.testbed.fakes.bus import FakeBus, FakeLeaderSlot, FakeSlotFile


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
        self.leader_slot = None
        self.answered = True

    def restored(self) -> None:
        pass

    async def try_acquire(self, *, heir: str | None = None) -> bool:
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


# -- the leader slot -----------------------------------------------------------------------

FREE_A = SlotView(locked=False, holder="a")
FREE_B = SlotView(locked=False, holder="b")
LOCKED = SlotView(locked=True, holder=None)


@pytest.mark.parametrize(
    ("before", "now", "try_now"),
    [
        (LOCKED, FREE_A, True),  # the leader died or gave the slot back
        (None, FREE_A, True),  # first look: a leader died before this standby started
        (FREE_A, FREE_B, True),  # another leader came and went between two probes
        (LOCKED, SlotView(locked=False, holder=None), True),  # no ID: a plain attempt
        (FREE_A, FREE_A, False),  # still free (the leader is elsewhere): tried already
        (None, LOCKED, False),  # a live leader (or a stopped one) holds it
        (FREE_A, LOCKED, False),
        (FREE_A, None, False),  # no slot file
        (None, None, False),
    ],
)
def test_vacated(before: SlotView | None, now: SlotView | None, try_now: bool) -> None:
    assert vacated(before, now) is try_now


TTL_MS = 60_000  # the next attempt is 20 s away and the lease lives for a minute:
PROBE_S = 0.005  # anything faster is the slot's doing


class Replica:
    """One process of a service: its lease on a shared fake Redis, its handle on the
    shared slot file and its leader loop."""

    def __init__(
        self, redis: FakeBus, file: FakeSlotFile | None, holder: str, ttl_ms: int = TTL_MS
    ) -> None:
        self.lease = redis.connect().lease("svc", holder, ttl_ms=ttl_ms)
        self.slot = FakeLeaderSlot(file, holder) if file is not None else None
        self.lease.leader_slot = self.slot
        self.elected = asyncio.Event()
        self.task = asyncio.create_task(
            hold(self.lease, self.elected, probe_interval_s=PROBE_S), name=f"hold-{holder}"
        )

    def kill(self) -> None:
        """SIGKILL: the loop stops at once, the kernel drops the slot's lock."""
        self.task.cancel()
        if self.slot is not None:
            self.slot.die()

    def stop(self) -> None:
        """SIGSTOP: the loop stops at once; the lock stays held."""
        self.task.cancel()


@pytest.fixture
async def replicas() -> AsyncIterator[Callable[..., Replica]]:
    redis = FakeBus("n1")
    made: list[Replica] = []

    def start(holder: str, file: FakeSlotFile | None, ttl_ms: int = TTL_MS) -> Replica:
        made.append(Replica(redis, file, holder, ttl_ms))
        return made[-1]

    yield start
    for r in made:
        r.task.cancel()
    await asyncio.gather(*(r.task for r in made), return_exceptions=True)


async def until(check: Callable[[], bool], what: str) -> None:
    """Poll `check` (the loops under test run meanwhile) for up to 5 s."""
    deadline = asyncio.get_running_loop().time() + 5.0
    while asyncio.get_running_loop().time() < deadline:
        if check():
            return
        await asyncio.sleep(PROBE_S)
    raise AssertionError(f"timed out waiting for {what}")


async def test_a_standby_takes_over_at_once_when_the_leader_dies(
    replicas: Callable[..., Replica],
) -> None:
    file = FakeSlotFile()
    a = replicas("host:1:aaaaaaaaaaaa", file)
    await until(lambda: a.elected.is_set() and file.locked_by is a.slot, "a leading in the slot")
    assert file.holder == a.lease.holder
    b = replicas("host:2:bbbbbbbbbbbb", file)
    probes = file.probes
    await until(lambda: file.probes > probes + 3, "b watching the slot")
    assert not b.elected.is_set()

    a.kill()
    await until(b.elected.is_set, "b leading")
    assert b.lease.token is not None and a.lease.token is not None
    assert b.lease.token > a.lease.token
    await until(lambda: file.locked_by is b.slot, "b in the slot")
    assert file.holder == b.lease.holder


async def test_a_stopped_leader_keeps_its_slot_and_its_lease(
    replicas: Callable[..., Replica],
) -> None:
    file = FakeSlotFile()
    a = replicas("host:1:aaaaaaaaaaaa", file)
    await until(lambda: file.locked_by is a.slot, "a leading in the slot")
    b = replicas("host:2:bbbbbbbbbbbb", file)
    a.stop()
    probes = file.probes
    await until(lambda: file.probes > probes + 20, "b probing a stopped leader's slot")
    assert not b.elected.is_set() and file.locked_by is a.slot
    a.kill()  # dead now
    await until(b.elected.is_set, "b leading")


async def test_a_free_slot_naming_another_holder_takes_nothing_and_is_tried_once(
    replicas: Callable[..., Replica],
) -> None:
    # The leader runs without this host's slot (another host); the slot names a holder
    # that died long ago.
    file = FakeSlotFile(holder="host:9:999999999999")
    a = replicas("host:1:aaaaaaaaaaaa", None)
    await until(a.elected.is_set, "a leading")
    b = replicas("host:2:bbbbbbbbbbbb", file)
    b_calls = b.lease.bus.calls  # type: ignore[attr-defined]
    await until(lambda: file.probes > 20, "b probing")
    assert not b.elected.is_set() and b_calls.count("acquire") == 2  # start-up, slot once
    assert file.locked_by is None


async def test_a_leader_takes_the_slot_once_a_stopped_former_leader_lets_go(
    replicas: Callable[..., Replica],
) -> None:
    file = FakeSlotFile()
    stalled = FakeLeaderSlot(file, "host:1:aaaaaaaaaaaa")
    assert stalled.claim()  # the former leader, stopped; its lease expired meanwhile
    b = replicas("host:2:bbbbbbbbbbbb", file)
    await until(b.elected.is_set, "b leading without the slot")
    probes_before = file.probes
    assert file.locked_by is stalled
    stalled.die()  # continued, stepped down, gone
    await until(lambda: file.locked_by is b.slot, "b in the slot")
    assert file.holder == b.lease.holder and file.probes == probes_before  # a leader never probes


async def test_a_clean_shutdown_hands_over_at_once(replicas: Callable[..., Replica]) -> None:
    file = FakeSlotFile()
    a = replicas("host:1:aaaaaaaaaaaa", file)
    await until(lambda: file.locked_by is a.slot, "a leading in the slot")
    b = replicas("host:2:bbbbbbbbbbbb", file)
    probes = file.probes
    await until(lambda: file.probes > probes + 3, "b watching the slot")
    a.task.cancel()  # SIGTERM: the tasks stop, then the lease and the slot are given back
    await asyncio.gather(a.task, return_exceptions=True)
    assert file.locked_by is a.slot  # the slot outlives the tasks until released
    await release_quietly(a.lease)
    assert not a.lease.held and file.locked_by is None
    await until(b.elected.is_set, "b leading")


async def test_an_unusable_slot_leaves_the_lease_to_its_ttl(
    replicas: Callable[..., Replica],
) -> None:
    file = FakeSlotFile(error=PermissionError("read-only run dir"))
    a = replicas("host:1:aaaaaaaaaaaa", file)
    b = replicas("host:2:bbbbbbbbbbbb", file)
    await until(a.elected.is_set, "a leading")
    await until(lambda: file.probes >= 1, "b's one look at the slot")
    await asyncio.sleep(20 * PROBE_S)  # a stretch in which b would probe again if it did
    assert file.probes == 1 and not b.elected.is_set()


async def test_a_leader_takes_the_slot_once_and_keeps_it_through_renewals(
    replicas: Callable[..., Replica], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="klet.bus.leader")
    file = FakeSlotFile()
    # Renewed every 150 ms: a TTL of tens of ms expired whenever the loaded test machine
    # stalled the loop that long, and the re-election logged a second "slot taken".
    a = replicas("host:1:aaaaaaaaaaaa", file, 450)
    calls = a.lease.bus.calls  # type: ignore[attr-defined]
    await until(lambda: calls.count("renew") >= 3, "a few renewals")
    assert a.elected.is_set() and file.locked_by is a.slot
    assert [r.message for r in caplog.records].count("leader slot taken") == 1


# -- Redis restarted empty ------------------------------------------------------------------

NEVER_MS = 600_000  # a renewal every 200 s: no test here waits for one


async def test_a_leader_takes_its_lease_back_as_soon_as_redis_answers_again() -> None:
    redis = FakeBus("n1")
    lease = redis.lease("svc", "a", ttl_ms=NEVER_MS)
    told: list[int | None] = []
    lease.on_restored(lambda: told.append(lease.token))
    elected = asyncio.Event()
    task = asyncio.create_task(hold(lease, elected))
    try:
        await asyncio.wait_for(elected.wait(), 5.0)

        def attempts() -> int:
            return redis.calls.count("renew") + redis.calls.count("acquire")

        before = attempts()
        status = NodeBus.of(redis, service="syncloop").status

        redis.error = BusUnavailable("Connection closed by server.")
        redis.restart()
        with pytest.raises(BusUnavailable):
            await status.get("uid-1")  # a reader finds Redis gone: the lease is told
        await until(lambda: attempts() > before + 1, "attempts while down")
        assert told == []  # nothing taken back while Redis does not answer

        redis.error = None  # back, empty
        await until(lambda: bool(told), "the lease taken back")
        assert told == [1]  # the first grant since the counter was lost: leading on
        assert elected.is_set() and not lease.lost.is_set()
        await NodeBus.of(redis, service="syncloop").status.delete("uid-1")  # fenced: accepted
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_renewal_that_finds_the_key_gone_tells_the_service_once() -> None:
    redis = FakeBus("n1")
    lease = redis.lease("svc", "a", ttl_ms=NEVER_MS)
    told: list[str] = []
    lease.on_restored(lambda: told.append("restored"))
    elected = asyncio.Event()
    task = asyncio.create_task(hold(lease, elected))
    try:
        await asyncio.wait_for(elected.wait(), 5.0)
        assert told == []  # an election is not a restore
        redis.restart()  # no call failed: the next look at the lease finds it gone
        lease.wake.set()
        await until(lambda: bool(told), "the lease taken back")
        lease.wake.set()  # renewed, not taken anew: nothing more to tell
        await until(lambda: redis.calls.count("renew") >= 2, "a renewal")
        assert told == ["restored"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_the_lease_is_told_of_an_unreachable_redis_once_per_outage_when_held() -> None:
    lease = FakeBus("n1").lease("svc", "a", ttl_ms=NEVER_MS)
    lease.unreachable()
    assert not lease.wake.is_set()  # a standby's loop keeps its own pace
    lease.held = True
    lease.unreachable()
    assert lease.wake.is_set() and not lease.answered
    lease.wake.clear()
    lease.unreachable()  # the loop has not reached Redis since: already retrying
    assert not lease.wake.is_set()
    lease.answered = True  # the loop's next attempt was answered
    lease.unreachable()
    assert lease.wake.is_set()
