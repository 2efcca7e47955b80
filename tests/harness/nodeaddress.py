"""A non-loopback address of this machine for a test node: the address the apiserver
reaches the node's kubelet API at (its node proxy refuses loopback node addresses with
"address not allowed"), that an EndpointSlice may hold, and that the node's pods reach
the node at (status.hostIP: 127.0.0.1 would be each pod's own loopback).

Only an address of this machine is used: the source address of its default route, or,
with no default route, one put on `lo` for the duration. Nothing is sent anywhere to find
it (a UDP connect only picks a route).
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
from collections.abc import Iterator

# The address put on `lo` only when the host has no default route: RFC 2544's benchmarking
# range, neither loopback nor link-local, so the apiserver proxies to it (the address is
# what it checks, not the interface). No dummy interface: this kernel has no dummy driver.
FALLBACK_ADDRESS = "198.18.0.1"


def _default_route_address() -> str | None:
    """The source address of this host's default route, None without one. A UDP
    connect only picks a route; nothing is sent."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("203.0.113.1", 9))  # TEST-NET-3: any routed address would do
        except OSError:
            return None
        address: str = s.getsockname()[0]
    return None if address.startswith("127.") else address


@contextlib.contextmanager
def host_address() -> Iterator[str]:
    """A non-loopback IPv4 address of this host that the apiserver may proxy to and an
    EndpointSlice may hold: the default route's source address, or (no default route)
    FALLBACK_ADDRESS added to `lo` for the duration and removed after."""
    address = _default_route_address()
    if address is not None:
        yield address
        return
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    subprocess.run(["ip", "addr", "add", f"{FALLBACK_ADDRESS}/32", "dev", "lo"], check=True)
    try:
        yield FALLBACK_ADDRESS
    finally:
        subprocess.run(["ip", "addr", "del", f"{FALLBACK_ADDRESS}/32", "dev", "lo"], check=False)
