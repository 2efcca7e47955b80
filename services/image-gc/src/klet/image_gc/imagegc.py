"""The image GC manager: image records kept current from CRI, GC passes, space on demand.

The I/O shell around `imageselect`: it lists images and containers through CRI, keeps
one `ImageRecord` per image (first detected, last used, size, pinned), persists the
times in the bus's `images` table so that a restarted image-gc keeps the LRU order, and
removes images through CRI RemoveImage. Three entry points, serialised by one lock so a
pass and a FreeSpace never remove concurrently:

- `detect()`: refresh the records (every 5 minutes, and at the start of the others);
- `garbage_collect()`: one periodic pass (imageMaximumGCAge, then the thresholds),
  returning what it removed and the error upstream would report; the thresholds' failure
  is also a `FreeDiskSpaceFailed` node event, a zero capacity `InvalidDiskCapacity`;
- `free_space(bytes)`: the eviction service's reclaim, same order, bounded by a deadline;
- `plan(policy)`: what a periodic pass would remove now (`klet gc --dry-run`), from a
  detection of its own that neither replaces the records nor writes the `images` table,
  and `imageselect.plan_pass`, the pass's own decisions; nothing is removed.

Nothing is removed while `sources_ready()` is False: a pod that a source has not
delivered yet may be about to use an image that looks unused. A failed removal is
logged and skipped (upstream continues despite errors); a bus outage only delays the
persistence, the in-memory records stay authoritative.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from klet.cri.errors import CRIError
from klet.cri.types import Container, ImageInfo
from klet.image_gc.imageselect import (
    REASON_AGE,
    REASON_SPACE,
    FsUsage,
    ImageGCPolicy,
    ImageRecord,
    age_victims,
    bytes_to_free,
    detect,
    eviction_order,
    fs_usage_percent,
    images_in_use,
    plan_pass,
    plan_space,
    space_candidates,
)
from klet.model.records import ImageUseRecord
from klet.model.types import ImageRef, SandboxID
from klet.obs import OnceLogger

log = logging.getLogger(__name__)

EVENT_FREE_DISK_SPACE_FAILED = "FreeDiskSpaceFailed"
EVENT_INVALID_DISK_CAPACITY = "InvalidDiskCapacity"


class ImageRuntime(Protocol):
    """The CRI calls image GC makes (RuntimeClient and FakeRuntimeService have them)."""

    async def list_images(self) -> list[ImageInfo]: ...

    async def list_containers(
        self, *, sandbox_id: SandboxID | None = None, label_selector: dict[str, str] | None = None
    ) -> list[Container]: ...

    async def remove_image(self, image: str) -> None: ...


class ImageUseStore(Protocol):
    """Where the records' times survive a restart (the bus's `images` table)."""

    async def load(self) -> dict[str, ImageUseRecord]: ...

    async def save(self, changed: Sequence[ImageUseRecord], removed: Sequence[str]) -> None: ...


FsStats = Callable[[], Awaitable[FsUsage]]
"""The image filesystem's capacity and available bytes."""
SandboxImage = Callable[[], Awaitable[str]]
"""The runtime's sandbox (pause) image name ("" when unknown)."""
NodeEvent = Callable[[str, str, str], None]
"""Record a node event: (type, reason, message)."""


@dataclass(frozen=True)
class ImageGCResult:
    """What one pass or one FreeSpace did; `error` is upstream's error text, if any."""

    images_removed: int = 0
    bytes_freed: int = 0
    error: str = ""


@dataclass(frozen=True)
class ImagePlan:
    """What `plan` found: the filesystem, the records' order, and the pass's plan."""

    sources_ready: bool
    fs: FsUsage | None = None
    age: tuple[ImageRecord, ...] = ()
    space: tuple[ImageRecord, ...] = ()
    bytes_to_free: int = 0
    problem: str = ""


@dataclass
class _Removal:
    freed: int = 0
    removed: int = 0
    errors: list[str] = field(default_factory=list)


class ImageGCManager:
    def __init__(
        self,
        runtime: ImageRuntime,
        *,
        policy: ImageGCPolicy,
        fs_stats: FsStats,
        sandbox_image: SandboxImage,
        store: ImageUseStore,
        events: NodeEvent,
        sources_ready: Callable[[], Awaitable[bool]],
        on_removed: Callable[[str], None] = lambda _reason: None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.runtime = runtime
        self.policy = policy
        self.fs_stats = fs_stats
        self.sandbox_image = sandbox_image
        self.store = store
        self.events = events
        self.sources_ready = sources_ready
        self.on_removed = on_removed
        self.clock = clock
        self.monotonic = monotonic
        self.began = clock()
        """When GC began; imageMaximumGCAge waits until the service is up that long."""
        self.records: dict[ImageRef, ImageRecord] = {}
        self._loaded = False
        self._resync_store = False
        self._sandbox = ""
        self._lock = asyncio.Lock()
        self._store_errors = OnceLogger(log, level=logging.WARNING)

    # -- detection ---------------------------------------------------------------------

    async def detect(self) -> set[ImageRef]:
        """Refresh the records now; returns the IDs of the images in use."""
        async with self._lock:
            return await self._detect(self.clock())

    async def _detect(self, now: float) -> set[ImageRef]:
        if not self._loaded:
            await self._load()
        images = await self.runtime.list_images()
        containers = await self.runtime.list_containers()
        sandbox = await self._sandbox_image()
        in_use = images_in_use(images, containers)
        before = self.records
        self.records = detect(before, images, in_use, now=now, sandbox_image=sandbox)
        changed = [
            r
            for r in self.records.values()
            if (old := before.get(r.id)) is None
            or (old.first_detected, old.last_used) != (r.first_detected, r.last_used)
        ]
        gone = [i for i in before if i not in self.records]
        await self._persist(changed, gone)
        log.debug(
            "images detected",
            extra={"images": len(self.records), "in_use": len(in_use), "sandbox_image": sandbox},
        )
        return in_use

    async def _load(self) -> None:
        try:
            stored = await self.store.load()
        except Exception as err:  # noqa: BLE001 - the bus is optional for detection
            self._store_errors.error("load", f"cannot read image records: {err}")
            return
        # Placeholders: the next detection fills size and pinned and keeps the times. An
        # image already seen by this process (the table was unreadable before) keeps the
        # earlier detection and the later use of the two.
        merged = dict(self.records)
        for key, row in stored.items():
            ref = ImageRef(key)
            mine = merged.get(ref)
            merged[ref] = ImageRecord(
                id=ref,
                first_detected=min(row.first_detected, mine.first_detected)
                if mine is not None
                else row.first_detected,
                last_used=max(row.last_used, mine.last_used) if mine is not None else row.last_used,
                size=mine.size if mine is not None else 0,
                pinned=mine.pinned if mine is not None else False,
                tags=mine.tags if mine is not None else (),
            )
        self.records = merged
        self._loaded = True
        self._store_errors.clear("load", "image records read")

    async def _persist(self, changed: Sequence[ImageRecord], gone: Sequence[str]) -> None:
        try:
            if self._resync_store:
                stored = await self.store.load()
                changed = list(self.records.values())
                gone = [k for k in stored if k not in self.records]
            await self.store.save(
                [
                    ImageUseRecord(id=r.id, first_detected=r.first_detected, last_used=r.last_used)
                    for r in changed
                ],
                list(gone),
            )
        except Exception as err:  # noqa: BLE001 - kept in memory; written in full later
            self._resync_store = True
            self._store_errors.error("save", f"cannot write image records: {err}")
            return
        self._resync_store = False
        self._store_errors.clear("save", "image records written")

    async def _sandbox_image(self) -> str:
        try:
            self._sandbox = await self.sandbox_image()
        except CRIError:
            if not self._sandbox:
                raise  # never guess: without it the pause image would look unused
        return self._sandbox

    # -- removal -----------------------------------------------------------------------

    async def garbage_collect(self) -> ImageGCResult:
        """One periodic pass: images past imageMaximumGCAge, then the thresholds."""
        async with self._lock:
            now = self.clock()
            try:
                in_use = await self._detect(now)
            except CRIError as err:
                return ImageGCResult(error=str(err))
            if not await self.sources_ready():
                log.info("image GC waits until every pod source is ready")
                return ImageGCResult()
            order = eviction_order(self.records, in_use)
            old = await self._remove(
                age_victims(order, self.policy, now=now, began=self.began), None, REASON_AGE
            )
            if old.errors:
                return ImageGCResult(
                    old.removed,
                    old.freed,
                    f"wanted to free images older than {self.policy.max_age_s:g}s, "
                    f"encountered errors in image deletion: {'; '.join(old.errors)}",
                )
            try:
                fs = await self.fs_stats()
            except (CRIError, OSError) as err:
                return ImageGCResult(old.removed, old.freed, f"cannot read image fs stats: {err}")
            if fs.capacity <= 0:
                message = "invalid capacity 0 on image filesystem"
                self.events("Warning", EVENT_INVALID_DISK_CAPACITY, message)
                return ImageGCResult(old.removed, old.freed, message)
            target = bytes_to_free(fs, self.policy)
            if target <= 0:
                return ImageGCResult(old.removed, old.freed)
            log.info(
                "Disk usage on image filesystem is over the high threshold, trying to free "
                "bytes down to the low threshold",
                extra={
                    "usage": fs_usage_percent(fs),
                    "highThreshold": self.policy.high_threshold_percent,
                    "amountToFree": target,
                    "lowThreshold": self.policy.low_threshold_percent,
                },
            )
            remaining = [r for r in order if r.id in self.records]
            space = await self._remove(
                space_candidates(remaining, self.policy, now=now), target, REASON_SPACE
            )
            removed, freed = old.removed + space.removed, old.freed + space.freed
            if space.errors:
                return ImageGCResult(
                    removed,
                    freed,
                    f"wanted to free {target} bytes, but freed {space.freed} bytes space with "
                    f"errors in image deletion: {'; '.join(space.errors)}",
                )
            if space.freed < target:
                message = (
                    "Failed to garbage collect required amount of images. Attempted to free "
                    f"{target} bytes, but only found {space.freed} bytes eligible to free."
                )
                self.events("Warning", EVENT_FREE_DISK_SPACE_FAILED, message)
                return ImageGCResult(removed, freed, message)
            return ImageGCResult(removed, freed)

    async def plan(self, policy: ImageGCPolicy | None = None) -> ImagePlan:
        """What one periodic pass under `policy` (default: the service's) would remove
        now. Reads CRI and the filesystem only; raises CRIError as a pass would fail."""
        policy = policy or self.policy
        now = self.clock()
        images = await self.runtime.list_images()
        containers = await self.runtime.list_containers()
        in_use = images_in_use(images, containers)
        records = detect(
            self.records, images, in_use, now=now, sandbox_image=await self._sandbox_image()
        )
        if not await self.sources_ready():
            return ImagePlan(sources_ready=False)
        try:
            fs = await self.fs_stats()
        except (CRIError, OSError) as err:
            return ImagePlan(True, problem=f"cannot read image fs stats: {err}")
        if fs.capacity <= 0:
            return ImagePlan(True, fs, problem="invalid capacity 0 on image filesystem")
        if not policy.periodic:
            return ImagePlan(
                True, fs, problem="image GC is off: imageGCHighThresholdPercent is 100"
            )
        decided = plan_pass(eviction_order(records, in_use), policy, fs, now=now, began=self.began)
        problem = ""
        if decided.eligible < decided.bytes_to_free:
            problem = (
                "Failed to garbage collect required amount of images. Attempted to free "
                f"{decided.bytes_to_free} bytes, but only found {decided.eligible} bytes "
                "eligible to free."
            )
        return ImagePlan(True, fs, decided.age, decided.space, decided.bytes_to_free, problem)

    async def free_space(
        self, bytes_to_free: int, *, deadline: float | None = None
    ) -> ImageGCResult:
        """Remove unused images in GC order until `bytes_to_free` bytes are freed, no
        candidate is left, or the monotonic `deadline` passes."""
        if bytes_to_free <= 0:
            return ImageGCResult()
        async with self._lock:
            now = self.clock()
            try:
                in_use = await self._detect(now)
            except CRIError as err:
                return ImageGCResult(error=str(err))
            if not await self.sources_ready():
                return ImageGCResult(error="pod sources are not ready; nothing is removed yet")
            candidates = space_candidates(
                eviction_order(self.records, in_use), self.policy, now=now
            )
            done = await self._remove(candidates, bytes_to_free, REASON_SPACE, deadline=deadline)
            error = ""
            if done.errors:
                error = (
                    f"wanted to free {bytes_to_free} bytes, but freed {done.freed} bytes space "
                    f"with errors in image deletion: {'; '.join(done.errors)}"
                )
            return ImageGCResult(done.removed, done.freed, error)

    async def _remove(
        self,
        candidates: Sequence[ImageRecord],
        target: int | None,
        reason: str,
        *,
        deadline: float | None = None,
    ) -> _Removal:
        """Remove `candidates` in order until `target` bytes are freed (None: all).

        The plan is the shortest prefix reaching what is still missing; an image that
        cannot be removed is skipped and the plan extended from the remaining ones."""
        done = _Removal()
        gone: list[str] = []
        pending = list(candidates)
        while pending and (target is None or done.freed < target):
            plan = pending if target is None else plan_space(pending, target - done.freed)
            pending = pending[len(plan) :]
            for r in plan:
                if deadline is not None and self.monotonic() >= deadline:
                    log.info("freeing space stopped at its deadline", extra={"freed": done.freed})
                    pending = []
                    break
                if await self._remove_one(r, reason, done):
                    gone.append(r.id)
        if gone:
            await self._persist([], gone)
        return done

    async def _remove_one(self, r: ImageRecord, reason: str, done: _Removal) -> bool:
        log.info(
            "Removing image to free bytes",
            extra={"imageID": r.id, "image": r.name, "size": r.size, "reason": reason},
        )
        try:
            await self.runtime.remove_image(r.id)
        except CRIError as err:
            log.warning("image removal failed", extra={"imageID": r.id, "error": str(err)})
            done.errors.append(f"{r.id}: {err}")
            return False
        self.records.pop(r.id, None)
        done.freed += r.size
        done.removed += 1
        self.on_removed(reason)
        return True
