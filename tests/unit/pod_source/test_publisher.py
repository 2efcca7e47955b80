"""The publisher writes a node's whole set of pods however large it is (issue 39 item 2).

The bus refuses a call of more than MAX_WRITE_OPS writes or MAX_WRITE_BYTES
(klet.bus.functions, mirrored by FakeBus), and pod-source's reconcile and snapshot
writes put every pod of a snapshot in one transaction: 3,000 pods (6,000 writes), or
fewer large ones (over 32 MiB), were refused on every attempt, so the node's pods were
never published. Now those writes go as several calls, each within the caps, each
pod's row with its change notice, the source's ready mark last.

Issue 42: the reconcile after every poll compares the merged state with copies of the
tables, so an idle poll reads their generations only (no HGETALL, nothing written); a
row removed behind its back (the generation moved) is written back at the next poll.
Redis restarted empty: a write refused meanwhile backs off, and once the lease is back
(`restored`) the publisher wakes and writes the tables back without a source poll and
without waiting out the back-off.
"""

from __future__ import annotations

from klet.bus import NodeBus
from klet.bus.functions import MAX_WRITE_BYTES, MAX_WRITE_OPS
from klet.bus.redisbus import SPLIT_OPS
from klet.model.types import JSON
from klet.pod_source.inbox import Inbox
from klet.pod_source.metrics import create_metrics
from klet.pod_source.publisher import Publisher
from klet.testbed.fakes.bus import FakeBus
from prometheus_client import CollectorRegistry

NODE = "node1"


def api_pod(i: int, *, note: str) -> JSON:
    return {
        "metadata": {
            "name": f"p{i}",
            "namespace": "team-a",
            "uid": f"uid-{i}",
            "annotations": {"note": note},
        },
        "spec": {"nodeName": NODE, "containers": [{"name": "app", "image": "nginx:1.25"}]},
        "status": {"phase": "Pending"},
    }


async def elected_publisher() -> tuple[Publisher, FakeBus, Inbox, NodeBus]:
    bus = FakeBus(NODE)
    nb = NodeBus.of(bus, service="pod-source")
    assert await bus.lease("pod-source", "host:1:aaaaaaaaaaaa").try_acquire()
    inbox = Inbox()
    publisher = Publisher(
        bus=nb,
        inbox=inbox,
        configured=frozenset({"api"}),
        metrics=create_metrics(CollectorRegistry()),
        idle_s=1.0,
    )
    publisher.decided.set()
    publisher.elected.set()
    return publisher, bus, inbox, nb


async def test_a_snapshot_over_the_bus_caps_is_written_in_several_calls() -> None:
    publisher, bus, inbox, nb = await elected_publisher()
    # 3,000 pods of 12 KiB each: 6,000 writes and about 36 MiB, over both caps.
    count, note = 3000, "x" * 12 * 1024
    assert 2 * count > MAX_WRITE_OPS and count * len(note) > MAX_WRITE_BYTES
    inbox.offer("api", [api_pod(i, note=note) for i in range(count)])
    await publisher.run_once()  # the reconcile at election writes them
    assert publisher.ready
    assert len(bus.rows(nb.desired)) == count
    assert bus.rows(nb.sources)["api"].ready
    assert len(bus.entries(nb.pods)) == count
    assert len(bus.writes) > 1 and max(bus.writes) <= SPLIT_OPS
    # Every pod changed: the snapshot's own write (not a reconcile) splits the same way.
    calls = len(bus.writes)
    inbox.offer("api", [api_pod(i, note="y" * 12 * 1024) for i in range(count)])
    await publisher.run_once()
    assert publisher.ready
    assert {r.pod["metadata"]["annotations"]["note"][0] for r in bus.rows(nb.desired).values()} == {
        "y"
    }
    assert len(bus.entries(nb.pods)) == 2 * count
    assert len(bus.writes) - calls > 1 and max(bus.writes) <= SPLIT_OPS


async def test_each_pods_row_and_notice_share_a_call_and_the_ready_mark_comes_last() -> None:
    publisher, bus, inbox, nb = await elected_publisher()
    seen: list[list[str]] = []
    write = bus.write

    async def spy(ops):  # type: ignore[no-untyped-def]
        seen.append([f"{op.verb} {op.key.rsplit(':', 1)[1]} {op.args[0]}" for op in ops])
        return await write(ops)

    bus.write = spy  # type: ignore[method-assign]
    inbox.offer("api", [api_pod(i, note="z" * 1024) for i in range(1501)])
    await publisher.run_once()
    assert len(seen) == 4
    for call in seen:
        # An odd number of writes in a call would have cut a pod's pair.
        assert len([op for op in call if not op.startswith("hset sources")]) % 2 == 0
    assert seen[-1][-1] == "hset sources api"
    assert not any(op.startswith("hset sources") for call in seen[:-1] for op in call)


async def test_an_idle_poll_reads_the_generations_only_and_repairs_what_moved() -> None:
    publisher, bus, inbox, nb = await elected_publisher()
    inbox.offer("api", [api_pod(i, note="n") for i in range(3)])
    await publisher.run_once()
    assert len(bus.rows(nb.desired)) == 3
    inbox.offer("api", [api_pod(i, note="n") for i in range(3)])
    await publisher.run_once()  # reads back what its own write moved, writes nothing
    bus.calls.clear()
    for _ in range(3):
        inbox.offer("api", [api_pod(i, note="n") for i in range(3)])  # a poll, unchanged
        await publisher.run_once()
    assert bus.calls == ["generations"] * 3  # no table read, nothing written
    bus.drop(nb.desired, "uid-1")  # removed behind pod-source's back
    inbox.offer("api", [api_pod(i, note="n") for i in range(3)])
    await publisher.run_once()
    assert set(bus.rows(nb.desired)) == {"uid-0", "uid-1", "uid-2"}


async def test_once_the_lease_is_back_the_tables_are_written_back_without_a_poll() -> None:
    publisher, bus, inbox, nb = await elected_publisher()
    inbox.offer("api", [api_pod(i, note="n") for i in range(3)])
    await publisher.run_once()
    bus.restart()  # Redis restarted empty: the tables and the lease are gone
    inbox.polled()
    await publisher.run_once()  # the poll's reconcile is refused: the lease lapsed
    assert bus.rows(nb.desired) == {} and not publisher.ready
    lease = nb.bus._fence
    assert lease is not None and await lease.try_acquire()  # the leader loop, then:
    publisher.restored()
    await inbox.wait(3600)  # rung: no poll needed
    await publisher.run_once()  # the back-off (0.5 s) is over too
    assert len(bus.rows(nb.desired)) == 3 and bus.rows(nb.sources)["api"].ready
    assert publisher.ready
