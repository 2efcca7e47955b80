"""The relister, syncloop's PLEG (pods/relisting.py), against FakeRuntimeService.

Covers: the first relist wakes every pod the runtime has; later relists wake only the
pods whose sandboxes or containers changed state, appeared or went away, including
pods no source wants; objects without a pod-UID label are not ours; the count of ready
sandboxes follows the last relist; health turns false once the last successful relist
is older than three minutes (a fake monotonic clock) and true again after one; the
run loop reports each pod-UID set, and logs a CRI failure once and its recovery;
a pod worker's own read (PodRuntime) refreshes its pod's fingerprint and owners without
waking it; a relist in flight while a worker removed its pod (or found it empty) does
not wake a new worker for it, and what it hid is found by the next relist;
the period is the long one only while runtime events flow, and a long one stretches
the health threshold; `kick` starts a relist at
once, and a kicked relist that fails is retried within a second until one succeeds;
the containers it last saw running (log rotation's) are read without a CRI call.
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from klet.cri import CRIError
from klet.cri import labels as L
from klet.cri.types import ContainerConfig, SandboxConfig
from klet.model.types import ContainerID, SandboxID
from klet.syncloop.pods.relisting import RELIST_THRESHOLD_S, Relister
from klet.syncloop.pods.runtime import PodRuntime
from klet.testbed.fakes.cri import FakeRuntimeService

from .helpers import Clock, running, until

IMAGE = "registry.klet.test/busybox:1.36"


def sandbox_config(uid: str, labels: dict[str, str]) -> SandboxConfig:
    return SandboxConfig(
        name=f"p-{uid}",
        namespace="default",
        uid=uid,
        attempt=0,
        hostname=uid,
        log_directory="/tmp",
        labels=labels,
    )


class World:
    def __init__(self) -> None:
        self.cri = FakeRuntimeService()
        self.cri.add_image(IMAGE)
        self.clock = Clock()
        self.woken: list[str] = []
        self.relister = Relister(self.cri, self.woken.append, period_s=0, clock=self.clock)

    async def sandbox(self, uid: str, *, labelled: bool = True) -> SandboxID:
        labels = {L.POD_UID: uid} if labelled else {}
        return await self.cri.run_pod_sandbox(sandbox_config(uid, labels))

    async def container(self, sandbox_id: SandboxID, uid: str, name: str = "main") -> ContainerID:
        config = ContainerConfig(name=name, attempt=0, image=IMAGE, labels={L.POD_UID: uid})
        labels = {L.POD_UID: uid}
        cid = await self.cri.create_container(sandbox_id, config, sandbox_config(uid, labels))
        await self.cri.start_container(cid)
        return cid

    async def relist(self) -> set[str]:
        self.woken.clear()
        return await self.relister.relist_once()


@pytest.fixture
def w() -> World:
    return World()


async def test_only_pods_that_changed_are_woken(w: World) -> None:
    a = await w.sandbox("a")
    await w.container(a, "a")
    await w.sandbox("b")
    await w.sandbox("theirs", labelled=False)  # not made by a kubelet: not ours
    assert await w.relist() == {"a", "b"}
    assert sorted(w.woken) == ["a", "b"]

    assert await w.relist() == {"a", "b"}
    assert w.woken == []  # nothing changed

    [cid] = list(w.cri.containers)
    w.cri.exit_container(cid, 1)
    await w.sandbox("c")  # a pod no source asked for is woken too: its worker decides
    await w.relist()
    assert sorted(w.woken) == ["a", "c"]

    b = next(s for s in w.cri.sandboxes.values() if s.config.uid == "b")
    await w.cri.stop_pod_sandbox(b.id)
    await w.cri.remove_pod_sandbox(b.id)
    assert await w.relist() == {"a", "c"}
    assert w.woken == ["b"]  # gone from the runtime: woken once more


async def test_ready_sandboxes_follow_the_last_relist(w: World) -> None:
    assert w.relister.ready_sandboxes() == 0
    a = await w.sandbox("a")
    await w.container(a, "a")
    await w.sandbox("b")
    await w.relist()
    assert w.relister.ready_sandboxes() == 2
    await w.cri.stop_pod_sandbox(a)
    assert w.relister.ready_sandboxes() == 2  # until the next relist
    await w.relist()
    assert w.relister.ready_sandboxes() == 1


async def test_running_containers_are_plegs_view_without_a_cri_call(w: World) -> None:
    # What log rotation takes instead of listing every container itself (issue 42).
    a = await w.sandbox("a")
    first = await w.container(a, "a")
    await w.relist()
    assert w.relister.running_containers() == [first]
    runtime = PodRuntime(w.cri, observe=w.relister.observe)
    second = await w.container(a, "a", "sidecar")
    w.cri.exit_container(first, 0)
    await runtime.get("a")  # a worker's read: its view, before the next relist
    w.cri.calls.clear()
    assert w.relister.running_containers() == [second]
    assert w.cri.calls == []


async def test_health_follows_the_age_of_the_last_successful_relist(w: World) -> None:
    assert w.relister.healthy()
    w.clock.t += RELIST_THRESHOLD_S - 1
    assert w.relister.healthy()
    w.clock.t += 1
    assert not w.relister.healthy()
    w.cri.fail_next("ListPodSandbox", CRIError("runtime down"))
    with pytest.raises(CRIError):
        await w.relist()
    assert not w.relister.healthy()  # a failed relist does not count
    await w.relist()
    assert w.relister.healthy() and w.relister.age() == 0


async def test_the_run_loop_reports_uids_and_logs_a_failure_once(
    w: World, caplog: pytest.LogCaptureFixture
) -> None:
    await w.sandbox("a")
    reported: list[set[str]] = []
    w.cri.fail_always("ListPodSandbox", CRIError("runtime down"))
    with caplog.at_level(logging.INFO, logger="klet.syncloop.pods.relisting"):
        async with running(w.relister.run(reported.append)):
            for _ in range(5):  # five failing passes
                await asyncio.sleep(0)
            assert reported == []
            w.cri.fail_always("ListPodSandbox", None)
            await until(lambda: bool(reported))
    assert reported[0] == {"a"}
    assert [r.getMessage() for r in caplog.records] == ["relist failed", "relist recovered"]


async def test_a_workers_read_refreshes_its_pods_fingerprint_without_waking(w: World) -> None:
    a = await w.sandbox("a")
    cid = await w.container(a, "a")
    b = await w.sandbox("b")
    await w.relist()
    assert w.relister.owner == {a: "a", cid: "a", b: "b"}
    runtime = PodRuntime(w.cri, observe=w.relister.observe)
    w.cri.exit_container(cid, 1)
    w.woken.clear()
    await runtime.get("a")  # the worker sees the exit itself
    assert w.woken == []
    await w.relist()
    assert w.woken == []  # the full relist agrees with the refreshed fingerprint
    # a container the worker made since the last relist is known by its read
    other = await w.container(a, "a", "sidecar")
    await runtime.get("a")
    assert w.relister.owner[other] == "a"
    await w.cri.stop_pod_sandbox(a)
    await w.cri.remove_pod_sandbox(a)
    await runtime.get("a")
    assert "a" not in w.relister.previous and w.relister.ready_sandboxes() == 1


def hold_once(w: World, rpc: str) -> tuple[asyncio.Event, asyncio.Event]:
    """Hold the next `rpc` call (only that one): `listed` is set when it arrives, and it
    answers once the test sets `go_on`."""
    listed, go_on = asyncio.Event(), asyncio.Event()

    async def held_once() -> None:
        del w.cri.hooks[rpc]
        listed.set()
        await go_on.wait()

    w.cri.hooks[rpc] = held_once
    return listed, go_on


async def test_a_relist_in_flight_while_a_worker_removes_its_pod_wakes_nobody(
    w: World,
) -> None:
    """issue 42's mass teardowns: a relist listed a pod, its worker then removed it and
    ended; the relist, older than the removal, must not wake a new worker for it (which
    only read CRI to find it gone, once per removed pod). A pod that changed otherwise
    is woken as before, and what the older relist listed of the removed pod is not kept."""
    a = await w.sandbox("a")
    ca = await w.container(a, "a")
    b = await w.sandbox("b")
    cb = await w.container(b, "b")
    await w.relist()
    runtime = PodRuntime(w.cri, observe=w.relister.observe, cache=w.relister.cache)
    current = await runtime.get("a")
    # the relist's ListContainers, not the reads after
    listed, go_on = hold_once(w, "ListContainers")
    w.woken.clear()
    relist = asyncio.ensure_future(w.relister.relist_once())
    await listed.wait()  # it has listed a's sandbox; its containers answer now
    w.cri.exit_container(cb, 1)  # b changes meanwhile
    # a's worker removes everything of a, as syncpod's kill does, and forgets it
    await w.cri.stop_container(ca, timeout_s=0)
    await w.cri.stop_pod_sandbox(a)
    await w.cri.remove_pod_sandbox(a)
    runtime.forget(current)
    go_on.set()
    await relist
    assert w.woken == ["b"]
    assert "a" not in w.relister.previous
    await w.relist()  # a relist begun after the removal agrees
    assert w.woken == []


async def test_what_an_older_relist_hid_is_found_by_the_next(w: World) -> None:
    """The rule above hides nothing for long: a pod found empty by its worker while a
    relist was in flight, and given a sandbox afterwards by someone else than its
    worker, is woken by the next relist."""
    runtime = PodRuntime(w.cri, observe=w.relister.observe, cache=w.relister.cache)
    listed, go_on = hold_once(w, "ListPodSandbox")
    w.woken.clear()
    relist = asyncio.ensure_future(w.relister.relist_once())
    await listed.wait()
    await runtime.get("a")  # nothing of a yet
    await w.sandbox("a")  # made behind the worker's back, before the relist lists
    go_on.set()
    await relist
    assert w.woken == []  # older than the worker's read: a stays as it read it
    await w.relist()
    assert w.woken == ["a"]


async def test_the_period_is_long_only_while_events_flow(w: World) -> None:
    relister = Relister(w.cri, w.woken.append, period_s=1, evented_period_s=20)
    assert relister.current_period() == 1 and relister.threshold_s() == RELIST_THRESHOLD_S
    relister.evented = True
    assert relister.current_period() == 20
    # a long evented period stretches the health threshold to two periods
    slow = Relister(w.cri, w.woken.append, evented_period_s=300, clock=w.clock)
    assert slow.threshold_s() == 600
    w.clock.t += 599
    assert slow.healthy()
    w.clock.t += 1
    assert not slow.healthy()


async def test_a_kick_relists_at_once_and_an_owed_relist_is_retried(w: World) -> None:
    await w.sandbox("a")
    reported: list[set[str]] = []
    relister = Relister(
        w.cri, w.woken.append, period_s=3600, evented_period_s=3600, retry_period_s=0
    )
    relister.evented = True
    async with running(relister.run(reported.append)):
        await until(lambda: len(reported) == 1)  # the first pass, then an hour's wait
        w.cri.fail_next("ListPodSandbox", CRIError("runtime restarting"))
        w.cri.fail_next("ListPodSandbox", CRIError("runtime restarting"))
        relister.kick()
        # two failures, retried at the retry period (not in an hour) until one succeeds
        await until(lambda: len(reported) == 2)
        assert not relister.owed()
    assert len(w.cri.calls_of("ListPodSandbox")) == 4
