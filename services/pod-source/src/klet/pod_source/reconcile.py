"""What to write so the bus tables match the merged state (level-triggered repair).

Pure. The publisher normally writes each snapshot's changes as they come (edges); this
module is the level check behind them, run at every source poll and after any bus
outage or takeover: it compares the `desired` and `sources` tables with the in-memory
merged state and returns the writes that make them equal, each desired write with the
stream operation that wakes syncloop for it. That is how a restarted or flushed Redis is
repopulated and how changes made while Redis was down get published.

Rules (DESIGN.md, "Gate destructive work on readiness"):
- Only sources that have delivered a snapshot in this process are authoritative: table
  entries of a configured source that has not reported yet are left as the previous run
  published them, so a restart never removes pods before the first read.
- Entries of a source that is not configured any more are removed (that source will
  never confirm them), and so is its `sources` entry.
- A configured source with no `sources` entry yet gets one with ready=False, so readers
  (syncloop's removal gate) know it exists and is still loading: "every entry is ready"
  must never be true while a configured source has not been read, as upstream's
  sourcesReady requires every configured source.
- An entry that differs only in local bookkeeping (seen time, config.* annotations) is
  rewritten without waking anyone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from klet.model.records import ChangeOp, DesiredPod, SourceName, SourceState
from klet.pod_source.podconfig import MergedPod, PodConfigState, classify


@dataclass(frozen=True)
class Plan:
    """Writes for one transaction: desired entries first, then `sources` entries."""

    puts: tuple[tuple[ChangeOp | None, DesiredPod], ...] = ()
    removes: tuple[tuple[str, DesiredPod], ...] = ()  # (table key, what it held)
    source_puts: tuple[SourceState, ...] = ()
    source_deletes: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.puts or self.removes or self.source_puts or self.source_deletes)


def to_record(pod: MergedPod) -> DesiredPod:
    return DesiredPod(
        uid=pod.uid, pod=pod.pod, source=pod.source, hash=pod.hash, seen_at=pod.seen_at
    )


def from_record(rec: DesiredPod) -> MergedPod:
    return MergedPod(uid=rec.uid, source=rec.source, pod=rec.pod, seen_at=rec.seen_at)


def plan_reconcile(
    state: PodConfigState,
    *,
    configured: frozenset[SourceName],
    desired: Mapping[str, DesiredPod],
    sources: Mapping[str, SourceState],
    now: float,
) -> Plan:
    """The writes that make `desired` and `sources` agree with `state`."""
    authoritative = state.ready & configured
    target = {uid: to_record(p) for uid, p in state.ready_pods().items() if p.source in configured}

    removes = [
        (key, rec)
        for key, rec in sorted(desired.items())
        if key not in target and (rec.source in authoritative or rec.source not in configured)
    ]
    puts: list[tuple[ChangeOp | None, DesiredPod]] = []
    for uid, rec in sorted(target.items()):
        current = desired.get(uid)
        if current is None:
            puts.append(("ADD", rec))
        elif current != rec:
            puts.append((classify(current.pod, rec.pod), rec))

    source_puts = tuple(
        SourceState(source=s, ready=True, at=now)
        for s in sorted(authoritative)
        if (entry := sources.get(s)) is None or not entry.ready
    ) + tuple(
        SourceState(source=s, ready=False, at=now)
        for s in sorted(configured - authoritative)
        if s not in sources
    )
    source_deletes = tuple(sorted(k for k in sources if k not in configured))
    return Plan(
        puts=tuple(puts),
        removes=tuple(removes),
        source_puts=source_puts,
        source_deletes=source_deletes,
    )
