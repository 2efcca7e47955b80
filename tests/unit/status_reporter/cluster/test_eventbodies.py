"""Event bodies, naming and namespace, aggregation within the 10-minute window (count
raised, then a new Event after the window or when forgotten) and LRU bound; the
correlator, table-driven: similar records (one object, type and reason, messages that
differ) combined from the 10th distinct message in the window, identical ones counted,
and the spam filter's burst of 25 per object refilled one every 5 minutes."""

from __future__ import annotations

import pytest
from klet.model.records import EventRecord
from klet.status_reporter.cluster import eventbodies


def web_pod(field_path: str = "spec.containers{app}") -> dict[str, str]:
    """The involved object of every record here: pod ns1/web's `field_path`."""
    return {
        "kind": "Pod",
        "namespace": "ns1",
        "name": "web",
        "uid": "u1",
        "fieldPath": field_path,
    }


def record(*, at: float = 1000.0, message: str = "pulling", count: int = 1) -> EventRecord:
    return EventRecord(
        type="Normal",
        reason="Pulling",
        message=message,
        involved=web_pod(),
        component="",
        at=at,
        count=count,
    )


def test_new_event_body() -> None:
    rec = record()
    ref = eventbodies.involved_object(rec.involved)
    body = eventbodies.new_event(rec, ref, node_name="node1", name="web.1")
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
    ref = eventbodies.involved_object({"kind": "Node", "name": "node1", "uid": "node1"})
    assert eventbodies.event_namespace(ref) == "default"
    assert eventbodies.event_name(ref, 1.5) == f"node1.{int(1.5e9):x}"


def test_aggregation_window() -> None:
    agg = eventbodies.Aggregator(window_s=600)
    first = record(at=1000.0)
    ref = eventbodies.involved_object(first.involved)
    key = eventbodies.event_key(first, ref)
    post = agg.decide(key, first, ref)
    assert post.kind == "create" and post.count == 1
    agg.posted(key, post, at=first.at)

    again = agg.decide(key, record(at=1500.0, count=2), ref)
    assert (again.kind, again.name, again.count) == ("patch", post.name, 3)
    agg.posted(key, again, at=1500.0)

    later = agg.decide(key, record(at=2200.0), ref)  # 700 s after the last one
    assert later.kind == "create" and later.name != post.name

    other = record(message="different")
    assert eventbodies.event_key(other, ref) != key
    agg.forget(key)
    assert agg.decide(key, record(at=1501.0), ref).kind == "create"


def test_aggregator_is_bounded() -> None:
    agg = eventbodies.Aggregator(size=2)
    ref = eventbodies.involved_object(record().involved)
    keys = []
    for i in range(3):
        rec = record(message=f"m{i}")
        key = eventbodies.event_key(rec, ref)
        keys.append(key)
        agg.posted(key, agg.decide(key, rec, ref), at=rec.at)
    assert agg.decide(keys[0], record(message="m0"), ref).kind == "create"
    assert agg.decide(keys[2], record(message="m2"), ref).kind == "patch"


def step(
    corr: eventbodies.Correlator, *, at: float, message: str, field: str = "spec.containers{app}"
) -> tuple[str, int, str]:
    """Correlate one record as the sink does (posting what is not skipped):
    (create/patch/skip, count, message)."""
    rec = EventRecord(
        type="Warning",
        reason="Failed",
        message=message,
        involved=web_pod(field),
        component="kubelet",
        at=at,
    )
    found = corr.correlate(rec, eventbodies.involved_object(rec.involved))
    if found.skip:
        return "skip", found.post.count, found.message
    corr.posted(found, found.post, at=at)
    return found.post.kind, found.post.count, found.message


C = eventbodies.COMBINED_PREFIX


@pytest.mark.parametrize(
    ("records", "expected"),
    [
        # identical records: one Event, its count rising
        (
            [(0, "a"), (10, "a"), (20, "a")],
            [("create", 1, "a"), ("patch", 2, "a"), ("patch", 3, "a")],
        ),
        # nine distinct messages are nine Events; the tenth starts the combined one,
        # which later distinct messages join (its message the latest)
        (
            [(i, f"m{i}") for i in range(12)],
            [("create", 1, f"m{i}") for i in range(9)]
            + [("create", 1, C + "m9"), ("patch", 2, C + "m10"), ("patch", 3, C + "m11")],
        ),
        # a container's fieldPath does not make records less similar
        (
            [(i, f"m{i}", f"spec.containers{{c{i % 2}}}") for i in range(10)],
            [("create", 1, f"m{i}") for i in range(9)] + [("create", 1, C + "m9")],
        ),
        # the window: similar records 10 minutes after the last start counting anew
        (
            [(i, f"m{i}") for i in range(10)] + [(609, "m10")],
            [("create", 1, f"m{i}") for i in range(9)]
            + [("create", 1, C + "m9"), ("create", 1, "m10")],
        ),
    ],
)
def test_correlator(
    records: list[tuple[float, str] | tuple[float, str, str]],
    expected: list[tuple[str, int, str]],
) -> None:
    corr = eventbodies.Correlator(spam_burst=1000)
    got = []
    for r in records:
        field = r[2] if len(r) == 3 else "spec.containers{app}"
        got.append(step(corr, at=float(r[0]), message=r[1], field=field))
    assert got == expected


@pytest.mark.parametrize(
    ("times", "posted"),
    [
        ([0.0] * 25, 25),  # the burst
        ([0.0] * 30, 25),  # then nothing at once
        ([0.0] * 30 + [299.0], 25),  # nor before the 5 minutes are up
        ([0.0] * 30 + [300.0, 301.0], 26),  # one token every 5 minutes
        ([0.0] * 30 + [30000.0] * 30, 50),  # refilled up to the burst, not beyond
    ],
)
def test_spam_filter(times: list[float], posted: int) -> None:
    corr = eventbodies.Correlator()
    kinds = [step(corr, at=t, message="same")[0] for t in times]
    assert len([k for k in kinds if k != "skip"]) == posted


def test_held_back_records_are_counted_into_the_next_post() -> None:
    corr = eventbodies.Correlator(spam_burst=2, spam_qps=1.0 / 300)
    got = [step(corr, at=t, message="same") for t in (0.0, 1.0, 2.0, 3.0, 301.0)]
    assert got == [
        ("create", 1, "same"),
        ("patch", 2, "same"),
        ("skip", 3, "same"),
        ("skip", 4, "same"),
        ("patch", 5, "same"),
    ]
