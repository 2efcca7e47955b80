"""The pod workers' kept reads (pods/runtimecache.py), alone and through syncloop's wiring
over FakeRuntimeService.

Covers, on `RuntimeCache` alone: a read is handed back only once a relist begun after it
began found its pod's fingerprint unchanged (a relist begun before it confirms nothing);
a relist that finds another fingerprint, or none, drops it; a drop while a read of the
pod is in flight spoils that read, while a read begun after the drop is kept; a failed
read keeps nothing, and an older read ending last does not replace a newer one; a newer
read that found the same fingerprint takes over the confirmation (another reader does
not cost the resync its kept read), one that found another waits for a relist; a pod
with nothing in the runtime is confirmed by a relist that lists nothing of it.

Through the wiring (PodRuntime, the relister, the controller, real pod workers): with
N running pods and one confirming relist, a periodic resync (`wake_all`) syncs every
pod and makes no CRI call at all, the relist's two lists being the idle node's only
ones; a container that died since (found by a relist, or announced by a runtime event)
makes its pod's next sync read CRI, and only that pod's; the worker's own action (a
kill request, a sync that acts, a kill) drops the read, so the sync after reads CRI
until a relist confirms again; a change of the pod drops it too; a sync that raises
drops it; a removed pod leaves nothing kept.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from klet.cri.types import ContainerState, EventKind, RuntimeEvent, SandboxState
from klet.model.records import DesiredPod, SourceState
from klet.model.types import ContainerID, PodUID
from klet.syncloop.model.runtimepod import RuntimePod
from klet.syncloop.pods.podworkers import Outcome, PodWorkers
from klet.syncloop.pods.runtimecache import Fingerprint, RuntimeCache
from klet.syncloop.pods.runtimeevents import EventWatcher
from klet.syncloop.wiring import Deps
from klet.testbed.fakes.cri import FakeRuntimeEvents, FakeRuntimeService

from .helpers import Clock, Held, pod, until, wire

IMAGE = "registry.klet.test/busybox:1.36"
READY = {"file": SourceState(source="file", ready=True, at=0.0)}
PER_POD_READS = ("ListPodSandbox", "ListContainers", "PodSandboxStatus", "ContainerStatus")
KILL = ("StopContainer", "StopPodSandbox", "RemovePodSandbox", "RemoveContainer")

FP: Fingerprint = frozenset({("s1", SandboxState.READY), ("c1", ContainerState.RUNNING)})
EXITED: Fingerprint = frozenset({("s1", SandboxState.READY), ("c1", ContainerState.EXITED)})


def read(cache: RuntimeCache, uid: str = "u", fp: Fingerprint | None = FP) -> int:
    """A whole read of pod `uid` that found fingerprint `fp`; its tick."""
    began = cache.read_began(uid)
    cache.read_ended(uid, began, RuntimePod(uid=uid), fp)
    return began


def test_a_read_is_fresh_only_after_a_relist_begun_after_it_confirms_it() -> None:
    cache = RuntimeCache()
    relist_before = cache.tick()
    read(cache)
    assert cache.fresh("u") is None  # nothing confirmed it yet
    cache.relisted(relist_before, {"u": FP})
    assert cache.fresh("u") is None  # that relist began before the read
    cache.relisted(cache.tick(), {"u": FP})
    assert cache.fresh("u") == RuntimePod(uid="u")


@pytest.mark.parametrize("found", [{"u": EXITED}, {}], ids=["changed", "gone"])
def test_a_relist_that_finds_another_fingerprint_drops_the_read(
    found: dict[str, Fingerprint],
) -> None:
    cache = RuntimeCache()
    read(cache)
    cache.relisted(cache.tick(), {"u": FP})
    cache.relisted(cache.tick(), found)
    assert cache.fresh("u") is None
    cache.relisted(cache.tick(), {"u": FP})  # nothing left to confirm
    assert cache.fresh("u") is None and len(cache) == 0


def test_a_drop_during_a_read_spoils_it_but_not_a_read_begun_after() -> None:
    cache = RuntimeCache()
    first = cache.read_began("u")
    cache.invalidate("u")  # an event lands while the read is in flight
    second = cache.read_began("u")
    cache.read_ended("u", first, RuntimePod(uid="u"), FP)
    cache.relisted(cache.tick(), {"u": FP})
    assert cache.fresh("u") is None  # the first read is not kept
    cache.read_ended("u", second, RuntimePod(uid="u"), FP)
    cache.relisted(cache.tick(), {"u": FP})
    assert cache.fresh("u") == RuntimePod(uid="u")
    cache.invalidate("u")
    assert cache.fresh("u") is None


def test_a_failed_read_keeps_nothing_and_an_older_read_does_not_replace_a_newer() -> None:
    cache = RuntimeCache()
    began = cache.read_began("u")
    cache.read_ended("u", began, None, None)
    assert len(cache) == 0
    old = cache.read_began("u")
    new = cache.read_began("u")
    cache.read_ended("u", new, RuntimePod(uid="u"), FP)
    cache.read_ended("u", old, RuntimePod(uid="stale"), EXITED)
    cache.relisted(cache.tick(), {"u": FP})
    assert cache.fresh("u") == RuntimePod(uid="u")


def test_a_newer_read_of_the_same_fingerprint_keeps_the_confirmation() -> None:
    cache = RuntimeCache()
    read(cache)
    cache.relisted(cache.tick(), {"u": FP})
    began = cache.read_began("u")  # another reader (the CPU manager's reconcile)
    cache.read_ended("u", began, RuntimePod(uid="newer"), FP)
    assert cache.fresh("u") == RuntimePod(uid="newer")
    read(cache, fp=EXITED)  # one that found a change waits for a relist of its own
    assert cache.fresh("u") is None
    cache.relisted(cache.tick(), {"u": EXITED})
    assert cache.fresh("u") == RuntimePod(uid="u")


def test_a_pod_with_nothing_is_confirmed_by_a_relist_without_it() -> None:
    cache = RuntimeCache()
    read(cache, fp=None)
    cache.relisted(cache.tick(), {"other": FP})
    assert cache.fresh("u") == RuntimePod(uid="u")


# -- through syncloop's wiring ---------------------------------------------------------


class Node:
    """syncloop's production wiring over a fake runtime, its pods driven by pod workers
    whose syncs are counted (`syncs`, and `busy` while one runs)."""

    def __init__(self, tmp_path: Path, cri: FakeRuntimeService | None = None) -> None:
        self.clock = Clock(1_700_000_000.0)
        # Another Node's runtime: this one is that node's syncloop restarted.
        self.cri = cri if cri is not None else FakeRuntimeService(clock=self.clock.ns)
        self.cri.add_image(IMAGE)
        self.deps: Deps = wire(tmp_path, self.cri, clock=self.clock)
        self.controller = self.deps.controller
        self.relister = self.deps.relister
        self.runtime = self.controller.runtime
        self.syncs = self.busy = 0
        sync = self.controller.sync_once

        async def counted(uid: str) -> Outcome:
            self.syncs += 1
            self.busy += 1
            try:
                return await sync(uid)
            finally:
                self.busy -= 1

        # as the controller builds its workers, with the syncs counted
        self.controller.workers = PodWorkers(
            counted, clock=self.clock, on_wake=self.runtime.invalidate
        )

    async def settled(self) -> None:
        """Wait until no pod worker is syncing or about to (a sync may wait for a
        thread: a pod's directories are made in one)."""
        while True:
            await until(lambda: self.busy == 0)
            before = self.syncs
            for _ in range(50):
                await asyncio.sleep(0)
            if self.busy == 0 and self.syncs == before:
                return

    async def start(self, n: int) -> list[str]:
        uids = [f"u{i}" for i in range(n)]
        self.controller.apply_desired(table(uids), READY, read_from=self.controller.generation)
        await until(lambda: len(self.running()) == n)
        await self.settled()
        return uids

    def running(self) -> list[str]:
        return [
            c.config.labels["io.kubernetes.pod.uid"]
            for c in self.cri.containers.values()
            if c.state == ContainerState.RUNNING
        ]

    def container_of(self, uid: str) -> ContainerID:
        return next(
            c.id
            for c in self.cri.containers.values()
            if c.config.labels["io.kubernetes.pod.uid"] == uid and c.state is ContainerState.RUNNING
        )

    def per_pod_reads(self) -> list[tuple[str, ...]]:
        """The CRI calls of pod reads (label-selected lists, status calls): not the
        relist's, which list everything without a selector."""
        return [c for c in self.cri.calls if c[0] in PER_POD_READS and len(c) > 1]

    def pods_read(self) -> set[str]:
        return {
            arg.split("=", 1)[1]
            for c in self.per_pod_reads()
            if c[0] == "ListPodSandbox"
            for arg in c[1:]
        }

    async def resync(self) -> int:
        """One periodic resync (app.py's periodic_resync); how many syncs it ran."""
        before = self.syncs
        self.cri.calls.clear()
        self.controller.workers.wake_all()
        await self.settled()
        return self.syncs - before


def table(uids: list[str]) -> dict[str, DesiredPod]:
    """The desired table holding `uids`, each a one-container pod."""
    return {
        uid: DesiredPod(
            uid=PodUID(uid), pod=pod("app", uid=uid), source="file", hash="h", seen_at=0.0
        )
        for uid in uids
    }


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    n = Node(tmp_path)
    yield n
    await n.controller.workers.stop()


async def test_an_idle_resync_reads_no_pod_from_cri(node: Node) -> None:
    uids = await node.start(5)
    await node.relister.relist_once()  # confirms every pod's last read
    assert await node.resync() == len(uids)
    assert node.cri.calls == []  # not a list, not a status call, for 5 synced pods
    node.cri.calls.clear()
    await node.relister.relist_once()
    assert node.cri.calls == [("ListPodSandbox",), ("ListContainers",)]
    assert await node.resync() == len(uids)
    assert node.cri.calls == []
    for uid in uids:
        status = node.controller.publisher.get(uid)
        assert status is not None and status["phase"] == "Running"


async def test_without_a_relist_since_the_last_read_the_resync_reads_cri(node: Node) -> None:
    uids = await node.start(3)
    await node.resync()  # no relist since the pods' last reads: nothing confirmed
    assert node.pods_read() == set(uids)


async def test_a_container_that_died_is_read_from_cri_by_its_pod_only(node: Node) -> None:
    uids = await node.start(3)
    await node.relister.relist_once()
    node.cri.exit_container(node.container_of("u1"), 1)
    node.cri.calls.clear()
    await node.relister.relist_once()  # finds u1 changed: drops its read, wakes its worker
    await node.settled()
    assert node.pods_read() == {"u1"}
    assert sorted(node.running()) == uids  # restarted from what CRI said
    await node.relister.relist_once()
    await node.resync()
    assert node.per_pod_reads() == []


async def test_a_runtime_event_drops_the_read_of_its_pod(node: Node) -> None:
    await node.start(2)
    await node.relister.relist_once()
    cid = node.container_of("u0")
    node.cri.exit_container(cid, 1)
    woken: list[str] = []
    watcher = EventWatcher(FakeRuntimeEvents(), node.cri, node.relister, wake=woken.append)
    watcher.dispatch(RuntimeEvent(EventKind.EXITED, cid, "/tasks/exit", exit_status=1))
    assert node.runtime.cache.fresh("u0") is None  # at once, before any CRI call
    assert node.runtime.cache.fresh("u1") is not None
    await until(lambda: woken.count("u0") == 2)  # noted, then confirmed through CRI
    await watcher.stop()
    await node.resync()
    assert node.pods_read() == {"u0"}
    assert len(node.running()) == 2  # restarted from what CRI said


async def test_the_workers_own_action_makes_its_next_syncs_read_cri(node: Node) -> None:
    uids = await node.start(2)
    await node.relister.relist_once()
    assert await node.controller.kill_pod(PodUID("u0"), 0, "Evicted", "test") is True
    # The kill request is a change of the pod: its sync read CRI, killed, read again.
    assert "u0" in node.pods_read()
    await node.settled()
    node.cri.calls.clear()
    await node.resync()  # the read after the kill is not confirmed yet
    assert node.pods_read() == {"u0"}
    await node.relister.relist_once()
    await node.resync()
    assert node.per_pod_reads() == []
    assert node.running() == [uids[1]]


async def test_a_sync_that_acts_or_kills_drops_the_read_first(tmp_path: Path) -> None:
    n = Node(tmp_path)
    try:
        await n.start(1)
        await n.relister.relist_once()
        current = await n.runtime.get("u0", reuse=True)
        assert n.runtime.cache.fresh("u0") is current
        n.cri.exit_container(n.container_of("u0"), 1)  # no relist, no event: still kept
        await n.controller.syncer.sync(pod("app", uid="u0"), current)  # nothing to do
        assert n.runtime.cache.fresh("u0") is current
        dead = await n.runtime.get("u0")
        await n.relister.relist_once()
        assert n.runtime.cache.fresh("u0") is dead
        await n.controller.syncer.sync(pod("app", uid="u0"), dead)  # restarts it
        assert n.runtime.cache.fresh("u0") is None
        again = await n.runtime.get("u0")
        await n.relister.relist_once()
        assert n.runtime.cache.fresh("u0") is again
        await n.controller.syncer.kill_pod(None, again, grace_override=0, remove=False)
        assert n.runtime.cache.fresh("u0") is None
    finally:
        await n.controller.workers.stop()


async def test_a_change_of_the_pod_a_failed_sync_or_a_removal_drops_the_read(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    await node.start(3)
    await node.relister.relist_once()
    node.controller.workers.wake("u0")  # an update, a deletion or a kill request
    assert node.runtime.cache.fresh("u0") is None
    await node.settled()
    await node.relister.relist_once()

    async def broken(_pods: object) -> None:
        raise OSError("cgroup files unreadable")

    monkeypatch.setattr(node.controller.syncer, "update_qos", broken)
    with pytest.raises(OSError):
        await node.controller.sync_once("u1")  # took the kept read, then failed
    assert node.runtime.cache.fresh("u1") is None
    monkeypatch.undo()
    table = {uid: s.desired for uid, s in node.controller.pods.items() if s.desired is not None}
    del table["u2"]
    node.controller.apply_desired(table, READY, read_from=node.controller.generation)
    await until(lambda: "u2" not in node.controller.pods)
    await node.settled()
    await node.relister.relist_once()
    assert node.runtime.cache.fresh("u2") is None
    assert node.runtime.cache.fresh("u0") is not None
    assert len(node.runtime.cache) == 1  # u1's went with its failed sync, nothing of u2


async def mass_removal(n: Node, uids: list[str]) -> tuple[int, Counter[str]]:
    """Remove every pod at once while a relist and the periodic resync land in the kills
    (as they do in a loaded node's teardown); the syncs it took and its CRI calls by
    RPC, the one relist's two lists left out."""
    await n.relister.relist_once()
    stops = Held()
    n.cri.hooks["StopContainer"] = stops
    n.cri.calls.clear()
    before = n.syncs
    n.controller.apply_desired({}, READY, read_from=n.controller.generation)
    await until(lambda: stops.in_flight == len(uids))
    await n.relister.relist_once()  # sees every container still running
    n.cri.exit_container(n.container_of(uids[0]), 0)  # one of them already exiting
    await n.relister.relist_once()  # sees that one change: nudges its worker
    n.controller.workers.wake_all()  # the periodic resync
    stops.release.set()
    await until(lambda: not n.controller.workers.uids())
    await n.settled()
    await n.relister.relist_once()  # a relist after the removals wakes nobody either
    await n.settled()
    calls = Counter(c[0] for c in n.cri.calls if not (c[0].startswith("List") and len(c) == 1))
    return n.syncs - before, calls


async def test_a_removed_pod_is_synced_once_and_a_restarted_syncloop_kills_it_alike(
    tmp_path: Path,
) -> None:
    """issue 42's idle-set teardowns, where klet had just been restarted: measured on
    containerd (bench/README.md, "Idle-set teardown"), a restarted syncloop made the same
    CRI calls per removed pod as one that never restarted, but each removed pod was
    synced three times, the later syncs reading CRI again to find it gone, because the
    relist and the resync that landed in its kill kept its worker going. Here, both
    ways: one sync per removed pod, and per pod one read (label-selected lists,
    PodSandboxStatus, ContainerStatus) and one each of StopContainer, StopPodSandbox,
    RemovePodSandbox, RemoveContainer."""
    once = Node(tmp_path / "a")
    again: Node | None = None
    try:
        uids = await once.start(4)
        syncs, calls = await mass_removal(once, uids)
        assert syncs == len(uids)
        assert calls == Counter({rpc: len(uids) for rpc in PER_POD_READS + KILL})
        # the same pods on a runtime whose syncloop restarted: a new wiring adopts them
        uids = await once.start(4)
        await once.controller.workers.stop()
        again = Node(tmp_path / "b", cri=once.cri)
        again.cri.calls.clear()
        again.controller.apply_desired(table(uids), READY, read_from=0)
        await until(lambda: len(again.controller.workers.uids()) == 0 or again.syncs >= 4)
        await again.settled()
        assert not [c for c in again.cri.calls if c[0] in ("RunPodSandbox", "StopContainer")]
        syncs, calls = await mass_removal(again, uids)
        assert syncs == len(uids)
        assert calls == Counter({rpc: len(uids) for rpc in PER_POD_READS + KILL})
    finally:
        await once.controller.workers.stop()
        if again is not None:
            await again.controller.workers.stop()
