"""How many connections the kubelet API holds, and whose: caps overall, per client and
for connections no credential has been checked on yet.

Every open connection costs a descriptor, a TLS session, read buffers and up to a
request head, and until a request on it passes authentication and authorization it
costs all that to anyone who can reach the port. Upstream's kubelet has no cap (Go's
server accepts until the process runs out of descriptors). Here a connection is
counted from the moment it is accepted, before the TLS handshake:

- overall (`max_total`) and per client (`max_per_client`): a connection over either is
  closed at once, without a handshake;
- *unauthenticated* connections — accepted, but no request on them passed the gate yet
  (the handshake, the first head, its review) — have a small pool of their own
  (`max_unauthenticated`, and `max_unauthenticated_per_client` for one client), so
  clients without credentials can never hold more than that pool whatever the other
  caps allow. When the pool is full a newcomer is not simply refused, or a handful of
  addresses holding slow handshakes would lock out the apiserver (whose client
  certificate authenticates it, but only once its handshake and first request are
  through): it takes the place of the oldest unauthenticated connection of the client
  holding the most of them, provided that client holds more than the newcomer's own
  does. Each client's share of the pool thus tends to an equal one, a client arriving
  with none always gets in, and only one holding at least as many as everybody else is
  refused. A connection leaves the pool as soon as a request on it is let through.

Clients are counted by address; IPv6 clients by their /64, the block one host usually
owns (counting single IPv6 addresses would let one host open a cap's worth from every
address it has). The caps must leave room for the apiserver, through which every
`kubectl logs -f`, exec and port-forward arrives from one address.

`ConnectionLimiter` is pure bookkeeping: the server closes what it names. `RefusalLog`
keeps the log to one line per minute however many connections are refused.
"""

from __future__ import annotations

import ipaddress
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

TOTAL = "total"
"""Refused: the overall cap is reached."""
CLIENT = "client"
"""Refused: the client's cap is reached."""
UNAUTHENTICATED = "unauthenticated"
"""Refused: the unauthenticated pool is full and nobody holds more of it than the client."""
UNAUTHENTICATED_CLIENT = "unauthenticated_client"
"""Refused: the client's share of the unauthenticated pool is reached."""
REFUSALS = (TOTAL, CLIENT, UNAUTHENTICATED, UNAUTHENTICATED_CLIENT)


def client_key(peername: Any) -> str:
    """The key a connection counts under: the IPv4 address, the IPv6 /64, or "" when
    the peer has no IP address."""
    if not isinstance(peername, tuple) or not peername:
        return ""
    try:
        ip = ipaddress.ip_address(str(peername[0]).split("%", 1)[0])
    except ValueError:
        return ""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


@dataclass(frozen=True)
class ConnectionCaps:
    """The caps of `ConnectionLimiter`; 0 is no cap."""

    max_total: int
    max_per_client: int
    max_unauthenticated: int = 0
    max_unauthenticated_per_client: int = 0


class Ticket:
    """One admitted connection, until `ConnectionLimiter.release` (or its eviction)."""

    __slots__ = ("authenticated", "key", "released", "seq")

    def __init__(self, key: str, seq: int) -> None:
        self.key = key
        self.seq = seq
        self.authenticated = False
        self.released = False

    def __repr__(self) -> str:
        state = "authenticated" if self.authenticated else "unauthenticated"
        return f"Ticket({self.key!r}, #{self.seq}, {state}{', released' if self.released else ''})"


@dataclass(frozen=True)
class Admission:
    """What `ConnectionLimiter.admit` decided."""

    ticket: Ticket | None
    """The new connection's ticket; None when it is refused."""
    refused: str = ""
    """Why not (one of REFUSALS), when refused."""
    message: str = ""
    """The refusal or the eviction, in words for the log."""
    evicted: Ticket | None = None
    """An unauthenticated connection of another client to close now: its place went to
    the new one. Already released."""


class ConnectionLimiter:
    """Counts open connections, overall, per client key and unauthenticated."""

    def __init__(self, caps: ConnectionCaps) -> None:
        self.caps = caps
        self.total = 0
        self.unauthenticated = 0
        self._per_client: dict[str, int] = {}
        # Unauthenticated tickets per key, oldest first (a dict as an ordered set).
        self._pending: dict[str, dict[Ticket, None]] = {}
        self._seq = itertools.count()

    def held(self, key: str) -> int:
        """Connections `key` holds."""
        return self._per_client.get(key, 0)

    def pending(self, key: str) -> int:
        """Unauthenticated connections `key` holds."""
        return len(self._pending.get(key, ()))

    def admit(self, key: str) -> Admission:
        """Count a new (unauthenticated) connection of `key`, or say why not."""
        c = self.caps
        if c.max_total and self.total >= c.max_total:
            return Admission(
                None, TOTAL, f"the kubelet API already holds {self.total} connections (the cap)"
            )
        held = self.held(key)
        if c.max_per_client and held >= c.max_per_client:
            return Admission(
                None,
                CLIENT,
                f"client {key or '?'} already holds {held} connections (the per-client cap)",
            )
        mine = self.pending(key)
        if c.max_unauthenticated_per_client and mine >= c.max_unauthenticated_per_client:
            return Admission(
                None,
                UNAUTHENTICATED_CLIENT,
                f"client {key or '?'} already holds {mine} unauthenticated connections "
                "(the per-client cap)",
            )
        evicted: Ticket | None = None
        message = ""
        if c.max_unauthenticated and self.unauthenticated >= c.max_unauthenticated:
            victim = self._largest_share(excluding=key)
            if victim is None or self.pending(victim) <= mine:
                return Admission(
                    None,
                    UNAUTHENTICATED,
                    f"the kubelet API already holds {self.unauthenticated} unauthenticated "
                    f"connections (the cap) and client {key or '?'} holds as many as any other",
                )
            evicted = next(iter(self._pending[victim]))
            message = (
                f"the pool is full: the oldest of client {victim or '?'} "
                f"({self.pending(victim)} held) went to client {key or '?'}"
            )
            self.release(evicted)
        ticket = Ticket(key, next(self._seq))
        self.total += 1
        self._per_client[key] = held + 1
        self.unauthenticated += 1
        self._pending.setdefault(key, {})[ticket] = None
        return Admission(ticket, message=message, evicted=evicted)

    def _largest_share(self, *, excluding: str) -> str | None:
        """The key holding the most unauthenticated connections (the one whose oldest is
        oldest, among equals), other than `excluding`."""
        best: tuple[int, int] | None = None
        found: str | None = None
        for key, tickets in self._pending.items():
            if key == excluding or not tickets:
                continue
            rank = (len(tickets), -next(iter(tickets)).seq)
            if best is None or rank > best:
                best, found = rank, key
        return found

    def authenticated(self, ticket: Ticket) -> None:
        """A request on `ticket`'s connection passed the gate: it leaves the
        unauthenticated pool (and can no longer be evicted)."""
        if ticket.released or ticket.authenticated:
            return
        ticket.authenticated = True
        self._unpend(ticket)

    def release(self, ticket: Ticket) -> None:
        """Uncount a connection; a second call (after an eviction) does nothing."""
        if ticket.released:
            return
        ticket.released = True
        if not ticket.authenticated:
            self._unpend(ticket)
        held = self._per_client.get(ticket.key, 0)
        if held <= 1:
            self._per_client.pop(ticket.key, None)
        else:
            self._per_client[ticket.key] = held - 1
        self.total = max(0, self.total - 1)

    def _unpend(self, ticket: Ticket) -> None:
        tickets = self._pending.get(ticket.key)
        if tickets is None or ticket not in tickets:
            return
        del tickets[ticket]
        if not tickets:
            del self._pending[ticket.key]
        self.unauthenticated = max(0, self.unauthenticated - 1)


class RefusalLog:
    """A WARNING for the first refused connection, then at most one per `every_s` with
    the number refused since. `action` and `done` word it (evictions are logged by one
    of their own)."""

    def __init__(
        self,
        *,
        every_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        action: str = "refusing connections",
        done: str = "refused",
    ) -> None:
        self.every_s = every_s
        self._clock = clock
        self._action = action
        self._done = done
        self._last: float | None = None
        self._since = 0

    def refused(self, reason: str) -> bool:
        """Note one refusal; whether it was logged."""
        self._since += 1
        now = self._clock()
        if self._last is not None and now - self._last < self.every_s:
            return False
        log.warning(
            "kubelet API: %s: %s (%d %s since the last report)",
            self._action,
            reason,
            self._since,
            self._done,
            extra={self._done: self._since},
        )
        self._last, self._since = now, 0
        return True
