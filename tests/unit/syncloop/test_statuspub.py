"""StatusPublisher's reconcile (pods/statuspub.py) against a copy of the `status` table.

Covers (issue 42): an idle reconcile reads the table's generation and nothing else; the
publisher's own flush moves the generation, and the next reconcile decodes only the rows
that flush wrote; a Redis restart (the table and its generation gone) is read in full
and every status published again; a status row of a pod nobody knows is removed.
A flush refused because the lease lapsed (Redis restarted empty) goes as soon as the
lease is back (`resume`), not after its retry delay; one that failed while Redis was
away is retried after it, and a success ends the back-off.
The in-memory bus (klet.testbed.fakes.bus); no sleeps.
"""

from __future__ import annotations

from klet.bus import BusUnavailable, Lease, LeaseLapsed, NodeBus
from klet.model.flowcontrol import BackoffPolicy
from klet.model.records import PodStatusRecord
from klet.model.types import PodUID
from klet.syncloop.pods.statuspub import StatusPublisher
from klet.testbed.fakes.bus import FakeBus


def known(uid: str) -> bool:
    return uid in {"u1", "u2"}


async def published() -> tuple[FakeBus, NodeBus, StatusPublisher]:
    bus = FakeBus()
    node = NodeBus.of(bus, service="syncloop")
    publisher = StatusPublisher(node, clock=lambda: 5.0, monotonic=lambda: 10.0)
    publisher.set("u1", "default", "a", {"phase": "Running"})
    publisher.set("u2", "default", "b", {"phase": "Pending"})
    await publisher.flush()
    await publisher.reconcile(known)
    return bus, node, publisher


async def test_an_idle_reconcile_reads_the_generation_only() -> None:
    bus, node, publisher = await published()
    bus.calls.clear()
    for _ in range(5):
        await publisher.reconcile(known)
        await publisher.flush()
    assert bus.calls == ["generations"] * 5  # nothing read, nothing re-marked or written
    assert publisher.table.decoded == 2


async def test_the_next_reconcile_decodes_only_what_a_flush_wrote() -> None:
    bus, node, publisher = await published()
    publisher.set("u2", "default", "b", {"phase": "Running"})
    await publisher.flush()
    bus.calls.clear()
    await publisher.reconcile(known)
    assert bus.calls == ["generations", "all"]
    assert publisher.table.decoded == 3  # u1 and u2 once, u2 again
    assert publisher.table.records["u2"] == (5.0, 2)  # all the copy keeps of a row


async def test_a_redis_restart_publishes_every_status_again() -> None:
    bus, node, publisher = await published()
    bus.restart()
    await publisher.reconcile(known)
    await publisher.flush()
    assert {uid: r.version for uid, r in bus.rows(node.status).items()} == {"u1": 1, "u2": 1}


async def test_a_status_of_a_pod_nobody_knows_is_removed() -> None:
    bus, node, publisher = await published()
    record = PodStatusRecord(
        uid=PodUID("u9"),
        namespace="default",
        name="gone",
        version=1,
        epoch=1.0,
        status={},
        updated_at=0.0,
    )
    bus.seed(node.status, "u9", record)  # an older leader's row
    await publisher.reconcile(known)
    await publisher.flush()
    assert set(bus.rows(node.status)) == {"u1", "u2"}


Leader = tuple[FakeBus, NodeBus, Lease, StatusPublisher]


async def leader_publisher(retry: BackoffPolicy) -> Leader:
    bus = FakeBus()
    lease = bus.lease("syncloop", "h1", ttl_ms=600_000)
    assert await lease.try_acquire()
    node = NodeBus.of(bus, service="syncloop")
    return bus, node, lease, StatusPublisher(node, clock=lambda: 5.0, retry=retry)


async def test_a_flush_refused_by_a_lapsed_lease_goes_as_soon_as_the_lease_is_back() -> None:
    # A retry delay no test outlives: only `resume` can end the wait.
    bus, node, lease, publisher = await leader_publisher(BackoffPolicy(600, 600))
    bus.restart()  # Redis restarted empty: the lease key is gone
    publisher.set("u1", "default", "a", {"phase": "Running"})
    await publisher.run_once()
    assert bus.rows(node.status) == {}
    assert await lease.try_acquire()  # the leader loop takes it back, then tells us
    publisher.resume()
    await publisher.run_once()
    assert set(bus.rows(node.status)) == {"u1"}


async def test_a_flush_that_found_redis_away_is_retried_and_a_success_ends_the_backoff() -> None:
    bus, node, _lease, publisher = await leader_publisher(BackoffPolicy(0, 0))
    publisher.set("u1", "default", "a", {"phase": "Running"})
    bus.fail(BusUnavailable("Connection closed by server."), LeaseLapsed("lapsed"))
    await publisher.run_once()
    await publisher.run_once()
    assert bus.rows(node.status) == {}
    await publisher.run_once()  # the retry delay (0 here), no resume needed
    assert set(bus.rows(node.status)) == {"u1"}
    publisher.set("u1", "default", "a", {"phase": "Failed"})
    await publisher.run_once()  # back to waiting for a change: one is there
    assert bus.rows(node.status)["u1"].status == {"phase": "Failed"}
