"""ContainerGC against the stateful fake CRI runtime and a fake clock: a container in
unknown state is stopped before it is removed, a running container is never removed,
nothing is touched (not even listed) while the sources are not ready, deleted pods'
containers, sandboxes and log directories go while desired pods' stay, failures keep the
sandbox and are counted, and node-level reclaim (`free`) reports the bytes freed."""

from __future__ import annotations

from pathlib import Path

import pytest
from klet.cri import labels as L
from klet.cri.errors import CRIError
from klet.cri.types import (
    ContainerConfig,
    ContainerState,
    ContainerStatsInfo,
    FilesystemUsageInfo,
    SandboxConfig,
)
from klet.image_gc.containergc import ContainerGC, ContainerGCResult, terminated_uids
from klet.image_gc.containerselect import ContainerGCSettings
from klet.model.records import PodStatusRecord
from klet.model.types import ContainerID, PodUID, SandboxID
from klet.testbed.fakes.cri import FakeRuntimeService

IMAGE = "registry.klet.test/busybox:1.36"


class Clock:
    """Seconds for ContainerGC, nanoseconds for the fake runtime; moved by the test."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def seconds(self) -> float:
        return self.now

    def ns(self) -> int:
        return int(self.now * 1e9)


class Stats:
    """ListContainerStats answering writable-layer sizes set by the test."""

    def __init__(self, sizes: dict[ContainerID, int | None]) -> None:
        self.sizes = sizes
        self.error: CRIError | None = None

    async def list_container_stats(self) -> list[ContainerStatsInfo]:
        if self.error is not None:
            raise self.error
        return [
            ContainerStatsInfo(
                id=cid,
                name="c",
                attempt=0,
                labels={},
                annotations={},
                cpu_timestamp_ns=0,
                cpu_usage_core_ns=None,
                cpu_usage_nano_cores=None,
                memory_timestamp_ns=0,
                memory_working_set_bytes=None,
                memory_usage_bytes=None,
                memory_rss_bytes=None,
                memory_available_bytes=None,
                writable_layer=FilesystemUsageInfo(0, "/", size, None),
            )
            for cid, size in self.sizes.items()
        ]


class Node:
    """A fake runtime plus what ContainerGC reads from the bus, all set by the test."""

    def __init__(self, tmp_path: Path) -> None:
        self.clock = Clock()
        self.cri = FakeRuntimeService(clock=self.clock.ns)
        self.cri.add_image(IMAGE)
        self.desired: set[str] = set()
        self.terminated: set[str] = set()
        self.held: set[str] = set()
        self.ready = True
        self.logs = tmp_path / "pods"
        self.logs.mkdir()

    async def sources_ready(self) -> bool:
        return self.ready

    async def desired_uids(self) -> set[str]:
        return set(self.desired)

    async def terminated_uids(self) -> set[str]:
        return set(self.terminated)

    async def held_uids(self) -> set[str]:
        return set(self.held)

    def gc(
        self, settings: ContainerGCSettings | None = None, stats: Stats | None = None
    ) -> ContainerGC:
        return ContainerGC(
            runtime=self.cri,
            settings=settings or ContainerGCSettings(),
            sources_ready=self.sources_ready,
            desired_uids=self.desired_uids,
            pod_logs_dir=self.logs,
            clock=self.clock.seconds,
            stats=stats,
            terminated_uids=self.terminated_uids,
            held_uids=self.held_uids,
        )

    async def pod(self, uid: str, *, attempt: int = 0) -> tuple[SandboxID, SandboxConfig]:
        """A ready sandbox of pod `ns/p-<uid>` and its log directory."""
        log_dir = self.logs / f"ns_p-{uid}_{uid}"
        log_dir.mkdir(exist_ok=True)
        (log_dir / "c").mkdir(exist_ok=True)
        (log_dir / "c" / "0.log").write_text("hello\n")
        config = SandboxConfig(
            name=f"p-{uid}",
            namespace="ns",
            uid=uid,
            attempt=attempt,
            hostname="p",
            log_directory=str(log_dir),
            labels=L.sandbox_labels(name=f"p-{uid}", namespace="ns", uid=uid, pod_labels={}),
        )
        self.clock.now += 1
        return await self.cri.run_pod_sandbox(config), config

    async def container(
        self, sandbox: tuple[SandboxID, SandboxConfig], name: str, attempt: int, *, dead: bool
    ) -> ContainerID:
        sid, config = sandbox
        labels = L.container_labels(
            pod_name=config.name, namespace="ns", uid=config.uid, container=name
        )
        self.clock.now += 1
        cid = await self.cri.create_container(
            sid,
            ContainerConfig(name=name, attempt=attempt, image=IMAGE, labels=labels),
            config,
        )
        await self.cri.start_container(cid)
        if dead:
            self.clock.now += 1
            self.cri.exit_container(cid, 1)
        return cid

    def states(self) -> dict[ContainerID, ContainerState]:
        return {cid: c.state for cid, c in self.cri.containers.items()}


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


async def test_dead_instances_beyond_the_limit_go_oldest_first(node: Node) -> None:
    node.desired = {"u1"}
    pod = await node.pod("u1")
    dead = [await node.container(pod, "c", i, dead=True) for i in range(4)]
    running = await node.container(pod, "c", 4, dead=False)

    result = await node.gc().collect()

    assert [c[1] for c in node.cri.calls_of("RemoveContainer")] == dead[:3]
    assert set(node.cri.containers) == {dead[3], running}
    assert result.containers_removed == 3 and result.sources_ready and result.errors == 0
    assert result.sandboxes_removed == 0 and result.log_dirs_removed == 0
    assert (node.logs / "ns_p-u1_u1").is_dir()


async def test_unknown_state_container_is_stopped_before_removal(node: Node) -> None:
    node.desired = {"u1"}
    pod = await node.pod("u1")
    unknown = await node.container(pod, "c", 0, dead=False)
    node.cri.containers[unknown].state = ContainerState.UNKNOWN
    await node.container(pod, "c", 1, dead=True)

    result = await node.gc().collect()

    calls = [c for c in node.cri.calls if c[0] in ("StopContainer", "RemoveContainer")]
    assert calls == [("StopContainer", unknown, "2"), ("RemoveContainer", unknown)]
    assert unknown not in node.cri.containers
    assert result.containers_stopped == 1 and result.containers_removed == 1


async def test_unknown_state_container_that_cannot_be_stopped_is_kept(node: Node) -> None:
    node.desired = {"u1"}
    pod = await node.pod("u1")
    unknown = await node.container(pod, "c", 0, dead=False)
    node.cri.containers[unknown].state = ContainerState.UNKNOWN
    await node.container(pod, "c", 1, dead=True)
    node.cri.fail_next("StopContainer", CRIError("stop failed"))

    result = await node.gc().collect()

    assert unknown in node.cri.containers and not node.cri.calls_of("RemoveContainer")
    assert result.errors == 1 and result.containers_removed == 0


async def test_running_containers_are_never_removed(node: Node) -> None:
    node.desired = {"u1"}  # u2 is deleted but still running: syncloop is killing it
    kept = await node.pod("u1")
    doomed = await node.pod("u2")
    running = [
        await node.container(kept, "c", 0, dead=False),
        await node.container(doomed, "c", 0, dead=False),
    ]

    result = await node.gc(ContainerGCSettings(max_per_pod_container=0, max_containers=0)).collect()

    assert all(node.states()[cid] == ContainerState.RUNNING for cid in running)
    assert not node.cri.calls_of("RemoveContainer") and not node.cri.calls_of("StopContainer")
    assert not node.cri.calls_of("RemovePodSandbox")
    assert (node.logs / "ns_p-u2_u2").is_dir()  # still running: its logs stay
    assert result == ContainerGCResult(sources_ready=True, duration_s=result.duration_s)


async def test_nothing_is_touched_while_sources_are_not_ready(node: Node) -> None:
    node.desired = set()
    node.ready = False
    pod = await node.pod("u1")
    dead = [await node.container(pod, "c", i, dead=True) for i in range(3)]
    await node.cri.stop_pod_sandbox(pod[0])
    node.cri.calls.clear()

    result = await node.gc().collect()
    freed = await node.gc().free(10**9)

    assert node.cri.calls == []  # not even listed
    assert set(node.cri.containers) == set(dead) and pod[0] in node.cri.sandboxes
    assert (node.logs / "ns_p-u1_u1" / "c" / "0.log").is_file()
    assert result == ContainerGCResult(sources_ready=False) and freed == (0, 0)


async def test_deleted_pods_lose_containers_sandboxes_and_log_dirs(node: Node) -> None:
    node.desired = {"keep"}
    keep = await node.pod("keep")
    await node.container(keep, "c", 0, dead=True)
    gone_old = await node.pod("gone")
    await node.container(gone_old, "c", 0, dead=True)
    await node.cri.stop_pod_sandbox(gone_old[0])
    gone_new = await node.pod("gone", attempt=1)
    await node.container(gone_new, "c", 1, dead=True)
    await node.cri.stop_pod_sandbox(gone_new[0])
    (node.logs / "ns_p-old_old").mkdir()  # a pod removed long ago: only its logs are left
    (node.logs / "not-a-pod-dir").mkdir()
    node.cri.calls.clear()

    result = await node.gc().collect()

    assert {c.sandbox_id for c in node.cri.containers.values()} == {keep[0]}
    assert set(node.cri.sandboxes) == {keep[0]}
    assert sorted(p.name for p in node.logs.iterdir()) == ["not-a-pod-dir", "ns_p-keep_keep"]
    assert result.containers_removed == 2 and result.sandboxes_removed == 2
    assert result.log_dirs_removed == 2 and result.errors == 0
    # every sandbox is stopped before its removal
    sandbox_calls = [c for c in node.cri.calls if c[0] in ("StopPodSandbox", "RemovePodSandbox")]
    assert sandbox_calls == [
        ("StopPodSandbox", gone_old[0]),
        ("RemovePodSandbox", gone_old[0]),
        ("StopPodSandbox", gone_new[0]),
        ("RemovePodSandbox", gone_new[0]),
    ]


async def test_minimum_age_is_measured_with_the_clock(node: Node) -> None:
    node.desired = {"u1"}
    pod = await node.pod("u1")
    dead = [await node.container(pod, "c", i, dead=True) for i in range(3)]
    gc = node.gc(ContainerGCSettings(min_age_s=60))

    assert (await gc.collect()).containers_removed == 0
    node.clock.now += 61
    assert (await gc.collect()).containers_removed == 2
    assert set(node.cri.containers) == {dead[2]}


async def test_a_container_that_cannot_be_removed_keeps_its_sandbox(node: Node) -> None:
    node.desired = set()
    pod = await node.pod("gone")
    cid = await node.container(pod, "c", 0, dead=True)
    await node.cri.stop_pod_sandbox(pod[0])
    node.cri.fail_next("RemoveContainer", CRIError("device busy"))

    result = await node.gc().collect()

    assert cid in node.cri.containers and pod[0] in node.cri.sandboxes
    assert not node.cri.calls_of("RemovePodSandbox")
    assert result.errors == 1 and result.containers_removed == 0
    assert (await node.gc().collect()).sandboxes_removed == 1  # the next pass finishes
    assert not node.cri.containers and not node.cri.sandboxes


async def test_free_reports_writable_layer_bytes_and_empties_terminated_pods(node: Node) -> None:
    node.desired = {"done", "live"}
    node.terminated = {"done"}
    done = await node.pod("done")
    d0 = await node.container(done, "c", 0, dead=True)
    d1 = await node.container(done, "c", 1, dead=True)
    await node.cri.stop_pod_sandbox(done[0])
    live = await node.pod("live")
    l0 = await node.container(live, "c", 0, dead=True)
    l1 = await node.container(live, "c", 1, dead=True)
    stats = Stats({d0: 1000, d1: 2000, l0: 300, l1: None})
    gc = node.gc(stats=stats)

    assert await gc.free(0) == (0, 0) and not node.cri.calls_of("RemoveContainer")
    assert await gc.free(5000) == (3300, 3)
    assert set(node.cri.containers) == {l1}  # the live pod keeps its newest dead one
    assert set(node.cri.sandboxes) == {live[0]}  # the terminated pod's sandbox is gone
    assert (node.logs / "ns_p-done_done").is_dir()  # still desired: logs stay


async def test_collect_does_not_empty_terminated_pods(node: Node) -> None:
    node.desired = {"done"}
    node.terminated = {"done"}
    done = await node.pod("done")
    await node.container(done, "c", 0, dead=True)
    newest = await node.container(done, "c", 1, dead=True)
    await node.cri.stop_pod_sandbox(done[0])

    result = await node.gc().collect()

    assert set(node.cri.containers) == {newest} and done[0] in node.cri.sandboxes
    assert result.containers_removed == 1


async def test_unknown_sizes_count_as_zero_bytes(node: Node) -> None:
    node.desired = set()
    pod = await node.pod("gone")
    await node.container(pod, "c", 0, dead=True)
    await node.cri.stop_pod_sandbox(pod[0])
    stats = Stats({})
    stats.error = CRIError("stats unavailable")

    assert await node.gc(stats=stats).free(1) == (0, 1)
    assert not node.cri.containers


def test_terminated_uids_are_those_with_a_terminal_phase() -> None:
    def rec(uid: str, phase: str) -> PodStatusRecord:
        return PodStatusRecord(
            uid=PodUID(uid),
            namespace="ns",
            name=uid,
            version=1,
            epoch=0.0,
            status={"phase": phase},
            updated_at=0.0,
        )

    table = {u: rec(u, p) for u, p in [("a", "Running"), ("b", "Succeeded"), ("c", "Failed")]}
    assert terminated_uids(table) == {"b", "c"}


async def test_a_pod_syncloop_is_still_removing_is_left_to_it(node: Node) -> None:
    """issue 42: in a mass teardown a pass found pods syncloop had stopped and was
    removing; it stopped and removed them too, and syncloop's own RemovePodSandbox failed
    ("already in removing state") and was retried. A pod whose status row syncloop still
    holds is now left alone, and removed by a later pass once syncloop has forgotten it."""
    pod = await node.pod("u1")
    dead = await node.container(pod, "c", 0, dead=True)
    await node.cri.stop_pod_sandbox(pod[0])
    node.held = {"u1"}
    node.cri.calls.clear()

    result = await node.gc().collect()

    assert node.cri.calls_of("StopPodSandbox") == []
    assert node.cri.calls_of("RemovePodSandbox") == []
    assert node.cri.calls_of("RemoveContainer") == []
    assert result.containers_removed == 0 and result.sandboxes_removed == 0
    assert (node.logs / "ns_p-u1_u1").is_dir()

    node.held = set()
    result = await node.gc().collect()
    assert dead not in node.cri.containers and pod[0] not in node.cri.sandboxes
    assert result.sandboxes_removed == 1 and result.log_dirs_removed == 1
