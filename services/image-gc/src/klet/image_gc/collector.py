"""The GarbageCollector behind the gRPC server and the periodic loops: container GC and
image GC composed, counted and reported.

- `free_space(bytes)` (eviction's node-level reclaim): dead containers first, then
  unused images in image GC order for what is still missing, within
  `free_space_timeout_s` for the image part (the container pass is one bounded sweep);
  returns what was freed, which is all a retry needs to be safe.
- `collect_now()`: one container GC pass and one image GC pass.
- `container_pass()` / `image_pass()`: what the periodic loops run. An image pass that
  fails is logged; a second failure in a row is also an `ImageGCFailed` node event with
  the error, as upstream's kubelet does (the first failure is often stats not being
  initialised yet).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from klet.image_gc.containergc import ContainerGCResult
from klet.image_gc.imagegc import ImageGCManager, ImageGCResult, NodeEvent
from klet.image_gc.metrics import Metrics
from klet.rpc.gc import CollectResult, FreeSpaceResult

log = logging.getLogger(__name__)

EVENT_IMAGE_GC_FAILED = "ImageGCFailed"


class ContainerCollector(Protocol):
    """What the collector needs of container GC (containergc.ContainerGC)."""

    async def collect(self) -> ContainerGCResult: ...

    async def free(self, bytes_to_free: int) -> tuple[int, int]: ...


@dataclass(frozen=True)
class CollectorSettings:
    free_space_timeout_s: float = 60.0
    """Seconds FreeSpace may spend removing images before it returns what it freed."""


class Collector:
    def __init__(
        self,
        *,
        containers: ContainerCollector,
        images: ImageGCManager,
        metrics: Metrics,
        events: NodeEvent,
        settings: CollectorSettings = CollectorSettings(),
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.containers = containers
        self.images = images
        self.metrics = metrics
        self.events = events
        self.settings = settings
        self.monotonic = monotonic
        self.image_failed_before = False
        self.last_image_pass: ImageGCResult | None = None

    async def free_space(self, bytes_to_free: int) -> FreeSpaceResult:
        if bytes_to_free <= 0:
            return FreeSpaceResult()
        deadline = self.monotonic() + self.settings.free_space_timeout_s
        c_bytes, c_count = await self.containers.free(bytes_to_free)
        self.metrics.containers_removed.inc(c_count)
        self.metrics.bytes_freed.labels("containers").inc(c_bytes)
        result = ImageGCResult()
        if c_bytes < bytes_to_free:
            result = await self.images.free_space(bytes_to_free - c_bytes, deadline=deadline)
            self.metrics.bytes_freed.labels("images").inc(result.bytes_freed)
            if result.error:
                log.warning("freeing image space failed", extra={"error": result.error})
        self.metrics.images_tracked.set(len(self.images.records))
        freed = FreeSpaceResult(
            bytes_freed=c_bytes + result.bytes_freed,
            containers_removed=c_count,
            images_removed=result.images_removed,
        )
        log.info(
            "freed space on request",
            extra={
                "wanted": bytes_to_free,
                "freed": freed.bytes_freed,
                "containers": freed.containers_removed,
                "images": freed.images_removed,
            },
        )
        return freed

    async def collect_now(self) -> CollectResult:
        c = await self.container_pass()
        i = await self.image_pass()
        return CollectResult(
            containers_removed=c.containers_removed,
            images_removed=i.images_removed,
            bytes_freed=c.bytes_freed + i.bytes_freed,
        )

    async def container_pass(self) -> ContainerGCResult:
        began = time.perf_counter()
        result = await self.containers.collect()
        self.metrics.container_gc_duration.observe(time.perf_counter() - began)
        self.metrics.containers_removed.inc(result.containers_removed)
        self.metrics.sandboxes_removed.inc(result.sandboxes_removed)
        self.metrics.log_dirs_removed.inc(result.log_dirs_removed)
        self.metrics.container_gc_errors.inc(result.errors)
        self.metrics.bytes_freed.labels("containers").inc(result.bytes_freed)
        return result

    async def image_pass(self) -> ImageGCResult:
        began = time.perf_counter()
        result = await self.images.garbage_collect()
        self.metrics.image_gc_duration.observe(time.perf_counter() - began)
        self.metrics.images_tracked.set(len(self.images.records))
        self.metrics.bytes_freed.labels("images").inc(result.bytes_freed)
        self.last_image_pass = result
        if result.error:
            self.metrics.image_gc_failures.inc()
            if self.image_failed_before:
                log.error(
                    "Image garbage collection failed multiple times in a row",
                    extra={"error": result.error},
                )
                self.events("Warning", EVENT_IMAGE_GC_FAILED, result.error)
            else:
                log.error(
                    "Image garbage collection failed once. "
                    "Stats initialization may not have completed yet",
                    extra={"error": result.error},
                )
            self.image_failed_before = True
        else:
            if self.image_failed_before:
                log.info("Image garbage collection succeeded")
            self.image_failed_before = False
        return result
