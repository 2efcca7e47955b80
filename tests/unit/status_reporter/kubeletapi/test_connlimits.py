"""Connection caps of the kubelet API (connlimits.py): the key a client counts under
(IPv4 address, IPv6 /64, IPv4-mapped IPv6 as IPv4), admission against the global and
per-client caps and their release, and refusals logged once a minute with a count."""

from __future__ import annotations

import logging

import pytest
from klet.status_reporter.kubeletapi.connlimits import ConnectionLimiter, RefusalLog, client_key


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


def test_caps() -> None:
    limiter = ConnectionLimiter(max_total=3, max_per_client=2)
    assert limiter.acquire("a") is None
    assert limiter.acquire("a") is None
    refused = limiter.acquire("a")
    assert refused == "client a already holds 2 connections (the per-client cap)"
    assert limiter.acquire("b") is None
    assert limiter.acquire("c") == "the kubelet API already holds 3 connections (the cap)"
    assert (limiter.total, limiter.held("a"), limiter.held("c")) == (3, 2, 0)
    limiter.release("a")
    assert limiter.acquire("c") is None
    for key in ("a", "b", "c"):
        limiter.release(key)
    assert (limiter.total, limiter.held("a"), limiter.held("b")) == (0, 0, 0)


def test_zero_is_no_cap() -> None:
    limiter = ConnectionLimiter(max_total=0, max_per_client=0)
    assert all(limiter.acquire("a") is None for _ in range(10_000))
    assert limiter.total == 10_000


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
