"""The unix socket endpoints plugins name when they register: one check for all kinds.

A CSI driver, a device plugin registering through the plugin watcher and a DRA driver
each tell klet a socket to dial (a path, or `unix://<path>`). klet refuses one it cannot
or should not dial the same way for every kind, so the check lives here, beside the
watcher that hands the registrations over, and each handler adds only its own rules
(the directories its sockets may be in, the kubelet's own socket, an empty endpoint).
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

UNIX_SCHEME = "unix://"
SOCKET_PATH_MAX = 107
"""Bytes of a unix socket's path (`sun_path` holds 108 with the terminating NUL)."""


def socket_path(endpoint: str) -> str:
    """The path of `endpoint`, a path or `unix://<path>`."""
    return endpoint.removeprefix(UNIX_SCHEME)


def endpoint_problem(endpoint: str, under: Sequence[Path] = ()) -> str | None:
    """Why `endpoint` is not a normalised absolute unix socket path (strictly inside one
    of the directories `under`, when any are given), or None."""
    path = socket_path(endpoint)
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in path):
        return f"endpoint {endpoint!r} holds a control character"
    if not path.startswith("/"):
        return f"endpoint {endpoint!r} is not an absolute unix socket path (or {UNIX_SCHEME}<path>)"
    if any(part in ("", ".", "..") for part in path.split("/")[1:]):
        return f"endpoint {endpoint!r} is not a normalised path (an empty, '.' or '..' element)"
    if len(path.encode()) > SOCKET_PATH_MAX:
        return (
            f"endpoint {endpoint!r} is longer than a unix socket path may be "
            f"({SOCKET_PATH_MAX} bytes)"
        )
    if under and not any(Path(path).is_relative_to(d) and Path(path) != d for d in under):
        return f"endpoint {endpoint!r} is not under {' or '.join(str(d) for d in under)}"
    return None
