"""A reader's copy of bus tables (klet.bus.tablecopy), over the in-memory bus.

Covers (issue 42): a watch reads its tables' generations in one call and a table only
when its generation moved (the first refresh reads every table); an idle refresh reads
and decodes nothing and reports no change; a write decodes only the rows whose text
changed, a removal none; an undecodable row is left out and logged once per change of
its text; a Redis restart (the generations lost) reads every table again; a write that
bypassed the fenced write (no generation moved) is read at the next full read,
`full_every_s` after the last; a refresh that failed part-way reports the change of the
tables it did read at the next refresh; the records mapping is replaced, never
mutated; and the watch's settings are checked. A reader's watch with `keep_lost_s`
keeps a table whose counter Redis lost as it was (no read at all, full reads included)
until the writer has written it again or `keep_lost_s` passed; a table never read at a
generation is read as it is.
"""

from __future__ import annotations

import logging

import pytest
from klet.bus import BusUnavailable, NodeBus
from klet.bus.tablecopy import TableCopy, TableWatch
from klet.model.records import DesiredPod, SourceState
from klet.model.types import PodUID
from klet.testbed.fakes.bus import FakeBus


def desired(uid: str, *, hash_: str = "h1") -> DesiredPod:
    pod = {"metadata": {"name": uid, "namespace": "default", "uid": uid}, "spec": {}}
    return DesiredPod(uid=PodUID(uid), pod=pod, source="file", hash=hash_, seen_at=0)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class World:
    def __init__(self) -> None:
        self.bus = FakeBus()
        self.clock = Clock()
        self.node = NodeBus.of(self.bus, service="syncloop")
        for uid in ("u1", "u2", "u3"):
            self.bus.seed(self.node.desired, uid, desired(uid))
        self.bus.seed(self.node.sources, "file", SourceState(source="file", ready=True, at=0))
        self.desired = TableCopy(self.node.desired)
        self.sources = TableCopy(self.node.sources)
        self.watch = TableWatch(self.desired, self.sources, full_every_s=60, clock=self.clock)


@pytest.fixture
def w() -> World:
    return World()


async def test_the_first_refresh_reads_every_table_then_an_idle_one_reads_nothing(
    w: World,
) -> None:
    assert await w.watch.refresh()
    assert w.bus.calls == ["generations", "all", "all"]
    assert set(w.desired.records) == {"u1", "u2", "u3"}
    assert set(w.sources.records) == {"file"}
    assert w.desired.generation == w.bus.generation(w.node.desired) is not None
    w.bus.calls.clear()
    for _ in range(10):
        w.clock.t += 5
        assert not await w.watch.refresh()
    assert w.bus.calls == ["generations"] * 10
    assert (w.desired.reads, w.desired.decoded) == (1, 3)
    assert (w.sources.reads, w.sources.decoded) == (1, 1)


async def test_a_write_decodes_only_the_rows_it_changed(w: World) -> None:
    await w.watch.refresh()
    before = w.desired.records
    w.bus.seed(w.node.desired, "u2", desired("u2", hash_="h2"))
    w.bus.seed(w.node.desired, "u4", desired("u4"))
    w.bus.calls.clear()
    assert await w.watch.refresh()
    assert w.bus.calls == ["generations", "all"]  # sources did not move
    assert w.desired.decoded == 3 + 2
    assert w.desired.records["u2"].hash == "h2" and "u4" in w.desired.records
    assert set(before) == {"u1", "u2", "u3"}  # the old mapping was replaced, not changed
    w.bus.drop(w.node.desired, "u1")
    assert await w.watch.refresh()
    assert set(w.desired.records) == {"u2", "u3", "u4"}
    assert w.desired.decoded == 5  # a removal decodes nothing
    # A write of the same text moves the generation: read again, decoded and reported
    # as nothing.
    w.bus.seed(w.node.desired, "u3", desired("u3"))
    assert not await w.watch.refresh()
    assert (w.desired.reads, w.desired.decoded) == (4, 5)


async def test_an_undecodable_row_is_left_out_and_logged_once_per_change(
    w: World, caplog: pytest.LogCaptureFixture
) -> None:
    w.bus.hset_directly(w.node.desired, "bad", "{not json")
    with caplog.at_level(logging.ERROR, logger="klet.bus.redisbus"):
        await w.watch.refresh()
        w.bus.seed(w.node.desired, "u4", desired("u4"))
        await w.watch.refresh()
    assert "bad" not in w.desired.records and "u4" in w.desired.records
    assert [r.getMessage() for r in caplog.records] == ["bad record in table"]


async def test_a_redis_restart_reads_every_table_again(w: World) -> None:
    await w.watch.refresh()
    w.bus.restart()
    w.bus.calls.clear()
    assert await w.watch.refresh()
    assert w.bus.calls == ["generations", "all", "all"]
    assert w.desired.records == {} and w.sources.records == {}
    # Written back: a counter made anew never comes back to a value a copy holds.
    w.bus.seed(w.node.desired, "u1", desired("u1"))
    assert await w.watch.refresh()
    assert set(w.desired.records) == {"u1"}


async def test_a_reader_keeps_a_lost_table_until_its_writer_writes_it_again(w: World) -> None:
    watch = TableWatch(w.desired, w.sources, full_every_s=10, keep_lost_s=15, clock=w.clock)
    await watch.refresh()
    before = w.desired.records
    w.bus.restart()
    w.bus.calls.clear()
    for _ in range(3):
        w.clock.t += 4  # a full read falls due meanwhile: kept all the same
        assert not await watch.refresh()
    assert w.bus.calls == ["generations"] * 3
    assert w.desired.records is before and set(w.sources.records) == {"file"}
    # The writer republishes (one row here): its counter is back, the table read as is.
    w.bus.seed(w.node.desired, "u1", desired("u1"))
    assert await watch.refresh()
    assert set(w.desired.records) == {"u1"}
    assert set(w.sources.records) == {"file"}  # not written yet: still kept


async def test_a_lost_table_nobody_writes_again_is_read_after_keep_lost_s(w: World) -> None:
    watch = TableWatch(w.desired, w.sources, keep_lost_s=15, clock=w.clock)
    await watch.refresh()
    w.bus.restart()
    w.clock.t += 1
    assert not await watch.refresh()  # the loss seen: the clock starts here
    w.clock.t += 14.9
    assert not await watch.refresh()
    w.clock.t += 0.1
    assert await watch.refresh()
    assert w.desired.records == {} and w.sources.records == {}
    # A loss later on is kept again, for its own keep_lost_s.
    w.bus.seed(w.node.desired, "u1", desired("u1"))
    assert await watch.refresh()
    w.bus.restart()
    w.clock.t += 100
    assert not await watch.refresh()
    assert set(w.desired.records) == {"u1"}


async def test_a_table_never_read_at_a_generation_is_read_as_it_is() -> None:
    bus = FakeBus()
    node = NodeBus.of(bus, service="syncloop")
    copy = TableCopy(node.desired)
    watch = TableWatch(copy, keep_lost_s=15, clock=Clock())
    assert await watch.refresh()  # a fresh Redis: no counter, nothing to keep
    assert copy.records == {} and copy.generation is None
    bus.seed(node.desired, "u1", desired("u1"))
    assert await watch.refresh()
    assert set(copy.records) == {"u1"}


async def test_a_write_that_bypassed_the_fenced_write_shows_at_the_next_full_read(
    w: World,
) -> None:
    await w.watch.refresh()
    w.bus.hset_directly(w.node.desired, "u4", desired("u4").encode())
    w.clock.t += 59.9
    assert not await w.watch.refresh()
    assert "u4" not in w.desired.records
    w.clock.t += 0.1
    w.bus.calls.clear()
    assert await w.watch.refresh()
    assert w.bus.calls == ["generations", "all", "all"]
    assert "u4" in w.desired.records
    assert w.desired.decoded == 4  # the full read decoded the new row only


async def test_a_refresh_that_failed_part_way_reports_the_change_next_time(w: World) -> None:
    await w.watch.refresh()
    w.bus.seed(w.node.desired, "u4", desired("u4"))
    w.bus.seed(w.node.sources, "http", SourceState(source="http", ready=False, at=0))
    # generations and desired answer, the read of sources fails.
    w.bus.fail(*[BusUnavailable("gone")])
    with pytest.raises(BusUnavailable):
        await w.watch.refresh()  # the generations call failed: nothing read
    real = w.node.sources.raw_all

    async def down() -> dict[str, str]:
        raise BusUnavailable("gone")

    w.node.sources.raw_all = down  # type: ignore[method-assign]
    with pytest.raises(BusUnavailable):
        await w.watch.refresh()
    assert "u4" in w.desired.records  # desired was read before sources failed
    w.node.sources.raw_all = real  # type: ignore[method-assign]
    assert await w.watch.refresh()  # desired's change is reported now, with sources'
    assert set(w.sources.records) == {"file", "http"}
    assert not await w.watch.refresh()


def test_the_watch_settings_are_checked(w: World) -> None:
    with pytest.raises(ValueError, match="at least one table"):
        TableWatch()
    with pytest.raises(ValueError, match="full_every_s"):
        TableWatch(w.desired, full_every_s=0)
    with pytest.raises(ValueError, match="keep_lost_s"):
        TableWatch(w.desired, keep_lost_s=-1)
