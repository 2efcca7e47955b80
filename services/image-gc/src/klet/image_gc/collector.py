"""The GarbageCollector behind the gRPC server and the periodic loops: container GC and
image GC composed, counted and reported.

- `free_space(bytes)` (eviction's node-level reclaim): dead containers first, then
  unused images in image GC order for what is still missing, within
  `free_space_timeout_s` for the image part (the container pass is one bounded sweep);
  returns what was freed, which is all a retry needs to be safe.
- `collect_now()`: one container GC pass and one image GC pass.
- `plan_collection(high)`: what `collect_now()` would remove, and the bytes each
  removal frees, without removing anything (`klet gc --dry-run`; `high` answers for
  another imageGCHighThresholdPercent). The container and image managers' own `plan`
  methods run the passes' decision functions on fresh listings.
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

from klet.cri import labels as L
from klet.cri.types import ContainerState
from klet.image_gc import containerselect
from klet.image_gc.containergc import ContainerGCPlan, ContainerGCResult
from klet.image_gc.imagegc import ImageGCManager, ImageGCResult, NodeEvent
from klet.image_gc.imageselect import ImageGCPolicy, PolicyError, fs_usage_percent
from klet.image_gc.metrics import Metrics
from klet.rpc.gc import (
    CollectionPlan,
    CollectResult,
    FreeSpaceResult,
    InvalidRequest,
    PlannedRemoval,
)

log = logging.getLogger(__name__)

EVENT_IMAGE_GC_FAILED = "ImageGCFailed"


class ContainerCollector(Protocol):
    """What the collector needs of container GC (containergc.ContainerGC)."""

    async def collect(self) -> ContainerGCResult: ...

    async def free(self, bytes_to_free: int) -> tuple[int, int]: ...

    async def plan(self) -> ContainerGCPlan: ...


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

    async def plan_collection(self, high_threshold_percent: int | None) -> CollectionPlan:
        """What `collect_now` would remove now; nothing is removed, counted or recorded.
        `high_threshold_percent` replaces imageGCHighThresholdPercent for this answer
        (the low threshold is lowered to it when it was above)."""
        policy = self.images.policy
        if high_threshold_percent is not None:
            try:
                policy = ImageGCPolicy(
                    high_threshold_percent=high_threshold_percent,
                    low_threshold_percent=min(policy.low_threshold_percent, high_threshold_percent),
                    min_age_s=policy.min_age_s,
                    max_age_s=policy.max_age_s,
                )
            except PolicyError as err:
                raise InvalidRequest(f"--threshold {high_threshold_percent}: {err}") from err
        containers = await self.containers.plan()
        images = await self.images.plan(policy)
        fs = images.fs
        return CollectionPlan(
            sources_ready=containers.sources_ready and images.sources_ready,
            high_threshold_percent=policy.high_threshold_percent,
            low_threshold_percent=policy.low_threshold_percent,
            image_fs_capacity=fs.capacity if fs else 0,
            image_fs_available=fs.available if fs else 0,
            image_fs_usage_percent=fs_usage_percent(fs) if fs and fs.capacity > 0 else 0,
            image_fs_mountpoint=fs.mountpoint if fs else "",
            bytes_to_free=images.bytes_to_free,
            removals=(
                *container_removals(containers),
                *(
                    PlannedRemoval("image", r.id, r.name, reason=reason, bytes=r.size)
                    for reason, group in (
                        ("age: unused longer than imageMaximumGCAge", images.age),
                        ("space: least recently used", images.space),
                    )
                    for r in group
                ),
            ),
            problem=images.problem,
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


def _pod(labels: dict[str, str]) -> str:
    return f"{labels.get(L.POD_NAMESPACE, '')}/{labels.get(L.POD_NAME, '')}"


def container_removals(plan: ContainerGCPlan) -> list[PlannedRemoval]:
    """A container pass's decision as planned removals, in the pass's order, each with
    why it goes (pod gone, or beyond the dead instances kept)."""
    gone = plan.decision.removable_pods
    out = []
    for c in plan.decision.containers:
        why = (
            "dead, pod gone"
            if containerselect.pod_uid(c.labels) in gone
            else "dead, beyond the dead instances kept"
        )
        if c.state == ContainerState.UNKNOWN:
            why += " (unknown state: stopped first)"
        out.append(
            PlannedRemoval(
                "container", c.id, c.name, _pod(c.labels), why, plan.container_bytes.get(c.id)
            )
        )
    for s in plan.decision.sandboxes:
        why = (
            "inactive, pod gone"
            if containerselect.pod_uid(s.labels) in gone
            else "inactive, not the pod's newest"
        )
        out.append(PlannedRemoval("sandbox", s.id, s.name, _pod(s.labels), why))
    for name, size in plan.log_dir_bytes.items():
        ns, _, rest = name.partition("_")
        pod = f"{ns}/{rest.rpartition('_')[0]}"
        out.append(PlannedRemoval("log-dir", name, name, pod, "pod gone", size))
    return out
