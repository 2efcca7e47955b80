"""Image GC decisions (imageselect): in-use detection from containers in any state,
record updates on detection (first detected kept, last used moved only when in use,
sandbox image pinned), the LRU-then-oldest eviction order, the minimum age and in-use
skips of a space pass, the shortest prefix reaching the target, imageMaximumGCAge, the
threshold arithmetic as upstream computes it, and policy validation naming the field."""

from __future__ import annotations

import pytest
from klet.cri.types import Container, ContainerState, ImageInfo
from klet.image_gc.imageselect import (
    FsUsage,
    ImageGCPolicy,
    ImageRecord,
    PolicyError,
    age_victims,
    bytes_to_free,
    detect,
    eviction_order,
    fs_usage_percent,
    images_in_use,
    plan_space,
    space_candidates,
)
from klet.model.types import ContainerID, ImageRef, SandboxID

MIB = 1 << 20


def image(
    id_: str, *, tags: tuple[str, ...] = (), size: int = MIB, pinned: bool = False
) -> ImageInfo:
    return ImageInfo(id=ImageRef(id_), repo_tags=tags, repo_digests=(), size=size, pinned=pinned)


def container(image_ref: str, state: ContainerState, *, image_name: str = "") -> Container:
    return Container(
        id=ContainerID(f"c-{image_ref}-{state.name}"),
        sandbox_id=SandboxID("s"),
        name="c",
        attempt=0,
        image=image_name or image_ref,
        image_ref=image_ref,
        state=state,
        created_at=0,
    )


def rec(
    id_: str, *, first: float, last: float = 0.0, size: int = MIB, pinned: bool = False
) -> ImageRecord:
    return ImageRecord(
        id=ImageRef(id_), first_detected=first, last_used=last, size=size, pinned=pinned
    )


IMAGES = [image("sha256:a", tags=("r/a:1",)), image("sha256:b", tags=("r/b:1",)), image("sha256:c")]


@pytest.mark.parametrize(
    ("containers", "expected"),
    [
        ([], set()),
        ([container("sha256:a", ContainerState.RUNNING)], {"sha256:a"}),
        # a dead or never-started container still uses its image
        ([container("sha256:b", ContainerState.EXITED)], {"sha256:b"}),
        ([container("sha256:c", ContainerState.CREATED)], {"sha256:c"}),
        ([container("sha256:a", ContainerState.UNKNOWN)], {"sha256:a"}),
        # no image ref (a runtime that leaves it out): matched by the image name
        ([container("", ContainerState.RUNNING, image_name="r/b:1")], {"sha256:b"}),
        # an image the runtime no longer lists is not "in use" of anything
        ([container("sha256:gone", ContainerState.EXITED)], set()),
        (
            [
                container("sha256:a", ContainerState.EXITED),
                container("sha256:c", ContainerState.RUNNING),
            ],
            {"sha256:a", "sha256:c"},
        ),
    ],
)
def test_images_in_use(containers: list[Container], expected: set[str]) -> None:
    assert images_in_use(IMAGES, containers) == expected


def test_detect_keeps_first_detected_and_moves_last_used_only_when_in_use() -> None:
    before = {
        ImageRef("sha256:a"): rec("sha256:a", first=10, last=20),
        ImageRef("sha256:b"): rec("sha256:b", first=11, last=15),
        ImageRef("sha256:gone"): rec("sha256:gone", first=1, last=2),
    }
    images = [
        image("sha256:a", size=5),
        image("sha256:b", size=6, pinned=True),
        image("sha256:new", tags=("r/pause:3.10",), size=7),
    ]
    after = detect(before, images, {ImageRef("sha256:a")}, now=100, sandbox_image="r/pause:3.10")
    assert set(after) == {"sha256:a", "sha256:b", "sha256:new"}  # "gone" is forgotten
    a, b, new = (
        after[ImageRef("sha256:a")],
        after[ImageRef("sha256:b")],
        after[ImageRef("sha256:new")],
    )
    assert (a.first_detected, a.last_used, a.size, a.pinned) == (10, 100, 5, False)
    assert (b.first_detected, b.last_used, b.size, b.pinned) == (11, 15, 6, True)
    # new: detected now, never used, pinned because it is the sandbox image
    assert (new.first_detected, new.last_used, new.pinned) == (100, 0.0, True)


@pytest.mark.parametrize(
    ("sandbox_image", "pinned"),
    [("", False), ("r/pause:3.10", True), ("sha256:p", True), ("r/other:1", False)],
)
def test_sandbox_image_is_pinned_by_tag_or_id(sandbox_image: str, pinned: bool) -> None:
    out = detect(
        {}, [image("sha256:p", tags=("r/pause:3.10",))], set(), now=1, sandbox_image=sandbox_image
    )
    assert out[ImageRef("sha256:p")].pinned is pinned


@pytest.mark.parametrize(
    ("records", "in_use", "expected"),
    [
        ([], set(), []),
        # least recently used first
        (
            [rec("x", first=1, last=30), rec("y", first=1, last=10), rec("z", first=1, last=20)],
            set(),
            ["y", "z", "x"],
        ),
        # never used (0) before any used one; ties broken by first detection
        (
            [rec("x", first=5, last=10), rec("y", first=9), rec("z", first=3)],
            set(),
            ["z", "y", "x"],
        ),
        # same last-used and first-detected: by ID, so the order is total
        ([rec("b", first=1, last=2), rec("a", first=1, last=2)], set(), ["a", "b"]),
        # in use and pinned images are not candidates at all
        (
            [rec("x", first=1), rec("y", first=1, pinned=True), rec("z", first=2)],
            {"x"},
            ["z"],
        ),
    ],
)
def test_eviction_order(records: list[ImageRecord], in_use: set[str], expected: list[str]) -> None:
    by_id = {r.id: r for r in records}
    order = eviction_order(by_id, {ImageRef(i) for i in in_use})
    assert [r.id for r in order] == expected


POLICY = ImageGCPolicy(high_threshold_percent=85, low_threshold_percent=80, min_age_s=120)


@pytest.mark.parametrize(
    ("order", "now", "expected"),
    [
        # old enough, unused: candidates in the given order
        ([rec("a", first=0, last=50), rec("b", first=0, last=60)], 1000, ["a", "b"]),
        # younger than imageMinimumGCAge: skipped, the next one still counts
        ([rec("young", first=900), rec("old", first=0, last=10)], 1000, ["old"]),
        # exactly the minimum age is old enough (upstream: age < minAge skips)
        ([rec("edge", first=880)], 1000, ["edge"]),
        # used at (or after) the pass's time: skipped
        ([rec("now", first=0, last=1000), rec("later", first=0, last=1001)], 1000, []),
    ],
)
def test_space_candidates(order: list[ImageRecord], now: float, expected: list[str]) -> None:
    assert [r.id for r in space_candidates(order, POLICY, now=now)] == expected


@pytest.mark.parametrize(
    ("sizes", "target", "expected"),
    [
        ([3, 4, 5], 0, 0),
        ([3, 4, 5], 1, 1),
        ([3, 4, 5], 3, 1),
        ([3, 4, 5], 4, 2),
        ([3, 4, 5], 7, 2),
        ([3, 4, 5], 8, 3),
        ([3, 4, 5], 100, 3),  # not enough: everything, the caller reports the shortfall
        ([], 10, 0),
    ],
)
def test_plan_space_takes_the_shortest_prefix(sizes: list[int], target: int, expected: int) -> None:
    candidates = [rec(f"i{n}", first=0, size=s) for n, s in enumerate(sizes)]
    assert plan_space(candidates, target) == candidates[:expected]


@pytest.mark.parametrize(
    ("max_age", "began", "now", "expected"),
    [
        (0, 0, 10_000, []),  # off
        (100, 950, 1000, []),  # the service is not up max_age yet
        (100, 900, 1000, []),  # up exactly max_age: still waits (upstream: <=)
        (100, 0, 1000, ["unused-long", "never-used-old"]),
    ],
)
def test_age_victims(max_age: float, began: float, now: float, expected: list[str]) -> None:
    policy = ImageGCPolicy(min_age_s=0, max_age_s=max_age)
    order = [
        rec("unused-long", first=0, last=800),
        rec("never-used-old", first=850),  # never used: unused since first detected
        rec("recent", first=0, last=950),
        rec("never-used-new", first=990),
    ]
    assert [r.id for r in age_victims(order, policy, now=now, began=began)] == expected


@pytest.mark.parametrize(
    ("capacity", "available", "usage", "to_free"),
    [
        (1000, 1000, 0, 0),
        (1000, 151, 85, 49),  # 84.9% used rounds up to 85 (Go integer division): free to 80%
        (1000, 160, 84, 0),  # below the high threshold: nothing
        (1000, 100, 90, 100),
        (1000, 0, 100, 200),
        (1000, 2000, 0, 0),  # available above capacity counts as capacity
        (0, 0, 0, 0),  # no capacity: nothing to compute (the manager reports it)
    ],
)
def test_thresholds(capacity: int, available: int, usage: int, to_free: int) -> None:
    fs = FsUsage(capacity=capacity, available=available)
    if capacity:
        assert fs_usage_percent(fs) == usage
    assert bytes_to_free(fs, POLICY) == to_free


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"high_threshold_percent": 101}, "imageGCHighThresholdPercent"),
        (
            {"high_threshold_percent": -1, "low_threshold_percent": -1},
            "imageGCHighThresholdPercent",
        ),
        ({"low_threshold_percent": -5}, "imageGCLowThresholdPercent"),
        ({"low_threshold_percent": 90, "high_threshold_percent": 85}, "imageGCLowThresholdPercent"),
        ({"min_age_s": -1}, "imageMinimumGCAge"),
        ({"max_age_s": -1}, "imageMaximumGCAge"),
    ],
)
def test_policy_validation_names_the_field(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(PolicyError, match=field):
        ImageGCPolicy(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(("high", "periodic"), [(85, True), (99, True), (100, False)])
def test_high_threshold_100_disables_the_periodic_pass(high: int, periodic: bool) -> None:
    assert ImageGCPolicy(high_threshold_percent=high, low_threshold_percent=80).periodic is periodic
