"""Posting the `events` stream: a record becomes a core/v1 Event; a repeat within the
window raises the count instead; a forgotten Event is created again; a static pod's
event names its mirror pod; malformed entries and refused Events are acknowledged and
dropped; an unavailable apiserver is retried (bounded) and logged once; a redelivered
record does not create a second Event; a container failing to be created over and over,
with a message that differs each time, is one combined Event whose count rises (PATCHed),
and past the spam filter's burst its occurrences are counted, not posted."""

from __future__ import annotations

import logging

import pytest
from klet.kube import Invalid, Unavailable
from klet.model.flowcontrol import BackoffPolicy
from klet.model.records import EventRecord
from klet.model.types import JSON
from klet.status_reporter.cluster.eventsink import GROUP, EventPolicy, EventSink
from klet.status_reporter.cluster.kubeapi import NO_RETRY, KubeApi
from klet.testbed.fakes.bus import FakeBus, FakeStream
from klet.testbed.fakes.status_reporter import FakeApiServer

EVENTS = "/api/v1/namespaces/ns1/events"


def record(*, at: float = 1000.0, uid: str = "u1", message: str = "pulling") -> EventRecord:
    return EventRecord(
        type="Normal",
        reason="Pulling",
        message=message,
        involved={"kind": "Pod", "namespace": "ns1", "name": "web", "uid": uid},
        component="kubelet",
        at=at,
    )


class World:
    def __init__(self, *, max_tries: int = 3) -> None:
        self.now = [100.0]
        self.kube = FakeApiServer()
        self.bus = FakeBus()
        self.feed = FakeStream(self.bus, "events", EventRecord, maxlen=10_000)
        self.mirrors: dict[str, str] = {}
        self.sink = EventSink(
            feed=self.feed,
            api=KubeApi(self.kube, retry=NO_RETRY),
            node_name="node1",
            mirror_uid=lambda uid: self.mirrors.get(uid),
            consumer="test",
            policy=EventPolicy(
                qps=0, max_tries=max_tries, retry=BackoffPolicy(0.0, 0.0), read_block_ms=1
            ),
            monotonic=lambda: self.now[0],
        )

    def events(self) -> list[JSON]:
        return [o for k, o in self.kube.objects.items() if k.startswith(EVENTS + "/")]


async def test_record_becomes_an_event_and_repeats_are_counted() -> None:
    w = World()
    w.bus.append(w.feed, record(at=1000.0))
    w.bus.append(w.feed, record(at=1010.0))
    assert await w.sink.consume_once() == 2
    [event] = w.events()
    assert event["count"] == 2
    assert event["lastTimestamp"] == "1970-01-01T00:16:50Z"
    assert event["source"] == {"component": "kubelet", "host": "node1"}
    assert w.feed.pending(GROUP) == [] and len(w.feed.acked) == 2


async def test_forgotten_event_is_created_again() -> None:
    w = World()
    await w.sink.post(record(at=1000.0))
    [first] = w.events()
    w.kube.objects.clear()  # the apiserver's event TTL removed it
    await w.sink.post(record(at=1001.0))
    [event] = w.events()  # created again, as upstream's recorder does: name and count kept
    assert event["metadata"]["name"] == first["metadata"]["name"] and event["count"] == 2


async def test_static_pod_event_names_the_mirror() -> None:
    w = World()
    w.mirrors["static-uid"] = "mirror-uid"
    await w.sink.post(record(uid="static-uid"))
    [event] = w.events()
    assert event["involvedObject"]["uid"] == "mirror-uid"


async def test_bad_and_refused_entries_are_acked(caplog: pytest.LogCaptureFixture) -> None:
    w = World()
    w.bus.plant(w.feed, '{"v": 9}')  # event: unsupported version 9
    w.kube.fail_next("POST", "events", Invalid("bad name"))
    w.bus.append(w.feed, record(message="refused"))
    w.bus.append(w.feed, record(message="fine"))
    caplog.set_level(logging.ERROR)
    await w.sink.consume_once()
    assert [e["message"] for e in w.events()] == ["fine"]
    assert len(w.feed.acked) == 3
    messages = [r.message for r in caplog.records]
    assert "bad events entry, acknowledging without posting" in messages
    assert "event refused by the apiserver, dropping it" in messages


async def test_unavailable_is_retried_then_dropped(caplog: pytest.LogCaptureFixture) -> None:
    w = World(max_tries=3)
    w.kube.fail_next("POST", "events", Unavailable("down"))
    w.bus.append(w.feed, record())
    await w.sink.consume_once()
    assert len(w.events()) == 1  # second try worked

    w.kube.down = True
    caplog.set_level(logging.WARNING)
    caplog.clear()
    w.bus.append(w.feed, record(message="lost"))
    await w.sink.consume_once()
    assert w.kube.count("POST") == 2 + 3
    messages = [r.message for r in caplog.records]
    assert messages.count("cannot post events, apiserver unavailable") == 1
    assert "event dropped after retries" in messages
    assert w.feed.pending(GROUP) == []


async def test_redelivery_creates_no_duplicate() -> None:
    w = World()
    await w.sink.post(record())
    fresh = World()
    fresh.kube = w.kube
    fresh.sink._api = KubeApi(w.kube, retry=NO_RETRY)  # noqa: SLF001 - a restarted sink
    await fresh.sink.post(record())
    assert len(w.events()) == 1


async def test_node_event_in_default_namespace() -> None:
    w = World()
    await w.sink.post(
        EventRecord(
            type="Normal",
            reason="NodeReady",
            message="Node node1 status is now: NodeReady",
            involved={"kind": "Node", "name": "node1", "uid": "node1"},
            component="kubelet",
            at=5.0,
        )
    )
    assert any(k.startswith("/api/v1/namespaces/default/events/node1.") for k in w.kube.objects)


async def test_stale_entries_are_taken_over_again_every_reclaim_interval() -> None:
    # Each takeover also removes dead consumers from the group (Stream.claim_stale).
    w = World()
    await w.sink.consume_once()
    await w.sink.consume_once()
    assert w.bus.calls.count("claim_stale") == 1
    w.now[0] += EventPolicy().reclaim_interval_s
    await w.sink.consume_once()
    assert w.bus.calls.count("claim_stale") == 2
    assert w.bus.calls.count("ensure_group") == 1


async def test_a_new_leader_takes_over_the_old_leaders_pending_entries_at_once() -> None:
    # The old leader read two entries, posted both, acknowledged the first and died.
    # Only the leader consumes, so the new one claims every pending entry when it starts
    # (not after claim_idle_ms, 30 s), posts it again (AlreadyExists: no second Event)
    # and acknowledges it.
    w = World()
    w.bus.append(w.feed, record(at=1000.0, message="first"))
    w.bus.append(w.feed, record(at=1001.0, message="second"))
    first, second = await w.feed.read(GROUP, "old-leader", count=10, block_ms=1)
    for entry in (first, second):
        assert entry.record is not None
        await w.sink.post(entry.record)
    await w.feed.ack(GROUP, first.id)
    assert w.feed.pending(GROUP) == [second.id]

    new = World()
    new.kube, new.bus, new.feed = w.kube, w.bus, w.feed
    new.sink = EventSink(
        feed=w.feed,
        api=KubeApi(w.kube, retry=NO_RETRY),
        node_name="node1",
        mirror_uid=lambda uid: None,
        consumer="new-leader",
        policy=EventPolicy(qps=0, read_block_ms=1),  # claim_idle_ms: the default 30 s
        monotonic=lambda: new.now[0],
    )
    await new.sink.consume_once()
    assert w.feed.pending(GROUP) == []
    assert w.feed.acked == [first.id, second.id]
    assert sorted(e["message"] for e in w.events()) == ["first", "second"]
    assert all(e["count"] == 1 for e in w.events())

    # Later takeovers wait for claim_idle_ms again: a live leader's own entries stay.
    w.bus.append(w.feed, record(at=1002.0, message="third"))
    await w.feed.read(GROUP, "someone", count=10, block_ms=1)
    new.now[0] += EventPolicy().reclaim_interval_s
    await new.sink.consume_once()
    assert len(w.feed.pending(GROUP)) == 1


def failed(at: float, attempt: int) -> EventRecord:
    return EventRecord(
        type="Warning",
        reason="Failed",
        message=f"Error: failed to create containerd container {attempt:064x}: not shared",
        involved={
            "kind": "Pod",
            "namespace": "ns1",
            "name": "web",
            "uid": "u1",
            "fieldPath": "spec.containers{main}",
        },
        component="kubelet",
        at=at,
    )


async def test_a_container_failing_again_and_again_is_one_event_with_a_rising_count() -> None:
    w = World()
    counts: list[int] = []
    for attempt in range(60):  # one failed create every 14 s for 14 minutes
        await w.sink.post(failed(1000.0 + 14 * attempt, attempt))
        combined = [e for e in w.events() if e["message"].startswith("(combined")]
        if combined:
            counts.append(combined[0]["count"])
    separate = [e for e in w.events() if not e["message"].startswith("(combined")]
    assert len(separate) == 9  # the first nine messages, each once
    [combined] = [e for e in w.events() if e["message"].startswith("(combined")]
    assert combined["type"] == "Warning" and combined["reason"] == "Failed"
    assert counts == sorted(counts) and counts[0] == 1 and counts[-1] > counts[0]
    # The spam filter: 25 tokens at once and one per 300 s (14/300 per record): records
    # 0-24 take the 25, record 25 (1350 s) the 1.17 refilled meanwhile, record 43
    # (1602 s, 1.007 tokens) the next; records 44-59 (up to 1826 s) find none. The
    # combined Event then holds every occurrence from the 10th record to the 44th.
    assert w.sink.posted == 27 and w.sink.filtered == 60 - 27
    assert combined["count"] == 44 - 9
    assert combined["message"] == "(combined from similar events): " + failed(0, 43).message
    assert combined["lastTimestamp"] == "1970-01-01T00:26:42Z"  # 1000 + 14 * 43 s
    assert w.kube.count("PATCH") == 27 - 10


async def test_the_spam_filter_holds_back_one_objects_events_only() -> None:
    w = World()
    for i in range(30):
        await w.sink.post(record(at=1000.0 + i, message=f"m{i % 5}"))
    await w.sink.post(record(at=1031.0, uid="u2"))  # another pod: its own bucket
    assert w.sink.filtered == 5
    assert sum(e["count"] for e in w.events() if e["involvedObject"]["uid"] == "u1") == 25
    assert [e["count"] for e in w.events() if e["involvedObject"]["uid"] == "u2"] == [1]
