"""The collector behind GarbageCollector and the loops: FreeSpace asks container GC
first and image GC only for what is still missing, CollectNow runs both passes and adds
them up, the passes are counted in the metrics, and a second image GC failure in a row
(not the first) is an ImageGCFailed node event with the error, as upstream's kubelet."""

from __future__ import annotations

from klet.image_gc.collector import Collector
from klet.image_gc.containergc import ContainerGCResult
from klet.image_gc.metrics import create_metrics
from klet.rpc.gc import CollectResult, FreeSpaceResult
from prometheus_client import CollectorRegistry

from tests.unit.image_gc.test_imagegc import MIB, Harness


class Containers:
    def __init__(self, *, frees: int = 0, removes: int = 0) -> None:
        self.frees = frees
        self.removes = removes
        self.asked: list[int] = []
        self.passes = 0

    async def collect(self) -> ContainerGCResult:
        self.passes += 1
        return ContainerGCResult(
            sources_ready=True,
            containers_removed=self.removes,
            sandboxes_removed=1,
            log_dirs_removed=1,
            bytes_freed=self.frees,
        )

    async def free(self, bytes_to_free: int) -> tuple[int, int]:
        self.asked.append(bytes_to_free)
        return self.frees, self.removes


def collector(h: Harness, containers: Containers) -> tuple[Collector, CollectorRegistry]:
    registry = CollectorRegistry()
    return (
        Collector(
            containers=containers,
            images=h.manager,
            metrics=create_metrics(registry),
            events=lambda t, r, m: h.events.append((t, r, m)),
        ),
        registry,
    )


async def images(h: Harness, *names: str) -> None:
    for name in names:
        await h.add_detected(f"r/{name}:1", 5)
    h.clock.now += 1000


async def test_free_space_takes_containers_first_then_images_for_the_rest() -> None:
    h = Harness()
    await images(h, "a", "b", "c")
    containers = Containers(frees=3 * MIB, removes=4)
    c, registry = collector(h, containers)
    result = await c.free_space(7 * MIB)
    # 3 MiB from containers, then images for the missing 4 MiB: one image of 5.
    assert containers.asked == [7 * MIB]
    assert result == FreeSpaceResult(bytes_freed=8 * MIB, containers_removed=4, images_removed=1)
    assert h.present() == {"r/b:1", "r/c:1"}
    assert registry.get_sample_value("klet_gc_freed_bytes_total", {"kind": "images"}) == 5 * MIB
    assert registry.get_sample_value("klet_container_gc_containers_removed_total") == 4


async def test_free_space_met_by_containers_leaves_images_alone() -> None:
    h = Harness()
    await images(h, "a")
    c, _ = collector(h, Containers(frees=10 * MIB, removes=2))
    assert await c.free_space(5 * MIB) == FreeSpaceResult(10 * MIB, 2, 0)
    assert h.present() == {"r/a:1"}
    assert await c.free_space(0) == FreeSpaceResult()


async def test_collect_now_runs_both_passes() -> None:
    h = Harness()
    await images(h, "a", "b")
    h.add("r/big:1", 80)  # young; pushes usage over the threshold
    containers = Containers(frees=MIB, removes=1)
    c, registry = collector(h, containers)
    result = await c.collect_now()
    assert containers.passes == 1
    assert result == CollectResult(containers_removed=1, images_removed=2, bytes_freed=11 * MIB)
    assert registry.get_sample_value("klet_container_gc_sandboxes_removed_total") == 1
    assert registry.get_sample_value("klet_image_gc_duration_seconds_count") == 1
    assert registry.get_sample_value("klet_image_gc_images") == 1


async def test_image_gc_failed_event_only_for_repeated_failures() -> None:
    h = Harness(capacity=0)
    c, registry = collector(h, Containers())
    await c.image_pass()
    assert [e[1] for e in h.events] == ["InvalidDiskCapacity"]
    await c.image_pass()
    assert [e[1] for e in h.events] == [
        "InvalidDiskCapacity",
        "InvalidDiskCapacity",
        "ImageGCFailed",
    ]
    assert h.events[-1] == ("Warning", "ImageGCFailed", "invalid capacity 0 on image filesystem")
    assert registry.get_sample_value("klet_image_gc_failures_total") == 2
    h.disk.capacity = 100 * MIB
    await c.image_pass()
    assert not c.image_failed_before
    h.disk.capacity = 0
    await c.image_pass()
    assert [e[1] for e in h.events].count("ImageGCFailed") == 1  # the streak was broken
