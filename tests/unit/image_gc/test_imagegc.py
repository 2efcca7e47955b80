"""The image GC manager against FakeRuntimeService with a fake clock: a pass over the
high threshold removes unused images least recently used first down to the low
threshold and never an image a container uses (running or exited), the sandbox image, a
pinned image or one younger than imageMinimumGCAge; a shortfall is a
FreeDiskSpaceFailed node event with upstream's message; zero capacity is
InvalidDiskCapacity; nothing goes before the pod sources are ready; imageMaximumGCAge
removes long-unused images once the service is up that long; a failed removal is
skipped; FreeSpace stops at its target and its deadline; the records' times survive a
restart through the store and a store outage is written in full later."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from klet.cri.errors import CRIError
from klet.cri.types import ContainerConfig, SandboxConfig
from klet.image_gc.imagegc import ImageGCManager
from klet.image_gc.imageselect import FsUsage, ImageGCPolicy
from klet.model.records import ImageUseRecord
from klet.model.types import ImageRef
from klet.testbed.fakes.cri import FakeRuntimeService

MIB = 1 << 20
PAUSE = "r/pause:3.10"


class Clock:
    def __init__(self, now: float = 10_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Store:
    def __init__(self) -> None:
        self.rows: dict[str, ImageUseRecord] = {}
        self.down = False
        self.saves = 0

    async def load(self) -> dict[str, ImageUseRecord]:
        if self.down:
            raise ConnectionError("redis down")
        return dict(self.rows)

    async def save(self, changed: Sequence[ImageUseRecord], removed: Sequence[str]) -> None:
        if self.down:
            raise ConnectionError("redis down")
        self.saves += 1
        for r in changed:
            self.rows[r.id] = r
        for k in removed:
            self.rows.pop(k, None)


class Disk:
    """An image filesystem whose use is a base plus the images the fake runtime holds."""

    def __init__(self, runtime: FakeRuntimeService, *, capacity: int, base: int) -> None:
        self.runtime = runtime
        self.capacity = capacity
        self.base = base

    async def usage(self) -> FsUsage:
        used = self.base + sum(i.size for i in self.runtime.images.values())
        return FsUsage(capacity=self.capacity, available=max(0, self.capacity - used))


class Harness:
    def __init__(
        self,
        *,
        policy: ImageGCPolicy | None = None,
        capacity: int = 100 * MIB,
        base: int = 10 * MIB,
        store: Store | None = None,
        runtime: FakeRuntimeService | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.clock = clock or Clock()
        self.runtime = runtime or FakeRuntimeService(clock=lambda: int(self.clock.now * 1e9))
        self.disk = Disk(self.runtime, capacity=capacity, base=base)
        self.store = store or Store()
        self.events: list[tuple[str, str, str]] = []
        self.removed_reasons: list[str] = []
        self.ready = True
        self.sandbox = PAUSE
        self.monotonic = 0.0

        async def sources_ready() -> bool:
            return self.ready

        async def sandbox_image() -> str:
            return self.sandbox

        self.manager = ImageGCManager(
            self.runtime,
            policy=policy or ImageGCPolicy(high_threshold_percent=85, low_threshold_percent=80),
            fs_stats=self.disk.usage,
            sandbox_image=sandbox_image,
            store=self.store,
            events=lambda t, r, m: self.events.append((t, r, m)),
            sources_ready=sources_ready,
            on_removed=self.removed_reasons.append,
            clock=self.clock,
            monotonic=lambda: self.monotonic,
        )

    def add(self, ref: str, mib: int) -> ImageRef:
        return self.runtime.add_image(ref, mib * MIB).id

    async def add_detected(self, ref: str, mib: int) -> None:
        """Add `ref` and detect it one second after the previous one (a total order)."""
        self.add(ref, mib)
        await self.manager.detect()
        self.clock.now += 1

    async def use(self, ref: str, *, running: bool) -> None:
        """A container from `ref`: left running, or started and exited."""
        sb_cfg = SandboxConfig(
            ref.replace("/", "-").replace(":", "-"), "default", ref, 0, "h", "/tmp"
        )
        sandbox = await self.runtime.run_pod_sandbox(sb_cfg)
        cid = await self.runtime.create_container(
            sandbox, ContainerConfig(name="c", attempt=0, image=ref), sb_cfg
        )
        await self.runtime.start_container(cid)
        if not running:
            self.runtime.exit_container(cid, 0)

    def present(self) -> set[str]:
        return {t for i in self.runtime.images.values() for t in i.repo_tags}


async def test_pass_over_high_threshold_removes_lru_first_down_to_low() -> None:
    h = Harness()
    h.add(PAUSE, 2)
    for name in ("a", "b", "c", "d", "e"):
        h.add(f"r/{name}:1", 10)
    h.add("r/running:1", 10)
    h.add("r/exited:1", 10)
    await h.use("r/running:1", running=True)
    await h.use("r/exited:1", running=False)
    # Use order c, a, e (oldest first); b and d never used: they are least recent of all.
    for name in ("c", "a", "e"):
        await h.use(f"r/{name}:1", running=False)
        await h.manager.detect()
        h.runtime.containers = {
            k: v for k, v in h.runtime.containers.items() if v.config.image != f"r/{name}:1"
        }
        h.clock.now += 10
    # A pull just now: the next pass detects it first, so it is younger than the minimum age.
    h.clock.now += 200
    h.add("r/young:1", 10)

    # base 10 + pause 2 + 8 images of 10 = 92 MiB of 100: over 85%; low 80% → free ≥ 12 MiB.
    result = await h.manager.garbage_collect()

    assert result.error == ""
    # b and d (never used; b detected first: same detection, so by ID) then nothing more:
    # 20 MiB freed reaches the 12 MiB target after two images.
    assert result.images_removed == 2 and result.bytes_freed == 20 * MIB
    assert h.present() == {
        PAUSE,
        "r/a:1",
        "r/c:1",
        "r/e:1",
        "r/running:1",
        "r/exited:1",
        "r/young:1",
    }
    assert h.removed_reasons == ["space", "space"]
    usage = await h.disk.usage()
    assert usage.capacity - usage.available <= 80 * MIB
    assert h.events == []


async def test_lru_order_among_used_images() -> None:
    h = Harness()
    for name in ("a", "b", "c"):
        h.add(f"r/{name}:1", 25)
    for name in ("b", "c", "a"):  # last used: b longest ago, then c, then a
        await h.use(f"r/{name}:1", running=False)
        await h.manager.detect()
        h.runtime.containers.clear()
        h.clock.now += 300
    # 10 + 75 = 85 MiB: at the high threshold; free to 80 → 5 MiB: one image, b.
    result = await h.manager.garbage_collect()
    assert result.images_removed == 1
    assert h.present() == {"r/a:1", "r/c:1"}


async def test_below_high_threshold_nothing_is_removed() -> None:
    h = Harness()
    h.add("r/a:1", 10)
    h.clock.now += 1000
    await h.manager.detect()
    h.clock.now += 1000
    assert (await h.manager.garbage_collect()).images_removed == 0
    assert h.present() == {"r/a:1"}


async def test_shortfall_is_a_free_disk_space_failed_event() -> None:
    h = Harness()
    h.add("r/in-use:1", 60)
    h.add("r/small:1", 20)
    await h.use("r/in-use:1", running=True)
    await h.manager.detect()
    h.clock.now += 1000
    # 90 MiB used: free 10 MiB; the unused image gives 20.
    assert (await h.manager.garbage_collect()).error == ""
    h.add("r/big:1", 35)
    await h.manager.detect()
    h.clock.now += 1000
    # 105 MiB wanted of 100: available 0, free 20 MiB; big (35) is eligible.
    assert (await h.manager.garbage_collect()).error == ""
    h.add("r/other:1", 35)  # 105 MiB again, but "other" is detected now: too young
    result = await h.manager.garbage_collect()
    message = (
        "Failed to garbage collect required amount of images. Attempted to free "
        f"{20 * MIB} bytes, but only found 0 bytes eligible to free."
    )
    assert result.error == message
    assert h.events == [("Warning", "FreeDiskSpaceFailed", message)]
    assert h.present() == {"r/in-use:1", "r/other:1"}


async def test_zero_capacity_is_an_invalid_disk_capacity_event() -> None:
    h = Harness(capacity=0)
    result = await h.manager.garbage_collect()
    assert result.error == "invalid capacity 0 on image filesystem"
    assert h.events == [
        ("Warning", "InvalidDiskCapacity", "invalid capacity 0 on image filesystem")
    ]


async def test_nothing_is_removed_before_the_sources_are_ready() -> None:
    h = Harness()
    h.add("r/a:1", 80)
    await h.manager.detect()
    h.clock.now += 1000
    h.ready = False
    assert (await h.manager.garbage_collect()).images_removed == 0
    assert (await h.manager.free_space(MIB)).images_removed == 0
    assert h.present() == {"r/a:1"} and h.runtime.calls_of("RemoveImage") == []
    h.ready = True
    assert (await h.manager.garbage_collect()).images_removed == 1


async def test_maximum_age_removes_long_unused_images_once_up_that_long() -> None:
    h = Harness(
        policy=ImageGCPolicy(
            high_threshold_percent=85, low_threshold_percent=80, min_age_s=60, max_age_s=600
        )
    )
    h.add("r/old:1", 1)
    h.add("r/fresh:1", 1)
    await h.use("r/old:1", running=False)
    await h.manager.detect()
    h.runtime.containers.clear()
    h.clock.now += 500
    await h.use("r/fresh:1", running=False)
    await h.manager.detect()
    h.runtime.containers.clear()
    h.clock.now += 200  # the service is up 700 s; old unused 700 s, fresh 200 s
    result = await h.manager.garbage_collect()
    assert result.images_removed == 1 and h.present() == {"r/fresh:1"}
    assert h.removed_reasons == ["age"]


async def test_maximum_age_waits_until_the_service_is_up_that_long() -> None:
    h = Harness(policy=ImageGCPolicy(min_age_s=0, max_age_s=600))
    img = h.runtime.add_image("r/x:1", MIB)
    h.store.rows = {img.id: ImageUseRecord(id=img.id, first_detected=0.0, last_used=1.0)}
    h.clock.now += 300
    assert (await h.manager.garbage_collect()).images_removed == 0
    h.clock.now += 301
    assert (await h.manager.garbage_collect()).images_removed == 1


async def test_pinned_images_are_never_removed() -> None:
    h = Harness()
    info = h.runtime.add_image("r/pinned:1", 90 * MIB)
    h.runtime.images[info.id] = dataclasses.replace(info, pinned=True)
    h.add(PAUSE, 1)
    await h.manager.detect()
    h.clock.now += 1000
    result = await h.manager.garbage_collect()
    assert result.images_removed == 0 and result.error.startswith("Failed to garbage collect")
    assert h.present() == {"r/pinned:1", PAUSE}


async def test_unknown_sandbox_image_blocks_removal() -> None:
    h = Harness()
    h.add(PAUSE, 90)

    async def broken() -> str:
        raise CRIError("Status: UNAVAILABLE")

    h.manager.sandbox_image = broken
    h.clock.now += 1000
    result = await h.manager.garbage_collect()
    assert result.error and result.images_removed == 0 and h.present() == {PAUSE}


async def test_a_failed_removal_is_skipped_and_the_next_image_goes() -> None:
    h = Harness()
    await h.add_detected("r/a:1", 40)
    await h.add_detected("r/b:1", 40)
    h.clock.now += 1000
    h.runtime.fail_next("RemoveImage", CRIError("image is busy"))
    result = await h.manager.garbage_collect()
    assert h.present() == {"r/a:1"}  # a (first in order) failed, b went instead
    assert result.images_removed == 1 and "image is busy" in result.error


async def test_free_space_stops_at_its_target() -> None:
    h = Harness()
    for name in ("a", "b", "c"):
        await h.add_detected(f"r/{name}:1", 5)
    h.clock.now += 1000
    result = await h.manager.free_space(6 * MIB)
    assert result.images_removed == 2 and result.bytes_freed == 10 * MIB
    assert h.present() == {"r/c:1"}
    assert h.removed_reasons == ["space", "space"]
    assert (await h.manager.free_space(0)).images_removed == 0


async def test_free_space_skips_young_images_and_stops_at_its_deadline() -> None:
    h = Harness()
    await h.add_detected("r/a:1", 5)
    await h.add_detected("r/b:1", 5)
    h.clock.now += 1000
    h.add("r/young:1", 5)  # first detected by the FreeSpace below: too young to go

    async def slow() -> None:
        h.monotonic += 10  # each removal takes 10 s

    h.runtime.hooks["RemoveImage"] = slow
    result = await h.manager.free_space(100 * MIB, deadline=5.0)
    assert result.images_removed == 1  # a went; the deadline passed before b
    assert h.present() == {"r/b:1", "r/young:1"}
    result = await h.manager.free_space(100 * MIB)
    assert result.images_removed == 1 and h.present() == {"r/young:1"}


async def test_times_survive_a_restart_through_the_store() -> None:
    clock = Clock()
    first = Harness(clock=clock)
    first.add("r/a:1", 80)
    await first.manager.detect()
    assert set(first.store.rows) == set(first.runtime.images)
    clock.now += 1000
    # A new manager (a restarted image-gc) with the same store and runtime: "a" keeps its
    # detection time, so it is old enough at once.
    second = Harness(clock=clock, store=first.store, runtime=first.runtime)
    assert (await second.manager.garbage_collect()).images_removed == 1
    assert first.store.rows == {}
    # Without the store it would have been "just detected" and kept.
    third = Harness(clock=clock)
    third.add("r/a:1", 80)
    assert (await third.manager.garbage_collect()).images_removed == 0


async def test_a_store_outage_is_written_in_full_later() -> None:
    h = Harness()
    h.store.rows["sha256:stale"] = ImageUseRecord(id="sha256:stale", first_detected=1, last_used=0)
    h.add("r/a:1", 1)
    await h.manager.detect()  # loads (stale is not in the runtime: dropped) and saves
    assert set(h.store.rows) == set(h.runtime.images)
    h.store.down = True
    h.add("r/b:1", 1)
    await h.manager.detect()
    assert len(h.store.rows) == 1
    h.store.down = False
    await h.manager.detect()
    assert set(h.store.rows) == set(h.runtime.images)
