"""PodSyncState: what the pod controller knows of one pod, in one record per pod UID.

As upstream's podSyncStatus (pkg/kubelet/pod_workers.go), the record says where the pod
is in its life — running as desired, terminating (killed by request, made terminal,
being deleted), or terminated — and what that took: the kill request PodControl waits
on, why the pod failed, whether its volumes were given back. The controller
(controller.py) creates it when a pod becomes desired or is asked to be killed, and
drops it when the pod is gone from the runtime and nobody wants it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from klet.model.records import DesiredPod
from klet.model.types import JSON


@dataclass
class KillRequest:
    """A PodControl kill (eviction, a deleted pod's stop): the caller waits on `done`."""

    grace_s: int | None
    reason: str
    message: str
    done: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    announced: bool = False  # its Event was recorded (once, even if the kill is retried)

    def finish(self) -> None:
        if not self.done.done():
            self.done.set_result(None)


@dataclass
class PodSyncState:
    desired: DesiredPod | None = None  # the record acted on; None: no source wants the pod
    last_pod: JSON | None = None  # the last desired spec, to kill a removed pod gracefully
    kill: KillRequest | None = None  # a kill asked for and not yet carried out
    terminal: tuple[str, str] | None = None  # (reason, message): the pod is Failed for good
    evicted: str | None = None  # the eviction message (a DisruptionTarget condition)
    restored: bool = False  # the terminal state published before a restart was read back
    released: bool = False  # terminated: its volumes were torn down
    waiting: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Why each container the last sync could not start waits (upstream's reasonCache):
    the status published before the next sync acts shows them."""

    @property
    def terminating(self) -> bool:
        """The pod is to be stopped (and not started again): killed or made terminal."""
        return self.kill is not None or self.terminal is not None
