"""The node shutdown manager (shutdown.py) with fakes of logind, the pods and KillPod.

Covers: upstream's migration of shutdownGracePeriod/CriticalPods into two periods, and
no period at all by default; explicit periods sorted; pods grouped by the highest period
priority at or below theirs (below all: the lowest; above all: the highest); a pod's own
shorter grace period wins; logind's delay raised when too short and a clear error when
it stays short; the lock taken at start and released after the shutdown; groups killed
lowest priority first with upstream's reason and message, the next group after the
previous one is down or its period is over; the Ready contribution written by the leader
only; a cancellation clears it and takes the lock again; a shutdown already under way at
start is handled at once; the state file keeps the times across a restart, and a node
without periods serves both time gauges at 0, as upstream; the root task
retries a manager that cannot watch 1 s doubling to 30 s, starting over after a run that
watched, and logs each changed reason once; a node without periods never loads logind's
client (dbus-fast), checked in a fresh interpreter (issue 42).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import pytest
from klet.config.kubelet import KubeletConfiguration
from klet.eviction import shutdown
from klet.eviction.manager import ActivePod, NodeEvent, PodKiller, PodLister
from klet.eviction.shutdown import (
    MESSAGE,
    REASON,
    Period,
    ShutdownDeps,
    ShutdownManager,
    StateFile,
    group_by_priority,
    periods,
    pod_grace_s,
    requested_s,
    supervise,
)
from klet.logind import LogindUnavailable
from klet.model.node import NODE_SHUTTING_DOWN
from klet.model.pod import SYSTEM_CRITICAL_PRIORITY
from klet.model.records import NodeConditionRecord
from klet.model.types import JSON, PodUID
from prometheus_client import CollectorRegistry

from tests.harness.freshimports import loaded_after


def _pod(name: str, priority: int | None = None, grace: int | None = None) -> ActivePod:
    spec: JSON = {"containers": [{"name": "c"}]}
    if priority is not None:
        spec["priority"] = priority
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    return ActivePod(
        {"metadata": {"name": name, "namespace": "ns", "uid": name}, "spec": spec}, None
    )


def test_no_period_by_default() -> None:
    assert periods(grace_s=0, critical_s=0, by_priority=()) == []


def test_grace_period_and_critical_migrate_into_two_periods() -> None:
    assert periods(grace_s=30, critical_s=10, by_priority=()) == [
        Period(0, 20),
        Period(SYSTEM_CRITICAL_PRIORITY, 10),
    ]
    assert requested_s(periods(grace_s=30, critical_s=10, by_priority=())) == 30


def test_explicit_periods_are_sorted_by_priority() -> None:
    got = periods(
        grace_s=0,
        critical_s=0,
        by_priority=[
            {"priority": 100000, "shutdownGracePeriodSeconds": 5},
            {"priority": 0, "shutdownGracePeriodSeconds": 7},
        ],
    )
    assert got == [Period(0, 7), Period(100000, 5)]


def test_pods_go_to_the_highest_period_at_or_below_their_priority() -> None:
    plan = [Period(10, 1), Period(100, 2), Period(1000, 3)]
    pods = [
        _pod("below", 5),
        _pod("at-10", 10),
        _pod("between", 500),
        _pod("at-1000", 1000),
        _pod("above", 5000),
    ]
    groups = group_by_priority(plan, pods)
    names = [[p.pod["metadata"]["name"] for p in g.pods] for g in groups]
    assert names == [["below", "at-10"], ["between"], ["at-1000", "above"]]


def test_a_shorter_pod_grace_period_wins() -> None:
    assert pod_grace_s(Period(0, 20), _pod("a", grace=5).pod) == 5
    assert pod_grace_s(Period(0, 20), _pod("b", grace=60).pod) == 20
    assert pod_grace_s(Period(0, 20), _pod("c").pod) == 20


class FakeLogind:
    def __init__(self, delay_s: float = 5.0, *, raise_to: float | None = None) -> None:
        self.delay_s = delay_s
        self.raise_to = raise_to
        self.preparing = False
        self.locks: list[int] = []
        self.signals: asyncio.Queue[bool | None] = asyncio.Queue()
        self.next_fd = 100

    async def inhibit_delay_max_s(self) -> float:
        return self.delay_s

    async def ensure_inhibit_delay(self, seconds: int) -> None:
        self.delay_s = self.raise_to if self.raise_to is not None else seconds

    async def take_delay_lock(self, who: str, why: str) -> int:
        self.next_fd += 1
        self.locks.append(self.next_fd)
        return self.next_fd

    async def preparing_for_shutdown(self) -> bool:
        return self.preparing

    async def shutdown_signals(self) -> AsyncIterator[bool]:
        while (item := await self.signals.get()) is not None:
            yield item


@dataclass
class Killer:
    delays: dict[str, float] = field(default_factory=dict)
    calls: list[tuple[str, int, str, str]] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)

    async def kill_pod(
        self,
        uid: PodUID,
        *,
        grace_period_s: int | None,
        reason: str,
        message: str,
        timeout_s: float | None = None,
    ) -> bool:
        self.calls.append((uid, grace_period_s or 0, reason, message))
        await asyncio.sleep(self.delays.get(uid, 0.0))
        self.finished.append(uid)
        return True


@dataclass
class Pods:
    pods: list[ActivePod]

    async def active(self) -> list[ActivePod]:
        return list(self.pods)


@dataclass
class Conditions:
    puts: list[NodeConditionRecord] = field(default_factory=list)
    deletes: int = 0

    async def put(self, key: str, record: NodeConditionRecord) -> None:
        assert key == record.type == "Ready"
        self.puts.append(record)

    async def delete(self, key: str) -> None:
        assert key == "Ready"
        self.deletes += 1


def _manager(
    tmp_path: Path,
    logind: FakeLogind,
    pods: list[ActivePod],
    plan: list[Period],
    *,
    leading: bool = True,
    killer: Killer | None = None,
) -> tuple[ShutdownManager, Killer, Conditions, list[int], list[tuple[float, float]]]:
    killer = killer or Killer()
    conditions = Conditions()
    released: list[int] = []
    times: list[tuple[float, float]] = []
    deps = ShutdownDeps(
        logind=logind,
        pods=Pods(pods),
        killer=killer,
        conditions=conditions,
        node_event=lambda *_: None,
        state=StateFile(tmp_path / "graceful_node_shutdown_state"),
        leading=lambda: leading,
        set_times=lambda start, end: times.append((start, end)),
        release=released.append,
    )
    return ShutdownManager(deps, plan), killer, conditions, released, times


async def test_start_raises_a_short_delay_and_takes_the_lock(tmp_path: Path) -> None:
    logind = FakeLogind(delay_s=5)
    manager, *_ = _manager(tmp_path, logind, [], [Period(0, 20), Period(100, 10)])
    await manager.start()
    assert logind.delay_s == 30
    assert manager.lock == logind.locks[-1]


async def test_a_delay_that_stays_short_is_a_clear_error(tmp_path: Path) -> None:
    logind = FakeLogind(delay_s=5, raise_to=5)
    manager, *_ = _manager(tmp_path, logind, [], [Period(0, 20)])
    with pytest.raises(RuntimeError, match="InhibitDelayMaxSec is 5s .* the 20s"):
        await manager.start()
    assert manager.lock is None


async def test_groups_are_killed_lowest_priority_first_then_the_lock_goes(tmp_path: Path) -> None:
    logind = FakeLogind(delay_s=60)
    pods = [_pod("critical", SYSTEM_CRITICAL_PRIORITY), _pod("web", 0, grace=1), _pod("batch")]
    manager, killer, conditions, released, times = _manager(
        tmp_path, logind, pods, periods(grace_s=3, critical_s=1, by_priority=())
    )
    await manager.start()
    lock = manager.lock
    await manager.on_signal(True)
    assert [c[0] for c in killer.calls[:2]] == ["web", "batch"]
    assert killer.calls[2][0] == "critical"
    assert {(c[0], c[1]) for c in killer.calls} == {("web", 1), ("batch", 2), ("critical", 1)}
    assert all(c[2] == REASON and c[3] == MESSAGE for c in killer.calls)
    assert released == [lock] and manager.lock is None
    assert conditions.puts[-1].status == "False"
    assert conditions.puts[-1].message == NODE_SHUTTING_DOWN
    start, end = times[-1]
    assert 0 < start <= end
    assert manager.handled == 1


async def test_the_next_group_starts_when_a_period_runs_out(tmp_path: Path) -> None:
    logind = FakeLogind(delay_s=60)
    killer = Killer(delays={"slow": 30.0})
    pods = [_pod("slow", 0), _pod("critical", 10)]
    manager, killer, *_ = _manager(
        tmp_path, logind, pods, [Period(0, 0), Period(10, 5)], killer=killer
    )
    await manager.start()
    await asyncio.wait_for(manager.on_signal(True), 5)
    assert "critical" in killer.finished and "slow" not in killer.finished


async def test_a_standby_kills_but_does_not_write_the_condition(tmp_path: Path) -> None:
    manager, killer, conditions, *_ = _manager(
        tmp_path, FakeLogind(60), [_pod("a")], [Period(0, 5)], leading=False
    )
    await manager.start()
    await manager.on_signal(True)
    assert [c[0] for c in killer.calls] == ["a"]
    assert conditions.puts == []


async def test_cancellation_clears_the_condition_and_takes_the_lock_again(tmp_path: Path) -> None:
    logind = FakeLogind(60)
    manager, _, conditions, *_ = _manager(tmp_path, logind, [], [Period(0, 5)])
    await manager.start()
    await manager.on_signal(True)
    assert manager.lock is None
    await manager.on_signal(False)
    assert manager.lock == logind.locks[-1]
    assert conditions.deletes == 1  # no contribution while the node is not shutting down


async def test_a_shutdown_under_way_at_start_is_handled_at_once(tmp_path: Path) -> None:
    logind = FakeLogind(60)
    logind.preparing = True
    manager, killer, *_ = _manager(tmp_path, logind, [_pod("a")], [Period(0, 5)])
    logind.signals.put_nowait(None)  # the bus connection ends after that
    await asyncio.wait_for(manager.run(), 5)
    assert [c[0] for c in killer.calls] == ["a"]
    assert manager.handled == 1


async def test_the_times_survive_a_restart(tmp_path: Path) -> None:
    manager, *_ = _manager(tmp_path, FakeLogind(60), [], [Period(0, 5)])
    await manager.start()
    await manager.on_signal(True)
    again, _, _, _, times = _manager(tmp_path, FakeLogind(60), [], [Period(0, 5)])
    assert len(times) == 1 and times[0][1] >= times[0][0] > 0


class ScriptedManager:
    """A manager whose runs end as scripted: (got as far as watching, why it ended)."""

    def __init__(self, script: list[tuple[bool, str]]) -> None:
        self.script = script
        self.watched = False
        self.runs = 0

    async def run(self) -> None:
        self.runs += 1
        self.watched, error = self.script.pop(0) if self.script else (False, "no bus")
        raise LogindUnavailable(error)

    async def trigger(self) -> None:
        raise AssertionError("no SIGUSR1 in this test")

    def drop_lock(self) -> None:
        pass


async def test_supervise_backs_off_and_starts_over_after_a_run_that_watched(
    caplog: pytest.LogCaptureFixture,
) -> None:
    script = [(False, "no bus")] * 4 + [(True, "bus lost"), (False, "no bus")]
    manager = ScriptedManager(list(script))
    slept: list[float] = []
    enough = asyncio.Event()

    async def sleep(delay: float) -> None:
        slept.append(delay)
        if len(slept) == len(script):
            enough.set()
            await asyncio.Event().wait()

    with caplog.at_level(logging.ERROR, logger="klet.eviction.shutdown"):
        task = asyncio.create_task(
            supervise(cast(ShutdownManager, manager), retry_s=8.0, sleep=sleep)
        )
        await asyncio.wait_for(enough.wait(), 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert slept == [8.0, 16.0, 30.0, 30.0, 8.0, 16.0]
    assert manager.runs == len(script)
    logged = [
        (r.__dict__["error"], r.__dict__["retry_s"])
        for r in caplog.records
        if r.getMessage().startswith("node shutdown manager cannot watch")
    ]
    assert logged == [("no bus", 8.0), ("bus lost", 8.0), ("no bus", 16.0)]


def test_a_node_without_periods_serves_the_shutdown_times_at_zero() -> None:
    """Upstream registers both gauges whenever its graceful shutdown gates are on, and its
    stub manager (no periods) never sets them: they are served at 0."""
    registry = CollectorRegistry()
    built = shutdown.build(
        KubeletConfiguration(),
        root_dir=Path("/nonexistent"),
        pods=cast(PodLister, None),
        killer=cast(PodKiller, None),
        conditions=cast(shutdown.ReadyTable, None),
        node_event=cast(NodeEvent, None),
        leading=lambda: True,
        registry=registry,
    )
    assert built is None
    for name in (
        "kubelet_graceful_shutdown_start_time_seconds",
        "kubelet_graceful_shutdown_end_time_seconds",
    ):
        assert registry.get_sample_value(name) == 0.0


def test_a_node_without_periods_does_not_load_logind_or_dbus() -> None:
    """The default configuration (no shutdown periods) builds no manager, and the eviction
    service's modules then hold neither klet.logind nor dbus-fast (and its XML parser)."""
    loaded = loaded_after(
        "import klet.eviction.app, klet.eviction.wiring\n"
        "from klet.eviction import shutdown\n"
        "from klet.config.kubelet import KubeletConfiguration\n"
        "built = shutdown.build(KubeletConfiguration(), root_dir=None, pods=None, "
        "killer=None, conditions=None, node_event=None, leading=None, registry=None)\n"
        "assert built is None, built",
        ["klet.logind", "dbus_fast", "xml"],
    )
    assert loaded == []
