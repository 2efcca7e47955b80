"""The GC dry-run (`klet gc --dry-run`): `imageselect.plan_pass` decides as a periodic
image pass does (age victims first, the filesystem then credited with their sizes, the
space candidates down to the low threshold, a shortfall named in upstream's words, off
at a high threshold of 100); `ContainerGC.plan` lists exactly what `collect` then
removes, with writable-layer and log sizes, and removes nothing; `ImageGCManager.plan`
neither removes images nor writes the `images` table nor replaces its records;
`Collector.plan_collection` puts both in the passes' order, answers for another high
threshold (lowering the low one to it), refuses an invalid one, and counts nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from klet.image_gc.collector import Collector
from klet.image_gc.containerselect import ContainerGCSettings
from klet.image_gc.imageselect import FsUsage, ImageGCPolicy, ImageRecord, plan_pass
from klet.image_gc.metrics import create_metrics
from klet.model.types import ImageRef
from klet.rpc.gc import InvalidRequest
from prometheus_client import CollectorRegistry

from tests.unit.image_gc.test_containergc import Node, Stats
from tests.unit.image_gc.test_imagegc import MIB, PAUSE, Harness


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def rec(name: str, *, size: int, last_used: float = 0.0, first: float = 0.0) -> ImageRecord:
    return ImageRecord(ImageRef(name), first, last_used, size, False, (name,))


NOW = 100_000.0
ORDER = [rec("a", size=10), rec("b", size=20, last_used=50), rec("c", size=30, last_used=60)]


@pytest.mark.parametrize(
    ("policy", "fs", "began", "age", "space", "target", "eligible"),
    [
        # below the high threshold: nothing
        (ImageGCPolicy(85, 80, 0), FsUsage(1000, 500), NOW, [], [], 0, 0),
        # 95% used: free down to 80% (200 - 50 = 150 bytes), everything is not enough
        (ImageGCPolicy(85, 80, 0), FsUsage(1000, 50), NOW, [], ["a", "b", "c"], 150, 60),
        # a small shortfall: the shortest prefix that reaches it
        (ImageGCPolicy(85, 84, 0), FsUsage(1000, 150), NOW, [], ["a"], 10, 60),
        (ImageGCPolicy(85, 84, 0), FsUsage(1000, 135), NOW, [], ["a", "b"], 25, 60),
        # imageMinimumGCAge keeps images first detected less than it ago
        (ImageGCPolicy(85, 80, NOW + 1), FsUsage(1000, 50), NOW, [], [], 150, 0),
        # imageMaximumGCAge: "a" (never used, detected at 0) goes for age, credited
        # before the thresholds are measured: 190 + 10 = 200 available -> 0 to free
        (ImageGCPolicy(85, 80, 0, NOW - 55), FsUsage(1000, 190), 0.0, ["a", "b"], [], 0, 0),
        # a high threshold of 100 turns the periodic pass off
        (ImageGCPolicy(100, 80, 0, 1), FsUsage(1000, 0), 0.0, [], [], 0, 0),
    ],
)
def test_plan_pass(
    policy: ImageGCPolicy,
    fs: FsUsage,
    began: float,
    age: list[str],
    space: list[str],
    target: int,
    eligible: int,
) -> None:
    plan = plan_pass(ORDER, policy, fs, now=NOW, began=began)
    assert [r.id for r in plan.age] == age
    assert [r.id for r in plan.space] == space
    assert (plan.bytes_to_free, plan.eligible) == (target, eligible)


async def test_container_plan_is_what_collect_then_removes(node: Node) -> None:
    node.desired = {"keep"}
    keep = await node.pod("keep")
    old = await node.container(keep, "c", 0, dead=True)
    await node.container(keep, "c", 1, dead=True)  # the newest dead one is kept
    gone = await node.pod("gone")
    gone_c = await node.container(gone, "c", 0, dead=True)
    await node.cri.stop_pod_sandbox(gone[0])
    gc = node.gc(stats=Stats({old: 4096, gone_c: None}))
    before = (set(node.cri.containers), set(node.cri.sandboxes), sorted(node.logs.iterdir()))
    node.cri.calls.clear()

    plan = await gc.plan()

    assert not [c for c in node.cri.calls if not c[0].startswith(("List", "ContainerStats"))]
    assert (
        set(node.cri.containers),
        set(node.cri.sandboxes),
        sorted(node.logs.iterdir()),
    ) == before
    assert [c.id for c in plan.decision.containers] == [old, gone_c]
    assert [s.id for s in plan.decision.sandboxes] == [gone[0]]
    assert dict(plan.container_bytes) == {old: 4096}
    assert dict(plan.log_dir_bytes) == {"ns_p-gone_gone": len("hello\n")}

    result = await gc.collect()
    assert result.containers_removed == 2 and result.sandboxes_removed == 1
    assert set(before[0]) - set(node.cri.containers) == {old, gone_c}
    assert set(before[1]) - set(node.cri.sandboxes) == {gone[0]}


async def test_container_plan_waits_for_the_sources(node: Node) -> None:
    node.ready = False
    assert not (await node.gc().plan()).sources_ready


async def test_image_plan_removes_and_writes_nothing() -> None:
    h = Harness(capacity=100 * MIB, base=40 * MIB)
    h.add(PAUSE, 2)
    for name in ("a", "b", "c"):
        await h.add_detected(f"r/{name}:1", 10)
    await h.use("r/c:1", running=True)
    h.clock.now += 1000
    records = dict(h.manager.records)
    saves = h.store.saves
    h.add("r/new:1", 10)  # listed by the runtime, not detected by the service yet

    plan = await h.manager.plan()

    # 40 + 2 + 40 = 82 MiB used < 85%: nothing for space
    assert plan.space == () and plan.bytes_to_free == 0
    assert h.manager.records == records and h.store.saves == saves
    high = await h.manager.plan(ImageGCPolicy(50, 40, 120))
    # down to 40% = 60 MiB available from 18: 42 MiB; "new" is younger than the minimum age
    assert [r.name for r in high.space] == ["r/a:1", "r/b:1"]
    assert high.bytes_to_free == 42 * MIB
    assert "only found 20971520 bytes eligible" in high.problem
    assert h.present() == {PAUSE, "r/a:1", "r/b:1", "r/c:1", "r/new:1"}
    assert h.manager.records == records and h.store.saves == saves and not h.events


class Containers:
    def __init__(self, node: Node, gc_settings: ContainerGCSettings) -> None:
        self.gc = node.gc(gc_settings)

    async def collect(self) -> object:
        raise AssertionError("a dry-run must not run a pass")

    async def free(self, bytes_to_free: int) -> tuple[int, int]:
        raise AssertionError("a dry-run must not free")

    async def plan(self) -> object:
        return await self.gc.plan()


async def test_plan_collection_orders_and_counts_nothing(node: Node) -> None:
    gone = await node.pod("gone")
    await node.container(gone, "c", 0, dead=True)
    await node.cri.stop_pod_sandbox(gone[0])
    h = Harness(capacity=100 * MIB, base=40 * MIB)
    for name in ("a", "b"):
        await h.add_detected(f"r/{name}:1", 10)
    h.clock.now += 1000
    registry = CollectorRegistry()
    c = Collector(
        containers=Containers(node, ContainerGCSettings()),  # type: ignore[arg-type]
        images=h.manager,
        metrics=create_metrics(registry),
        events=lambda t, r, m: h.events.append((t, r, m)),
    )
    plan = await c.plan_collection(30)
    assert (plan.high_threshold_percent, plan.low_threshold_percent) == (30, 30)
    assert [(r.kind, r.pod, r.reason) for r in plan.removals] == [
        ("container", "ns/p-gone", "dead, pod gone"),
        ("sandbox", "ns/p-gone", "inactive, pod gone"),
        ("log-dir", "ns/p-gone", "pod gone"),
        ("image", "", "space: least recently used"),
        ("image", "", "space: least recently used"),
    ]
    assert plan.removals[2].bytes == len("hello\n")
    assert plan.removals[0].bytes is None  # no stats reader: size unknown
    assert [r.name for r in plan.removals[3:]] == ["r/a:1", "r/b:1"]
    assert plan.image_fs_usage_percent == 60 and plan.sources_ready
    assert registry.get_sample_value("klet_container_gc_containers_removed_total") == 0
    assert len(node.cri.containers) == 1 and h.present() == {"r/a:1", "r/b:1"}
    with pytest.raises(InvalidRequest, match="--threshold 101: imageGCHighThresholdPercent"):
        await c.plan_collection(101)
