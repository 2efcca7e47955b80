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
from collections.abc import Mapping
from dataclasses import dataclass, field

from klet.model.pod import is_static
from klet.model.records import DesiredPod
from klet.model.types import JSON
from klet.syncloop.probing.probes import CarriedProbes


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
    # Readiness and `started` of each running container as published before a restart,
    # by container ID: the prober starts from them (klet.syncloop.probing.prober).
    carried: dict[str, CarriedProbes] = field(default_factory=dict)
    # The status published before a restart: the previous status of the first one
    # computed after it (startTime, the conditions' lastTransitionTime carry over).
    published_before: JSON | None = None
    released: bool = False  # terminated: its volumes were torn down
    waiting: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Why each container the last sync could not start waits (upstream's reasonCache):
    the status published before the next sync acts shows them."""
    synced: DesiredPod | None = None
    """The desired record the last sync acted on; a sync of another one is an update
    (kubelet_pod_worker_duration_seconds)."""
    synced_once: bool = False
    """A sync of this pod ran in this process (the first one is its create)."""

    @property
    def terminating(self) -> bool:
        """The pod is to be stopped (and not started again): killed or made terminal."""
        return self.kill is not None or self.terminal is not None


# kubelet_pod_worker_duration_seconds operation_type values: upstream's SyncPodType
# names, and "terminated" for a pod's last work
WORKER_CREATE, WORKER_UPDATE, WORKER_SYNC = "create", "update", "sync"
WORKER_KILL, WORKER_TERMINATED = "kill", "terminated"


# kubelet_working_pods: upstream's lifecycle values and its valid (config, static)
# combinations ("" is upstream's label of a pod that is not static)
LIFECYCLES = ("sync", "terminating", "terminated")
WORKING_CONFIGS = (
    ("desired", "true"),
    ("desired", ""),
    ("orphan", "true"),
    ("orphan", ""),
    ("runtime_only", "unknown"),
)
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


def working_pod(state: PodSyncState | None, phase: str | None) -> tuple[str, str, str]:
    """(lifecycle, config, static) of a pod with a worker, as upstream's
    kubelet_working_pods labels it; `phase` is the pod's last published phase.

    Config: `desired` while a source wants it, `orphan` once none does (its spec known),
    `runtime_only` for a pod known only from the runtime (static `unknown`). Lifecycle:
    `terminated` once stopped for good (its volumes released, or a terminal phase
    without a stop asked for), `terminating` while being stopped (killed, made terminal,
    deleted, or no longer wanted), `sync` otherwise."""
    pod = None if state is None else (state.desired.pod if state.desired else state.last_pod)
    if state is None or pod is None:
        return "terminating", "runtime_only", "unknown"
    static = "true" if is_static(pod) else ""
    if state.desired is None:
        return ("terminated" if state.released else "terminating"), "orphan", static
    deleting = bool((pod.get("metadata") or {}).get("deletionTimestamp"))
    if state.released:
        return "terminated", "desired", static
    if state.terminating or deleting:
        return "terminating", "desired", static
    if phase in TERMINAL_PHASES:
        return "terminated", "desired", static
    return "sync", "desired", static


def working_pod_counts(
    pods: Mapping[str, tuple[PodSyncState | None, str | None]],
) -> dict[tuple[str, str, str], int]:
    """Every valid (lifecycle, config, static) with its count of `pods` (state, phase by
    UID), zeros included, as upstream sets them all."""
    counts = {(life, *config): 0 for config in WORKING_CONFIGS for life in LIFECYCLES}
    for state, phase in pods.values():
        counts[working_pod(state, phase)] += 1
    return counts


def pod_worker_operation(state: PodSyncState | None) -> str:
    """The `operation_type` of the pod worker sync about to run for `state`:
    `terminated` for a pod no source wants, `kill` for one being stopped or deleted,
    `create` for the first sync of a pod in this process, `update` after its desired
    record changed, `sync` otherwise (a resync, a runtime event, a back-off ending)."""
    if state is None or state.desired is None:
        return WORKER_TERMINATED
    meta = state.desired.pod.get("metadata") or {}
    if state.terminating or meta.get("deletionTimestamp"):
        return WORKER_KILL
    if not state.synced_once:
        return WORKER_CREATE
    return WORKER_UPDATE if state.synced is not state.desired else WORKER_SYNC
