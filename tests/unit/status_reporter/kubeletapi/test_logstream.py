"""Reading and following a CRI log file: the selected lines first, then new lines as the
file grows, a rotated (replaced) file read from its start, the end of the stream once
the container stops (with its last lines and dangling partial), and limitBytes ending
a followed stream."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from klet.status_reporter.kubeletapi.crilogs import LogOptions
from klet.status_reporter.kubeletapi.logstream import FollowPolicy, stream_log

FAST = FollowPolicy(poll_s=0.01, check_s=0.03)


def line(text: str, tag: str = "F") -> bytes:
    return f"2024-01-01T00:00:00.000000001Z stdout {tag} {text}\n".encode()


async def collect(path: Path, opts: LogOptions, running: list[bool]) -> list[bytes]:
    async def is_running() -> bool:
        return running[0]

    return [c async for c in stream_log(str(path), opts, is_running=is_running, policy=FAST)]


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

    async def reader() -> None:
        async for chunk in stream_log(
            str(log), LogOptions(follow=True), is_running=is_running, policy=FAST
        ):
            chunks.append(chunk)

    task = asyncio.create_task(reader())
    await asyncio.sleep(0.05)
    assert b"".join(chunks) == b"first\n"
    with log.open("ab") as f:
        f.write(line("second"))
    await asyncio.sleep(0.05)
    assert b"".join(chunks) == b"first\nsecond\n"
    rotated = tmp_path / "new.log"
    rotated.write_bytes(line("after-rotation"))
    os.replace(rotated, log)
    await asyncio.sleep(0.05)
    assert b"".join(chunks).endswith(b"after-rotation\n")
    with log.open("ab") as f:
        f.write(line("last") + line("dangling", "P"))
    running[0] = False
    await asyncio.wait_for(task, 2)
    assert b"".join(chunks) == b"first\nsecond\nafter-rotation\nlast\ndangling"


async def test_limit_bytes_ends_a_followed_stream(tmp_path: Path) -> None:
    log = tmp_path / "0.log"
    log.write_bytes(line("abc"))

    async def grow() -> None:
        await asyncio.sleep(0.05)
        with log.open("ab") as f:
            f.write(line("defg"))

    writer = asyncio.create_task(grow())
    out = await asyncio.wait_for(collect(log, LogOptions(follow=True, limit_bytes=6), [True]), 2)
    await writer
    assert out == [b"abc\n", b"de"]
