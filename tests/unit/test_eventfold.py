"""klet.model.eventfold: the one folding rule that status-reporter's aggregator and
`klet events` both apply, so a standalone node's table matches what a cluster holds;
similar records (messages that differ) fold alike too, into one combined Event from
the 10th distinct message."""

from __future__ import annotations

from klet.cli.eventview import aggregate
from klet.model.eventfold import WINDOW_S, event_name, fold_key, folds
from klet.model.records import EventRecord
from klet.status_reporter.cluster.eventbodies import (
    Aggregator,
    Correlator,
    event_key,
    involved_object,
)

POD = {"kind": "Pod", "namespace": "ns", "name": "web", "uid": "u1"}


def _record(at: float, *, reason: str = "BackOff", component: str = "") -> EventRecord:
    return EventRecord(
        involved=dict(POD), type="Warning", reason=reason, message="m", component=component, at=at
    )


def test_the_key_defaults_type_and_component() -> None:
    bare = EventRecord(involved=dict(POD), type="", reason="R", message="m", component="", at=1.0)
    named = EventRecord(
        involved=dict(POD), type="Normal", reason="R", message="m", component="kubelet", at=2.0
    )
    assert fold_key(POD, bare) == fold_key(POD, named)
    assert fold_key(POD, bare) != fold_key({**POD, "fieldPath": "spec.containers{c}"}, bare)


def test_window_is_open_below_ten_minutes_either_way() -> None:
    assert folds(100.0, 100.0 + WINDOW_S - 1)
    assert folds(100.0, 90.0)
    assert not folds(100.0, 100.0 + WINDOW_S)


def test_status_reporter_and_klet_events_fold_alike() -> None:
    records = [_record(0.0), _record(300.0), _record(300.0 + WINDOW_S), _record(5.0, reason="X")]
    shown = aggregate(records)
    posted: dict[tuple[str, ...], int] = {}
    aggregator = Aggregator()
    names = []
    for record in sorted(records, key=lambda r: r.at):
        ref = involved_object(record.involved)
        key = event_key(record, ref)
        post = aggregator.decide(key, record, ref)
        aggregator.posted(key, post, at=record.at)
        posted[(*key, post.name)] = post.count
        names.append(post.name)
    assert sorted(row.count for row in shown) == sorted(posted.values()) == [1, 1, 2]
    assert {row.event_name for row in shown} == set(names)
    assert event_name("web", 0.0) in names


def test_similar_records_fold_alike_in_status_reporter_and_klet_events() -> None:
    records = [
        EventRecord(
            involved={**POD, "fieldPath": "spec.containers{main}"},
            type="Warning",
            reason="Failed",
            message=f"Error: failed to generate container {i:08x}",
            component="kubelet",
            at=100.0 + 12 * i,
        )
        for i in range(14)
    ]
    shown = aggregate(records)
    assert len(shown) == 10
    combined = [row for row in shown if row.message.startswith("(combined from similar events): ")]
    assert [(row.count, row.message) for row in combined] == [
        (5, "(combined from similar events): " + records[-1].message)
    ]
    correlator = Correlator(spam_burst=1000)
    posted: dict[tuple[str, ...], tuple[int, str]] = {}
    for record in records:
        found = correlator.correlate(record, involved_object(record.involved))
        correlator.posted(found, found.post, at=record.at)
        posted[found.key] = (found.post.count, found.message)
    assert sorted(posted.values()) == sorted((row.count, row.message) for row in shown)
