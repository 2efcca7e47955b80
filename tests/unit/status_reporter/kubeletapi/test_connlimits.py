"""Connection caps of the kubelet API (connlimits.py): the key a client counts under
(IPv4 address, IPv6 /64, IPv4-mapped IPv6 as IPv4); admission against the global and
per-client caps and their release; the unauthenticated pool (its per-client share,
leaving it on authentication, a full pool giving the oldest place of the client holding
the most to a newcomer holding fewer, and refusing one holding as many as anybody); the
bookkeeping staying consistent over random sequences; refusals logged once a minute with
a count (evictions in words of their own)."""

from __future__ import annotations

import logging
import random
from collections import Counter

import pytest
from klet.status_reporter.kubeletapi.connlimits import (
    CLIENT,
    TOTAL,
    UNAUTHENTICATED,
    UNAUTHENTICATED_CLIENT,
    ConnectionCaps,
    ConnectionLimiter,
    RefusalLog,
    Ticket,
    client_key,
)


@pytest.mark.parametrize(
    ("peer", "key"),
    [
        (("10.0.0.7", 51000), "10.0.0.7"),
        (("2001:db8:1:2:aaaa::1", 51000, 0, 0), "2001:db8:1:2::/64"),
        (("2001:db8:1:2:bbbb::9", 51000, 0, 0), "2001:db8:1:2::/64"),
        (("::ffff:10.0.0.7", 51000, 0, 0), "10.0.0.7"),
        (("fe80::1%eth0", 51000, 0, 2), "fe80::/64"),
        ("/run/klet.sock", ""),
        (None, ""),
        (("not-an-ip", 1), ""),
    ],
)
def test_client_key(peer: object, key: str) -> None:
    assert client_key(peer) == key


def admitted(limiter: ConnectionLimiter, key: str) -> Ticket:
    admission = limiter.admit(key)
    assert admission.ticket is not None, admission.message
    assert admission.evicted is None
    return admission.ticket


def test_caps() -> None:
    limiter = ConnectionLimiter(ConnectionCaps(max_total=3, max_per_client=2))
    a1, a2 = admitted(limiter, "a"), admitted(limiter, "a")
    refused = limiter.admit("a")
    assert (refused.ticket, refused.refused) == (None, CLIENT)
    assert refused.message == "client a already holds 2 connections (the per-client cap)"
    b = admitted(limiter, "b")
    refused = limiter.admit("c")
    assert (refused.refused, refused.message) == (
        TOTAL,
        "the kubelet API already holds 3 connections (the cap)",
    )
    assert (limiter.total, limiter.held("a"), limiter.held("c")) == (3, 2, 0)
    limiter.release(a1)
    c = admitted(limiter, "c")
    for ticket in (a2, b, c, c):  # a second release does nothing
        limiter.release(ticket)
    assert (limiter.total, limiter.unauthenticated, limiter.held("a"), limiter.held("b")) == (
        0, 0, 0, 0,
    )  # fmt: skip


def test_zero_is_no_cap() -> None:
    limiter = ConnectionLimiter(ConnectionCaps(max_total=0, max_per_client=0))
    assert all(limiter.admit("a").ticket is not None for _ in range(10_000))
    assert (limiter.total, limiter.unauthenticated) == (10_000, 10_000)


def test_unauthenticated_share_per_client() -> None:
    caps = ConnectionCaps(
        max_total=10, max_per_client=5, max_unauthenticated=10, max_unauthenticated_per_client=2
    )
    limiter = ConnectionLimiter(caps)
    first, second = admitted(limiter, "a"), admitted(limiter, "a")
    refused = limiter.admit("a")
    assert refused.refused == UNAUTHENTICATED_CLIENT
    assert refused.message == (
        "client a already holds 2 unauthenticated connections (the per-client cap)"
    )
    # A request let through on one of them: it leaves the pool, not the client's count.
    limiter.authenticated(first)
    limiter.authenticated(first)
    assert (limiter.pending("a"), limiter.held("a"), limiter.unauthenticated) == (1, 2, 1)
    third = admitted(limiter, "a")
    assert limiter.admit("a").refused == UNAUTHENTICATED_CLIENT
    limiter.authenticated(second)
    limiter.authenticated(third)
    for _ in range(2):
        admitted(limiter, "a")
    assert limiter.admit("a").refused == CLIENT  # 5 held: the overall share wins
    limiter.release(first)
    assert (limiter.total, limiter.pending("a"), limiter.held("a")) == (4, 2, 4)


def test_a_full_pool_gives_the_largest_shares_oldest_place_away() -> None:
    caps = ConnectionCaps(max_total=100, max_per_client=100, max_unauthenticated=4)
    limiter = ConnectionLimiter(caps)
    a = [admitted(limiter, "attacker-a") for _ in range(3)]
    b = admitted(limiter, "attacker-b")
    # The apiserver, holding none, takes the oldest place of the client holding most.
    admission = limiter.admit("apiserver")
    assert admission.ticket is not None and admission.evicted is a[0]
    assert a[0].released and limiter.pending("attacker-a") == 2
    assert admission.message == (
        "the pool is full: the oldest of client attacker-a (3 held) went to client apiserver"
    )
    assert (limiter.total, limiter.unauthenticated) == (4, 4)
    limiter.release(a[0])  # its connection ends later: nothing is counted twice
    assert (limiter.total, limiter.unauthenticated) == (4, 4)
    # attacker-a holds 2, nobody else more: its newcomer is refused, not a swap.
    refused = limiter.admit("attacker-a")
    assert (refused.ticket, refused.refused) == (None, UNAUTHENTICATED)
    # attacker-b (1) may still displace attacker-a (2):
    evicted = limiter.admit("attacker-b").evicted
    assert evicted is a[1]
    assert (limiter.pending("attacker-a"), limiter.pending("attacker-b")) == (1, 2)
    # The apiserver's connection, once let through, is out of the pool and out of reach.
    apiserver = admission.ticket
    limiter.authenticated(apiserver)
    assert limiter.unauthenticated == 3
    for _ in range(10):
        admission = limiter.admit(f"other-{_}")
        assert admission.evicted is not apiserver
    assert not apiserver.released and limiter.held("apiserver") == 1
    assert b.released  # attacker-b's oldest, given to a newcomer since


def test_equal_shares_give_up_the_oldest_connection() -> None:
    limiter = ConnectionLimiter(ConnectionCaps(max_total=0, max_per_client=0,
                                               max_unauthenticated=3))  # fmt: skip
    x, y, z = admitted(limiter, "x"), admitted(limiter, "y"), admitted(limiter, "z")
    assert limiter.admit("w").evicted is x
    assert limiter.admit("v").evicted is y
    assert z.released is False and limiter.unauthenticated == 3


def test_random_sequences_keep_the_books_straight() -> None:
    rng = random.Random(25)
    caps = ConnectionCaps(
        max_total=40, max_per_client=8, max_unauthenticated=12, max_unauthenticated_per_client=5
    )
    limiter = ConnectionLimiter(caps)
    live: list[Ticket] = []
    keys = [f"10.0.0.{i}" for i in range(6)]
    seen: Counter[str] = Counter()
    for _ in range(20_000):
        op = rng.random()
        if op < 0.55 or not live:
            key = rng.choice(keys)
            before = limiter.pending(key)
            admission = limiter.admit(key)
            if admission.evicted is not None:
                # Only a client holding more than the newcomer's client gives way.
                assert admission.evicted.key != key
                assert limiter.pending(admission.evicted.key) + 1 > before
                live.remove(admission.evicted)
                seen["evicted"] += 1
            if admission.ticket is not None:
                live.append(admission.ticket)
            seen[admission.refused] += 1
        elif op < 0.85:
            limiter.authenticated(rng.choice(live))
        else:
            ticket = live.pop(rng.randrange(len(live)))
            limiter.release(ticket)
        pending = [t for t in live if not t.authenticated]
        assert limiter.total == len(live) <= caps.max_total
        assert limiter.unauthenticated == len(pending) <= caps.max_unauthenticated
        for key in keys:
            mine = [t for t in live if t.key == key]
            assert limiter.held(key) == len(mine) <= caps.max_per_client
            unauth = sum(not t.authenticated for t in mine)
            assert limiter.pending(key) == unauth <= caps.max_unauthenticated_per_client
        assert not any(t.released for t in live)
    # Every path was taken.
    assert set(seen) == {"", "evicted", TOTAL, CLIENT, UNAUTHENTICATED, UNAUTHENTICATED_CLIENT}


def test_refusals_are_logged_once_a_minute(caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    refusals = RefusalLog(every_s=60, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING):
        assert refusals.refused("cap") is True
        assert not any(refusals.refused("cap") for _ in range(500))
        now[0] += 61
        assert refusals.refused("cap") is True
    first, second = (r.getMessage() for r in caplog.records)
    assert first == "kubelet API: refusing connections: cap (1 refused since the last report)"
    assert second.endswith("(501 refused since the last report)")


def test_evictions_are_worded_as_such(caplog: pytest.LogCaptureFixture) -> None:
    evictions = RefusalLog(action="closing unauthenticated connections for others", done="closed")
    with caplog.at_level(logging.WARNING):
        evictions.refused("the pool is full: ...")
    assert caplog.records[0].getMessage() == (
        "kubelet API: closing unauthenticated connections for others: the pool is full: ... "
        "(1 closed since the last report)"
    )
