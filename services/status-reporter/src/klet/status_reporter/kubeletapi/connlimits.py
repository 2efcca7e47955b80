"""How many connections the kubelet API holds: a global cap and a cap per client.

Every open connection costs a descriptor, a TLS session and up to a request head of
buffer, and before its first request passes authentication it costs all that to anyone
who can reach the port. Upstream's kubelet has no cap (Go's server accepts until the
process runs out of descriptors); here a connection is counted from the moment it is
accepted, before the TLS handshake, and one over either cap is closed at once, without
a handshake, so a flood from one address cannot starve the others, and a flood from
many cannot take the process past its open-files limit.

Clients are counted by address; IPv6 clients by their /64, the block one host usually
owns (counting single IPv6 addresses would let one host open a cap's worth from every
address it has). The caps must leave room for the apiserver, through which every
`kubectl logs -f`, exec and port-forward arrives from one address.

`ConnectionLimiter` is pure bookkeeping; `RefusalLog` keeps the log to one line per
minute however many connections are refused.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


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


class ConnectionLimiter:
    """Counts open connections, overall and per client key; a cap of 0 is no cap."""

    def __init__(self, *, max_total: int, max_per_client: int) -> None:
        self.max_total = max_total
        self.max_per_client = max_per_client
        self.total = 0
        self._per_client: dict[str, int] = {}

    def acquire(self, key: str) -> str | None:
        """Count a new connection of `key`; None when admitted, else why not (and the
        connection is not counted)."""
        if self.max_total and self.total >= self.max_total:
            return f"the kubelet API already holds {self.total} connections (the cap)"
        held = self._per_client.get(key, 0)
        if self.max_per_client and held >= self.max_per_client:
            return f"client {key or '?'} already holds {held} connections (the per-client cap)"
        self.total += 1
        self._per_client[key] = held + 1
        return None

    def release(self, key: str) -> None:
        """Uncount a connection `acquire` admitted."""
        held = self._per_client.get(key, 0)
        if held <= 1:
            self._per_client.pop(key, None)
        else:
            self._per_client[key] = held - 1
        self.total = max(0, self.total - 1)

    def held(self, key: str) -> int:
        return self._per_client.get(key, 0)


class RefusalLog:
    """A WARNING for the first refused connection, then at most one per `every_s` with
    the number refused since."""

    def __init__(self, *, every_s: float = 60.0, clock: Callable[[], float] = time.monotonic):
        self.every_s = every_s
        self._clock = clock
        self._last: float | None = None
        self._since = 0

    def refused(self, reason: str) -> bool:
        """Note one refusal; whether it was logged."""
        self._since += 1
        now = self._clock()
        if self._last is not None and now - self._last < self.every_s:
            return False
        log.warning(
            "kubelet API: refusing connections: %s (%d refused since the last report)",
            reason,
            self._since,
            extra={"refused": self._since},
        )
        self._last, self._since = now, 0
        return True
