"""`klet why`'s index on the real bus, each service with its own real credential (issue 39
item 6, the index half; item 2's history expiry).

Any service can record an Event naming any UID, namespace and name, in its own Events
stream. status-reporter's history keeper, writing with its own credential through the
fenced write, keys a pod's index row and `history:<uid>` by what the tables' owners
say (syncloop's `status`, pod-source's `desired`): eviction's Event with a fresh UID
and a real pod's name makes no row and no key, the real pod's own Events join its
history, `klet why ns/name` tells the real pod's story, and every history key the
keeper writes carries its expiry (the fenced write refuses an append without it).
"""

from __future__ import annotations

import time

from klet.bus import Bus
from klet.bus.history import pod_story
from klet.devstack import RedisServer
from klet.model.records import EventRecord, PodStatusRecord
from klet.model.timestamps import rfc3339
from klet.status_reporter.metrics.instruments import Metrics
from klet.status_reporter.pods.history import HistoryKeeper, HistoryPolicy
from klet.status_reporter.pods.podcache import PodCache
from prometheus_client import CollectorRegistry

from tests.harness.busroles import leader

NODE = "indexed"


def status(uid: str) -> PodStatusRecord:
    now = time.time()
    return PodStatusRecord(
        uid=uid,
        namespace="ns",
        name="web",
        version=1,
        epoch=0.0,
        status={
            "phase": "Running",
            "containerStatuses": [
                {
                    "name": "app",
                    "ready": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": rfc3339(now)}},
                }
            ],
        },
        updated_at=now,
    )


def event(uid: str, namespace: str, name: str, reason: str) -> EventRecord:
    return EventRecord(
        type="Warning",
        reason=reason,
        message=f"{reason} by {uid}",
        involved={"kind": "Pod", "namespace": namespace, "name": name, "uid": uid},
        component="kubelet",
        at=time.time(),
    )


async def test_an_event_with_a_fresh_uid_cannot_take_a_real_pods_name(
    redis_server: RedisServer,
) -> None:
    policy = HistoryPolicy(max_entries=50, max_age_s=3600.0, read_block_ms=1)
    async with (
        leader(redis_server, NODE, "syncloop") as syncloop,
        leader(redis_server, NODE, "eviction") as eviction,
        leader(redis_server, NODE, "status-reporter") as reporter,
    ):
        await syncloop.status.put("real-uid", status("real-uid"))
        view = PodCache(  # the keeper's status changes are the view's (as wiring.py)
            desired=reporter.desired,
            status=reporter.status,
            feed=reporter.podstatus,
            metrics=Metrics(CollectorRegistry()),
        )
        keeper = HistoryKeeper(bus=reporter, consumer="leader-1", changes=view, policy=policy)
        await keeper.statuses_once()  # the full pass at election: the real pod's row
        # Later, a forged story under the real pod's name, and one the real pod's own.
        await eviction.events.publish(event("forged-uid", "ns", "web", "Evicted"))
        await eviction.events.publish(event("real-uid", "ns", "web", "Preempting"))
        # A real UID under another name does not rename its row either.
        await eviction.events.publish(event("real-uid", "kube-system", "other", "Killing"))
        while await keeper.events_once():
            pass
        found = await pod_story(reporter, "ns", "web")
        assert found is not None
        assert (found.story.uid, found.earlier) == ("real-uid", ())
        assert await pod_story(reporter, "kube-system", "other") is None
        assert set(await reporter.history.all()) == {"real-uid"}
        kept = await reporter.history_of("real-uid").latest(50)
        reasons = [e.record.reason for e in kept if e.record is not None]
        assert "Preempting" in reasons and "Killing" in reasons and "Evicted" not in reasons
    admin = Bus.from_url(redis_server.url, NODE, auth=redis_server.admin, timeout_s=10)
    try:
        client = admin.client
        assert await client.keys(admin.key("history:*")) == [admin.key("history:real-uid")]
        assert 0 < await client.pttl(admin.key("history:real-uid")) <= 3_600_000
    finally:
        await admin.close()
