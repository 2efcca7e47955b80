"""The pod view manager over fake tables and a fake stream: reload joins desired pods
with statuses, stream entries refresh one pod (malformed ones are skipped; a batch read
at once is fetched in one read per table and the listeners are told once), the stream
is tailed from its newest entry with no consumer group so every replica sees every
entry, stale versions never replace newer ones, removed pods stay until their status is
terminal, a bus outage keeps the last view, is logged once and heals, and the PodList
is built and encoded once per change of the view, whatever the number of readers. The
status records a stream batch fetched are handed to `subscribe_statuses` (the pods'
history takes them instead of fetching them again); a full reload's are not. Issue 42:
an idle reload reads both tables' generations and nothing else (no HGETALL, no decode,
the PodList kept, the view still fresh), a write shows at the next reload with only its
row decoded, a Redis restart keeps the view as it was (no table read) until the
writers write the tables again, or `keep_lost_s` passed, and a write that bypassed the
fenced write shows at the next full reload (`full_reload_interval_s`)."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field

import pytest
from klet.bus import BusUnavailable
from klet.model.records import DesiredPod, PodStatusChange, PodStatusRecord
from klet.model.types import JSON
from klet.status_reporter.metrics.instruments import Metrics
from klet.status_reporter.pods import listing
from klet.status_reporter.pods.podcache import CachePolicy, PodCache
from klet.testbed.fakes.bus import FakeBus, FakeStream, FakeTable
from klet.testbed.fakes.status_reporter import desired_record, make_pod, status_record
from prometheus_client import CollectorRegistry
from starlette.responses import JSONResponse

from tests.unit.status_reporter.helpers import until

FAST = CachePolicy(
    reload_interval_s=0.05,
    read_block_ms=5,
    backoff_initial_s=0.01,
    backoff_max_s=0.02,
    stale_after_s=1.0,
)


@dataclass
class World:
    bus: FakeBus = field(default_factory=FakeBus)
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    now: list[float] = field(default_factory=lambda: [1000.0])

    def __post_init__(self) -> None:
        self.desired = FakeTable(self.bus, "desired", DesiredPod)
        self.status = FakeTable(self.bus, "status", PodStatusRecord)
        self.feed = FakeStream(self.bus, "podstatus", PodStatusChange, maxlen=10_000)
        self.cache = self.replica(registry=self.registry)

    def replica(
        self, *, registry: CollectorRegistry | None = None, policy: CachePolicy = FAST
    ) -> PodCache:
        """A pod view over this world's bus (each replica of the service has one)."""
        return PodCache(
            desired=self.desired,
            status=self.status,
            feed=self.feed,
            metrics=Metrics(registry or CollectorRegistry(), clock=lambda: self.now[0]),
            policy=policy,
            clock=lambda: self.now[0],
        )

    def want(self, pod: JSON) -> None:
        self.bus.seed(self.desired, pod["metadata"]["uid"], desired_record(pod))

    def report(self, pod: JSON, *, version: int, epoch: float = 1.0, phase: str = "Running") -> str:
        record = status_record(pod, version=version, epoch=epoch, phase=phase)
        self.bus.seed(self.status, record.uid, record)
        return self.bus.append(self.feed, PodStatusChange(uid=record.uid, version=version))

    def phases(self) -> dict[str, str]:
        return {
            i["metadata"]["name"]: i["status"].get("phase") for i in self.cache.pod_list()["items"]
        }

    def metric(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(name, labels)


WEB = make_pod("web")
DB = make_pod("db")


async def test_reload_joins_desired_pods_with_statuses() -> None:
    w = World()
    w.want(WEB)
    w.want(DB)
    w.report(WEB, version=1)
    assert not w.cache.loaded.is_set() and w.cache.stale
    await w.cache.reload()
    assert w.phases() == {"web": "Running", "db": "Pending"}
    assert w.cache.loaded.is_set() and not w.cache.stale
    assert w.metric("kubelet_running_pods") == 1


async def test_stream_applies_newer_versions_and_ignores_older() -> None:
    w = World()
    w.want(WEB)
    assert await w.cache.consume_once() == 0  # takes the cursor: the stream is empty
    w.report(WEB, version=2, phase="Running")
    assert await w.cache.consume_once() == 1
    assert w.phases() == {"web": "Running"}

    w.report(WEB, version=3, phase="Succeeded")
    await w.cache.consume_once()
    assert w.phases() == {"web": "Succeeded"}

    # A late, older write lands in the table (a reordered writer): the view keeps v3,
    # both when the stream announces it and when a full reload reads it.
    w.report(WEB, version=1, phase="Pending")
    await w.cache.consume_once()
    assert w.phases() == {"web": "Succeeded"}
    await w.cache.reload()
    assert w.phases() == {"web": "Succeeded"}

    # A new syncloop epoch starts counting again and wins.
    w.report(WEB, version=1, epoch=2.0, phase="Running")
    await w.cache.consume_once()
    assert w.phases() == {"web": "Running"}
    assert "ensure_group" not in w.bus.calls and not w.feed.acked  # no consumer group


async def test_malformed_entry_is_skipped_and_the_next_one_applied(
    caplog: pytest.LogCaptureFixture,
) -> None:
    w = World()
    w.want(WEB)
    await w.cache.consume_once()
    w.bus.plant(w.feed, '{"v": 7}')  # podstatuschange: unsupported version 7
    w.report(WEB, version=1)
    with caplog.at_level(logging.ERROR):
        assert await w.cache.consume_once() == 2
    assert w.phases() == {"web": "Running"}
    assert any("bad podstatus entry" in r.getMessage() for r in caplog.records)


async def test_removed_pod_stays_listed_until_terminal() -> None:
    w = World()
    await w.cache.consume_once()  # takes the cursor
    w.want(WEB)
    w.report(WEB, version=1)
    await w.cache.reload()
    w.bus.drop(w.desired, "uid-web")
    await w.cache.reload()
    (item,) = w.cache.pod_list()["items"]
    assert item["spec"] == WEB["spec"]  # the last seen spec, not a skeleton
    w.report(WEB, version=2, phase="Failed")
    await w.cache.consume_once()
    assert w.phases() == {}
    # Gone from both tables: gone from the view.
    w.bus.drop(w.status, "uid-web")
    await w.cache.reload()
    assert w.cache.pod_list()["items"] == []


async def test_reload_does_not_undo_a_refresh_that_happened_during_it() -> None:
    w = World()
    w.want(WEB)
    w.report(WEB, version=1)
    await w.cache.reload()
    await w.cache.consume_once()  # takes the cursor

    # The status table moved (web's next status, its stream entry not consumed yet),
    # so the reload reads it; a stream refresh for a new pod runs after that read
    # returned and before the reload merges: the reload must not drop that pod.
    w.report(WEB, version=2)
    real_all = w.status.raw_all
    new = make_pod("new")

    async def slow_all() -> dict[str, str]:
        snapshot = await real_all()
        w.want(new)
        w.report(new, version=1)
        await w.cache.consume_once()
        return snapshot

    w.status.raw_all = slow_all  # type: ignore[method-assign]
    await w.cache.reload()
    assert w.phases() == {"new": "Running", "web": "Running"}


async def test_outage_keeps_the_view_logs_once_and_heals(
    caplog: pytest.LogCaptureFixture,
) -> None:
    w = World()
    w.want(WEB)
    w.report(WEB, version=1)
    caplog.set_level(logging.DEBUG, logger="klet.status_reporter.pods.podcache")
    tasks = [
        asyncio.create_task(w.cache.run_reloader()),
        asyncio.create_task(w.cache.run_consumer()),
    ]
    try:
        await asyncio.wait_for(w.cache.loaded.wait(), 1)
        w.bus.error = BusUnavailable("fake bus down")
        w.now[0] += 30
        await until(
            lambda: (w.metric("klet_status_reporter_bus_errors_total") or 0) >= 4,
            what="several failed attempts of both loops",
        )
        assert w.phases() == {"web": "Running"}  # the last view, still served
        assert w.cache.stale and not w.cache.bus_available
        assert w.metric("klet_status_reporter_view_age_seconds") == pytest.approx(30, abs=0.01)
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert [r.getMessage() for r in warnings] == ["bus unavailable, serving the last pod view"]

        # Redis is back with different content: the view follows promptly.
        w.want(DB)
        w.report(DB, version=1, phase="Pending")
        w.bus.error = None
        await until(
            lambda: (
                w.phases() == {"web": "Running", "db": "Pending"}
                and w.cache.bus_available
                and not w.cache.stale
            ),  # the reloader's next attempt may come after the consumer's
            what="the view following the bus again",
        )
        assert sum("available again" in r.getMessage() for r in caplog.records) == 1
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_the_cursor_starts_at_the_newest_entry_and_asks_for_a_reload() -> None:
    # Entries published before a replica starts are not replayed (there may be
    # thousands): the tables hold what they announced, and taking the cursor wakes the
    # reloader at once rather than after its interval (an hour here).
    w = World()
    w.cache = w.replica(policy=CachePolicy(reload_interval_s=3600, read_block_ms=5))
    w.want(WEB)
    w.report(WEB, version=1)
    assert await w.cache.consume_once() == 0  # the entry is older than the cursor
    assert w.phases() == {}
    tasks = [asyncio.create_task(w.cache.run_reloader())]
    try:
        await until(lambda: w.cache.loaded.is_set(), what="the first reload")
        w.want(DB)  # no stream entry: only a reload can show it
        w.bus.fail(BusUnavailable("fake bus down"))  # the consumer's next read fails
        tasks.append(asyncio.create_task(w.cache.run_consumer()))
        await until(lambda: w.phases() == {"web": "Running", "db": "Pending"}, what="a reload")
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_every_replica_sees_every_entry() -> None:
    # Two replicas of the service on one bus: a consumer group would hand each entry to
    # one of them only, leaving the other's view behind until its next reload.
    w = World()
    other = w.replica()
    w.want(WEB)
    w.want(DB)
    await w.cache.consume_once()
    await other.consume_once()
    w.report(WEB, version=1)
    w.report(DB, version=1, phase="Succeeded")
    assert await w.cache.consume_once() == 2
    assert await other.consume_once() == 2
    for view in (w.cache, other):
        assert {uid: rec.version for uid, rec in view.statuses().items()} == {
            WEB["metadata"]["uid"]: 1,
            DB["metadata"]["uid"]: 1,
        }


async def test_a_failed_read_takes_a_fresh_cursor() -> None:
    # After a bus failure the stream may have been flushed and restarted: the old cursor
    # means nothing any more, so a new one is taken (and the reload covers the gap).
    w = World()
    await w.cache.consume_once()
    w.bus.fail(BusUnavailable("fake bus down"))
    task = asyncio.create_task(w.cache.run_consumer())
    try:
        await until(lambda: w.bus.calls.count("last_id") == 2, what="a second cursor")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_policy_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="reload_interval_s"):
        CachePolicy(reload_interval_s=-1)
    with pytest.raises(ValueError, match="backoff_max_s"):
        CachePolicy(backoff_max_s=-1)
    with pytest.raises(ValueError, match="read_count"):
        CachePolicy(read_count=0)
    with pytest.raises(ValueError, match="keep_lost_s"):
        CachePolicy(keep_lost_s=-1)


async def test_an_idle_reload_reads_the_generations_only() -> None:
    w = World()
    w.want(WEB)
    w.want(DB)
    w.report(WEB, version=1)
    await w.cache.reload()
    body = w.cache.pod_list_json()
    w.bus.calls.clear()
    for _ in range(5):
        w.now[0] += 5
        await w.cache.reload()
    assert w.bus.calls == ["generations"] * 5  # no HGETALL, nothing decoded
    assert w.cache.pod_list_json() is body and not w.cache.stale

    # A write shows at the next reload, decoding its row only.
    w.report(DB, version=1)
    w.bus.calls.clear()
    await w.cache.reload()
    assert w.bus.calls == ["generations", "all"]  # the status table only
    assert w.phases() == {"web": "Running", "db": "Running"}
    assert w.cache._status_copy.decoded == 2

    # A Redis restart: the view kept as it was, nothing read, until a writer is back.
    w.bus.restart()
    w.bus.calls.clear()
    await w.cache.reload()
    assert w.bus.calls == ["generations"]
    assert w.phases() == {"web": "Running", "db": "Running"}
    w.want(WEB)  # pod-source republished (only web: db was removed meanwhile)
    await w.cache.reload()
    assert w.phases() == {"web": "Running", "db": "Running"}  # db's status still lists it
    w.report(WEB, version=1, epoch=2.0)  # a new syncloop epoch's statuses
    await w.cache.reload()
    assert w.phases() == {"web": "Running"}
    # Nobody writes a table again: read as Redis has it once keep_lost_s has passed.
    w.bus.restart()
    await w.cache.reload()
    w.now[0] += FAST.keep_lost_s
    await w.cache.reload()
    assert w.cache.pod_list()["items"] == []


async def test_a_write_that_bypassed_the_fenced_write_shows_at_the_next_full_reload() -> None:
    w = World()
    w.want(WEB)
    await w.cache.reload()
    w.bus.hset_directly(w.desired, "uid-db", desired_record(DB).encode())
    w.now[0] += 59
    await w.cache.reload()
    assert w.phases() == {"web": "Pending"}
    w.now[0] += 1  # full_reload_interval_s (60 s) since the last full read
    await w.cache.reload()
    assert w.phases() == {"web": "Pending", "db": "Pending"}


async def test_a_batch_of_entries_is_fetched_in_one_read_per_table() -> None:
    w = World()
    told: list[int] = []
    w.cache.subscribe(lambda: told.append(1))
    assert await w.cache.consume_once() == 0  # takes the cursor
    w.want(WEB)
    w.want(DB)
    w.report(WEB, version=1, phase="Pending")
    w.bus.plant(w.feed, "bad json")
    w.report(DB, version=1)
    w.report(WEB, version=2)  # the table holds v2 by the time the batch is read
    w.bus.calls.clear()
    told.clear()
    assert await w.cache.consume_once() == 4
    assert w.bus.calls == ["tail", "get_many", "get_many"]
    assert w.phases() == {"web": "Running", "db": "Running"}
    assert told == [1]


async def test_the_statuses_a_batch_fetched_are_handed_over_once() -> None:
    w = World()
    handed: list[list[tuple[str, int]]] = []
    w.cache.subscribe_statuses(
        lambda records: handed.append([(r.name, r.version) for r in records])
    )
    assert await w.cache.consume_once() == 0  # takes the cursor
    w.want(WEB)
    w.report(WEB, version=1)
    w.report(DB, version=1)  # not desired (any more): its status is handed over all the same
    w.report(WEB, version=2)
    w.bus.calls.clear()
    assert await w.cache.consume_once() == 3
    assert w.bus.calls == ["tail", "get_many", "get_many"]  # one fetch serves every taker
    assert handed == [[("web", 2), ("db", 1)]]
    await w.cache.reload()  # the tables in full: not changes, not handed over
    assert len(handed) == 1


async def test_the_view_settles_when_loaded_or_when_the_bus_fails_first() -> None:
    # The reading ports open once the view settles (app.py): a loaded view, or a bus
    # that is down before the first load, so no replica waits on one for ever.
    w = World()
    w.want(WEB)
    assert not w.cache.settled.is_set()
    await w.cache.reload()
    assert w.cache.settled.is_set() and w.cache.loaded.is_set()

    down = w.replica()
    w.bus.error = BusUnavailable("fake bus down")
    task = asyncio.create_task(down.run_reloader())
    try:
        await asyncio.wait_for(down.settled.wait(), 1)
        assert not down.loaded.is_set()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


class CountingEncoder:
    """listing.encode_pod_list, counting its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, pod_list: JSON) -> bytes:
        self.calls += 1
        return listing.encode_pod_list(pod_list)


async def test_the_pod_list_is_encoded_once_per_change_not_per_reader() -> None:
    w = World()
    encode = CountingEncoder()
    cache = PodCache(
        desired=w.desired,
        status=w.status,
        feed=w.feed,
        metrics=Metrics(CollectorRegistry()),
        policy=FAST,
        encode=encode,
    )
    w.want(WEB)
    w.want(DB)
    w.report(WEB, version=1)
    await cache.reload()
    assert encode.calls == 0  # nobody read it yet: nothing encoded
    bodies = {cache.pod_list_json() for _ in range(10)}
    assert encode.calls == 1
    (body,) = bodies
    assert body == JSONResponse(cache.pod_list()).body  # what /pods served before
    assert cache.pod_list() is cache.pod_list()  # built once, shared too

    assert await cache.consume_once() == 0  # takes the cursor
    w.report(WEB, version=2, phase="Failed")
    assert await cache.consume_once() == 1  # a change: the next reader encodes, once
    assert encode.calls == 1
    after = [cache.pod_list_json() for _ in range(10)]
    assert encode.calls == 2
    assert after == [after[0]] * 10 and after[0] != body
    phases = {i["metadata"]["name"]: i["status"]["phase"] for i in json.loads(after[0])["items"]}
    assert phases == {"db": "Pending", "web": "Failed"}

    await cache.reload()  # the periodic reload finds what the stream brought: kept
    assert cache.pod_list_json() == after[0]
    assert encode.calls == 2
    w.want(make_pod("new"))  # a desired pod only a reload tells the view about
    await cache.reload()
    cache.pod_list_json()
    cache.pod_list_json()
    assert encode.calls == 3
    assert "new" in {i["metadata"]["name"] for i in json.loads(cache.pod_list_json())["items"]}
    w.bus.seed(w.status, WEB["metadata"]["uid"], status_record(WEB, version=3, phase="Running"))
    await cache.reload()  # a newer status only the table has (another replica's entry)
    assert json.loads(cache.pod_list_json())["items"][-1]["status"]["phase"] == "Running"
    assert encode.calls == 4
