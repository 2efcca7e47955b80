"""Kubernetes Events from the bus's EventRecords: the pure part (bodies, aggregation).

We post core/v1 Events (`/api/v1/namespaces/<ns>/events`), which is what the upstream
kubelet's recorder still writes and what `kubectl describe` and `kubectl get events`
show. Rules restated from client-go's event correlator and recorder:

- **Name**: `<involved name>.<hex of Unix nanoseconds>`, in the involved object's
  namespace ("default" for cluster-scoped objects such as the Node).
- **Source**: `source.component` is the record's component ("kubelet" when empty),
  `source.host` the node; `reportingComponent`/`reportingInstance` mirror them.
- **Aggregation** (klet.model.eventfold's rule, which `klet events` shares): a record
  that folds into one posted less than the window (10 min) ago is not posted again; the
  existing Event's `count` is raised and its `lastTimestamp` moved (a PATCH). After the
  window, or when the PATCH finds the Event gone, a new Event is created.
- **Rate limit** (in `eventsink.py`, with `klet.model.flowcontrol.TokenBucket`): a
  token bucket of eventRecordQPS with eventBurst tokens; a post waits for its token
  (0 QPS = unlimited), so a burst is smoothed, never dropped.

Static pods' events are posted against their mirror pod (the only object of theirs the
apiserver knows); the caller does that translation.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from klet.model import eventfold
from klet.model.eventfold import DEFAULT_COMPONENT, DEFAULT_TYPE, EventKey
from klet.model.records import EventRecord
from klet.model.timestamps import rfc3339
from klet.model.types import JSON

AGGREGATION_WINDOW_S = eventfold.WINDOW_S
CACHE_SIZE = 4096


def involved_object(involved: JSON) -> JSON:
    """The API ObjectReference of a record's `involved` (apiVersion v1 unless given)."""
    ref: JSON = {
        "kind": str(involved.get("kind") or ""),
        "name": str(involved.get("name") or ""),
        "apiVersion": str(involved.get("apiVersion") or "v1"),
    }
    for key in ("namespace", "uid", "fieldPath", "resourceVersion"):
        if involved.get(key):
            ref[key] = str(involved[key])
    return ref


def event_namespace(ref: JSON) -> str:
    return str(ref.get("namespace") or "default")


def event_key(record: EventRecord, ref: JSON) -> EventKey:
    """What makes two records "the same event" for aggregation."""
    return eventfold.fold_key(ref, record)


def event_name(ref: JSON, at: float) -> str:
    return eventfold.event_name(ref.get("name"), at)


def new_event(record: EventRecord, ref: JSON, *, node_name: str, name: str) -> JSON:
    """The core/v1 Event to create for `record` about `ref`."""
    component = record.component or DEFAULT_COMPONENT
    stamp = rfc3339(record.at)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": event_namespace(ref)},
        "involvedObject": ref,
        "reason": record.reason,
        "message": record.message,
        "type": record.type or DEFAULT_TYPE,
        "source": {"component": component, "host": node_name},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": max(1, record.count),
        "reportingComponent": component,
        "reportingInstance": node_name,
    }


def count_patch(count: int, at: float) -> JSON:
    """The patch that records `count` occurrences, the latest at `at`."""
    return {"count": count, "lastTimestamp": rfc3339(at)}


@dataclass
class _Seen:
    name: str
    count: int
    last: float


@dataclass(frozen=True)
class Post:
    """What to do with one record: create a new Event, or patch `name`'s count."""

    kind: str  # "create" | "patch"
    name: str
    count: int


class Aggregator:
    """The correlator's memory: recent Events by key, least recently used evicted."""

    def __init__(self, *, window_s: float = AGGREGATION_WINDOW_S, size: int = CACHE_SIZE) -> None:
        self.window_s = window_s
        self.size = size
        self._seen: OrderedDict[EventKey, _Seen] = OrderedDict()

    def decide(self, key: EventKey, record: EventRecord, ref: JSON) -> Post:
        seen = self._seen.get(key)
        if seen is not None and eventfold.folds(seen.last, record.at, self.window_s):
            return Post("patch", seen.name, seen.count + max(1, record.count))
        return Post("create", event_name(ref, record.at), max(1, record.count))

    def posted(self, key: EventKey, post: Post, *, at: float) -> None:
        """Remember an Event that now exists with `post.count`, last seen `at`."""
        self._seen[key] = _Seen(post.name, post.count, at)
        self._seen.move_to_end(key)
        while len(self._seen) > self.size:
            self._seen.popitem(last=False)

    def forget(self, key: EventKey) -> None:
        self._seen.pop(key, None)
