"""How `klet gc --dry-run` and `klet evict --dry-run` print their answers: pure
functions from the services' plans (`klet.rpc.gc.CollectionPlan`,
`klet.rpc.eviction.DryRunResult`) to a table for people or a JSON document.

Sizes in tables are binary units with one decimal ("11.8Mi"); JSON keeps exact
integers. Signals counted in inodes or PIDs print as plain numbers.

Image names, pod names and eviction messages come from pods and registries, so the
text shows control characters escaped (klet.model.podhistory `printable`; table cells
before their widths are measured); JSON escapes them itself.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

from klet.model.podhistory import printable
from klet.rpc.eviction import DryRunResult
from klet.rpc.gc import CollectionPlan

_UNITS = ("Ki", "Mi", "Gi", "Ti", "Pi")
_COUNTED = ("inodesFree", "pid.available")


def human_bytes(n: int) -> str:
    """Bytes in binary units, one decimal: 512, 1.5Ki, 11.8Mi."""
    if abs(n) < 1024:
        return str(n)
    value = float(n)
    for unit in _UNITS:
        value /= 1024
        if abs(value) < 1024 or unit == _UNITS[-1]:
            return f"{value:.1f}{unit}"
    raise AssertionError("unreachable")


def signal_amount(signal: str, n: int) -> str:
    """An amount of `signal`: bytes for memory and filesystems, a count otherwise."""
    return str(n) if signal.endswith(_COUNTED) else human_bytes(n)


def table(rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns, three spaces apart, trailing spaces dropped; every cell
    `printable`."""
    rows = [[printable(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


def _printed(lines: Sequence[str]) -> str:
    """`lines` joined, each `printable` (escaping is idempotent: a table's escaped
    cells stay as they are)."""
    return "\n".join(printable(line) for text in lines for line in text.split("\n"))


def _short(ident: str) -> str:
    return ident.removeprefix("sha256:")[:13]


def gc_text(plan: CollectionPlan) -> str:
    """The GC plan for people: the image filesystem, then every removal in order."""
    lines = []
    if not plan.sources_ready:
        return (
            "not every pod source has delivered its pods yet: "
            "no GC pass removes anything until they have"
        )
    if plan.image_fs_capacity:
        state = (
            f"must free {human_bytes(plan.bytes_to_free)} to reach the low threshold"
            if plan.bytes_to_free
            else "below the high threshold: images go only past imageMaximumGCAge"
        )
        lines.append(
            f"image filesystem {plan.image_fs_mountpoint}: "
            f"{plan.image_fs_usage_percent}% used of {human_bytes(plan.image_fs_capacity)}, "
            f"{human_bytes(plan.image_fs_available)} available "
            f"(high threshold {plan.high_threshold_percent}%, "
            f"low {plan.low_threshold_percent}%): {state}"
        )
    if plan.problem:
        lines.append(f"image GC: {plan.problem}")
    if not plan.removals:
        lines.append("nothing would be removed")
        return _printed(lines)
    rows = [["KIND", "ID", "NAME", "POD", "BYTES", "REASON"]]
    for r in plan.removals:
        rows.append(
            [
                r.kind,
                r.id if r.kind == "log-dir" else _short(r.id),
                "" if r.kind == "log-dir" else r.name,
                r.pod,
                human_bytes(r.bytes) if r.bytes is not None else "?",
                r.reason,
            ]
        )
    total = sum(r.bytes or 0 for r in plan.removals)
    unknown = sum(1 for r in plan.removals if r.bytes is None)
    lines.append(table(rows))
    lines.append(
        f"{len(plan.removals)} removals, {human_bytes(total)} freed"
        + (f" ({unknown} of unknown size)" if unknown else "")
    )
    return _printed(lines)


def evict_text(result: DryRunResult) -> str:
    """The eviction dry-run for people: signals, conditions, the decision, the ranking."""
    rows = [["SIGNAL", "AVAILABLE", "CAPACITY", "THRESHOLD", "VALUE", "CROSSED", "MET"]]
    for s in result.signals:
        rows.append(
            [
                s.signal,
                signal_amount(s.signal, s.available),
                signal_amount(s.signal, s.capacity),
                s.threshold or "-",
                signal_amount(s.signal, s.threshold_value) if s.threshold else "-",
                "yes" if s.crossed else "no",
                "yes" if s.met else "no",
            ]
        )
    lines = [table(rows), ""]
    lines.append(f"conditions: {', '.join(result.conditions) or 'none'}")
    if result.reclaim_bytes:
        lines.append(f"node-level reclaim first: {human_bytes(result.reclaim_bytes)} from image-gc")
    lines.append(result.summary)
    if result.pods:
        ranked = [["RANK", "POD", "EVICT", "GRACE", "REASON"]]
        for i, p in enumerate(result.pods, 1):
            evict = "yes" if p.evict else ("critical" if p.critical else "no")
            grace = f"{p.grace_period_s}s" if p.evict else ""
            ranked.append([str(i), p.pod, evict, grace, p.reason])
        lines += ["", table(ranked)]
        lines += [f"message: {p.message.strip()}" for p in result.pods if p.evict and p.message]
    return _printed(lines)


def as_json(value: CollectionPlan | DryRunResult, **extra: object) -> str:
    """The plan as one JSON document (exact integers), with `extra` keys first."""
    return json.dumps({**extra, **dataclasses.asdict(value)}, indent=2)
