"""PodSyncer against FakeRuntimeService: what SyncPod and KillPod do through CRI.

Covers a new pod (one sandbox; containers created and started with upstream labels,
annotations and `<name>/<restart>.log` log paths), crash-loop restarts (immediate
first restart with restartCount + 1, then CrashLoopBackOff until the back-off ends),
image pulls (ErrImagePull → ImagePullBackOff with a wake time, ErrImageNeverPull), one
ImageStatus per container start (the image's user taken from the pull step's read), and
KillPod (grace period passed to StopContainer, 2 s minimum, sandbox stopped after
the containers, everything removed with remove=True, and every object it stops noted
for the evented PLEG beforehand, but for a stop that failed), and the bound on sandbox
creations in flight across pods (a burst queues, a failed creation frees its slot,
containers of an existing sandbox never wait for it, 0 = no bound).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from klet.cri import CRIError, NotFound
from klet.cri import labels as L
from klet.cri.types import ContainerState, SandboxState
from klet.syncloop.containers.syncsettings import SyncSettings
from klet.syncloop.model import podspec
from klet.syncloop.pods.syncpod import SyncResult
from klet.testbed.fakes.cri import FakeRuntimeService

from .helpers import Clock, RecordedEvents, pod, until, wire

IMAGE = "registry.klet.test/busybox:1.36"


class World:
    def __init__(self, tmp_path: Path) -> None:
        self.clock = Clock(1_700_000_000.0)
        self.cri = FakeRuntimeService(clock=self.clock.ns)
        self.cri.add_image(IMAGE, 1_000_000)
        self.events = RecordedEvents()
        self.syncer = wire(
            tmp_path, self.cri, events=self.events, clock=self.clock
        ).controller.syncer
        self.runtime = self.syncer.runtime

    async def sync(self, p: dict[str, Any]) -> SyncResult:
        return await self.syncer.sync(p, await self.runtime.get(p["metadata"]["uid"]))

    def live(self) -> list[str]:
        return [
            c.config.name for c in self.cri.containers.values() if c.state == ContainerState.RUNNING
        ]

    def latest(self, name: str) -> Any:
        return max(
            (c for c in self.cri.containers.values() if c.config.name == name),
            key=lambda c: c.config.attempt,
        )


@pytest.fixture
def w(tmp_path: Path) -> World:
    return World(tmp_path)


async def test_new_pod_gets_one_sandbox_and_started_containers(w: World, tmp_path: Path) -> None:
    p = pod("app", "sidecar")
    result = await w.sync(p)
    assert result.acted and result.waiting == {} and result.wake_at is None
    [sandbox] = w.cri.sandboxes.values()
    assert sandbox.state == SandboxState.READY and sandbox.config.labels[L.POD_UID] == "u1"
    assert sandbox.config.log_directory == f"{tmp_path}/default_web-node1_u1"
    assert sorted(w.live()) == ["app", "sidecar"]
    for spec in p["spec"]["containers"]:
        c = w.latest(spec["name"])
        assert c.sandbox_id == sandbox.id and c.config.attempt == 0
        assert c.config.labels[L.POD_UID] == "u1"
        assert c.config.labels[L.CONTAINER_NAME] == spec["name"]
        assert c.config.annotations[L.CONTAINER_HASH] == podspec.container_hash(spec)
        assert c.config.annotations[L.CONTAINER_RESTART_COUNT] == "0"
        assert c.config.log_path == f"{spec['name']}/0.log"
        assert (tmp_path / "default_web-node1_u1" / spec["name"]).is_dir()
    acts = ("RunPodSandbox", "CreateContainer", "StartContainer")
    assert [c[0] for c in w.cri.calls if c[0] in acts] == [
        "RunPodSandbox",
        "CreateContainer",
        "StartContainer",
        "CreateContainer",
        "StartContainer",
    ]
    # A second sync with nothing changed does nothing.
    assert not (await w.sync(p)).acted
    assert len(w.cri.containers) == 2 and len(w.cri.sandboxes) == 1


async def test_a_container_start_asks_image_status_once(w: World) -> None:
    """The image's user comes from the ImageStatus the pull step read (issue 42: two
    per start before, as upstream's EnsureImageExists and getImageUser each ask)."""
    p = pod("app", "sidecar")
    p["spec"]["containers"][0]["securityContext"] = {"runAsNonRoot": True}
    w.cri.images.clear()
    w.cri.add_image(IMAGE, 1_000_000, uid=1000)
    await w.sync(p)
    assert sorted(w.live()) == ["app", "sidecar"]
    assert len(w.cri.calls_of("ImageStatus")) == 2  # one per container
    assert w.latest("app").config.security.run_as_user == 1000  # the image's user
    # An image pulled first: its status before the pull (absent) and after it (the
    # size for the Pulled Event, and the user), nothing more.
    q = pod("main", uid="u2")
    q["spec"]["containers"][0]["image"] = "registry.klet.test/pulled:1.0"
    w.cri.calls.clear()
    await w.sync(q)
    assert len(w.cri.calls_of("PullImage")) == 1
    assert len(w.cri.calls_of("ImageStatus")) == 2


async def test_exited_container_restarts_then_waits_out_the_back_off(w: World) -> None:
    p = pod("app")
    await w.sync(p)
    w.clock.advance(5)
    w.cri.exit_container(w.latest("app").id, 1)
    w.clock.advance(1)
    result = await w.sync(p)  # the first restart is immediate
    second = w.latest("app")
    assert result.waiting == {} and second.state == ContainerState.RUNNING
    assert second.config.attempt == 1
    assert second.config.annotations[L.CONTAINER_RESTART_COUNT] == "1"
    assert second.config.log_path == "app/1.log"
    assert len(w.cri.sandboxes) == 1  # same sandbox

    w.clock.advance(3)
    w.cri.exit_container(second.id, 1)
    exited_at = w.clock()
    w.clock.advance(1)
    result = await w.sync(p)
    reason, message = result.waiting["app"]
    assert reason == "CrashLoopBackOff" and "back-off 10s" in message
    assert result.wake_at == pytest.approx(exited_at + 10)
    assert w.latest("app").id == second.id  # nothing started

    w.clock.advance(9)  # exited_at + 10: the back-off is over
    result = await w.sync(p)
    assert result.waiting == {}
    third = w.latest("app")
    assert third.state == ContainerState.RUNNING and third.config.attempt == 2


async def test_failed_pull_is_err_image_pull_then_image_pull_back_off(w: World) -> None:
    image = "registry.klet.test/missing:1.0"
    p = pod("app")
    p["spec"]["containers"][0]["image"] = image
    w.cri.fail_pull(image, NotFound("manifest unknown", code="NOT_FOUND"))
    failed_at = w.clock()
    result = await w.sync(p)
    assert result.waiting["app"][0] == "ErrImagePull"
    assert result.wake_at == pytest.approx(failed_at + 10)
    assert len(w.cri.sandboxes) == 1 and w.cri.containers == {}

    w.clock.advance(4)
    result = await w.sync(p)
    assert result.waiting["app"][0] == "ImagePullBackOff"
    assert result.wake_at == pytest.approx(failed_at + 10)
    assert len(w.cri.calls_of("PullImage")) == 1  # no pull during the back-off

    w.cri.fail_pull(image, None)
    w.clock.advance(6)
    result = await w.sync(p)
    assert result.waiting == {} and w.live() == ["app"]
    assert len(w.cri.calls_of("PullImage")) == 2
    assert len(w.cri.sandboxes) == 1


async def test_never_pull_policy_with_missing_image(w: World) -> None:
    p = pod("app")
    p["spec"]["containers"][0].update(image="registry.klet.test/absent:2", imagePullPolicy="Never")
    result = await w.sync(p)
    assert result.waiting["app"][0] == "ErrImageNeverPull"
    assert w.cri.calls_of("PullImage") == [] and w.cri.containers == {}
    assert "ErrImageNeverPull" in w.events.reasons()


@pytest.mark.parametrize(
    ("spec_grace", "override", "expected"),
    [(45, None, "45"), (0, None, "2"), (45, 7, "7"), (45, 1, "2")],
)
async def test_kill_pod_stops_containers_with_the_grace_then_the_sandbox(
    w: World, spec_grace: int, override: int | None, expected: str
) -> None:
    p = pod("app", "sidecar", terminationGracePeriodSeconds=spec_grace)
    await w.sync(p)
    await w.syncer.kill_pod(p, await w.runtime.get("u1"), grace_override=override, remove=False)
    stops = w.cri.calls_of("StopContainer")
    assert sorted(c[1] for c in stops) == sorted(w.cri.containers)
    assert {c[2] for c in stops} == {expected}
    names = [c[0] for c in w.cri.calls]
    last_stop = max(i for i, n in enumerate(names) if n == "StopContainer")
    assert names.index("StopPodSandbox") > last_stop
    assert w.live() == []
    assert w.cri.containers and all(c.exit_code == 137 for c in w.cri.containers.values())
    [sandbox] = w.cri.sandboxes.values()
    assert sandbox.state == SandboxState.NOTREADY  # kept, with its dead containers
    assert w.cri.calls_of("RemovePodSandbox") == []


async def test_kill_pod_with_remove_removes_the_sandboxes(w: World) -> None:
    p = pod("app")
    await w.sync(p)
    other = pod("db", uid="u2")
    await w.sync(other)
    await w.syncer.kill_pod(p, await w.runtime.get("u1"), grace_override=None, remove=True)
    assert [s.config.uid for s in w.cri.sandboxes.values()] == ["u2"]
    assert w.live() == ["db"]
    assert len(w.cri.calls_of("RemovePodSandbox")) == 1
    assert (await w.runtime.get("u1")).empty


async def test_kill_pod_notes_what_it_stops_so_their_events_need_no_confirmation(
    w: World,
) -> None:
    """issue 42: the evented PLEG confirms an exit through CRI unless a worker caused it
    (runtimeevents.py); the kill notes its containers and sandboxes before stopping
    them, through the notices the PLEG reads (one object, as wiring.py builds it)."""
    assert w.syncer.hooks.stops is w.runtime.exits
    p = pod("app", "sidecar")
    await w.sync(p)
    current = await w.runtime.get("u1")
    seen: list[tuple[str, int]] = []
    w.runtime.observe = lambda uid, sandboxes, containers: seen.append(
        (uid, len(sandboxes) + len(containers))
    )
    await w.syncer.kill_pod(p, current, grace_override=0, remove=True)
    stopped = [c[1] for c in w.cri.calls if c[0] in ("StopContainer", "StopPodSandbox")]
    assert len(stopped) == 3
    assert all(w.runtime.exits.stopped_by_worker(oid) for oid in stopped)
    # removed for good: the exits wake nobody (the pod is forgotten after this)
    assert all(w.runtime.exits.removed_by_worker(oid) for oid in stopped)
    # PLEG is told the removed pod has nothing left, as a read would: its next relist
    # wakes no worker to find that out
    assert seen == [("u1", 0)]


async def test_a_failed_stop_is_not_noted_as_the_workers_own(w: World) -> None:
    p = pod("app")
    await w.sync(p)
    [cid] = list(w.cri.containers)
    w.cri.fail_next("StopContainer", CRIError("runtime busy", code="DEADLINE_EXCEEDED"))
    with pytest.raises(CRIError):
        await w.syncer.kill_pod(p, await w.runtime.get("u1"), grace_override=0, remove=False)
    assert not w.runtime.exits.stopped_by_worker(cid)  # its exit, if it comes, is news
    [sid] = list(w.cri.sandboxes)
    assert w.runtime.exits.stopped_by_worker(sid)
    assert not w.runtime.exits.removed_by_worker(sid)  # a pod kept: its exits wake
    # a removal that fails takes its marks back: the worker will retry and read again
    w.cri.fail_next("StopPodSandbox", CRIError("runtime busy", code="DEADLINE_EXCEEDED"))
    with pytest.raises(CRIError):
        await w.syncer.kill_pod(p, await w.runtime.get("u1"), grace_override=0, remove=True)
    assert not w.runtime.exits.removed_by_worker(sid)
    assert not w.runtime.exits.removed_by_worker(cid)


class HeldSandboxes:
    """A RunPodSandbox hook: every creation waits until the test releases it, and the
    most ever in flight at once is recorded."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.in_flight = 0
        self.most = 0

    async def __call__(self) -> None:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            await self.release.wait()
        finally:
            self.in_flight -= 1


def bounded_world(tmp_path: Path, limit: int) -> tuple[World, HeldSandboxes]:
    w = World(tmp_path)
    w.syncer = wire(
        tmp_path,
        w.cri,
        events=w.events,
        clock=w.clock,
        sync=SyncSettings(pod_logs_dir=tmp_path, parallel_sandbox_creations=limit),
    ).controller.syncer
    w.runtime = w.syncer.runtime
    held = HeldSandboxes()
    w.cri.hooks["RunPodSandbox"] = held
    return w, held


def sandbox_calls(w: World) -> int:
    return sum(1 for c in w.cri.calls if c[0] == "RunPodSandbox")


async def test_a_burst_of_new_pods_creates_at_most_the_bound_of_sandboxes_at_once(
    tmp_path: Path,
) -> None:
    w, held = bounded_world(tmp_path, 2)
    syncs = [asyncio.ensure_future(w.sync(pod("app", uid=f"u{i}"))) for i in range(5)]
    await until(lambda: held.in_flight == 2)
    for _ in range(20):  # the other three stay queued however long the two take
        await asyncio.sleep(0)
    assert sandbox_calls(w) == 2
    held.release.set()
    await asyncio.gather(*syncs)
    assert held.most == 2 and sandbox_calls(w) == 5
    assert len(w.live()) == 5


async def test_a_failed_sandbox_creation_gives_its_slot_back(tmp_path: Path) -> None:
    w, held = bounded_world(tmp_path, 1)
    held.release.set()
    w.cri.fail_next("RunPodSandbox", CRIError("CNI failed", code="UNKNOWN"))
    syncs = [asyncio.ensure_future(w.sync(pod("app", uid=f"u{i}"))) for i in range(3)]
    await until(lambda: all(s.done() for s in syncs))
    results = [s.result() for s in syncs]
    assert sandbox_calls(w) == 3
    # whichever sync reached the runtime first got the failure (their volume set-ups
    # may finish in any order); the other two went on through the slot it gave back
    assert sorted(bool(r.waiting) for r in results) == [False, False, True]
    assert len(w.live()) == 2


async def test_a_container_restart_in_an_existing_sandbox_does_not_wait_for_the_bound(
    tmp_path: Path,
) -> None:
    w, held = bounded_world(tmp_path, 1)
    held.release.set()
    old = pod("app", uid="old")
    await w.sync(old)
    held.release.clear()
    new = asyncio.ensure_future(w.sync(pod("app", uid="new")))
    await until(lambda: held.in_flight == 1)  # the only slot is taken
    w.cri.exit_container(w.latest("app").id, 1)
    await w.sync(old)  # restarts at once (the first restart has no back-off)
    assert w.live() == ["app"] and w.latest("app").config.attempt == 1
    held.release.set()
    await new


async def test_zero_means_no_bound_on_sandbox_creations(tmp_path: Path) -> None:
    w, held = bounded_world(tmp_path, 0)
    syncs = [asyncio.ensure_future(w.sync(pod("app", uid=f"u{i}"))) for i in range(5)]
    await until(lambda: held.in_flight == 5)
    held.release.set()
    await asyncio.gather(*syncs)
    assert len(w.live()) == 5


async def test_a_mass_removal_stops_every_pod_at_once_whatever_the_creation_bound(
    tmp_path: Path,
) -> None:
    """issue 42: removing many pods at once must not queue behind the bound on sandbox
    creations (upstream bounds no stop): with a bound of 1, five pods removed together
    have all five StopContainer calls in flight at once, then all five StopPodSandbox
    calls, and every pod is gone. Measured on real containerd (bench/README.md, "Mass
    teardown"), the 110 kills of a mass removal all reach the runtime within seconds."""
    w, held = bounded_world(tmp_path, 1)
    held.release.set()
    pods = [pod("app", uid=f"u{i}") for i in range(5)]
    for p in pods:
        await w.sync(p)
    stops, sandbox_stops = HeldSandboxes(), HeldSandboxes()  # any held call will do
    w.cri.hooks["StopContainer"] = stops
    w.cri.hooks["StopPodSandbox"] = sandbox_stops
    currents = [await w.runtime.get(p["metadata"]["uid"]) for p in pods]
    kills = [
        asyncio.ensure_future(w.syncer.kill_pod(p, c, grace_override=0, remove=True))
        for p, c in zip(pods, currents, strict=True)
    ]
    await until(lambda: stops.in_flight == 5)
    stops.release.set()
    await until(lambda: sandbox_stops.in_flight == 5)
    sandbox_stops.release.set()
    await asyncio.gather(*kills)
    assert stops.most == 5 and sandbox_stops.most == 5
    assert w.cri.sandboxes == {} and w.cri.containers == {}
