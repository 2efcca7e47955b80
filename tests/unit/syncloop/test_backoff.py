"""Back-off arithmetic: immediate first retry, doubling from 10 s to the 300 s cap,
waiting measured from the last exit, and forgetting after twice the cap."""

from __future__ import annotations

from klet.syncloop.pods.backoff import Backoff


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
