"""The rule that folds Event records into Events, restated from client-go's event
correlator. status-reporter applies it before it posts (one Event whose count grows)
and `klet events` applies it to show a standalone node's records the same way, so it
lives here once.

Two records are one Event when they have the same involved object (kind, namespace,
name, uid, fieldPath), type, reason, message and component, and the later comes less
than the window (10 min) after the previous one. An Event is named
`<object name>.<hex Unix nanoseconds of its first record>`.

Similar records (client-go's EventAggregator, `SimilarEvents`): the same object
(without its fieldPath), type, reason and component with different messages. From the
10th distinct message within the window, a record folds under the similar key instead,
with the message "(combined from similar events): <its message>": one Event whose count
rises, its message the latest, instead of one per message (a failing CreateContainer
whose error names a new container ID each time).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

from klet.model.records import EventRecord

WINDOW_S = 600.0
"""Records further apart than this are separate Events (client-go's aggregation window)."""

DEFAULT_COMPONENT = "kubelet"
DEFAULT_TYPE = "Normal"

EventKey = tuple[str, ...]

SIMILAR_MAX = 10
"""Distinct messages of similar records in the window before they are combined
(client-go's defaultAggregateMaxEvents)."""
COMBINED_PREFIX = "(combined from similar events): "
CACHE_SIZE = 4096

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


def similar_key(involved: Mapping[str, object], record: EventRecord) -> EventKey:
    """What makes records "similar" (client-go's EventAggregatorByReasonFunc): the
    object without its fieldPath, type, reason and component; not the message."""
    subject = tuple(str(involved.get(f) or "") for f in ("kind", "namespace", "name", "uid"))
    return (
        "similar",
        *subject,
        record.type or DEFAULT_TYPE,
        record.reason,
        record.component or DEFAULT_COMPONENT,
    )


@dataclass
class _Similar:
    messages: OrderedDict[str, None]
    last: float


class SimilarEvents:
    """client-go's EventAggregator: the key a record folds under and the message its
    Event carries. Records are expected roughly in time order."""

    def __init__(
        self,
        *,
        window_s: float = WINDOW_S,
        max_messages: int = SIMILAR_MAX,
        size: int = CACHE_SIZE,
    ) -> None:
        self.window_s = window_s
        self.max_messages = max_messages
        self.size = size
        self._seen: OrderedDict[EventKey, _Similar] = OrderedDict()

    def classify(self, involved: Mapping[str, object], record: EventRecord) -> tuple[EventKey, str]:
        """(the key, the message) of `record`'s Event: its own, or the combined one."""
        key = similar_key(involved, record)
        entry = self._seen.get(key)
        if entry is None or not folds(entry.last, record.at, self.window_s):
            entry = _Similar(OrderedDict(), record.at)
        entry.messages[record.message] = None
        entry.last = max(entry.last, record.at)
        self._seen[key] = entry
        self._seen.move_to_end(key)
        while len(self._seen) > self.size:
            self._seen.popitem(last=False)
        if len(entry.messages) < self.max_messages:
            return fold_key(involved, record), record.message
        entry.messages.popitem(last=False)  # never more than the maximum
        return key, COMBINED_PREFIX + record.message
