"""What `klet events` shows: the node's Event records folded into Events and printed as
`kubectl events` / `kubectl get events` print them. Pure: records and time in, rows and
text out (the reading is in klet.cli.events).

Folding is klet.model.eventfold's rule, the one status-reporter applies before it
posts: a record joins an Event while it comes within the window of the Event's last
one; its count grows and its last-seen time moves. Later, the same record starts a new
Event, as the apiserver would then hold. Similar records (one object and reason,
messages that differ) fold into one "(combined from similar events)" Event from the 10th
distinct message on, as status-reporter posts them (eventfold's `SimilarEvents`). So a
standalone node reads as a cluster node's `kubectl get events` would (status-reporter's
spam filter aside: here every occurrence is counted at once).

Columns, as kubectl's: NAMESPACE (unless one namespace is asked for), LAST SEEN, TYPE,
REASON, OBJECT, MESSAGE; LAST SEEN reads `2m (x5 over 9m)` when an Event happened more
than once, as `kubectl events` writes it, so the count and the age of the first
occurrence are on the default table too. `-o wide` adds kubectl's SUBOBJECT, SOURCE,
FIRST SEEN, COUNT and NAME. Ages use kubectl's human durations (`45s`, `3m12s`,
`4h5m`, `3d`).

An Event's name is eventfold's, the shape status-reporter creates; a node Event's
namespace is "default", where upstream posts it.

Every cell is text some service or pod wrote (a termination message, a probe's output,
a name), so the table shows control and format characters escaped (`\x1b`, `\u202e`;
klet.model.podhistory `printable`, as `klet why` shows them): an escape sequence in an
Event's message cannot retitle, clear or rewrite the reader's terminal. The JSON output
needs nothing more, since JSON escapes control characters itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from klet.model.eventfold import (
    DEFAULT_COMPONENT,
    DEFAULT_TYPE,
    WINDOW_S,
    EventKey,
    SimilarEvents,
    folds,
)
from klet.model.eventfold import event_name as fold_name
from klet.model.podhistory import printable
from klet.model.records import EventRecord
from klet.model.timestamps import rfc3339
from klet.model.types import JSON

NODE_EVENTS_NAMESPACE = "default"


@dataclass(frozen=True)
class EventRow:
    """One Event as shown: what happened to which object, how often, first and last."""

    namespace: str
    kind: str
    name: str
    uid: str
    field_path: str
    type: str
    reason: str
    message: str
    component: str
    count: int
    first_seen: float  # Unix seconds
    last_seen: float

    @property
    def event_name(self) -> str:
        return fold_name(self.name, self.first_seen)


def row_of(record: EventRecord) -> EventRow:
    """A record as an Event of its own (count as recorded, at least 1)."""
    involved = record.involved

    def text(field: str) -> str:
        value = involved.get(field)
        return "" if value is None else str(value)

    return EventRow(
        namespace=text("namespace") or NODE_EVENTS_NAMESPACE,
        kind=text("kind"),
        name=text("name"),
        uid=text("uid"),
        field_path=text("fieldPath"),
        type=record.type or DEFAULT_TYPE,
        reason=record.reason,
        message=record.message,
        component=record.component or DEFAULT_COMPONENT,
        count=max(1, record.count),
        first_seen=record.at,
        last_seen=record.at,
    )


class Correlator:
    """The Events seen so far, folding each new record into its Event (no I/O)."""

    def __init__(self, *, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self._rows: list[EventRow] = []
        self._open: dict[EventKey, int] = {}  # key -> index in _rows of its latest Event
        self._similar = SimilarEvents(window_s=window_s)

    def add(self, record: EventRecord) -> EventRow:
        """Fold `record` in; returns the Event it made or changed."""
        key, message = self._similar.classify(record.involved, record)
        new = replace(row_of(record), message=message)
        index = self._open.get(key)
        if index is not None:
            seen = self._rows[index]
            # An older record joining does not move the Event's last-seen time back.
            if folds(seen.last_seen, new.first_seen, self.window_s):
                merged = replace(
                    seen,
                    message=new.message if new.last_seen >= seen.last_seen else seen.message,
                    count=seen.count + new.count,
                    first_seen=min(seen.first_seen, new.first_seen),
                    last_seen=max(seen.last_seen, new.last_seen),
                )
                self._rows[index] = merged
                return merged
        self._open[key] = len(self._rows)
        self._rows.append(new)
        return new

    def rows(self) -> list[EventRow]:
        """Every Event, oldest last-seen first (kubectl's order)."""
        return sorted(self._rows, key=lambda r: (r.last_seen, r.first_seen))


def aggregate(records: Iterable[EventRecord], *, window_s: float = WINDOW_S) -> list[EventRow]:
    """`records` (in any order) as Events, sorted by last seen."""
    correlator = Correlator(window_s=window_s)
    for record in sorted(records, key=lambda r: r.at):
        correlator.add(record)
    return correlator.rows()


def human_duration(seconds: float) -> str:
    """A duration as kubectl prints ages: two units while they tell something."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    days = hours // 24
    if hours < 24 * 8:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    if days < 365 * 2:
        return f"{days}d"
    years, rest = divmod(days, 365)
    if years < 8:
        return f"{years}y{rest}d" if rest else f"{years}y"
    return f"{years}y"


def last_seen_cell(row: EventRow, *, now: float) -> str:
    age = human_duration(now - row.last_seen)
    if row.count > 1:
        return f"{age} (x{row.count} over {human_duration(now - row.first_seen)})"
    return age


def object_cell(row: EventRow) -> str:
    return f"{row.kind.lower()}/{row.name}"


def header(*, namespaced: bool, wide: bool) -> list[str]:
    cols = ["LAST SEEN", "TYPE", "REASON", "OBJECT"]
    cols += (
        ["SUBOBJECT", "SOURCE", "MESSAGE", "FIRST SEEN", "COUNT", "NAME"] if wide else ["MESSAGE"]
    )
    return cols if namespaced else ["NAMESPACE", *cols]


def cells(row: EventRow, *, now: float, namespaced: bool, wide: bool, node: str) -> list[str]:
    """One table line's cells, each `printable`. `namespaced`: one namespace was asked
    for (no NAMESPACE)."""
    out = [last_seen_cell(row, now=now), row.type, row.reason, object_cell(row)]
    if wide:
        source = f"{row.component}, {node}" if node else row.component
        out += [
            row.field_path,
            source,
            one_line(row.message),
            human_duration(now - row.first_seen),
            str(row.count),
            row.event_name,
        ]
    else:
        out.append(one_line(row.message))
    return [printable(cell) for cell in (out if namespaced else [row.namespace, *out])]


def one_line(message: str) -> str:
    """A message on one table line (a multi-line message would break the columns)."""
    return " ".join(message.split())


def widths(lines: Sequence[Sequence[str]]) -> list[int]:
    return [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]


def render_line(line: Sequence[str], column_widths: Sequence[int]) -> str:
    """A table line, columns three spaces apart (kubectl's padding); the last cell is
    not padded."""
    padded = [c.ljust(w) for c, w in zip(line[:-1], column_widths, strict=False)]
    return "   ".join([*padded, line[-1]]).rstrip()


def render_table(lines: Sequence[Sequence[str]]) -> str:
    column_widths = widths(lines)
    return "\n".join(render_line(line, column_widths) for line in lines)


def in_namespace(row: EventRow, namespace: str | None) -> bool:
    """Whether `row` is shown for `-n namespace` (None: every namespace)."""
    return namespace is None or row.namespace == namespace


def to_event(row: EventRow, *, node: str) -> JSON:
    """`row` as a core/v1 Event, as status-reporter would post it in cluster mode."""
    involved: JSON = {"kind": row.kind, "name": row.name, "apiVersion": "v1"}
    if row.namespace and row.kind != "Node":
        involved["namespace"] = row.namespace
    if row.uid:
        involved["uid"] = row.uid
    if row.field_path:
        involved["fieldPath"] = row.field_path
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": row.event_name, "namespace": row.namespace},
        "involvedObject": involved,
        "reason": row.reason,
        "message": row.message,
        "type": row.type,
        "source": {"component": row.component, "host": node},
        "firstTimestamp": rfc3339(row.first_seen),
        "lastTimestamp": rfc3339(row.last_seen),
        "count": row.count,
        "reportingComponent": row.component,
        "reportingInstance": node,
    }


def event_list(rows: Iterable[EventRow], *, node: str) -> JSON:
    """`-o json`: a v1 List of Events, as `kubectl get events -o json` prints."""
    return {"apiVersion": "v1", "kind": "List", "items": [to_event(r, node=node) for r in rows]}
