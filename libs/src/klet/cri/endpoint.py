"""A CRI endpoint as the kubelet's flags spell it, as a gRPC target.

Its own module, without gRPC or the CRI stubs, so the allow-list proxy (which forwards
raw bytes and needs neither the stubs nor the client's retries) can be served inside
`klet up`'s supervisor without loading klet.cri.client. Pure.
"""

from __future__ import annotations


def channel_target(endpoint: str) -> str:
    """A gRPC target for a CRI endpoint as the kubelet's flags spell it."""
    if endpoint.startswith("unix://"):
        return endpoint
    if endpoint.startswith("/"):
        return f"unix://{endpoint}"
    if endpoint.startswith("tcp://"):
        return endpoint[len("tcp://") :]
    return endpoint
