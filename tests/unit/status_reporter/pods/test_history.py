"""status-reporter's HistoryKeeper on the fake bus: Events and statuses become entries
of the right pod's stream with an expiry, a restarted keeper adds nothing twice, bad
entries are acknowledged and left out, and the index is kept within its bounds. An
Event joins only the history of a pod the node has (desired or with a status), named as
the owners of those tables name it: a forged Event with a fresh UID and a real pod's
name makes no row and no stream, so `klet why` still tells the real pod's story. A pass
over many pods is written in calls within the bus's cap, and a policy the bus would
refuse (a longer stream or expiry than it takes) is refused up front, naming the flag.
Status changes come from the pod view (PodCache.subscribe_statuses): the view's one
stream read and one status fetch serve the history too (issue 42), and a record of the
view older than what a full pass recorded is left out. Both feeds' findings go in one
fenced write per gathering window (issue 42: a pod start's Events and statuses were about
six writes), and the Events of a write that failed stay unacknowledged."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import pytest
from klet.bus import BusUnavailable, NodeBus
from klet.bus.history import pod_story
from klet.model.podhistory import EVICTION_NOTE, HISTORY_ONLY
from klet.model.records import (
    DesiredPod,
    EventRecord,
    HistoryEntry,
    PodStatusChange,
    PodStatusRecord,
)
from klet.model.timestamps import rfc3339
from klet.status_reporter.metrics.instruments import Metrics
from klet.status_reporter.pods.history import GROUP, WRITE_OPS, HistoryKeeper, HistoryPolicy
from klet.status_reporter.pods.podcache import CachePolicy, PodCache
from klet.testbed.fakes.bus import FakeBus
from prometheus_client import CollectorRegistry

T0 = 1_800_000_000.0
POLICY = HistoryPolicy(
    max_entries=50, max_age_s=3600.0, max_pods=3, read_block_ms=1, coalesce_s=0.0
)


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


def record(
    uid: str, *, restarts: int = 0, started: float = T0, name: str = "web"
) -> PodStatusRecord:
    return PodStatusRecord(
        uid=uid,
        namespace="ns",
        name=name,
        version=restarts + 1,
        epoch=0.0,
        status={
            "phase": "Running",
            "containerStatuses": [
                {
                    "name": "app",
                    "ready": True,
                    "restartCount": restarts,
                    "state": {"running": {"startedAt": rfc3339(started)}},
                }
            ],
        },
        updated_at=T0,
    )


def event(uid: str, reason: str, *, at: float = T0, **extra: Any) -> EventRecord:
    return EventRecord(
        type="Normal",
        reason=reason,
        message=f"{reason} happened",
        involved={"kind": "Pod", "namespace": "ns", "name": "web", "uid": uid},
        component="kubelet",
        at=at,
        extra=extra,
    )


def on_node(bus: FakeBus, *uids: str, name: str = "web") -> None:
    """Plant `uids` in pod-source's `desired` table, as pods of this node named ns/`name`."""
    node = NodeBus.of(bus, service="pod-source")
    for uid in uids:
        pod = {"metadata": {"namespace": "ns", "name": name, "uid": uid}}
        bus.seed(
            node.desired, uid, DesiredPod(uid=uid, pod=pod, source="api", hash="h", seen_at=T0)
        )


class View:
    """The pod view's status changes as the keeper takes them; `offer` hands some over."""

    def __init__(self) -> None:
        self.callbacks: list[Callable[[Sequence[PodStatusRecord]], None]] = []

    def subscribe_statuses(self, callback: Callable[[Sequence[PodStatusRecord]], None]) -> None:
        self.callbacks.append(callback)

    def offer(self, *records: PodStatusRecord) -> None:
        for callback in self.callbacks:
            callback(list(records))


def keeper(
    bus: FakeBus, clock: Clock, consumer: str = "leader-1", view: View | None = None
) -> HistoryKeeper:
    return HistoryKeeper(
        bus=NodeBus.of(bus, service="status-reporter"),
        consumer=consumer,
        changes=view if view is not None else View(),
        policy=POLICY,
        clock=clock,
    )


def entries(bus: FakeBus, uid: str) -> list[HistoryEntry]:
    node = NodeBus.of(bus, service="status-reporter")
    return bus.entries(node.history_of(uid))


async def test_events_of_every_service_go_to_their_pods_history() -> None:
    clock = Clock()
    bus = FakeBus(clock=clock)
    node = NodeBus.of(bus, service="status-reporter")
    syncloop = NodeBus.of(bus, service="syncloop")
    eviction = NodeBus.of(bus, service="eviction")
    on_node(bus, "u1", "u2")
    bus.append(syncloop.events, event("u1", "Pulled"))
    bus.append(
        eviction.events,
        event("u1", EVICTION_NOTE, **{HISTORY_ONLY: True, "detail": {"signal": "x"}}),
    )
    bus.append(syncloop.events, event("u2", "Started"))
    node_wide = EventRecord(
        type="Normal",
        reason="NodeReady",
        message="",
        involved={"kind": "Node", "name": "n"},
        component="kubelet",
        at=T0,
    )
    bus.append(syncloop.events, node_wide)
    bus.plant(syncloop.events, '{"v": 1, "reason": 3}')
    k = keeper(bus, clock)
    assert await k.events_once() + await k.events_once() >= 0
    got = entries(bus, "u1")
    assert [(e.reason, e.source) for e in got] == [
        ("Pulled", "syncloop"),
        (EVICTION_NOTE, "eviction"),
    ]
    assert got[1].detail == {"signal": "x"}
    assert [e.reason for e in entries(bus, "u2")] == ["Started"]
    # Every entry was acknowledged, the bad one and the Node's too.
    for stream in node.event_feed.streams.values():
        assert stream.pending(GROUP) == []  # type: ignore[attr-defined]
    index = bus.rows(node.history)
    assert set(index) == {"u1", "u2"} and (index["u1"].namespace, index["u1"].name) == ("ns", "web")
    # Each pod's stream expires max_age after its last write.
    assert bus.expiry[node.history_of("u1").key] == clock.t + POLICY.max_age_s


async def test_statuses_are_recorded_once_even_by_a_restarted_keeper() -> None:
    clock = Clock()
    bus = FakeBus(clock=clock)
    node = NodeBus.of(bus, service="status-reporter")
    bus.seed(node.status, "u1", record("u1"))
    first = keeper(bus, clock)
    await first.statuses_once()  # the full pass at election
    assert [e.what for e in entries(bus, "u1")] == ["started", "ready", "phase"]

    # A restart (a new leader): the same status adds nothing.
    clock.t += 10
    view = View()
    second = keeper(bus, clock, consumer="leader-2", view=view)
    await second.statuses_once()
    assert len(entries(bus, "u1")) == 3

    # A change the pod view fetched is compared with what was recorded.
    restarted = record("u1", restarts=1, started=T0 + 20)
    restarted.status["containerStatuses"][0]["lastState"] = {
        "terminated": {"exitCode": 1, "reason": "Error", "finishedAt": rfc3339(T0 + 19)}
    }
    bus.seed(node.status, "u1", restarted)
    view.offer(restarted)
    assert await second.statuses_once() == 1
    assert [e.what for e in entries(bus, "u1")][3:] == ["exited", "started"]
    found = await pod_story(node, "ns", "web")
    assert found is not None and found.story.answer.startswith(
        "restarted 1 time: container app exited"
    )


async def test_the_views_one_read_of_a_change_serves_the_history() -> None:
    """issue 42: the pod view and the history each XREAD `podstatus` and HMGET `status`
    in the same process; the keeper now takes what the view fetched."""
    clock = Clock()
    bus = FakeBus(clock=clock)
    node = NodeBus.of(bus, service="status-reporter")
    view = PodCache(
        desired=node.desired,
        status=node.status,
        feed=node.podstatus,
        metrics=Metrics(CollectorRegistry(), clock=clock),
        policy=CachePolicy(read_block_ms=1),
    )
    k = keeper(bus, clock, view=view)  # type: ignore[arg-type]
    await k.statuses_once()  # the full pass at election: nothing yet
    await view.consume_once()  # takes its cursor
    bus.seed(node.status, "u1", record("u1"))
    bus.append(node.podstatus, PodStatusChange(uid="u1", version=1))
    bus.calls.clear()
    assert await view.consume_once() == 1
    assert bus.calls == ["tail", "get_many", "get_many"]  # the stream, `status`, `desired`
    bus.calls.clear()
    assert await k.statuses_once() == 1
    assert "tail" not in bus.calls and "get_many" not in bus.calls  # nothing read again
    assert [e.what for e in entries(bus, "u1")] == ["started", "ready", "phase"]


async def test_a_view_record_older_than_the_passes_is_left_out() -> None:
    clock = Clock()
    bus = FakeBus(clock=clock)
    node = NodeBus.of(bus, service="status-reporter")
    newer = record("u1", restarts=1, started=T0 + 20)
    bus.seed(node.status, "u1", newer)
    view = View()
    view.offer(record("u1"))  # fetched before the election: the pass reads the table
    k = keeper(bus, clock, view=view)
    await k.statuses_once()
    recorded, row = len(entries(bus, "u1")), bus.rows(node.history)["u1"]
    view.offer(record("u1"))  # the view's fetch came before the pass's, landed after
    assert await k.statuses_once() == 1
    assert len(entries(bus, "u1")) == recorded
    assert bus.rows(node.history)["u1"] == row  # the index keeps the newer containers


async def test_old_and_surplus_histories_are_dropped() -> None:
    clock = Clock()
    bus = FakeBus(clock=clock)
    node = NodeBus.of(bus, service="status-reporter")
    k = keeper(bus, clock)
    on_node(bus, *(f"gone-{i}" for i in range(5)))
    for i in range(5):
        bus.append(NodeBus.of(bus, service="syncloop").events, event(f"gone-{i}", "Started"))
        await k.events_once()
        clock.t += 1
    bus.seed(node.status, "here", record("here", name="here"))
    await k.full_pass()
    index = bus.rows(node.history)
    # max_pods 3: the newest are kept, the pod still on the node among them.
    assert set(index) == {"here", "gone-4", "gone-3"}
    assert bus.expiry[node.history_of("gone-0").key] <= clock.t + 0.001
    # Past max_age a pod that is gone loses its history; one on the node keeps it.
    clock.t += POLICY.max_age_s + 1
    await k.full_pass()
    assert set(bus.rows(node.history)) == {"here"}
    assert bus.expiry[node.history_of("here").key] == clock.t + POLICY.max_age_s


async def test_a_story_is_found_by_name_or_uid_and_names_earlier_pods() -> None:
    clock = Clock()
    bus = FakeBus(clock=clock)
    node = NodeBus.of(bus, service="status-reporter")
    k = keeper(bus, clock)
    syncloop = NodeBus.of(bus, service="syncloop")
    on_node(bus, "old", "new")
    bus.append(syncloop.events, event("old", "Started"))
    await k.events_once()
    clock.t += 5
    bus.append(syncloop.events, event("new", "Started", at=T0 + 5))
    await k.events_once()
    found = await pod_story(node, "ns", "web")
    assert found is not None and found.story.uid == "new"
    assert [uid for uid, _ in found.earlier] == ["old"]
    by_uid = await pod_story(node, "ns", "old")
    assert by_uid is not None and by_uid.story.uid == "old"
    assert await pod_story(node, "ns", "nobody") is None


async def test_a_forged_event_with_a_fresh_uid_makes_no_row_and_no_stream() -> None:
    clock = Clock()
    bus = FakeBus(clock=clock)
    node = NodeBus.of(bus, service="status-reporter")
    bus.seed(node.status, "real", record("real"))
    k = keeper(bus, clock)
    await k.statuses_once()
    # Later, from any service's own Events stream: a fresh UID with the real pod's name,
    # and the real UID under another name.
    clock.t += 60
    eviction = NodeBus.of(bus, service="eviction")
    forged = event("forged", "Evicted", at=clock.t)
    renamed = EventRecord(
        type="Warning",
        reason="Killing",
        message="renamed",
        involved={"kind": "Pod", "namespace": "kube-system", "name": "other", "uid": "real"},
        component="kubelet",
        at=clock.t,
    )
    bus.append(eviction.events, forged)
    bus.append(eviction.events, renamed)
    await k.events_once()
    index = bus.rows(node.history)
    assert set(index) == {"real"}
    assert (index["real"].namespace, index["real"].name) == ("ns", "web")
    assert node.history_of("forged").key not in bus.streams
    found = await pod_story(node, "ns", "web")
    assert found is not None and found.story.uid == "real" and found.earlier == ()
    # Every Event was acknowledged, the one left out too.
    for stream in node.event_feed.streams.values():
        assert stream.pending(GROUP) == []  # type: ignore[attr-defined]


async def test_a_pod_known_only_by_its_status_is_named_as_its_status_names_it() -> None:
    clock = Clock()
    bus = FakeBus(clock=clock)
    node = NodeBus.of(bus, service="status-reporter")
    bus.seed(node.status, "u9", record("u9", name="from-status"))
    bus.append(NodeBus.of(bus, service="syncloop").events, event("u9", "Pulled"))
    await keeper(bus, clock).events_once()
    row = bus.rows(node.history)["u9"]
    assert (row.namespace, row.name) == ("ns", "from-status")


async def test_a_pass_over_many_pods_is_written_within_the_bus_cap() -> None:
    clock = Clock()
    bus = FakeBus(clock=clock)
    node = NodeBus.of(bus, service="status-reporter")
    for i in range(1200):  # 3 entries and 2 writes of its own each: 6000 writes in all
        bus.seed(node.status, f"u{i}", record(f"u{i}", name=f"p{i}"))
    policy = HistoryPolicy(
        max_entries=50, max_age_s=3600.0, max_pods=2000, read_block_ms=1, coalesce_s=0.0
    )
    k = HistoryKeeper(bus=node, consumer="l", changes=View(), policy=policy, clock=clock)
    await k.full_pass()
    assert len(bus.rows(node.history)) == 1200
    assert sum(bus.writes) == 6000 and max(bus.writes) <= WRITE_OPS


class HeldWrite:
    """The keeper's gathering wait, held open until `release`: what both feeds stage
    meanwhile goes in the one write."""

    def __init__(self) -> None:
        self.waits = 0
        self.open = asyncio.Event()

    async def __call__(self, _seconds: float) -> None:
        self.waits += 1
        await self.open.wait()

    def release(self) -> None:
        self.open.set()


def pending(uid: str) -> PodStatusRecord:
    waiting = {"name": "app", "ready": False, "restartCount": 0, "state": {"waiting": {}}}
    return replace(record(uid), status={"phase": "Pending", "containerStatuses": [waiting]})


def start_of(bus: FakeBus, view: View, uid: str) -> None:
    """A pod start as the keeper sees it: syncloop's three Events, the view's two statuses."""
    syncloop = NodeBus.of(bus, service="syncloop")
    on_node(bus, uid)
    for reason in ("Pulled", "Created", "Started"):
        bus.append(syncloop.events, event(uid, reason))
    view.offer(pending(uid))
    view.offer(replace(record(uid), version=2))


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_a_pod_starts_events_and_statuses_go_in_one_write() -> None:
    """issue 42: the Events feed and the status feed each wrote their findings at once,
    about six fenced writes per pod start; both now stage, and one write carries all."""
    clock = Clock()
    bus = FakeBus(clock=clock)
    node = NodeBus.of(bus, service="status-reporter")
    view, held = View(), HeldWrite()
    policy = HistoryPolicy(max_entries=50, max_age_s=3600.0, read_block_ms=1, coalesce_s=0.25)
    k = HistoryKeeper(bus=node, consumer="l", changes=view, policy=policy, clock=clock, sleep=held)
    assert await k.statuses_once() == 0  # the pass at election: nothing yet, no write
    assert bus.writes == [] and held.waits == 0
    for uid in ("u1", "u2"):
        start_of(bus, view, uid)
    events = asyncio.create_task(k.events_once())
    statuses = asyncio.create_task(k.statuses_once())
    await settle()
    assert bus.writes == [] and held.waits == 1  # both staged, one write gathering
    held.release()
    assert await events == 6 and await statuses == 2
    assert len(bus.writes) == 1
    for uid in ("u1", "u2"):
        got = entries(bus, uid)
        assert [e.reason for e in got if e.what == "event"] == ["Pulled", "Created", "Started"]
        assert {"started", "ready", "phase"} <= {e.what for e in got}
    for stream in node.event_feed.streams.values():
        assert stream.pending(GROUP) == []  # type: ignore[attr-defined]


async def test_the_events_of_a_failed_write_stay_pending_and_the_index_is_read_again() -> None:
    clock = Clock()
    bus = FakeBus(clock=clock)
    node = NodeBus.of(bus, service="status-reporter")
    view, held = View(), HeldWrite()
    k = HistoryKeeper(bus=node, consumer="l", changes=view, policy=POLICY, sleep=held)
    held.release()
    await k.statuses_once()  # the pass at election
    start_of(bus, view, "u1")
    held.open.clear()
    events = asyncio.create_task(k.events_once())
    statuses = asyncio.create_task(k.statuses_once())
    await settle()
    bus.fail(BusUnavailable("redis went away"))  # the next call: the write
    held.release()
    for step in (events, statuses):
        with pytest.raises(BusUnavailable):
            await step
    assert entries(bus, "u1") == [] and node.history.key not in bus.hashes
    for stream in node.event_feed.streams.values():
        if stream.pending(GROUP):  # type: ignore[attr-defined]
            break
    else:
        pytest.fail("the Events of the failed write were acknowledged")
    # The next compare reads the index from the bus again, not the failed write's copy.
    bus.calls.clear()
    view.offer(replace(record("u1"), version=2))
    assert await k.statuses_once() == 1
    assert "all" in bus.calls
    assert {"started", "ready", "phase"} <= {e.what for e in entries(bus, "u1")}
    # The Events left pending are claimed and written by the next reader of the group.
    await keeper(bus, clock, consumer="leader-2").events_once()
    got = [e.reason for e in entries(bus, "u1") if e.what == "event"]
    assert got == ["Pulled", "Created", "Started"]


@pytest.mark.parametrize(
    ("fields", "flag"),
    [
        ({"max_entries": 100_001}, "--pod-history-max-entries 100001: must be 1 to 100000"),
        ({"max_entries": 0}, "--pod-history-max-entries 0"),
        ({"max_age_s": 91 * 86400.0}, "--pod-history-max-age 7862400.0s: must be positive"),
        ({"max_age_s": 0.0}, "--pod-history-max-age 0.0s"),
    ],
)
def test_a_policy_the_bus_would_refuse_is_refused_naming_the_flag(
    fields: dict[str, Any], flag: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(flag)):
        HistoryPolicy(**fields)
