"""The evented PLEG (pods/runtimeevents.py) against FakeRuntimeService and FakeRuntimeEvents.

Covers: what each event calls for (`action_for`); an open subscription switches the
relister to its long period and owes one full relist; an exit with its status is noted
(the pod adapter reads the container as exited, OOMKilled after an OOM event) and wakes
the pod's worker at once, and again once CRI shows the container stopped (polled with
growing delays, bounded), when the notice is dropped; the delete that follows a seen
exit wakes nobody; an OOM kill wakes at once, and an exit CRI recorded as `Error` before
it handled the OOM event reads `OOMKilled` from then on; creations and starts wake
nobody and cost no CRI call; an event about an object the last relist did not know is
resolved through lists filtered by its ID, and one that is not ours is dropped and
looked up once; the exit and delete of an object a worker stopped itself
(`ExitNotices.expect_stop`: its CRI stop call is synchronous) cost no CRI call, the exit
waking the worker once (a kill inside a sync is followed by the sync that restarts the
container) and the delete nobody, unless that stop failed; the exits of a pod a worker
removes for good (`expect_removal`) wake nobody; the woken worker's read (PodRuntime)
refreshes PLEG's fingerprint; a dropped stream puts the relister back on its short
period, owes a relist, re-subscribes after the back-off delays and owes one more full
relist once open; a runtime without events leaves the relister short-period for good;
the observer sees each subscription, drop and event.
"""

from __future__ import annotations

import asyncio

import pytest
from klet.cri import CRIError, RuntimeUnavailable
from klet.cri import labels as L
from klet.cri.types import ContainerConfig, ContainerState, EventKind, RuntimeEvent, SandboxConfig
from klet.model.flowcontrol import BackoffPolicy
from klet.model.types import ContainerID, SandboxID
from klet.syncloop.metrics import create_metrics
from klet.syncloop.pods.relisting import Relister
from klet.syncloop.pods.runtime import ExitNotices, PodRuntime
from klet.syncloop.pods.runtimeevents import (
    Action,
    EventWatcher,
    SettleSettings,
    action_for,
    settle_delays,
)
from klet.testbed.fakes.cri import FakeRuntimeEvents, FakeRuntimeService
from prometheus_client import CollectorRegistry, generate_latest

from .helpers import running, until

IMAGE = "registry.klet.test/busybox:1.36"


class Observer:
    def __init__(self) -> None:
        self.log: list[str] = []

    def subscribed(self, source: str) -> None:
        self.log.append(f"subscribed {source}")

    def unsubscribed(self, *, error: bool) -> None:
        self.log.append(f"unsubscribed error={error}")

    def event(self, event: RuntimeEvent) -> None:
        self.log.append(f"{event.kind.value} {event.object_id}")


class World:
    def __init__(self) -> None:
        self.cri = FakeRuntimeService()
        self.cri.add_image(IMAGE)
        self.events = FakeRuntimeEvents()
        self.woken: list[str] = []
        self.slept: list[float] = []
        self.on_sleep: list[object] = []  # callables run on the n-th sleep, in order
        self.relister = Relister(self.cri, self.woken.append, period_s=1, evented_period_s=20)
        self.observer = Observer()
        self.watcher = EventWatcher(
            self.events,
            self.cri,
            self.relister,
            wake=self.woken.append,
            observer=self.observer,
            backoff=BackoffPolicy(initial_s=0.1, max_s=0.4),
            settle=SettleSettings(first_s=0.01, growth=2, max_s=0.1),
            sleep=self.sleep,
        )

    async def sleep(self, delay: float) -> None:
        self.slept.append(delay)
        await asyncio.sleep(0)  # no time passes, but the other tasks run
        if self.on_sleep:
            action = self.on_sleep.pop(0)
            if callable(action):
                result = action()
                if asyncio.iscoroutine(result):
                    await result

    async def pod(self, uid: str, *, labelled: bool = True) -> tuple[SandboxID, ContainerID]:
        labels = {L.POD_UID: uid} if labelled else {}
        config = SandboxConfig(
            name=f"p-{uid}",
            namespace="default",
            uid=uid,
            attempt=0,
            hostname=uid,
            log_directory="/tmp",
            labels=labels,
        )
        sid = await self.cri.run_pod_sandbox(config)
        cid = await self.cri.create_container(
            sid, ContainerConfig(name="main", attempt=0, image=IMAGE, labels=labels), config
        )
        await self.cri.start_container(cid)
        return sid, cid

    async def subscribed(self) -> None:
        await until(lambda: self.watcher.subscribed)

    def list_calls(self) -> list[tuple[str, ...]]:
        return [c for c in self.cri.calls if c[0] in ("ListPodSandbox", "ListContainers")]


@pytest.fixture
def w() -> World:
    return World()


def test_settle_delays_grow_up_to_the_step_within_the_bound() -> None:
    assert settle_delays(SettleSettings(first_s=0.01, growth=2, max_s=0.1)) == pytest.approx(
        [0.01, 0.02, 0.04]
    )
    assert settle_delays(SettleSettings(first_s=0.1, growth=2, step_max_s=0.3, max_s=1.0)) == (
        pytest.approx([0.1, 0.2, 0.3, 0.3])
    )
    # the default grows by a quarter: no poll comes more than a quarter late
    delays = settle_delays(SettleSettings(max_s=0.05))
    assert delays == pytest.approx(
        [
            0.002,
            0.0025,
            0.003125,
            0.00390625,
            0.0048828125,
            0.006103515625,
            0.00762939453125,
            0.0095367431640625,
        ]
    )
    assert settle_delays(SettleSettings(first_s=0.0, max_s=1.0)) == []
    assert settle_delays(SettleSettings(first_s=2.0, max_s=1.0)) == []


@pytest.mark.parametrize(
    ("kind", "exit_seen", "action"),
    [
        (EventKind.EXITED, False, Action.CONFIRM),
        (EventKind.EXITED, True, Action.CONFIRM),
        (EventKind.DELETED, True, Action.IGNORE),  # its exit wakes the worker
        (EventKind.DELETED, False, Action.CONFIRM),  # the exit was missed
        (EventKind.OOM, False, Action.WAKE),  # an exit published may turn OOMKilled
        (EventKind.STARTED, False, Action.IGNORE),  # a worker's own action, seen by it
        (EventKind.CREATED, False, Action.IGNORE),
    ],
)
def test_what_each_event_calls_for(kind: EventKind, exit_seen: bool, action: Action) -> None:
    assert action_for(kind, exit_seen=exit_seen) is action


@pytest.mark.parametrize(
    ("kind", "exit_seen", "action"),
    [
        (EventKind.EXITED, False, Action.WAKE),  # recorded: the worker's stop returned
        (EventKind.DELETED, False, Action.IGNORE),  # its own removal
        (EventKind.DELETED, True, Action.IGNORE),
        (EventKind.OOM, False, Action.WAKE),  # not its doing: the reason may change
    ],
)
def test_what_the_events_of_a_workers_own_stop_call_for(
    kind: EventKind, exit_seen: bool, action: Action
) -> None:
    assert action_for(kind, exit_seen=exit_seen, own_stop=True) is action


@pytest.mark.parametrize(
    ("kind", "action"),
    [
        (EventKind.EXITED, Action.IGNORE),  # the worker forgets the pod: nobody to wake
        (EventKind.DELETED, Action.IGNORE),
        (EventKind.OOM, Action.WAKE),
    ],
)
def test_what_the_events_of_a_pod_removed_for_good_call_for(
    kind: EventKind, action: Action
) -> None:
    for own_stop in (False, True):
        assert action_for(kind, exit_seen=False, own_stop=own_stop, removing=True) is action


async def test_the_exits_of_a_pod_removed_for_good_wake_nobody(w: World) -> None:
    sid, cid = await w.pod("a")
    await w.relister.relist_once()
    w.woken.clear()
    async with running(w.watcher.run()):
        await w.subscribed()
        w.cri.calls.clear()
        for oid in (cid, sid):
            w.watcher.notices.expect_removal(oid)
        w.watcher.notices.expect_stop(cid)  # as LifecycleHooks.stop notes it too
        w.cri.exit_container(cid, 137)
        for oid in (cid, sid):
            w.events.push(EventKind.EXITED, oid, exit_status=137)
            w.events.push(EventKind.DELETED, oid)
        await until(lambda: len(w.observer.log) == 5 and not w.watcher._tasks)
    assert w.woken == [] and w.cri.calls == [] and w.slept == []
    assert not w.watcher.notices.removed_by_worker(cid)  # deleted: nothing more expected


async def test_the_exit_and_delete_of_a_workers_own_stop_cost_no_cri_call(w: World) -> None:
    """issue 42: a removed pod's teardown polled ContainerStatus 13-21 and
    PodSandboxStatus 3-9 times confirming exits its own synchronous stops had caused."""
    sid, cid = await w.pod("a")
    await w.relister.relist_once()
    w.cri.calls.clear()
    w.woken.clear()
    async with running(w.watcher.run()):
        await w.subscribed()
        w.cri.calls.clear()  # the subscription's catch-up relist is not the events'
        for oid in (cid, sid):
            w.watcher.notices.expect_stop(oid)
        await w.cri.stop_container(cid, timeout_s=0)
        await w.cri.stop_pod_sandbox(sid)
        for oid in (cid, sid):
            w.events.push(EventKind.EXITED, oid, exit_status=137)
        for oid in (cid, sid):
            w.events.push(EventKind.DELETED, oid)
        await until(lambda: len(w.observer.log) == 5 and not w.watcher._tasks)
    assert w.woken == ["a", "a"]  # each exit once, at once; the deletes nobody
    assert [c[0] for c in w.cri.calls] == ["StopContainer", "StopPodSandbox"]
    assert w.slept == []  # no confirmation polls
    assert cid not in w.watcher.notices  # no announced exit left to read
    # deleted: the IDs are no longer expected (a reused ID would be the runtime's news)
    assert not w.watcher.notices.stopped_by_worker(cid)
    assert not w.watcher.notices.stopped_by_worker(sid)


async def test_the_exit_of_a_failed_own_stop_is_confirmed_as_any_other(w: World) -> None:
    _sid, cid = await w.pod("a")
    await w.relister.relist_once()
    w.woken.clear()
    w.watcher.notices.expect_stop(cid)
    w.watcher.notices.stop_failed(cid)  # StopContainer raised: the exit is news
    async with running(w.watcher.run()):
        await w.subscribed()
        w.cri.exit_container(cid, 137)
        w.events.push(EventKind.EXITED, cid)
        await until(lambda: w.woken == ["a"] and not w.watcher._tasks)
    assert ("ContainerStatus", cid) in w.cri.calls


async def test_subscribing_switches_to_the_long_period_and_owes_a_relist(w: World) -> None:
    assert w.relister.current_period() == 1
    async with running(w.watcher.run()):
        await w.subscribed()
        assert w.relister.evented and w.relister.current_period() == 20
        assert w.relister.owed()
        assert w.observer.log == ["subscribed containerd"]


async def test_an_exit_wakes_the_pod_at_once_and_again_once_cri_shows_it(w: World) -> None:
    _sid, cid = await w.pod("a")
    await w.pod("b")
    await w.relister.relist_once()
    w.cri.calls.clear()
    w.woken.clear()
    runtime = PodRuntime(w.cri, w.watcher.notices, w.relister.observe)
    seen: list[tuple[list[str], ContainerState, int]] = []

    async def look() -> None:  # what a worker woken before CRI's record reads
        c = (await runtime.get("a")).containers[0]
        seen.append((list(w.woken), c.state, c.exit_code))

    # containerd announces the exit before its CRI plugin records it: the container
    # still reads RUNNING for two polls, while the notice already counts.
    w.on_sleep = [look, lambda: w.cri.exit_container(cid, 137)]
    async with running(w.watcher.run()):
        await w.subscribed()
        w.events.push(EventKind.EXITED, cid, exit_status=137, at=1_700_000_000.5)
        await until(lambda: w.woken == ["a", "a"] and not w.watcher._tasks)
    assert seen == [(["a"], ContainerState.EXITED, 137)]
    assert cid not in w.watcher.notices  # CRI's record stands from now on
    assert w.slept == pytest.approx([0.01, 0.02])
    assert [c for c in w.cri.calls_of("ContainerStatus") if c[1] == cid][-3:] == [
        ("ContainerStatus", cid)
    ] * 3
    # the watcher lists nothing itself: these are the early worker read's (look)
    assert w.list_calls() == [
        ("ListPodSandbox", f"{L.POD_UID}=a"),
        ("ListContainers", f"{L.POD_UID}=a"),
    ]
    # the woken worker's read refreshes PLEG's fingerprint: the next full relist
    # wakes nobody again
    await runtime.get("a")
    w.woken.clear()
    await w.relister.relist_once()
    assert w.woken == []


async def test_a_noticed_exit_reads_as_cri_will_record_it(w: World) -> None:
    _sid, cid = await w.pod("a")
    runtime = PodRuntime(w.cri, w.watcher.notices)
    started = (await runtime.get("a")).containers[0]
    assert started.state is ContainerState.RUNNING
    at = started.started_at / 1e9 + 2.5
    w.watcher.notices.add(cid, 0, at)
    done = (await runtime.get("a")).containers[0]
    assert (done.state, done.exit_code, done.reason) == (ContainerState.EXITED, 0, "")
    assert done.finished_at == int(at * 1e9)
    # an OOM kill seen before the exit gives CRI's reason
    async with running(w.watcher.run()):
        await w.subscribed()
        w.events.push(EventKind.OOM, cid)
        w.events.push(EventKind.EXITED, cid, exit_status=137, at=1_700_000_001.0)
        await until(lambda: w.woken[:1] == ["a"])
        killed = (await runtime.get("a")).containers[0]
        assert (killed.state, killed.exit_code, killed.reason) == (
            ContainerState.EXITED,
            137,
            "OOMKilled",
        )
        w.cri.exit_container(cid, 137, reason="OOMKilled")
        await until(lambda: not w.watcher._tasks)
    # once CRI records it, CRI's record is what is read (and cached)
    assert (await runtime.get("a")).containers[0].reason == "OOMKilled"
    assert cid not in w.watcher.notices


async def test_a_notice_waits_for_cri_when_the_message_comes_from_the_log(w: World) -> None:
    labels = {L.POD_UID: "a"}
    config = SandboxConfig(
        name="p-a",
        namespace="default",
        uid="a",
        attempt=0,
        hostname="a",
        log_directory="/tmp",
        labels=labels,
    )
    sid = await w.cri.run_pod_sandbox(config)
    annotations = {L.TERMINATION_MESSAGE_POLICY: "FallbackToLogsOnError"}
    cid = await w.cri.create_container(
        sid,
        ContainerConfig(
            name="main", attempt=0, image=IMAGE, labels=labels, annotations=annotations
        ),
        config,
    )
    await w.cri.start_container(cid)
    runtime = PodRuntime(w.cri, w.watcher.notices)
    w.watcher.notices.add(cid, 1, 0.0)  # failed: its message would be its log's tail
    assert (await runtime.get("a")).containers[0].state is ContainerState.RUNNING
    w.watcher.notices.add(cid, 0, 0.0)  # succeeded: no log read, the notice counts
    assert (await runtime.get("a")).containers[0].state is ContainerState.EXITED


def test_notices_are_bounded() -> None:
    notices = ExitNotices(limit=2)
    for i in range(3):
        notices.add(f"c{i}", 1, 10.0)
    assert "c0" not in notices and "c1" in notices and "c2" in notices


async def test_exit_and_delete_of_one_death_wake_the_worker_once(w: World) -> None:
    _sid, cid = await w.pod("a")
    await w.relister.relist_once()
    w.woken.clear()
    async with running(w.watcher.run()):
        await w.subscribed()
        w.cri.exit_container(cid, 137)
        w.events.push(EventKind.EXITED, cid)
        w.events.push(EventKind.DELETED, cid)
        await until(lambda: len(w.observer.log) == 3 and not w.watcher._tasks)
        assert w.woken == ["a"]
        # a delete whose exit was not seen stands in for it
        w.events.push(EventKind.DELETED, cid)
        await until(lambda: len(w.observer.log) == 4 and not w.watcher._tasks)
    assert w.woken == ["a", "a"]


async def test_an_oom_kill_after_the_recorded_exit_turns_it_oomkilled(w: World) -> None:
    """containerd's CRI plugin handles events in order: an OOM event that came after the
    exit leaves CRI's record an `Error` until it is handled (then `OOMKilled` for good).
    The exit read in between must not stand: the OOM event wakes the worker, and the
    cached exit reads OOMKilled."""
    _sid, cid = await w.pod("a")
    await w.relister.relist_once()
    runtime = PodRuntime(w.cri, w.watcher.notices)
    w.woken.clear()
    async with running(w.watcher.run()):
        await w.subscribed()
        w.cri.exit_container(cid, 137)  # recorded before the OOM event was handled
        w.events.push(EventKind.EXITED, cid, exit_status=137)
        await until(lambda: w.woken == ["a", "a"] and not w.watcher._tasks)
        first = (await runtime.get("a")).containers[0]
        assert (first.state, first.reason) == (ContainerState.EXITED, "Error")
        w.events.push(EventKind.OOM, cid)
        await until(lambda: w.woken == ["a", "a", "a"] and not w.watcher._tasks)
    again = (await runtime.get("a")).containers[0]
    assert (again.state, again.exit_code, again.reason) == (
        ContainerState.EXITED,
        137,
        "OOMKilled",
    )
    assert again.finished_at == first.finished_at
    # the cache holds the reason from now on, however many OOM kills come after
    w.watcher.notices.limit = 0
    w.watcher.notices.oom_killed("another")
    assert (await runtime.get("a")).containers[0].reason == "OOMKilled"


async def test_an_oom_kill_in_a_live_container_wakes_but_changes_nothing(w: World) -> None:
    _sid, cid = await w.pod("a")
    await w.relister.relist_once()
    runtime = PodRuntime(w.cri, w.watcher.notices)
    w.woken.clear()
    async with running(w.watcher.run()):
        await w.subscribed()
        w.events.push(EventKind.OOM, cid)  # a child was killed; the container lives on
        await until(lambda: w.woken == ["a"] and not w.watcher._tasks)
    assert (await runtime.get("a")).containers[0].state is ContainerState.RUNNING
    w.cri.exit_container(cid, 0)  # its exit later reads as CRI records it: OOMKilled
    assert (await runtime.get("a")).containers[0].reason == "OOMKilled"


async def test_an_exit_cri_never_confirms_wakes_the_pod_after_the_bound(w: World) -> None:
    _sid, cid = await w.pod("a")
    await w.relister.relist_once()
    w.woken.clear()
    async with running(w.watcher.run()):
        await w.subscribed()
        w.events.push(EventKind.EXITED, cid)
        await until(lambda: w.woken == ["a"])
    assert w.slept == pytest.approx([0.01, 0.02, 0.04])
    assert w.cri.containers[cid].state is ContainerState.RUNNING


async def test_creations_and_starts_wake_nobody_and_cost_nothing(w: World) -> None:
    sid, cid = await w.pod("a")  # not relisted yet: the relister knows neither ID
    w.cri.calls.clear()
    async with running(w.watcher.run()):
        await w.subscribed()
        for kind in (EventKind.CREATED, EventKind.STARTED):
            w.events.push(kind, sid)
            w.events.push(kind, cid)
        await until(lambda: len(w.observer.log) == 5)  # counted all the same
    assert w.woken == [] and w.cri.calls == []


async def test_an_exit_of_an_unknown_object_is_looked_up(w: World) -> None:
    sid, cid = await w.pod("a")  # not relisted yet: the relister knows neither ID
    await w.cri.stop_pod_sandbox(sid)  # the pause task exits
    async with running(w.watcher.run()):
        await w.subscribed()
        w.events.push(EventKind.EXITED, sid)  # a sandbox ID
        await until(lambda: w.woken == ["a"] and not w.watcher._tasks)
    # looked up with lists filtered by ID, which fail nothing when the ID is the other kind
    assert w.cri.calls_of("ListContainers")[0] == ("ListContainers", f"id={sid}")
    assert w.cri.calls_of("ListPodSandbox")[0] == ("ListPodSandbox", f"id={sid}")
    assert w.relister.owner == {sid: "a"}
    assert cid not in w.relister.owner  # the woken worker's read teaches it the rest


async def test_an_event_naming_its_pod_needs_no_lookup(w: World) -> None:
    _sid, cid = await w.pod("a")
    w.cri.calls.clear()
    async with running(w.watcher.run()):
        await w.subscribed()
        w.events.push(EventKind.OOM, cid, pod_uid="a")
        await until(lambda: w.woken == ["a"])
    assert w.cri.calls == []


async def test_events_about_objects_that_are_not_ours_are_dropped_after_one_lookup(
    w: World,
) -> None:
    _sid, cid = await w.pod("theirs", labelled=False)
    async with running(w.watcher.run()):
        await w.subscribed()
        w.events.push(EventKind.OOM, cid)
        w.events.push(EventKind.OOM, "gone")  # neither container nor sandbox any more
        await until(lambda: w.observer.log[-1] == "oom gone" and not w.watcher._tasks)
        w.events.push(EventKind.OOM, cid)
        await until(lambda: w.observer.log.count(f"oom {cid}") == 2 and not w.watcher._tasks)
    assert w.woken == []
    assert w.cri.calls_of("ListContainers") == [
        ("ListContainers", f"id={cid}"),
        ("ListContainers", "id=gone"),
    ]
    assert w.cri.calls_of("ListPodSandbox") == [("ListPodSandbox", "id=gone")]


async def test_a_cri_failure_while_following_an_event_is_left_to_the_relist(w: World) -> None:
    _sid, cid = await w.pod("a")
    await w.relister.relist_once()
    w.woken.clear()
    w.cri.fail_next("ContainerStatus", RuntimeUnavailable("down"))
    async with running(w.watcher.run()):
        await w.subscribed()
        w.events.push(EventKind.EXITED, cid)
        await until(lambda: w.observer.log[-1] == f"exited {cid}" and not w.watcher._tasks)
        assert w.woken == []
        assert w.watcher.subscribed  # the stream itself is fine


async def test_a_dropped_stream_is_replaced_and_followed_by_a_full_relist(w: World) -> None:
    seen: list[tuple[bool, bool, float]] = []

    def look() -> None:
        seen.append((w.relister.evented, w.relister.owed(), w.relister.current_period()))
        w.relister._kick.clear()  # as if the owed relist ran (and failed: no runtime)

    def runtime_back() -> None:
        look()
        w.events.refuse(None)

    async with running(w.watcher.run()):
        await w.subscribed()
        w.relister._kick.clear()  # as if the owed relist ran
        w.events.refuse(RuntimeUnavailable("connection refused"))
        w.on_sleep = [look, None, runtime_back]
        w.events.drop()
        await until(lambda: w.events.subscriptions == 2 and w.watcher.subscribed)
        assert w.relister.evented and w.relister.owed()  # the catch-up relist
    # dropped: relisting every second again, starting at once
    assert seen == [(False, True, 1), (False, False, 1)]
    assert w.slept == pytest.approx([0.1, 0.2, 0.4])  # two refused attempts in between
    assert w.observer.log == [
        "subscribed containerd",
        "unsubscribed error=True",
        "unsubscribed error=True",
        "unsubscribed error=True",
        "subscribed containerd",
    ]


async def test_the_backoff_starts_over_after_a_successful_subscription(w: World) -> None:
    async with running(w.watcher.run()):
        await w.subscribed()
        w.events.drop()
        await until(lambda: w.events.subscriptions == 2 and w.watcher.subscribed)
        w.events.drop()
        await until(lambda: w.events.subscriptions == 3 and w.watcher.subscribed)
    assert w.slept == pytest.approx([0.1, 0.1])


async def test_a_runtime_without_events_keeps_relisting_every_second(
    w: World, caplog: pytest.LogCaptureFixture
) -> None:
    w.events.unsupported = True
    with caplog.at_level("INFO", logger="klet.syncloop.pods.runtimeevents"):
        async with running(w.watcher.run()):
            await until(lambda: bool(w.observer.log))
            for _ in range(10):
                await until(lambda: True)
            assert w.events.subscriptions == 0 and w.slept == []
            assert not w.relister.evented and w.relister.current_period() == 1
    assert w.observer.log == ["unsubscribed error=False"]
    assert "serves no events" in caplog.text


async def test_a_generic_failure_is_logged_once(w: World, caplog: pytest.LogCaptureFixture) -> None:
    w.events.refuse(CRIError("permission denied", code="PERMISSION_DENIED"))
    with caplog.at_level("INFO", logger="klet.syncloop.pods.runtimeevents"):
        async with running(w.watcher.run()):
            await until(lambda: len(w.slept) >= 4)
            w.events.refuse(None)
            await w.subscribed()
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["runtime event stream failed", "runtime event stream open again"]


async def test_stream_opens_and_failures_are_counted_under_upstreams_names(w: World) -> None:
    registry = CollectorRegistry()
    w.watcher.observer = create_metrics(registry).pleg

    def value(name: str) -> float | None:
        return registry.get_sample_value(name)

    assert value("kubelet_evented_pleg_connection_success_count") == 0
    assert value("kubelet_evented_pleg_connection_error_count") == 0
    async with running(w.watcher.run()):
        await w.subscribed()
        w.events.refuse(RuntimeUnavailable("connection refused"))
        w.on_sleep = [None, None, lambda: w.events.refuse(None)]
        w.events.drop()
        await until(lambda: w.events.subscriptions == 2 and w.watcher.subscribed)
    # two streams obtained; the drop and the two refused attempts are errors
    assert value("kubelet_evented_pleg_connection_success_count") == 2
    assert value("kubelet_evented_pleg_connection_error_count") == 3
    page = generate_latest(registry).decode()
    assert "kubelet_evented_pleg_connection_success_count 2.0" in page
