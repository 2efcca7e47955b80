"""The registered Node's identity, shared by the cluster-mode managers.

The node status manager learns the Node's UID when it registers or adopts the Node;
the Lease and mirror pods need it for their owner references. One small mutable
object passed to all three is simpler than a channel between them.
"""

from __future__ import annotations

import asyncio


class NodeIdentity:
    """The node name, and the Node object's UID once known."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.uid: str | None = None
        self.registered = asyncio.Event()
        """Set once the Node exists in the apiserver (created or adopted)."""

    def set_uid(self, uid: str) -> None:
        self.uid = uid or None
        if self.uid is not None:
            self.registered.set()

    def forget(self) -> None:
        """The Node is gone from the apiserver (deleted): register again."""
        self.uid = None
        self.registered.clear()
