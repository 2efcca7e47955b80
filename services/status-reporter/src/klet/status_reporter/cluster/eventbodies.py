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
- **Similar events** (client-go's EventAggregator, eventfold's `SimilarEvents`, which
  `klet events` applies too): records about one object (kind,
  namespace, name, uid; not the fieldPath) with the same type, reason and component
  but different messages are counted by distinct message over the window; from the
  10th distinct message on, a record is posted as one Event with the message
  "(combined from similar events): <its message>" whose count rises (the PATCH moves
  the message to the latest), instead of one Event per message. The count of distinct
  messages never grows past 10 (one is let go each time), as upstream's.
- **Spam filter** (client-go's EventSourceObjectSpamFilter): a token bucket per
  involved object (kind, namespace, name, uid) of burst 25 refilled one token every
  5 minutes, measured on the records' own times; a record finding it empty is not
  posted, but still counted into its Event, so the next one posted carries the count
  of all (upstream observes before it filters).
- **Rate limit** (in `eventsink.py`, with `klet.model.flowcontrol.TokenBucket`): a
  token bucket of eventRecordQPS with eventBurst tokens; a post waits for its token
  (0 QPS = unlimited), so a burst is smoothed, never dropped.

The correlation memory is per process, as upstream's: a new status-reporter leader
starts with fresh buckets and creates new Events for what repeats.

Static pods' events are posted against their mirror pod (the only object of theirs the
apiserver knows); the caller does that translation.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from klet.model import eventfold
from klet.model.eventfold import DEFAULT_COMPONENT, DEFAULT_TYPE, EventKey, SimilarEvents
from klet.model.flowcontrol import TokenBucket
from klet.model.records import EventRecord
from klet.model.timestamps import rfc3339
from klet.model.types import JSON

AGGREGATION_WINDOW_S = eventfold.WINDOW_S
CACHE_SIZE = 4096
SIMILAR_MAX = eventfold.SIMILAR_MAX
COMBINED_PREFIX = eventfold.COMBINED_PREFIX
SPAM_BURST = 25
"""Events one object may have posted at once (client-go's defaultSpamBurst)..."""
SPAM_QPS = 1.0 / 300.0
"""...and the refill: one more every 5 minutes (defaultSpamQPS)."""


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


def new_event(
    record: EventRecord,
    ref: JSON,
    *,
    node_name: str,
    name: str,
    message: str | None = None,
    count: int | None = None,
) -> JSON:
    """The core/v1 Event to create for `record` about `ref` (with the correlator's
    message and count when given)."""
    component = record.component or DEFAULT_COMPONENT
    stamp = rfc3339(record.at)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": event_namespace(ref)},
        "involvedObject": ref,
        "reason": record.reason,
        "message": record.message if message is None else message,
        "type": record.type or DEFAULT_TYPE,
        "source": {"component": component, "host": node_name},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": max(1, record.count) if count is None else count,
        "reportingComponent": component,
        "reportingInstance": node_name,
    }


def count_patch(count: int, at: float, message: str | None = None) -> JSON:
    """The patch that records `count` occurrences, the latest at `at` (and, for a
    combined Event, the latest message)."""
    patch: JSON = {"count": count, "lastTimestamp": rfc3339(at)}
    if message is not None:
        patch["message"] = message
    return patch


def spam_key(ref: JSON) -> EventKey:
    """The spam filter's key: the involved object (the source is always this node's)."""
    return tuple(str(ref.get(f) or "") for f in ("kind", "namespace", "name", "uid"))


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


@dataclass
class SpamFilter:
    """client-go's EventSourceObjectSpamFilter: a token bucket per involved object."""

    burst: int = SPAM_BURST
    qps: float = SPAM_QPS
    size: int = CACHE_SIZE
    _buckets: OrderedDict[EventKey, TokenBucket] = field(default_factory=OrderedDict)

    def allows(self, ref: JSON, at: float) -> bool:
        key = spam_key(ref)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = TokenBucket(self.qps, self.burst, now=at)
        self._buckets[key] = bucket
        self._buckets.move_to_end(key)
        while len(self._buckets) > self.size:
            self._buckets.popitem(last=False)
        return bucket.try_take(at)


@dataclass(frozen=True)
class Correlation:
    """What to do with one record (client-go's EventCorrelateResult)."""

    key: EventKey
    post: Post
    message: str
    combined: bool
    skip: bool
    """The spam filter holds it back: counted into its Event, not posted."""


class Correlator:
    """client-go's EventCorrelator over the bus's records: similar events combined,
    identical ones counted into one Event, each object's Events rate-limited."""

    def __init__(
        self,
        *,
        window_s: float = AGGREGATION_WINDOW_S,
        similar_max: int = SIMILAR_MAX,
        spam_burst: int = SPAM_BURST,
        spam_qps: float = SPAM_QPS,
        size: int = CACHE_SIZE,
    ) -> None:
        self.similar = SimilarEvents(window_s=window_s, max_messages=similar_max, size=size)
        self.events = Aggregator(window_s=window_s, size=size)
        self.spam = SpamFilter(burst=spam_burst, qps=spam_qps, size=size)

    def correlate(self, record: EventRecord, ref: JSON) -> Correlation:
        key, message = self.similar.classify(ref, record)
        post = self.events.decide(key, record, ref)
        skip = not self.spam.allows(ref, record.at)
        if skip:
            # Observed before filtered (upstream): the Event to come carries this one.
            self.events.posted(key, post, at=record.at)
        return Correlation(key, post, message, message != record.message, skip)

    def posted(self, correlation: Correlation, post: Post, *, at: float) -> None:
        """The Event now exists with `post.count`, last seen `at`."""
        self.events.posted(correlation.key, post, at=at)

    def forget(self, key: EventKey) -> None:
        self.events.forget(key)
