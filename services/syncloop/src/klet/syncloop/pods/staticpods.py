"""Static pods start one at a time per full name (upstream's pod workers'
allowStaticPodStart, startedStaticPodsByFullname, waitingToStartStaticPodsByFullname).

An edited manifest is a new pod (a new UID, the content hash) with the same
namespace/name as the old one, and both share what the name implies: the host ports, a
hostPath lock file, the mirror pod. So the new one must not start until the old one
has stopped. The rule, pure: static pods with one full name queue in the order they
were first seen; one of them is "started" (it may run) until it has stopped; the next
one in the queue that is still wanted (not gone, not being stopped) may start then,
and no other. A UID that is started stays allowed.

`StaticPodGate` holds the two maps for the controller; it decides, it does no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class StaticPodGate:
    """Which static pod of each full name may start."""

    started: dict[str, str] = field(default_factory=dict)
    """The UID that may run, by full name (startedStaticPodsByFullname)."""
    waiting: dict[str, list[str]] = field(default_factory=dict)
    """UIDs waiting for their turn, oldest first (waitingToStartStaticPodsByFullname)."""

    def seen(self, full_name: str, uid: str) -> None:
        """A static pod is desired: it joins its name's queue (once)."""
        if self.started.get(full_name) == uid:
            return
        queue = self.waiting.setdefault(full_name, [])
        if uid not in queue:
            queue.append(uid)

    def allow(self, full_name: str, uid: str, *, wanted: Callable[[str], bool]) -> bool:
        """Whether static pod `uid` may start now; `wanted(uid)` says whether a waiting
        pod still counts (desired, not being stopped). Allowing makes it the started one."""
        holder = self.started.get(full_name)
        if holder is not None:
            return holder == uid
        queue = [u for u in self.waiting.get(full_name, []) if u == uid or wanted(u)]
        if queue and queue[0] != uid:
            self.waiting[full_name] = queue
            return False
        rest = [u for u in queue if u != uid]
        if rest:
            self.waiting[full_name] = rest
        else:
            self.waiting.pop(full_name, None)
        self.started[full_name] = uid
        return True

    def stopped(self, full_name: str, uid: str) -> list[str]:
        """Static pod `uid` has stopped (or is gone): its name is free. Returns the UIDs
        waiting for it, to be woken."""
        if self.started.get(full_name) == uid:
            del self.started[full_name]
        queue = self.waiting.get(full_name, [])
        if uid in queue:
            queue.remove(uid)
            if not queue:
                self.waiting.pop(full_name, None)
        return list(self.waiting.get(full_name, []))
