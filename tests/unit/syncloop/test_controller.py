"""PodController.sync_once, the pod worker body, against FakeRuntimeService.

Covers: a desired pod is synced and its status published (Running once its containers
run), in one sync reading the pod from CRI twice (only a sidecar's start asks for the
next sync at once); a runtime pod nobody wants is left alone until every pod source is ready, then
killed and removed; the desired table read landing while the worker's CRI call is in
flight wins over the stale empty view (no kill); PodControl's kill_pod stops a desired
pod with the given grace, marks it Failed with its reason and message and keeps it
dead on later syncs; kill_pod of an unknown pod answers False; a removed pod's
crash-loop back-off entries go with it; a batch of stream changes is read in one
round trip (and the sources once, for its removals), in stream order; only a change of
the pod itself (not its status or resourceVersion, unless a readiness gate's condition)
wakes its worker, PLEG only nudges it, and a container that cannot be created fails the
sync (the worker's back-off then paces it); the new pod of an edited static manifest
gets no sandbox until the old one of the same name is stopped and removed, which wakes
it; after a restart the first sync reads the status table once for every pod and starts
the probes of every pod's running containers from it, before their own syncs. Workers
are replaced by a recorder so each test drives sync_once itself, one step at a time.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from klet.cri import CRIError
from klet.cri import labels as L
from klet.cri.types import ContainerState, SandboxState
from klet.model.records import DesiredPod, PodChange, PodStatusRecord, SourceState
from klet.model.types import JSON, PodUID
from klet.syncloop.model import podspec
from klet.syncloop.model.runtimepod import RuntimePod
from klet.syncloop.pods.controller import needs_sync
from klet.syncloop.probing.proberesults import ProbeKind
from klet.testbed.fakes.bus import FakeBus
from klet.testbed.fakes.cri import FakeRuntimeService

from .helpers import Clock, RecordedEvents, pod, wire

IMAGE = "registry.klet.test/busybox:1.36"
READY = {"file": SourceState(source="file", ready=True, at=0.0)}
NOT_READY = {"file": SourceState(source="file", ready=False, at=0.0)}


class RecordingWorkers:
    def __init__(self) -> None:
        self.woken: list[str] = []
        self.nudged: list[str] = []

    def wake(self, uid: str) -> None:
        self.woken.append(uid)

    def nudge(self, uid: str) -> None:
        self.nudged.append(uid)

    def uids(self) -> list[str]:
        return sorted(set(self.woken))


class World:
    def __init__(self, tmp_path: Path) -> None:
        self.clock = Clock(1_700_000_000.0)
        self.cri = FakeRuntimeService(clock=self.clock.ns)
        self.cri.add_image(IMAGE)
        self.bus = FakeBus()
        self.events = RecordedEvents()
        self.deps = wire(tmp_path, self.cri, events=self.events, clock=self.clock, bus=self.bus)
        self.controller = self.deps.controller
        self.syncer = self.controller.syncer
        self.workers = RecordingWorkers()
        self.controller.workers = self.workers  # type: ignore[assignment]

    async def run_unwanted(self, uid: str) -> None:
        """A pod the runtime has (left by a previous syncloop) but nobody asked for here."""
        await self.syncer.sync(pod("app", uid=uid), RuntimePod(uid=uid))

    def running(self) -> list[str]:
        return [
            c.config.labels["io.kubernetes.pod.uid"]
            for c in self.cri.containers.values()
            if c.state == ContainerState.RUNNING
        ]


def desired(uid: str = "u1", **spec: Any) -> DesiredPod:
    return DesiredPod(
        uid=PodUID(uid), pod=pod("app", uid=uid, **spec), source="file", hash="h1", seen_at=0.0
    )


@pytest.fixture
def w(tmp_path: Path) -> World:
    return World(tmp_path)


async def test_desired_pod_is_synced_and_its_status_published(w: World) -> None:
    w.controller.apply_desired({"u1": desired()}, READY, read_from=w.controller.generation)
    assert w.workers.woken == ["u1"]
    outcome = await w.controller.sync_once("u1")
    assert not outcome.done
    assert w.running() == ["u1"]
    status = w.controller.publisher.get("u1")
    assert status is not None and status["phase"] == "Running"
    assert status["podIP"].startswith("10.88.")
    [cs] = status["containerStatuses"]
    assert "running" in cs["state"] and cs["ready"] is True
    [(uid, ns, name, _)] = w.controller.publisher.items()
    assert (uid, ns, name) == ("u1", "default", "web-node1")


async def test_a_pod_start_is_one_sync_that_reads_the_pod_twice(w: World) -> None:
    """A pod of plain containers is Running and ready after one sync, which reads the
    pod from CRI before it acts and once after: no sync follows at once to find nothing
    left to do (issue 42: a third pair of lists and the status reads per start)."""
    rec = DesiredPod(
        uid=PodUID("u1"), pod=pod("app", "web", uid="u1"), source="file", hash="h1", seen_at=0.0
    )
    w.controller.apply_desired({"u1": rec}, READY, read_from=w.controller.generation)
    outcome = await w.controller.sync_once("u1")
    assert outcome.wake_at is None and not outcome.failed
    status = w.controller.publisher.get("u1")
    assert status is not None and status["phase"] == "Running"
    assert [c["ready"] for c in status["containerStatuses"]] == [True, True]
    pod_reads = ("io.kubernetes.pod.uid=u1",)  # (admission's first node-wide list aside)
    assert [c[1:] for c in w.cri.calls_of("ListPodSandbox") if c[1:]] == [pod_reads] * 2
    assert [c[1:] for c in w.cri.calls_of("ListContainers") if c[1:]] == [pod_reads] * 2
    assert len(w.cri.calls_of("ContainerStatus")) == 2  # the read after the start
    assert len(w.cri.calls_of("RunPodSandbox")) == 1
    assert len(w.cri.calls_of("StartContainer")) == 2


async def test_unwanted_pod_waits_for_sources_then_is_killed_and_removed(w: World) -> None:
    await w.run_unwanted("u2")
    outcome = await w.controller.sync_once("u2")  # no table read yet
    assert not outcome.done and outcome.wake_at == pytest.approx(w.clock() + 5)
    w.controller.apply_desired(
        {}, NOT_READY, read_from=w.controller.generation
    )  # a source still loading
    await w.controller.sync_once("u2")
    assert w.running() == ["u2"]
    assert w.cri.calls_of("StopContainer") == [] and w.cri.calls_of("RemovePodSandbox") == []

    w.controller.apply_desired({}, READY, read_from=w.controller.generation)
    outcome = await w.controller.sync_once("u2")
    assert outcome.done
    assert w.cri.sandboxes == {} and w.cri.containers == {}
    assert w.controller.publisher.get("u2") is None


async def test_table_read_landing_during_the_runtime_call_wins(w: World) -> None:
    await w.run_unwanted("u3")
    landed: list[bool] = []

    async def table_read_lands() -> None:
        if not landed:
            landed.append(True)
            await asyncio.sleep(0)
            w.controller.apply_desired(
                {"u3": desired("u3")}, READY, read_from=w.controller.generation
            )

    w.cri.hooks["ListPodSandbox"] = table_read_lands
    w.cri.calls.clear()
    outcome = await w.controller.sync_once("u3")  # started before the first table read
    assert landed and not outcome.done
    assert w.running() == ["u3"]
    assert [
        c
        for c in w.cri.calls
        if c[0] in ("StopContainer", "StopPodSandbox", "RemovePodSandbox", "RemoveContainer")
    ] == []
    status = w.controller.publisher.get("u3")
    assert status is not None and status["phase"] == "Running"


async def test_kill_pod_stops_a_desired_pod_and_keeps_it_failed(w: World) -> None:
    w.controller.apply_desired({"u1": desired()}, READY, read_from=w.controller.generation)
    await w.controller.sync_once("u1")
    kill = asyncio.create_task(
        w.controller.kill_pod(PodUID("u1"), 5, "Evicted", "The node was low on resource: memory.")
    )
    await asyncio.sleep(0)
    assert not kill.done()  # waits for the worker to do it
    await w.controller.sync_once("u1")
    assert await kill is True
    assert [c[2] for c in w.cri.calls_of("StopContainer")] == ["5"]
    assert w.running() == []
    [sandbox] = w.cri.sandboxes.values()
    assert sandbox.state == SandboxState.NOTREADY
    status = w.controller.publisher.get("u1")
    assert status is not None
    assert (status["phase"], status["reason"]) == ("Failed", "Evicted")
    assert status["message"] == "The node was low on resource: memory."

    w.cri.calls.clear()
    w.clock.t += 60
    w.controller.apply_desired(
        {"u1": desired()}, READY, read_from=w.controller.generation
    )  # a resync still lists it
    await w.controller.sync_once("u1")
    assert [
        c for c in w.cri.calls if c[0] in ("RunPodSandbox", "CreateContainer", "StartContainer")
    ] == []
    status = w.controller.publisher.get("u1")
    assert status is not None and status["phase"] == "Failed"


async def test_a_removed_pod_takes_its_crash_loop_back_off_along(w: World) -> None:
    w.controller.apply_desired({"u1": desired()}, READY, read_from=w.controller.generation)
    await w.controller.sync_once("u1")
    [cid] = list(w.cri.containers)
    w.cri.exit_container(cid, 1)
    await w.controller.sync_once("u1")  # restarted at once; the next restart waits
    p = desired().pod
    key = podspec.backoff_key(p, podspec.containers(p)[0])
    assert w.syncer.backoff.delay(key, w.clock()) == 10.0
    w.controller.apply_desired({}, READY, read_from=w.controller.generation)
    assert (await w.controller.sync_once("u1")).done
    assert w.syncer.backoff.delay(key, w.clock()) == 0.0


def record_published(w: World) -> list[JSON]:
    """Every status the controller hands the publisher that changed, in order."""
    published: list[JSON] = []
    publisher = w.controller.publisher
    set_status = publisher.set

    def recording(
        uid: str, namespace: str, name: str, status: JSON, *, terminated: bool = False
    ) -> bool:
        changed = set_status(uid, namespace, name, status, terminated=terminated)
        if changed:
            published.append(status)
        return changed

    publisher.set = recording  # type: ignore[method-assign]
    return published


def state_of(status: JSON) -> tuple[str, int, bool]:
    [cs] = status["containerStatuses"]
    return next(iter(cs["state"])), cs["restartCount"], cs["ready"]


async def test_a_death_is_published_before_the_restart_and_a_back_off_does_not_flap(
    w: World,
) -> None:
    w.controller.apply_desired({"u1": desired()}, READY, read_from=w.controller.generation)
    await w.controller.sync_once("u1")
    published = record_published(w)
    [cid] = list(w.cri.containers)
    w.cri.exit_container(cid, 1)
    await w.controller.sync_once("u1")  # restarted at once (no back-off the first time)
    assert [state_of(s) for s in published] == [("terminated", 0, False), ("running", 1, True)]
    ready = {c["type"]: c["status"] for c in published[0]["conditions"]}["Ready"]
    assert ready == "False"
    published.clear()
    [cid] = [c.id for c in w.cri.containers.values() if c.state == ContainerState.RUNNING]
    w.cri.exit_container(cid, 1)
    await w.controller.sync_once("u1")  # dead again: its restart waits 10 s
    assert [state_of(s) for s in published] == [("terminated", 1, False), ("waiting", 1, False)]
    published.clear()
    w.clock.t += 5  # a sync inside the back-off: the reason the last sync found stands
    await w.controller.sync_once("u1")
    assert published == []
    w.clock.t += 6
    await w.controller.sync_once("u1")
    assert [state_of(s) for s in published] == [("running", 2, True)]


async def test_kill_pod_of_an_unknown_pod(w: World) -> None:
    assert await w.controller.kill_pod(PodUID("nobody"), None, "Evicted", "") is False
    assert w.workers.woken == [] and w.controller.pods == {}


async def test_table_read_older_than_a_stream_change_does_not_undo_it(w: World) -> None:
    # The start-up read (admission holds every pod until the first full read is in).
    w.controller.apply_desired({}, NOT_READY, read_from=w.controller.generation)
    read_from = w.controller.generation  # a resync starts reading the tables here
    w.bus.seed(w.deps.node_bus.desired, "u5", desired("u5"))  # pod-source wrote it
    await w.controller.on_change(PodChange(op="ADD", uid=PodUID("u5"), source="file"))
    await w.controller.sync_once("u5")
    assert "u5" in w.running()
    w.controller.apply_desired({}, READY, read_from=read_from)  # that read lacks u5
    await w.controller.sync_once("u5")
    assert "u5" in w.running(), "a stale table read killed a pod the stream had just added"
    w.controller.apply_desired({}, READY, read_from=w.controller.generation)  # a newer read
    await w.controller.sync_once("u5")
    assert "u5" not in w.running()


async def test_pod_removed_while_syncloop_was_away_keeps_its_grace_period(w: World) -> None:
    uid = "u9"
    await w.syncer.sync(pod("app", uid=uid, terminationGracePeriodSeconds=60), RuntimePod(uid=uid))
    w.controller.apply_desired({}, READY, read_from=w.controller.generation)  # no spec known
    await w.controller.sync_once(uid)
    stops = [c for c in w.cri.calls if c[0] == "StopContainer"]
    assert stops and all(c[-1] == "60" for c in stops), stops


async def test_deleted_pod_is_stopped_with_min_grace_and_reported_terminated(w: World) -> None:
    rec = desired("u7", terminationGracePeriodSeconds=30)
    w.controller.apply_desired({"u7": rec}, READY, read_from=w.controller.generation)
    await w.controller.sync_once("u7")
    assert "u7" in w.running()
    pod_json = dict(rec.pod)
    pod_json["metadata"] = {
        **rec.pod["metadata"],
        "deletionTimestamp": "2026-01-01T00:00:00Z",
        "deletionGracePeriodSeconds": 7,
    }
    deleting = DesiredPod(uid=rec.uid, pod=pod_json, source="api", hash="h2", seen_at=0.0)
    w.controller.apply_desired({"u7": deleting}, READY, read_from=w.controller.generation)
    await w.controller.sync_once("u7")
    assert "u7" not in w.running()
    stops = [c for c in w.cri.calls if c[0] == "StopContainer"]
    assert stops and all(c[-1] == "7" for c in stops)
    entry = w.controller.publisher._entries["u7"]
    assert entry.terminated and entry.status["phase"] == "Failed"
    await w.controller.sync_once("u7")  # later syncs neither restart it nor un-terminate it
    assert "u7" not in w.running() and w.controller.publisher._entries["u7"].terminated


async def test_a_started_sidecar_lets_the_next_sync_start_main_at_once(w: World) -> None:
    """The worker itself goes on after a sidecar's start (klet drops its own start
    events, which upstream's pod worker waits for): the sidecar's sync asks for the next
    one now; the main container's start asks for none."""
    sidecar = {"name": "proxy", "restartPolicy": "Always"}
    rec = DesiredPod(
        uid=PodUID("u9"),
        pod=pod("main", uid="u9", inits=(sidecar,)),
        source="file",
        hash="h1",
        seen_at=0.0,
    )
    w.controller.apply_desired({"u9": rec}, READY, read_from=w.controller.generation)

    def names() -> list[str]:
        return sorted(
            c.config.name for c in w.cri.containers.values() if c.state == ContainerState.RUNNING
        )

    outcome = await w.controller.sync_once("u9")
    assert names() == ["proxy"] and outcome.wake_at == w.clock.t
    outcome = await w.controller.sync_once("u9")
    # main started: nothing waits for it, so no sync follows at once
    assert names() == ["main", "proxy"] and outcome.wake_at is None


async def test_active_deadline_fails_the_pod(w: World) -> None:
    rec = desired("u8", activeDeadlineSeconds=30)
    w.controller.apply_desired({"u8": rec}, READY, read_from=w.controller.generation)
    outcome = await w.controller.sync_once("u8")
    assert "u8" in w.running()
    # nothing waits for the started container: the next sync is at the deadline
    assert outcome.wake_at is not None and abs(outcome.wake_at - (w.clock.t + 30)) < 1
    w.clock.t += 31
    await w.controller.sync_once("u8")
    assert "u8" not in w.running()
    status = w.controller.publisher.get("u8")
    assert status is not None and status["phase"] == "Failed"
    assert status["reason"] == "DeadlineExceeded"
    await w.controller.sync_once("u8")  # stays failed, not restarted
    assert "u8" not in w.running()


async def test_a_pod_failed_before_a_restart_is_not_started_again(w: World) -> None:
    evicted = {
        "phase": "Failed",
        "reason": "Evicted",
        "message": "The node was low on resource: memory.",
        "conditions": [{"type": "DisruptionTarget", "status": "True", "message": "low on memory"}],
    }
    asked: list[str] = []

    async def last_status(uid: str) -> dict[str, Any] | None:
        asked.append(uid)
        return evicted if uid == "u1" else None

    w.controller.last_status = last_status
    w.controller.apply_desired(
        {"u1": desired(), "u2": desired("u2")}, READY, read_from=w.controller.generation
    )
    await w.controller.sync_once("u1")
    await w.controller.sync_once("u2")
    await w.controller.sync_once("u1")
    assert w.running() == ["u2"]  # the evicted pod stays down; the other one runs
    assert asked == ["u1", "u2"]  # read back once per pod
    status = w.controller.publisher.get("u1")
    assert status is not None and (status["phase"], status["reason"]) == ("Failed", "Evicted")
    target = [c for c in status["conditions"] if c["type"] == "DisruptionTarget"]
    assert target and target[0]["message"] == "low on memory"


async def test_a_restart_starts_carried_probes_before_any_pods_first_sync(w: World) -> None:
    # A previous syncloop left u1 and u2 running and published their statuses (ready).
    # The restarted one's first sync (of u1, begun before the full read of the desired
    # pods landed) reads the status table once for every pod and starts u2's readiness
    # probe too, from its published readiness, before u2's own first sync; u2's sync
    # then reads no status of its own.
    probe = {"exec": {"command": ["true"]}, "periodSeconds": 2, "failureThreshold": 1}
    specs = {u: pod("app", uid=u) for u in ("u1", "u2")}
    for spec in specs.values():
        spec["spec"]["containers"][0]["readinessProbe"] = probe
    cids = {}
    for uid, spec in specs.items():
        await w.syncer.sync(spec, RuntimePod(uid=uid))
        cids[uid] = next(
            c.id for c in w.cri.containers.values() if c.config.labels[L.POD_UID] == uid
        )
        status = {
            "phase": "Running",
            "podIP": "10.88.0.9",
            "containerStatuses": [
                {"name": "app", "containerID": f"containerd://{cids[uid]}", "ready": True,
                 "started": True, "state": {"running": {}}},
            ],
        }  # fmt: skip
        record = PodStatusRecord(
            uid=PodUID(uid), namespace="default", name="web-node1", version=3, epoch=1.0,
            status=status, updated_at=1.0,
        )  # fmt: skip
        w.bus.seed(w.deps.node_bus.status, uid, record)
    records = {
        u: DesiredPod(uid=PodUID(u), pod=spec, source="file", hash="h1", seen_at=0.0)
        for u, spec in specs.items()
    }
    landed: list[bool] = []

    async def table_read_lands() -> None:
        if not landed:  # the first sync began before the full read (a PLEG nudge)
            landed.append(True)
            await asyncio.sleep(0)
            w.controller.apply_desired(records, READY, read_from=w.controller.generation)

    w.cri.hooks["ListPodSandbox"] = table_read_lands
    prober = w.controller.prober
    assert prober is not None
    w.bus.calls.clear()
    await w.controller.sync_once("u1")
    assert landed
    assert prober.probing("u2") == {cids["u2"]: []}  # started (run() owns the tasks)
    assert prober.result(ProbeKind.READINESS, cids["u2"]) is True
    assert w.bus.calls.count("all") == 1 and "get" not in w.bus.calls
    await w.controller.sync_once("u2")
    assert "get" not in w.bus.calls
    assert prober.probing("u2") == {cids["u2"]: []}  # the same instance, kept
    status = w.controller.publisher.get("u2")
    assert status is not None and status["containerStatuses"][0]["ready"] is True


async def test_a_batch_of_changes_reads_the_desired_table_once(w: World) -> None:
    w.controller.apply_desired({"u3": desired("u3")}, READY, read_from=0)
    w.bus.seed(w.deps.node_bus.sources, "file", READY["file"])
    for uid in ("u1", "u2"):
        w.bus.seed(w.deps.node_bus.desired, uid, desired(uid))
    w.workers.woken.clear()
    w.bus.calls.clear()
    await w.controller.on_changes(
        [
            PodChange(op="ADD", uid=PodUID("u1"), source="file"),
            PodChange(op="REMOVE", uid=PodUID("u3"), source="file"),
            PodChange(op="ADD", uid=PodUID("u2"), source="file"),
            PodChange(op="ADD", uid=PodUID("u4"), source="file"),  # gone again already
        ]
    )
    assert w.bus.calls == ["get_many", "all"]  # one read for four changes, sources once
    assert w.workers.woken == ["u1", "u3", "u2"]
    assert set(w.controller.desired) == {"u1", "u2"}
    assert w.controller.generation == 4


def _changed(**changes: Any) -> tuple[JSON, JSON]:
    old = pod("app", uid="u1")
    old["metadata"]["resourceVersion"] = "1"
    old["status"] = {"phase": "Pending", "conditions": [{"type": "Ready", "status": "False"}]}
    new = {**old, "metadata": {**old["metadata"]}, "status": {**old["status"]}}
    for path, value in changes.items():
        where, key = path.split("__")
        new[where] = {**(new.get(where) or {}), key: value}
    return old, new


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({}, False),
        ({"metadata__resourceVersion": "2"}, False),  # our own status patch came back
        ({"status__phase": "Running"}, False),
        ({"status__message": "x", "metadata__resourceVersion": "3"}, False),
        (
            {"metadata__annotations": {"kubernetes.io/config.seen": "2026-01-01T00:00:00Z"}},
            False,
        ),
        ({"spec__activeDeadlineSeconds": 30}, True),
        ({"metadata__labels": {"app": "new"}}, True),
        ({"metadata__annotations": {"example.com/x": "1"}}, True),
        ({"metadata__deletionTimestamp": "2026-01-01T00:00:00Z"}, True),
        ({"metadata__deletionGracePeriodSeconds": 0}, True),
    ],
)
def test_only_a_change_of_the_pod_itself_calls_for_a_sync(
    changes: dict[str, Any], expected: bool
) -> None:
    old, new = _changed(**changes)
    assert needs_sync(old, new) is expected


def test_a_readiness_gate_condition_change_calls_for_a_sync() -> None:
    old, new = _changed()
    for p in (old, new):
        p["spec"] = {**p["spec"], "readinessGates": [{"conditionType": "example.com/gate"}]}
    assert not needs_sync(old, new)
    gate = {"type": "example.com/gate", "status": "True"}
    new["status"] = {**new["status"], "conditions": [*new["status"]["conditions"], gate]}
    assert needs_sync(old, new)


async def test_a_status_only_record_does_not_wake_and_pleg_only_nudges(w: World) -> None:
    rec = desired()
    w.controller.set_desired("u1", rec)
    assert w.workers.woken == ["u1"]
    echoed = {**rec.pod, "status": {"phase": "Pending", "message": "our own status"}}
    w.controller.set_desired("u1", DesiredPod(**{**rec.__dict__, "pod": echoed}))
    assert w.workers.woken == ["u1"]  # the RECONCILE of our own status: no sync
    assert w.controller.desired["u1"].pod is echoed  # but the record is kept
    w.controller.on_runtime_change("u1")
    assert w.workers.nudged == ["u1"] and w.workers.woken == ["u1"]


async def test_a_container_that_cannot_be_created_fails_the_sync(w: World) -> None:
    w.controller.apply_desired({"u1": desired()}, READY, read_from=w.controller.generation)
    w.cri.fail_always("CreateContainer", CRIError("path is not a shared mount"))
    outcome = await w.controller.sync_once("u1")
    assert outcome.failed and outcome.wake_at is None  # the pod worker's back-off decides
    status = w.controller.publisher.get("u1")
    assert status is not None
    [cs] = status["containerStatuses"]
    assert cs["state"]["waiting"]["reason"] == "CreateContainerError"
    w.cri.fail_always("CreateContainer", None)
    outcome = await w.controller.sync_once("u1")
    assert not outcome.failed


def static(uid: str) -> DesiredPod:
    p = pod("app", uid=uid)
    p["metadata"]["annotations"] = {"kubernetes.io/config.source": "file"}
    return DesiredPod(uid=PodUID(uid), pod=p, source="file", hash=uid, seen_at=0.0)


async def test_an_edited_static_pod_starts_only_once_the_old_one_is_gone(w: World) -> None:
    w.controller.apply_desired({"old": static("old")}, READY, read_from=w.controller.generation)
    await w.controller.sync_once("old")
    assert w.running() == ["old"]
    # The manifest is edited: the old UID is removed, the new one added, in one batch.
    w.controller.apply_desired({"new": static("new")}, READY, read_from=w.controller.generation)
    w.workers.woken.clear()
    outcome = await w.controller.sync_once("new")  # the new worker happens to go first
    assert w.running() == ["old"] and len(w.cri.sandboxes) == 1
    assert outcome.wake_at is not None  # a safety net: the old pod's end wakes it
    status = w.controller.publisher.get("new")
    assert status is not None and status["phase"] == "Pending"
    outcome = await w.controller.sync_once("old")  # stopped and removed
    assert outcome.done and w.cri.sandboxes == {}
    assert w.workers.woken == ["new"]
    await w.controller.sync_once("new")
    assert w.running() == ["new"]


async def test_static_pods_of_other_names_do_not_wait(w: World) -> None:
    other = static("other")
    other.pod["metadata"]["name"] = "other-node1"
    w.controller.apply_desired(
        {"a": static("a"), "other": other}, READY, read_from=w.controller.generation
    )
    await w.controller.sync_once("a")
    await w.controller.sync_once("other")
    assert sorted(w.running()) == ["a", "other"]
