"""How many TokenReviews (or SubjectAccessReviews) the kubelet API runs at once, and how
many may wait: a bounded semaphore with a bounded queue.

Anyone who reaches port 10250 can make the server ask the apiserver a TokenReview, with
a random bearer token per request that no cache will ever answer. Each review holds a
worker thread of the API's apiserver client while it runs (klet.kube is a blocking
library behind `asyncio.to_thread`), and that client's QPS bucket. So reviews run
`concurrency` at a time, on a client with threads of its own (see wiring.py: the
API's client never shares the event loop's default pool, which the node Lease's
renewal uses), and at most `queue` more may wait; one more is refused at once with
`ReviewsOverloaded`, answered 429 with Retry-After, rather than queueing without bound
and answering long after the client gave up. TokenReviews and SubjectAccessReviews
have a pair of slots each: only an authenticated user causes a SubjectAccessReview, so
a flood of random tokens never delays the apiserver's own authorization.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class ReviewsOverloaded(Exception):
    """Every slot is busy and the queue is full: refuse the request (429)."""

    def __init__(self, review: str) -> None:
        super().__init__(f"too many {review}s waiting")
        self.review = review


class ReviewSlots:
    """At most `concurrency` holders at once and `queue` waiting (both at least 1)."""

    def __init__(self, review: str, *, concurrency: int, queue: int) -> None:
        if concurrency < 1 or queue < 0:
            raise ValueError(f"{review} slots: concurrency {concurrency}, queue {queue}")
        self.review = review
        self.concurrency = concurrency
        self.queue = queue
        self.waiting = 0
        self.running = 0
        self._free = asyncio.Semaphore(concurrency)

    @contextlib.asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        """A slot for one review. Raises ReviewsOverloaded when none is free and
        `queue` others already wait."""
        if self.running + self.waiting >= self.concurrency and self.waiting >= self.queue:
            raise ReviewsOverloaded(self.review)
        self.waiting += 1
        try:
            await self._free.acquire()
        finally:
            self.waiting -= 1
        self.running += 1
        try:
            yield
        finally:
            self.running -= 1
            self._free.release()
