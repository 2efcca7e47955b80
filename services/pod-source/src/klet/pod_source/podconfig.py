"""The PodConfig merge: per-source snapshots in, pod change operations out.

Pure. The state keeps one map of pods per source, keyed by UID, plus the set of sources
that have delivered a snapshot (ready). `merge_snapshot` replaces one source's map with a
new full snapshot (upstream's SET) and reports the difference as upstream's incremental
operations, emitted in upstream's order: REMOVE, ADD, UPDATE, DELETE, RECONCILE.

- ADD: a UID the source did not have.
- UPDATE: a semantic change (spec, labels, deletionTimestamp,
  deletionGracePeriodSeconds, or annotations other than the local `config.*` ones).
- DELETE: a semantic change that sets a deletionTimestamp (graceful deletion).
- RECONCILE: only the status changed.
- REMOVE: the UID is gone from the snapshot.

The first-seen time of a pod (`kubernetes.io/config.seen`, and `seen_at`) is kept
across updates; it is what pod start latency is measured from.

A second pod with the same namespace/name in one snapshot is dropped, as upstream does
(FailedValidation): with static pods that is usually an editor's backup file next to
the real manifest, and the first one by file name wins. A UID another source already
owns is dropped the same way, so one source can never overwrite another's pod.
Dropped pods are reported in `Changes.dropped` only when they are newly dropped, so the
caller logs each once rather than at every poll.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from klet.model.pod import CONFIG_HASH, CONFIG_MIRROR, CONFIG_SEEN, CONFIG_SOURCE
from klet.model.records import ChangeOp, SourceName
from klet.model.timestamps import rfc3339_nano
from klet.model.types import JSON, PodUID, pod_full_name, pod_uid

LOCAL_ANNOTATIONS = frozenset({CONFIG_SOURCE, CONFIG_MIRROR, CONFIG_SEEN})

# The order in which one snapshot's operations are emitted (upstream's).
OP_ORDER: tuple[ChangeOp, ...] = ("REMOVE", "ADD", "UPDATE", "DELETE", "RECONCILE")


@dataclass(frozen=True)
class MergedPod:
    """One pod of the merged state: what gets written to the `desired` table."""

    uid: PodUID
    source: SourceName
    pod: JSON
    seen_at: float

    @property
    def full_name(self) -> str:
        return pod_full_name(self.pod)

    @property
    def hash(self) -> str:
        return str((self.pod.get("metadata", {}).get("annotations") or {}).get(CONFIG_HASH, ""))


@dataclass(frozen=True)
class Dropped:
    """A pod left out of a snapshot, and why (logged once, counted, reported as an event)."""

    source: SourceName
    uid: PodUID
    full_name: str
    reason: str


@dataclass(frozen=True)
class Changes:
    """The difference one snapshot made to its source's pods."""

    source: SourceName
    first: bool = False  # the source's first snapshot: it just became ready
    removes: tuple[MergedPod, ...] = ()
    adds: tuple[MergedPod, ...] = ()
    updates: tuple[MergedPod, ...] = ()
    deletes: tuple[MergedPod, ...] = ()
    reconciles: tuple[MergedPod, ...] = ()
    dropped: tuple[Dropped, ...] = ()

    @property
    def empty(self) -> bool:
        """No pod changed and nothing newly dropped (a no-op poll)."""
        return not (self.first or self.dropped or any(pods for _, pods in self.by_op()))

    def by_op(self) -> list[tuple[ChangeOp, tuple[MergedPod, ...]]]:
        return [
            ("REMOVE", self.removes),
            ("ADD", self.adds),
            ("UPDATE", self.updates),
            ("DELETE", self.deletes),
            ("RECONCILE", self.reconciles),
        ]

    def ops(self) -> list[tuple[ChangeOp, MergedPod]]:
        """Every operation, in emit order."""
        return [(op, pod) for op, pods in self.by_op() for pod in pods]


@dataclass(frozen=True)
class PodConfigState:
    """The merged pods of every source. Never mutated: merges return a new state."""

    pods: Mapping[SourceName, Mapping[PodUID, MergedPod]] = field(default_factory=dict)
    ready: frozenset[SourceName] = frozenset()
    dropped: Mapping[SourceName, frozenset[tuple[str, PodUID]]] = field(default_factory=dict)

    def source_pods(self, source: SourceName) -> Mapping[PodUID, MergedPod]:
        return self.pods.get(source, {})

    def all_ready(self, sources: Iterable[SourceName]) -> bool:
        return all(s in self.ready for s in sources)

    def ready_pods(self) -> dict[PodUID, MergedPod]:
        """Every pod of the ready sources: the set the bus must show."""
        return {uid: p for s in self.ready for uid, p in self.pods.get(s, {}).items()}


def merge_snapshot(
    state: PodConfigState, source: SourceName, pods: Sequence[JSON], now: float
) -> tuple[PodConfigState, Changes]:
    """Replace `source`'s pods with the snapshot `pods` (each carrying metadata.uid)."""
    old = state.source_pods(source)
    owner = {uid: s for s, by_uid in state.pods.items() if s != source for uid in by_uid}
    new: dict[PodUID, MergedPod] = {}
    names: set[str] = set()
    dropped_now: list[Dropped] = []
    groups: dict[ChangeOp, list[MergedPod]] = {op: [] for op in OP_ORDER}

    for pod in pods:
        uid, name = pod_uid(pod), pod_full_name(pod)
        reason = None
        if name in names:
            reason = f"duplicate pod name {name} in source {source}"
        elif uid in owner:
            reason = f"UID {uid} already belongs to a pod from source {owner[uid]}"
        elif uid in new:
            reason = f"duplicate UID {uid} in source {source}"
        if reason is not None:
            dropped_now.append(Dropped(source, uid, name, reason))
            continue
        names.add(name)
        existing = old.get(uid)
        if existing is None:
            merged = MergedPod(uid, source, _with_local(pod, source, now), now)
            groups["ADD"].append(merged)
        else:
            op = classify(existing.pod, pod)
            if op is None:
                merged = existing
            else:
                merged = MergedPod(
                    uid, source, _with_local(pod, source, existing.seen_at), existing.seen_at
                )
                groups[op].append(merged)
        new[uid] = merged

    groups["REMOVE"] = [p for uid, p in old.items() if uid not in new]
    previously = state.dropped.get(source, frozenset())
    current = frozenset((d.full_name, d.uid) for d in dropped_now)
    changes = Changes(
        source=source,
        first=source not in state.ready,
        removes=tuple(groups["REMOVE"]),
        adds=tuple(groups["ADD"]),
        updates=tuple(groups["UPDATE"]),
        deletes=tuple(groups["DELETE"]),
        reconciles=tuple(groups["RECONCILE"]),
        dropped=tuple(d for d in dropped_now if (d.full_name, d.uid) not in previously),
    )
    new_state = PodConfigState(
        pods={**state.pods, source: new},
        ready=state.ready | {source},
        dropped={**state.dropped, source: current},
    )
    return new_state, changes


def seed(state: PodConfigState, pods: Iterable[MergedPod]) -> PodConfigState:
    """Preload what an earlier run published, for sources that have not reported yet.

    A restarted pod-source then diffs its first snapshot against what the bus holds:
    unchanged pods produce nothing, and pods removed while it was down get a REMOVE.
    Seeded sources do not become ready; only a snapshot does that.
    """
    merged: dict[SourceName, dict[PodUID, MergedPod]] = {s: dict(m) for s, m in state.pods.items()}
    for pod in pods:
        if pod.source not in state.ready:
            merged.setdefault(pod.source, {})[pod.uid] = pod
    return PodConfigState(pods=merged, ready=state.ready, dropped=state.dropped)


def classify(old: JSON, new: JSON) -> ChangeOp | None:
    """The operation that turns `old` into `new` for the same UID; None if nothing to do."""
    if differs_semantically(old, new):
        return "DELETE" if _meta(new).get("deletionTimestamp") else "UPDATE"
    if old.get("status") != new.get("status"):
        return "RECONCILE"
    return None


def differs_semantically(old: JSON, new: JSON) -> bool:
    """Whether a change matters to the pod's workers (not status, not local bookkeeping)."""
    old_meta, new_meta = _meta(old), _meta(new)
    if (old.get("spec") or {}) != (new.get("spec") or {}):
        return True
    if (old_meta.get("labels") or {}) != (new_meta.get("labels") or {}):
        return True
    for key in ("deletionTimestamp", "deletionGracePeriodSeconds"):
        if old_meta.get(key) != new_meta.get(key):
            return True
    return _shared_annotations(old_meta) != _shared_annotations(new_meta)


def _with_local(pod: JSON, source: SourceName, seen_at: float) -> JSON:
    """A copy of `pod` with the local annotations the merge owns."""
    meta = dict(_meta(pod))
    annotations = dict(meta.get("annotations") or {})
    annotations[CONFIG_SOURCE] = source
    annotations[CONFIG_SEEN] = rfc3339_nano(seen_at)
    meta["annotations"] = annotations
    return {**pod, "metadata": meta}


def _meta(pod: JSON) -> dict[str, Any]:
    meta = pod.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _shared_annotations(meta: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in (meta.get("annotations") or {}).items() if k not in LOCAL_ANNOTATIONS}
