"""The pod workers' last reads of their pods, kept until PLEG says they may be stale.

Upstream's pod workers do not ask the runtime for a pod they sync: they take the status
its PLEG's last relist put in the pod cache, once that relist is newer than the worker's
last sync (`podCache.GetNewerThan`). klet's workers read their pod through CRI
themselves (runtime.py: two lists by label, PodSandboxStatus for the newest ready
sandbox, ContainerStatus per container not known exited), which is right after a change
and wasted on a pod where nothing changed: the periodic resync (every syncFrequency)
made about four CRI calls per pod, 440 a minute on an idle node of 110 pods (issue 42).
So each read is kept here with its pod's fingerprint (the set of (id, state) of its
sandboxes and containers, as the relister compares them), and a sync that no change
caused (the periodic resync, a back-off or a timer ending, a probe result) takes the kept
read instead of asking CRI, when it is *fresh*:

- a relist that began after the read began found the pod's fingerprint unchanged
  (upstream's "newer than": evidence from after the read, not before it); and
- nothing made it stale since: a runtime event about one of the pod's objects, a relist
  that found another fingerprint, an action of the pod's worker (syncpod.py drops the
  read before it creates, starts, stops or removes anything, the hooks running inside
  those; a resize is followed by a new read in the same sync; a sync that raises drops
  it), a change of the pod (an update, a deletion, a kill request: the pod workers' wake
  drops it, so such a sync reads CRI), or the pod being forgotten. A drop that
  comes while a read of the pod is in flight spoils that read too: it is not kept,
  whatever a relist then says (an exit event that lands between a read's lists and its
  status calls must not be covered by a relist that listed before the exit).

Why the fingerprint is enough for what a sync reads besides it. Sandbox and container
IDs are never reused and states only move forward (created, running, exited; ready,
not ready), so one fingerprint seen at two times means no object came, went or changed
state in between. What else a read holds is fixed for an object's life or while its
state stands: a sandbox's IPs (set when it is made, dropped with its NOTREADY state),
a container's image, attempt and restart count (its labels and annotations), its start
time, and once exited its exit code, finish time and termination message (runtime.py
keeps those too, `_exited`). The two things that do change under one fingerprint come
with events, which drop the read: an exit the runtime announced before CRI recorded it
(`ExitNotices`), and an OOM kill, whose reason CRI may record after the exit. A
container's resources change only through the worker's own UpdateContainerResources
(a resize, which drops the read). Without runtime events (relisting every second) a
kept read is as old as the last relist at most, which is all upstream's cache promises.

Ticks, not clock times, order reads and relists: two steps of one event loop may share
a clock reading, never a tick.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from klet.cri import labels as L
from klet.cri.types import ContainerState, SandboxState
from klet.syncloop.model.runtimepod import RuntimePod

RuntimeState = SandboxState | ContainerState
Fingerprint = frozenset[tuple[str, RuntimeState]]


def fingerprints(
    sandboxes: list[tuple[str, SandboxState, dict[str, str]]],
    containers: list[tuple[str, ContainerState, dict[str, str]]],
) -> dict[str, Fingerprint]:
    """Group (id, state, labels) triples by pod UID label; unlabelled objects are not ours."""
    triples: list[tuple[str, RuntimeState, dict[str, str]]] = [*sandboxes, *containers]
    out: dict[str, set[tuple[str, RuntimeState]]] = {}
    for oid, state, labels in triples:
        uid = labels.get(L.POD_UID)
        if uid:
            out.setdefault(uid, set()).add((oid, state))
    return {uid: frozenset(v) for uid, v in out.items()}


@dataclass(frozen=True)
class Kept:
    """One read of a pod: what it found, its fingerprint (None: the pod had nothing),
    the tick it began at, and whether a later relist confirmed the fingerprint."""

    pod: RuntimePod
    fingerprint: Fingerprint | None
    began: int
    confirmed: bool = False


class RuntimeCache:
    """The kept reads by pod UID (see the module docstring); no I/O."""

    def __init__(self) -> None:
        self._tick = 0
        self._kept: dict[str, Kept] = {}
        self._reading: dict[str, int] = {}  # pod UID -> reads in flight
        self._spoiled: dict[str, int] = {}  # pod UID -> tick of a drop while reads were in flight

    def tick(self) -> int:
        """The next tick: a relist takes one as it begins."""
        self._tick += 1
        return self._tick

    def read_began(self, uid: str) -> int:
        """A read of pod `uid` begins; the tick to hand back to `read_ended`."""
        self._reading[uid] = self._reading.get(uid, 0) + 1
        return self.tick()

    def read_ended(
        self, uid: str, began: int, pod: RuntimePod | None, fingerprint: Fingerprint | None
    ) -> None:
        """The read that began at `began` found `pod` (None: it failed). It is kept
        unless something dropped the pod's read while it was in flight, or a read that
        began later is kept already. It takes over the confirmation of the read it
        replaces when it found the same fingerprint: nothing changed between the two
        reads, and it is the newer (another reader, e.g. the CPU manager's reconcile,
        must not cost the next resync its kept read)."""
        left = self._reading.get(uid, 1) - 1
        spoiled = self._spoiled.get(uid, 0) > began
        if left > 0:
            self._reading[uid] = left
        else:
            self._reading.pop(uid, None)
            self._spoiled.pop(uid, None)
        if pod is None or spoiled:
            return
        kept = self._kept.get(uid)
        if kept is None or kept.began < began:
            confirmed = kept is not None and kept.confirmed and kept.fingerprint == fingerprint
            self._kept[uid] = Kept(pod, fingerprint, began, confirmed)

    def invalidate(self, uid: str) -> None:
        """Something may have changed pod `uid` in the runtime (or it is gone): its next
        sync reads CRI."""
        self._kept.pop(uid, None)
        if uid in self._reading:
            self._spoiled[uid] = self.tick()

    def relisted(self, began: int, current: Mapping[str, Fingerprint]) -> None:
        """A relist that began at tick `began` found these fingerprints (a pod with
        nothing has none): a kept read whose fingerprint differs is dropped, one that
        matches and began before the relist is confirmed."""
        for uid, kept in list(self._kept.items()):
            if current.get(uid) != kept.fingerprint:
                del self._kept[uid]
            elif not kept.confirmed and kept.began < began:
                self._kept[uid] = replace(kept, confirmed=True)

    def fresh(self, uid: str) -> RuntimePod | None:
        """The kept read of pod `uid` if a relist confirmed it and nothing dropped it."""
        kept = self._kept.get(uid)
        return kept.pod if kept is not None and kept.confirmed else None

    def __len__(self) -> int:
        """How many reads are kept (one per pod at most)."""
        return len(self._kept)
