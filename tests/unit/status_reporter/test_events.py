"""Event bodies, naming and namespace, aggregation within the 10-minute window (count
raised, then a new Event after the window or when forgotten) and LRU bound."""

from __future__ import annotations

from klet.model.records import EventRecord
from klet.status_reporter import events


def record(*, at: float = 1000.0, message: str = "pulling", count: int = 1) -> EventRecord:
    return EventRecord(
        type="Normal",
        reason="Pulling",
        message=message,
        involved={
            "kind": "Pod",
            "namespace": "ns1",
            "name": "web",
            "uid": "u1",
            "fieldPath": "spec.containers{app}",
        },
        component="",
        at=at,
        count=count,
    )


def test_new_event_body() -> None:
    rec = record()
    ref = events.involved_object(rec.involved)
    body = events.new_event(rec, ref, node_name="node1", name="web.1")
    assert body["metadata"] == {"name": "web.1", "namespace": "ns1"}
    assert body["involvedObject"] == {
        "kind": "Pod",
        "name": "web",
        "apiVersion": "v1",
        "namespace": "ns1",
        "uid": "u1",
        "fieldPath": "spec.containers{app}",
    }
    assert body["source"] == {"component": "kubelet", "host": "node1"}
    assert body["count"] == 1
    assert body["firstTimestamp"] == body["lastTimestamp"] == "1970-01-01T00:16:40Z"
    assert (body["type"], body["reason"], body["message"]) == ("Normal", "Pulling", "pulling")


def test_node_events_go_to_default_namespace() -> None:
    ref = events.involved_object({"kind": "Node", "name": "node1", "uid": "node1"})
    assert events.event_namespace(ref) == "default"
    assert events.event_name(ref, 1.5) == f"node1.{int(1.5e9):x}"


def test_aggregation_window() -> None:
    agg = events.Aggregator(window_s=600)
    first = record(at=1000.0)
    ref = events.involved_object(first.involved)
    key = events.event_key(first, ref)
    post = agg.decide(key, first, ref)
    assert post.kind == "create" and post.count == 1
    agg.posted(key, post, at=first.at)

    again = agg.decide(key, record(at=1500.0, count=2), ref)
    assert (again.kind, again.name, again.count) == ("patch", post.name, 3)
    agg.posted(key, again, at=1500.0)

    later = agg.decide(key, record(at=2200.0), ref)  # 700 s after the last one
    assert later.kind == "create" and later.name != post.name

    other = record(message="different")
    assert events.event_key(other, ref) != key
    agg.forget(key)
    assert agg.decide(key, record(at=1501.0), ref).kind == "create"


def test_aggregator_is_bounded() -> None:
    agg = events.Aggregator(size=2)
    ref = events.involved_object(record().involved)
    keys = []
    for i in range(3):
        rec = record(message=f"m{i}")
        key = events.event_key(rec, ref)
        keys.append(key)
        agg.posted(key, agg.decide(key, rec, ref), at=rec.at)
    assert agg.decide(keys[0], record(message="m0"), ref).kind == "create"
    assert agg.decide(keys[2], record(message="m2"), ref).kind == "patch"
