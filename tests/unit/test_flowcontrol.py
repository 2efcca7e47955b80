"""Retry and rate arithmetic of `klet.model.flowcontrol`: the per-key back-off (immediate
first retry, doubling from 10 s to the 300 s cap, waiting measured from the last exit,
forgetting after twice the cap), the retry policy's value checks (its delays are
`klet.retry`'s, tests/unit/test_retry.py), the jittered period, and the token bucket (a
burst, then `qps` a second)."""

from __future__ import annotations

import pytest
from klet.model.flowcontrol import Backoff, BackoffPolicy, TokenBucket, jittered


def test_doubles_to_cap() -> None:
    b = Backoff(initial_s=10, max_s=300)
    delays = [b.next("k", now=float(i)) for i in range(7)]
    assert delays == [10, 20, 40, 80, 160, 300, 300]


def test_in_backoff_since_counts_from_event() -> None:
    b = Backoff(initial_s=10, max_s=300)
    assert not b.in_backoff_since("k", event_time=0, now=1)  # no entry: no wait
    b.next("k", now=0)
    assert b.in_backoff_since("k", event_time=100, now=105)
    assert not b.in_backoff_since("k", event_time=100, now=110)


def test_entry_expires_after_twice_the_cap() -> None:
    b = Backoff(initial_s=10, max_s=300)
    b.next("k", now=0)
    b.next("k", now=1)
    assert b.next("k", now=602) == 10
    b.gc(now=5000)
    assert b.delay("k", now=5000) == 0


def test_backoff_policy_refuses_negative_delays() -> None:
    with pytest.raises(ValueError, match="BackoffPolicy"):
        BackoffPolicy(-1.0, 5.0)


def test_jittered_adds_up_to_factor_of_the_period() -> None:
    assert jittered(10.0, 0.5, rand=lambda: 1.0) == 15.0
    assert jittered(10.0, 0.5, rand=lambda: 0.0) == 10.0
    assert jittered(10.0, 0.0, rand=lambda: 1.0) == 10.0


def test_token_bucket_take_returns_the_wait() -> None:
    bucket = TokenBucket(qps=10, burst=2, now=0.0)
    assert bucket.take(0.0) == 0.0
    assert bucket.take(0.0) == 0.0
    assert abs(bucket.take(0.0) - 0.1) < 1e-9
    assert bucket.take(1.0) == 0.0  # refilled (up to the burst)
    unlimited = TokenBucket(qps=0, burst=1, now=0.0)
    assert all(unlimited.take(0.0) == 0.0 for _ in range(100))


@pytest.mark.parametrize(
    ("qps", "burst", "ticks", "accepted"),
    [
        (5.0, 10, [0.0] * 12, 10),  # a burst, then nothing until tokens come back
        (1.0, 1, [0.0, 0.5, 1.0, 1.5, 2.0], 3),
        (2.0, 1, [0.0, 0.5, 1.0], 3),
        (1.0, 0, [0.0, 0.0], 1),  # a burst below 1 still lets one through
    ],
)
def test_token_bucket_try_take(qps: float, burst: int, ticks: list[float], accepted: int) -> None:
    bucket = TokenBucket(qps, burst, now=0.0)
    count = 0
    for t in ticks:
        count += bucket.try_take(t)
    assert count == accepted
