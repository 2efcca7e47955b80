"""Reading, and following, one container's CRI log file (the I/O around `crilogs`).

The file is read whole once (the runtime caps it at containerLogMaxSize, 10 MiB by
default), the selected lines are sent, and with `follow` the file is then polled for
growth every `poll_s`. After `check_s` without new data the container's state is asked
for (`is_running`); once it is not running the file is read one last time and the
stream ends, as upstream's follow ends when the container exits. A file replaced under
us (log rotation: a new inode, or a file shorter than our offset) is reopened from its
start. A client that goes away is noticed by the HTTP layer, which cancels the reader.

Reads go through `asyncio.to_thread` so a slow disk never stalls the event loop.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from klet.status_reporter.kubeletapi.crilogs import (
    Limiter,
    LogDecoder,
    LogOptions,
    LogRecord,
    render,
    render_all,
    select,
)

READ_CHUNK = 1 << 20


@dataclass(frozen=True)
class FollowPolicy:
    """How a followed log is watched (tests shrink these)."""

    poll_s: float = 0.2
    """Seconds between checks for new data."""
    check_s: float = 1.0
    """Seconds without new data before asking whether the container still runs."""


def _read_from(path: str, offset: int) -> tuple[bytes, int, int]:
    """(data from `offset` to EOF, the file's inode, its size)."""
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        if st.st_size < offset:
            return b"", st.st_ino, st.st_size
        f.seek(offset)
        chunks = []
        while chunk := f.read(READ_CHUNK):
            chunks.append(chunk)
        return b"".join(chunks), st.st_ino, st.st_size


async def stream_log(
    path: str,
    opts: LogOptions,
    *,
    is_running: Callable[[], Awaitable[bool]],
    policy: FollowPolicy = FollowPolicy(),
    now_ns: Callable[[], int] = time.time_ns,
) -> AsyncIterator[bytes]:
    """The formatted log of the file at `path`. Raises OSError when it cannot be read."""
    data, inode, _ = await asyncio.to_thread(_read_from, path, 0)
    offset = len(data)
    decoder = LogDecoder()
    limiter = Limiter(opts.limit_bytes)
    records = decoder.feed(data)
    if not opts.follow:
        records += decoder.flush()
    first = render_all(
        select(records, opts, now_ns=now_ns()), timestamps=opts.timestamps, limiter=limiter
    )
    if first:
        yield first
    if not opts.follow:
        return
    since = opts.since_ns(now_ns())

    def show(recs: list[LogRecord]) -> bytes:
        out = bytearray()
        for r in recs:
            if since is not None and r.time_ns < since:
                continue
            if limiter.exhausted:
                break
            out.extend(limiter.take(render(r, timestamps=opts.timestamps)))
        return bytes(out)

    idle = 0.0
    running = True
    while not limiter.exhausted:
        try:
            data, now_inode, size = await asyncio.to_thread(_read_from, path, offset)
        except FileNotFoundError:
            data, now_inode, size = b"", inode, offset
        if now_inode != inode or size < offset:
            inode, offset = now_inode, 0
            continue
        if data:
            offset += len(data)
            idle = 0.0
            out = show(decoder.feed(data))
            if out:
                yield out
            continue
        if not running:
            out = show(decoder.flush())
            if out:
                yield out
            return
        await asyncio.sleep(policy.poll_s)
        idle += policy.poll_s
        if idle >= policy.check_s:
            idle = 0.0
            # One more read after the container stopped catches its last lines.
            running = await is_running()
