"""Reading and following a container's CRI log: the selected lines first, then new lines
as the file grows, a replaced file read from its start, the end of the stream once the
container stops (with its last lines and dangling partial), limitBytes ending a
followed stream; the rotated files (gzipped or not) read in order for a whole log,
--tail and --since; follow across a rotation (rename, late writes to the old file,
reopen) losing nothing, even two rotations behind; and the bounds: --tail=1 on a 19 MB
log reads a few blocks, memory stays far below an 8 MB log's size, and a followed
burst arrives in blocks."""

from __future__ import annotations

import asyncio
import gzip
import os
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest
from klet.status_reporter.kubeletapi import logstream
from klet.status_reporter.kubeletapi.crilogs import LogOptions, TailFinder
from klet.status_reporter.kubeletapi.logstream import (
    BLOCK,
    FollowPolicy,
    LogFiles,
    scan_back,
    stream_log,
)
from klet.testbed.fakes.kubeletapi import FollowerClock

FAST = FollowPolicy(poll_s=0.01, check_s=0.03)


def stepped(clock: FollowerClock) -> FollowPolicy:
    """FAST, polling when the test moves `clock` on."""
    return FollowPolicy(poll_s=FAST.poll_s, check_s=FAST.check_s, sleep=clock.sleep)


T0_S = 1_700_000_000


def line(text: str, tag: str = "F", second: int = 0) -> bytes:
    return f"2023-11-14T22:13:{20 + second:02d}.000000001Z stdout {tag} {text}\n".encode()


def numbered(first: int, last: int, second: int = 0) -> bytes:
    return b"".join(line(f"n{i}", second=second) for i in range(first, last))


async def collect(
    path: Path, opts: LogOptions, running: list[bool], policy: FollowPolicy = FAST
) -> list[bytes]:
    async def is_running() -> bool:
        return running[0]

    files = LogFiles.open(str(path))
    try:
        return [c async for c in stream_log(files, opts, is_running=is_running, policy=policy)]
    finally:
        files.close()


async def test_no_follow_reads_once(tmp_path: Path) -> None:
    log = tmp_path / "0.log"
    log.write_bytes(line("a") + line("b") + line("part", "P"))
    out = await collect(log, LogOptions(tail_lines=2), [True])
    assert b"".join(out) == b"b\npart"


async def test_follow_streams_growth_rotation_and_ends_with_the_container(tmp_path: Path) -> None:
    log = tmp_path / "0.log"
    log.write_bytes(line("first"))
    running = [True]
    chunks: list[bytes] = []

    async def is_running() -> bool:
        return running[0]

    files = LogFiles.open(str(log))
    clock = FollowerClock()

    async def reader() -> None:
        async for chunk in stream_log(
            files, LogOptions(follow=True), is_running=is_running, policy=stepped(clock)
        ):
            chunks.append(chunk)

    task = asyncio.create_task(reader())
    await clock.advance(0.05, task)
    assert b"".join(chunks) == b"first\n"
    with log.open("ab") as f:
        f.write(line("second"))
    await clock.advance(0.05, task)
    assert b"".join(chunks) == b"first\nsecond\n"
    replacement = tmp_path / "new.log"
    replacement.write_bytes(line("after-rotation"))
    os.replace(replacement, log)
    await clock.advance(0.05, task)
    assert b"".join(chunks).endswith(b"after-rotation\n")
    with log.open("ab") as f:
        f.write(line("last") + line("dangling", "P"))
    running[0] = False
    await clock.finish(task)
    files.close()
    assert b"".join(chunks) == b"first\nsecond\nafter-rotation\nlast\ndangling"


async def test_limit_bytes_ends_a_followed_stream(tmp_path: Path) -> None:
    log = tmp_path / "0.log"
    log.write_bytes(line("abc"))

    clock = FollowerClock()
    task = asyncio.create_task(
        collect(log, LogOptions(follow=True, limit_bytes=6), [True], stepped(clock))
    )
    await clock.advance(0.05, task)
    with log.open("ab") as f:
        f.write(line("defg"))
    await clock.finish(task)
    assert task.result() == [b"abc\n", b"de"]


def rotated_set(tmp_path: Path) -> Path:
    """n0..n29 over three files: a gzipped one, a plain one, the current log; plus the
    leftovers of an interrupted rotation, which must not be read."""
    older = tmp_path / "0.log.20231114-221300.gz"
    older.write_bytes(gzip.compress(numbered(0, 10, second=0)))
    (tmp_path / "0.log.20231114-221300").write_bytes(b"stale copy of the .gz\n")
    (tmp_path / "0.log.20231114-221310.tmp").write_bytes(b"half a compression\n")
    (tmp_path / "0.log.20231114-221310").write_bytes(numbered(10, 20, second=10))
    (tmp_path / "1.log").write_bytes(line("another container"))
    log = tmp_path / "0.log"
    log.write_bytes(numbered(20, 30, second=20))
    return log


def names(out: list[bytes]) -> list[int]:
    return [int(n[1:]) for n in b"".join(out).decode().split()]


@pytest.mark.parametrize(
    ("opts", "expected"),
    [
        (LogOptions(), list(range(30))),
        (LogOptions(tail_lines=3), [27, 28, 29]),
        (LogOptions(tail_lines=15), list(range(15, 30))),  # into the plain rotated file
        (LogOptions(tail_lines=25), list(range(5, 30))),  # into the gzipped one
        (LogOptions(tail_lines=100), list(range(30))),
        (LogOptions(since_time_ns=(T0_S + 10) * 10**9), list(range(10, 30))),
        (LogOptions(since_time_ns=(T0_S + 5) * 10**9), list(range(10, 30))),
        (LogOptions(since_time_ns=T0_S * 10**9), list(range(30))),
        (LogOptions(tail_lines=25, since_time_ns=(T0_S + 10) * 10**9), list(range(10, 30))),
        (LogOptions(tail_lines=25, limit_bytes=len(b"n5\nn6\n")), [5, 6]),
    ],
)
async def test_rotated_files_are_read_in_order(
    tmp_path: Path, opts: LogOptions, expected: list[int]
) -> None:
    log = rotated_set(tmp_path)
    assert names(await collect(log, opts, [False])) == expected


async def test_follow_across_a_rotation_loses_nothing(tmp_path: Path) -> None:
    """What log rotation does: rename the log, the runtime writes on to the renamed file
    until it reopens, then writes to a new file at the log path."""
    log = tmp_path / "0.log"
    log.write_bytes(numbered(0, 3))
    running = [True]
    chunks: list[bytes] = []

    async def is_running() -> bool:
        return running[0]

    files = LogFiles.open(str(log))
    clock = FollowerClock()

    async def reader() -> None:
        opts = LogOptions(follow=True, tail_lines=1)
        async for chunk in stream_log(files, opts, is_running=is_running, policy=stepped(clock)):
            chunks.append(chunk)

    task = asyncio.create_task(reader())
    await clock.advance(0.05, task)
    runtime = log.open("ab", buffering=0)  # the runtime's open log
    runtime.write(numbered(3, 6))
    await clock.advance(0.05, task)
    log.rename(tmp_path / "0.log.20231114-221320")
    runtime.write(numbered(6, 9))  # before the reopen: into the rotated file
    await clock.advance(0.05, task)
    runtime.close()
    runtime = log.open("ab", buffering=0)  # ReopenContainerLog
    runtime.write(numbered(9, 12))
    await clock.advance(0.05, task)
    runtime.write(numbered(12, 14))
    runtime.close()
    await clock.advance(0.05, task)
    running[0] = False
    await clock.finish(task)
    files.close()
    assert names(chunks) == list(range(2, 14))


async def test_a_follower_two_rotations_behind_reads_the_file_in_between(
    tmp_path: Path,
) -> None:
    """The client does not read while the log is rotated twice (the first rotated file
    already gzipped): the file rotated in between is read before the new log."""
    log = tmp_path / "0.log"
    log.write_bytes(numbered(0, 3))
    running = [True]

    async def is_running() -> bool:
        return running[0]

    files = LogFiles.open(str(log))
    stream = stream_log(files, LogOptions(follow=True), is_running=is_running, policy=FAST)
    chunks = [await anext(stream)]
    # the client stalls; meanwhile two rotations, the first file then compressed
    first = tmp_path / "0.log.20231114-221320"
    log.rename(first)
    log.write_bytes(numbered(3, 6))
    log.rename(tmp_path / "0.log.20231114-221330")
    first.with_name(first.name + ".gz").write_bytes(gzip.compress(first.read_bytes()))
    first.unlink()
    log.write_bytes(numbered(6, 9))
    running[0] = False
    chunks += [c async for c in stream]
    files.close()
    assert names(chunks) == list(range(9))


def test_scan_back_stops_after_the_lines_it_needs() -> None:
    data = numbered(0, 1000) + b"2023-11-14T22:13:20Z stdout F unfinished"
    read_bytes = []

    def read(offset: int, n: int) -> bytes:
        read_bytes.append(n)
        return data[offset : offset + n]

    start = scan_back(
        read, len(data), TailFinder(tail_lines=2, since_ns=None, follow=False), block=512
    )
    assert data[start:].startswith(line("n998"))
    assert sum(read_bytes) == 512
    read_bytes.clear()
    everything = scan_back(
        read, len(data), TailFinder(tail_lines=5000, since_ns=None, follow=False), block=512
    )
    assert everything is None and sum(read_bytes) == len(data)


def big_log(tmp_path: Path, lines: int = 400_000) -> Path:
    log = tmp_path / "0.log"
    with log.open("wb") as f:
        for first in range(0, lines, 10_000):
            f.write(numbered(first, first + 10_000))
    assert log.stat().st_size > 16_000_000
    return log


def counting_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    counts: list[int] = []
    real: Callable[[logstream._LogFile, int, int], bytes] = logstream._LogFile.read

    def read(self: logstream._LogFile, offset: int, n: int) -> bytes:
        data = real(self, offset, n)
        counts.append(len(data))
        return data

    monkeypatch.setattr(logstream._LogFile, "read", read)
    return counts


async def test_tail_reads_a_bounded_number_of_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = big_log(tmp_path)
    counts = counting_reads(monkeypatch)
    assert names(await collect(log, LogOptions(tail_lines=1), [False])) == [399_999]
    assert sum(counts) <= 2 * BLOCK
    counts.clear()
    out = await collect(log, LogOptions(tail_lines=2000), [False])
    assert names(out) == list(range(398_000, 400_000))
    assert sum(counts) <= 2 * 2000 * len(line("n399999")) + 2 * BLOCK
    counts.clear()
    out = await collect(log, LogOptions(limit_bytes=10), [False])
    assert b"".join(out) == b"n0\nn1\nn2\nn"
    assert sum(counts) <= BLOCK


async def test_memory_stays_bounded_whatever_the_log_size(tmp_path: Path) -> None:
    log = tmp_path / "0.log"
    text = "x" * 1000
    with log.open("wb") as f:
        for _ in range(8):
            f.write(line(text) * 1000)
    files = LogFiles.open(str(log))
    total = 0
    largest = 0

    async def stopped() -> bool:
        return False

    tracemalloc.start()
    try:
        async for chunk in stream_log(files, LogOptions(), is_running=stopped, policy=FAST):
            total += len(chunk)
            largest = max(largest, len(chunk))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        files.close()
    assert total == 8000 * (len(text) + 1)
    assert largest <= BLOCK
    assert peak < 2 * 2**20, f"peak {peak} bytes for a {log.stat().st_size}-byte log"


async def test_a_followed_burst_arrives_in_blocks(tmp_path: Path) -> None:
    log = tmp_path / "0.log"
    log.write_bytes(line("start"))
    running = [True]
    largest = 0
    total = 0

    async def is_running() -> bool:
        return running[0]

    files = LogFiles.open(str(log))
    clock = FollowerClock()

    async def reader() -> None:
        nonlocal largest, total
        async for chunk in stream_log(
            files, LogOptions(follow=True), is_running=is_running, policy=stepped(clock)
        ):
            largest, total = max(largest, len(chunk)), total + len(chunk)

    task = asyncio.create_task(reader())
    await clock.advance(0.05, task)
    burst = numbered(0, 100_000)
    with log.open("ab") as f:
        f.write(burst)
    running[0] = False
    await clock.finish(task)
    files.close()
    assert total == len(b"start\n") + sum(len(f"n{i}\n") for i in range(100_000))
    assert largest <= BLOCK
