"""Fast failover through the leader slot, with two real replica processes sharing a run
directory and a real Redis: a standby takes over from a leader killed with SIGKILL, and
from one that shut down cleanly, long before the lease could expire or the standby's
next regular attempt; a leader stopped with SIGSTOP keeps its slot, so it is never
taken over through it (it would be by the TTL, as tests/integration/test_fencing.py
shows, and fenced).

The lease lives for ten minutes and a standby asks for it every 200 s, so inside the 30 s
each test waits only the slot can explain a takeover. No timings are asserted beyond that.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from klet.bus import Bus
from klet.devstack import ManagedProcess, RedisServer
from klet.model.layout import leader_slot

from tests.harness.leader_replica import LEASE
from tests.integration.test_fencing import buses, replica, wait_for, writes

__all__ = ["buses"]  # the fixture, shared with test_fencing

TTL_MS = 600_000
TAKEOVER_S = 30.0
SLOT_SEEN = "the leader slot is free: trying for the lease at once"


class Pair:
    """Replica a leading, replica b standing by beside it (one run directory)."""

    def __init__(self, tmp: Path, redis: RedisServer, bus: Bus) -> None:
        run_dir = tmp / "run"
        self.bus = bus
        self.a = replica(tmp, redis, "a", TTL_MS, run_dir=run_dir)
        self.b = replica(tmp, redis, "b", TTL_MS, run_dir=run_dir)
        self.slot = leader_slot(run_dir, LEASE)

    async def start(self) -> None:
        self.a.start()
        await wait_for(self.writing("a"), "replica a leading and writing")
        self.b.start()

        async def b_standing_by() -> bool:
            return "standing by for the lease" in self.b.log_path.read_text()

        await wait_for(b_standing_by, "replica b standing by")
        assert await names(self.slot, self.a)()

    def writing(self, name: str) -> Callable[[], Awaitable[bool]]:
        async def check() -> bool:
            return any(w == name for _, w in await writes(self.bus))

        return check

    def stop(self) -> None:
        for proc in (self.a, self.b):
            if proc.pid is not None and proc.alive:
                os.kill(proc.pid, signal.SIGCONT)
            proc.stop()


@pytest.fixture
async def pair(tmp_path: Path, redis_server: RedisServer, buses: Callable[[], Bus]) -> Pair:
    return Pair(tmp_path, redis_server, buses())


def log_of(proc: ManagedProcess) -> str:
    return proc.log_path.read_text()


async def test_a_standby_takes_over_at_once_from_a_killed_leader(pair: Pair) -> None:
    try:
        await pair.start()
        pair.a.kill()
        await wait_for(pair.writing("b"), "replica b taking over", timeout_s=TAKEOVER_S)
        assert SLOT_SEEN in log_of(pair.b), log_of(pair.b)[-2000:]
        assert pair.b.alive
        # The new leader holds the slot in turn.
        await wait_for(names(pair.slot, pair.b), "replica b in the leader slot")
    finally:
        pair.stop()


async def test_a_standby_takes_over_at_once_from_a_leader_shutting_down(pair: Pair) -> None:
    try:
        await pair.start()
        assert pair.a.stop() == 0  # SIGTERM: the lease and the slot are given back
        await wait_for(pair.writing("b"), "replica b taking over", timeout_s=TAKEOVER_S)
        assert SLOT_SEEN in log_of(pair.b), log_of(pair.b)[-2000:]
    finally:
        pair.stop()


async def test_a_stopped_leader_is_not_taken_over_through_the_slot(pair: Pair) -> None:
    try:
        await pair.start()
        assert pair.a.pid is not None
        os.kill(pair.a.pid, signal.SIGSTOP)
        # An absence cannot be waited for: b probes the slot about 20 times in this
        # stretch, and must take nothing from a leader that is stopped, not dead.
        await asyncio.sleep(3.0)
        assert SLOT_SEEN not in log_of(pair.b)
        assert all(w == "a" for _, w in await writes(pair.bus))
        assert pair.b.alive
        # Still watching: once the stopped leader really dies, b takes over at once.
        pair.a.kill()
        await wait_for(pair.writing("b"), "replica b taking over", timeout_s=TAKEOVER_S)
        assert SLOT_SEEN in log_of(pair.b)
    finally:
        pair.stop()


def names(slot: Path, proc: ManagedProcess) -> Callable[[], Awaitable[bool]]:
    """Whether the leader slot names `proc` (holder IDs are `host:pid:random`)."""

    async def check() -> bool:
        return (await asyncio.to_thread(slot.read_text)).split(":")[1] == str(proc.pid)

    return check
