"""Bounded review slots (reviewslots.py): at most `concurrency` holders at once, at most
`queue` waiting behind them and the next one refused at once with ReviewsOverloaded;
a finished or cancelled holder or waiter gives its place back; bad sizes are refused."""

from __future__ import annotations

import asyncio

import pytest
from klet.status_reporter.kubeletapi.reviewslots import ReviewSlots, ReviewsOverloaded


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_concurrency_then_queue_then_refusal() -> None:
    slots = ReviewSlots("TokenReview", concurrency=2, queue=3)
    release = asyncio.Event()
    peak = 0

    async def review() -> None:
        nonlocal peak
        async with slots.hold():
            peak = max(peak, slots.running)
            await release.wait()

    tasks = [asyncio.create_task(review()) for _ in range(5)]
    await settle()
    assert (slots.running, slots.waiting) == (2, 3)
    with pytest.raises(ReviewsOverloaded, match="too many TokenReviews waiting") as refused:
        async with slots.hold():
            raise AssertionError("a sixth review got a slot")
    assert refused.value.review == "TokenReview"
    release.set()
    await asyncio.gather(*tasks)
    assert (slots.running, slots.waiting, peak) == (0, 0, 2)
    async with slots.hold():  # free again
        assert slots.running == 1


async def test_a_cancelled_waiter_gives_its_place_back() -> None:
    slots = ReviewSlots("SubjectAccessReview", concurrency=1, queue=1)
    release = asyncio.Event()

    async def review() -> None:
        async with slots.hold():
            await release.wait()

    holder = asyncio.create_task(review())
    waiter = asyncio.create_task(review())
    await settle()
    with pytest.raises(ReviewsOverloaded):
        async with slots.hold():
            pass
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    assert slots.waiting == 0
    late = asyncio.create_task(review())  # the queue has room again
    await settle()
    assert slots.waiting == 1
    release.set()
    await asyncio.gather(holder, late)
    assert (slots.running, slots.waiting) == (0, 0)


async def test_no_queue_means_only_free_slots() -> None:
    slots = ReviewSlots("TokenReview", concurrency=1, queue=0)
    async with slots.hold():
        with pytest.raises(ReviewsOverloaded):
            async with slots.hold():
                pass


@pytest.mark.parametrize(("concurrency", "queue"), [(0, 1), (1, -1)])
def test_sizes_are_checked(concurrency: int, queue: int) -> None:
    with pytest.raises(ValueError, match="TokenReview slots"):
        ReviewSlots("TokenReview", concurrency=concurrency, queue=queue)
