"""The rule that folds Event records into Events, restated from client-go's event
correlator. status-reporter applies it before it posts (one Event whose count grows)
and `klet events` applies it to show a standalone node's records the same way, so it
lives here once.

Two records are one Event when they have the same involved object (kind, namespace,
name, uid, fieldPath), type, reason, message and component, and the later comes less
than the window (10 min) after the previous one. An Event is named
`<object name>.<hex Unix nanoseconds of its first record>`.
"""

from __future__ import annotations

from collections.abc import Mapping

from klet.model.records import EventRecord

WINDOW_S = 600.0
"""Records further apart than this are separate Events (client-go's aggregation window)."""

DEFAULT_COMPONENT = "kubelet"
DEFAULT_TYPE = "Normal"

EventKey = tuple[str, ...]

_OBJECT_FIELDS = ("kind", "namespace", "name", "uid", "fieldPath")


def fold_key(involved: Mapping[str, object], record: EventRecord) -> EventKey:
    """What makes `record` about `involved` the same Event as another."""
    subject = tuple(str(involved.get(field) or "") for field in _OBJECT_FIELDS)
    return (
        *subject,
        record.type or DEFAULT_TYPE,
        record.reason,
        record.message,
        record.component or DEFAULT_COMPONENT,
    )


def folds(last_seen: float, at: float, window_s: float = WINDOW_S) -> bool:
    """Whether a record at `at` joins the Event last seen at `last_seen`. Records of one
    stream come in order; across streams one may be a little older than the last folded
    in, which still joins."""
    return abs(at - last_seen) < window_s


def event_name(object_name: object, first_at: float) -> str:
    return f"{object_name or 'unknown'}.{int(first_at * 1e9):x}"
