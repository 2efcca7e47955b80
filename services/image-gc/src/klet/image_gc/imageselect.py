"""Image GC decisions, pure: which images are in use, in what order unused images go,
which of them a pass removes, and how much space the image filesystem must give back.

Upstream's image GC manager (pkg/kubelet/images) restated as functions of observations
and time, so every rule has a table-driven test:

- **Detection** (`detect`): every image the runtime lists gets a record; a new one is
  first detected now; an image that any container uses (running or not) was last used
  now; size and pinned come from the runtime each time; records of images that are gone
  are dropped. The sandbox image counts as pinned (containerd 1.6 does not pin it).
- **Eviction order** (`eviction_order`): unused, unpinned images, least recently used
  first, ties broken by the earliest first detection (then by ID, so the order is
  total and a test can rely on it).
- **Space** (`space_candidates`, `plan_space`): an image used at or after the pass's
  time, or first detected less than imageMinimumGCAge ago, is skipped; the others go in
  order until the freed sizes reach the target.
- **Age** (`age_victims`): with imageMaximumGCAge set, once the service has been up that
  long, every image in the order unused for longer than it goes. An image never seen in
  use counts as unused since it was first detected (upstream compares against a zero
  last-used time, which would remove a just-pulled image at once).
- **Thresholds** (`fs_usage`, `bytes_to_free`): usage is `100 - available*100/capacity`
  in integer percent; at or above the high threshold the pass frees
  `capacity*(100-low)/100 - available` bytes.

Times are Unix seconds (floats); sizes are bytes as the runtime reports them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from klet.cri.types import Container, ImageInfo
from klet.model.types import ImageRef

REASON_AGE = "age"
REASON_SPACE = "space"
"""Reasons of `kubelet_image_garbage_collected_total`, as upstream."""


class PolicyError(ValueError):
    """An image GC policy that upstream's NewImageGCManager would refuse; names the field."""


@dataclass(frozen=True)
class ImageGCPolicy:
    """The band image GC keeps the image filesystem in (upstream ImageGCPolicy).

    Validated at construction, each problem naming the KubeletConfiguration field.
    """

    high_threshold_percent: int = 85
    """imageGCHighThresholdPercent: usage (percent) at or above which a pass frees space;
    100 turns the periodic pass off."""
    low_threshold_percent: int = 80
    """imageGCLowThresholdPercent: usage (percent) a pass frees space down to."""
    min_age_s: float = 120.0
    """imageMinimumGCAge: seconds since first detection before an image may go."""
    max_age_s: float = 0.0
    """imageMaximumGCAge: seconds unused after which an image goes regardless of space
    (0 = off)."""

    def __post_init__(self) -> None:
        problems = []
        if not 0 <= self.high_threshold_percent <= 100:
            problems.append(
                f"imageGCHighThresholdPercent: must be in range [0-100], "
                f"got {self.high_threshold_percent}"
            )
        if not 0 <= self.low_threshold_percent <= 100:
            problems.append(
                f"imageGCLowThresholdPercent: must be in range [0-100], "
                f"got {self.low_threshold_percent}"
            )
        if self.low_threshold_percent > self.high_threshold_percent:
            problems.append(
                f"imageGCLowThresholdPercent: {self.low_threshold_percent} can not be higher "
                f"than imageGCHighThresholdPercent {self.high_threshold_percent}"
            )
        if self.min_age_s < 0:
            problems.append(f"imageMinimumGCAge: must not be negative, got {self.min_age_s:g}s")
        if self.max_age_s < 0:
            problems.append(f"imageMaximumGCAge: must not be negative, got {self.max_age_s:g}s")
        if problems:
            raise PolicyError("; ".join(problems))

    @property
    def periodic(self) -> bool:
        """Whether the periodic pass runs (upstream: a high threshold of 100 disables it)."""
        return self.high_threshold_percent < 100


@dataclass(frozen=True)
class ImageRecord:
    """What image GC knows of one image."""

    id: ImageRef
    first_detected: float
    last_used: float  # 0.0 = never seen in use
    size: int
    pinned: bool
    tags: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """A readable name for logs: the first tag, else the ID."""
        return self.tags[0] if self.tags else self.id


@dataclass(frozen=True)
class FsUsage:
    """The image filesystem: total and available bytes (statfs of its mount point)."""

    capacity: int
    available: int
    mountpoint: str = ""


def images_in_use(images: Iterable[ImageInfo], containers: Iterable[Container]) -> set[ImageRef]:
    """IDs of the images some container (in any state) was created from."""
    by_name: dict[str, ImageRef] = {}
    ids = set()
    for image in images:
        ids.add(image.id)
        for name in (*image.repo_tags, *image.repo_digests):
            by_name[name] = image.id
    used: set[ImageRef] = set()
    for c in containers:
        if c.image_ref in ids:
            used.add(ImageRef(c.image_ref))
        elif c.image in ids:
            used.add(ImageRef(c.image))
        elif c.image in by_name:
            used.add(by_name[c.image])
    return used


def is_sandbox_image(image: ImageInfo, sandbox_image: str) -> bool:
    if not sandbox_image:
        return False
    return sandbox_image == image.id or sandbox_image in (*image.repo_tags, *image.repo_digests)


def detect(
    records: Mapping[ImageRef, ImageRecord],
    images: Sequence[ImageInfo],
    in_use: set[ImageRef],
    *,
    now: float,
    sandbox_image: str = "",
) -> dict[ImageRef, ImageRecord]:
    """The records after one detection (upstream detectImages)."""
    out: dict[ImageRef, ImageRecord] = {}
    for image in images:
        old = records.get(image.id)
        first = old.first_detected if old is not None else now
        last = now if image.id in in_use else (old.last_used if old is not None else 0.0)
        out[image.id] = ImageRecord(
            id=image.id,
            first_detected=first,
            last_used=last,
            size=image.size,
            pinned=image.pinned or is_sandbox_image(image, sandbox_image),
            tags=image.repo_tags or image.repo_digests,
        )
    return out


def eviction_order(
    records: Mapping[ImageRef, ImageRecord], in_use: set[ImageRef]
) -> list[ImageRecord]:
    """Unused, unpinned images, least recently used first, then earliest detected."""
    return sorted(
        (r for r in records.values() if r.id not in in_use and not r.pinned),
        key=lambda r: (r.last_used, r.first_detected, r.id),
    )


def space_candidates(
    order: Sequence[ImageRecord], policy: ImageGCPolicy, *, now: float
) -> list[ImageRecord]:
    """The images of `order` a space pass may remove, in order."""
    return [r for r in order if r.last_used < now and now - r.first_detected >= policy.min_age_s]


def plan_space(candidates: Sequence[ImageRecord], bytes_to_free: int) -> list[ImageRecord]:
    """The shortest prefix of `candidates` whose sizes reach `bytes_to_free`, or all."""
    plan: list[ImageRecord] = []
    freed = 0
    for r in candidates:
        if freed >= bytes_to_free:
            break
        plan.append(r)
        freed += r.size
    return plan


def age_victims(
    order: Sequence[ImageRecord], policy: ImageGCPolicy, *, now: float, began: float
) -> list[ImageRecord]:
    """The images imageMaximumGCAge removes now (none until the service is up that long)."""
    if policy.max_age_s <= 0 or now - began <= policy.max_age_s:
        return []
    return [
        r
        for r in order
        if now - (r.last_used if r.last_used > 0 else r.first_detected) > policy.max_age_s
    ]


def fs_usage_percent(fs: FsUsage) -> int:
    """Used percent of the image filesystem, as upstream computes it (capacity > 0)."""
    available = min(fs.available, fs.capacity)
    return 100 - (available * 100) // fs.capacity


def bytes_to_free(fs: FsUsage, policy: ImageGCPolicy) -> int:
    """Bytes a pass must free: 0 below the high threshold, else down to the low one."""
    if fs.capacity <= 0 or fs_usage_percent(fs) < policy.high_threshold_percent:
        return 0
    available = min(fs.available, fs.capacity)
    return max(0, fs.capacity * (100 - policy.low_threshold_percent) // 100 - available)


@dataclass(frozen=True)
class ImagePassPlan:
    """What one periodic image pass would remove (`plan_pass`), nothing removed yet."""

    age: tuple[ImageRecord, ...]
    """imageMaximumGCAge's victims, removed first."""
    space: tuple[ImageRecord, ...]
    """Then, in order, what the thresholds need."""
    bytes_to_free: int
    """What the space part must free, measured after the age part."""
    eligible: int
    """Bytes the space candidates hold in all (below `bytes_to_free`: the pass fails)."""


def plan_pass(
    order: Sequence[ImageRecord],
    policy: ImageGCPolicy,
    fs: FsUsage,
    *,
    now: float,
    began: float,
) -> ImagePassPlan:
    """One periodic pass over `order` (`eviction_order`), as `garbage_collect` runs it,
    assuming every removal succeeds and frees the size the runtime reports: the age
    victims go first, the filesystem is then taken to have gained their sizes, and the
    space candidates of the rest go until the low threshold is reached."""
    if not policy.periodic:
        return ImagePassPlan((), (), 0, 0)
    age = age_victims(order, policy, now=now, began=began)
    gone = {r.id for r in age}
    after = FsUsage(
        fs.capacity, min(fs.capacity, fs.available + sum(r.size for r in age)), fs.mountpoint
    )
    target = bytes_to_free(after, policy)
    candidates = space_candidates([r for r in order if r.id not in gone], policy, now=now)
    space = plan_space(candidates, target) if target > 0 else []
    return ImagePassPlan(
        tuple(age), tuple(space), target, sum(r.size for r in candidates) if target else 0
    )
