"""Reading, and following, one container's CRI log across its rotated files, in bounded
memory (the I/O around `crilogs`).

A container's log is its current file `<n>.log` plus the files log rotation left
beside it (`<n>.log.<stamp>`, older ones gzipped; `klet.model.logfiles` says which are
in use), all opened at once when the request arrives so a rotation meanwhile changes
nothing for it. Upstream's reader reads the current file only, so right after a
rotation `kubectl logs --tail=100` shows a few lines; this one spans the rotated files
oldest first, as a user of `--tail` or `--since` expects.

Where the output starts is found backwards from the end (`scan_back` feeding
`crilogs.TailFinder` the lines newest first, one block at a time), so `--tail=1` on a
gigabyte file reads one block; a gzipped file, which can only be read forwards, is
scanned by `crilogs.forward_start` without being held in memory. Then the output is
read forwards from there in blocks of `BLOCK` bytes and sent block by block: without
`follow` up to the size the current file had when opened; with `follow` the current
file is then polled every `poll_s`. After `check_s` without new data the container's
state is asked for (`is_running`); once it is not running the file is read one last
time and the stream ends, as upstream's follow ends when the container exits. When
the log path names another file than the one being read (log rotation renamed it and
the runtime reopened a new one), the old file is read to its end, then any file rotated
meanwhile (a client slower than the writer), then the new one from its start; a file
truncated under us is read again from its start. A client that goes
away is noticed by the HTTP layer, which cancels the reader.

Memory: one block read, one partial line per stream (`crilogs.MAX_PENDING`) and one
unterminated physical line (`crilogs.MAX_PHYSICAL`) at most, whatever the request.
Reads go through `asyncio.to_thread` so a slow disk never stalls the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import io
import os
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass

from klet.model.logfiles import COMPRESSED_SUFFIX, is_compressed, rotations_of
from klet.status_reporter.kubeletapi.crilogs import (
    MAX_PHYSICAL,
    Limiter,
    LogDecoder,
    LogOptions,
    TailFinder,
    forward_start,
    render_all,
)

BLOCK = 64 * 1024
OPEN_ATTEMPTS = 5
OPEN_RETRY_S = 0.02
FILE_END = b""
"""What `LogFiles.chunks` yields between two files."""

Read = Callable[[int, int], bytes]
"""read(offset, n): up to n bytes of a file at offset."""


@dataclass(frozen=True)
class FollowPolicy:
    """How a followed log is watched (tests shrink these, or pass a fake `sleep`)."""

    poll_s: float = 0.2
    """Seconds between checks for new data."""
    check_s: float = 1.0
    """Seconds without new data before asking whether the container still runs."""
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    """The follower's clock: how it waits `poll_s` (testing.FollowerClock in unit tests)."""


def scan_back(read: Read, end: int, finder: TailFinder, *, block: int = BLOCK) -> int | None:
    """Offers the complete lines of a plain file's first `end` bytes to `finder`, newest
    first; returns the offset where the output starts, or None when every line belongs
    (the output starts in an older file, or at this one's start). Bytes after the last
    newline are an unfinished line and are not offered. At most about `block` bytes
    beyond the lines offered are read, and no more than MAX_PHYSICAL are held."""
    pos = end
    newline = -1  # offset of the newline ending the line being put together
    head = bytearray()  # the part of that line read so far (its end)
    while pos > 0:
        n = min(block, pos)
        pos -= n
        data = read(pos, n)
        j = len(data)
        while (i := data.rfind(b"\n", 0, j)) >= 0:
            if newline >= 0:
                line = data[i + 1 : j] + head
                head.clear()
                if not finder.include(bytes(line)):
                    return newline + 1
            newline, j = pos + i, i
        if newline >= 0:
            head[:0] = data[:j]
            if len(head) > MAX_PHYSICAL:
                return newline + 1  # not a CRI line: the output starts after it
    if newline >= 0 and not finder.include(bytes(head)):
        return newline + 1
    return None


def _split_lines(chunks: Iterator[bytes]) -> Iterator[tuple[int, bytes]]:
    """(offset, line without newline) of the complete lines in a stream of chunks;
    lines longer than MAX_PHYSICAL are skipped."""
    offset, rest, skipping = 0, b"", False
    for chunk in chunks:
        data = rest + chunk
        start = 0
        while (i := data.find(b"\n", start)) >= 0:
            if not skipping:
                yield offset + start, data[start:i]
            skipping = False
            start = i + 1
        offset += start
        rest = data[start:]
        if len(rest) > MAX_PHYSICAL:
            offset += len(rest)
            rest, skipping = b"", True


class _LogFile:
    def __init__(self, name: str, f: io.FileIO) -> None:
        self.name = name
        self.f = f
        self.gz = is_compressed(name)

    def read(self, offset: int, n: int) -> bytes:
        return os.pread(self.f.fileno(), n, offset)

    def size(self) -> int:
        return os.fstat(self.f.fileno()).st_size

    def gz_chunks(self) -> Iterator[bytes]:
        """The decompressed content; a damaged archive ends where it breaks."""
        self.f.seek(0)
        with gzip.GzipFile(fileobj=self.f, mode="rb") as z:
            while True:
                try:
                    data = z.read(BLOCK)
                except (OSError, EOFError, zlib.error):
                    return
                if not data:
                    return
                yield data


class LogFiles:
    """A container's log files as they were at one moment, oldest first; the last is the
    current log. Owns their file descriptors (`close`)."""

    def __init__(self, path: str, files: list[_LogFile], size: int) -> None:
        self.path = path
        self.files = files
        self.size = size
        """The current log's size when it was opened."""
        self.offset = 0
        """Where the current log has been read to (`chunks`, `read_current`)."""
        self.known = {f.name.removesuffix(COMPRESSED_SUFFIX) for f in files[:-1]}
        """Rotated files (names without .gz) read or older than the one being read."""

    @classmethod
    def open(cls, path: str) -> LogFiles:
        """Open the log at `path` and its rotated files. Raises OSError when the log
        cannot be opened (a rotation in progress is waited out a few times)."""
        directory, base = os.path.split(path)
        for attempt in range(OPEN_ATTEMPTS):
            names = _names(directory)
            in_use, _ = rotations_of(base, names)
            rotated = [f for f in (_open(os.path.join(directory, n), n) for n in in_use) if f]
            try:
                current = open(path, "rb", buffering=0)  # noqa: SIM115 - owned by LogFiles
            except FileNotFoundError:
                _close(rotated)
                if attempt + 1 == OPEN_ATTEMPTS or not in_use:
                    raise
                time.sleep(OPEN_RETRY_S)  # renamed by rotation, not yet reopened
                continue
            seen = {n.removesuffix(COMPRESSED_SUFFIX) for n in in_use}
            later, _ = rotations_of(base, _names(directory))
            if attempt + 1 < OPEN_ATTEMPTS and any(
                n.removesuffix(COMPRESSED_SUFFIX) not in seen for n in later
            ):
                # rotated between the listing and the open: the lines just rotated
                # would be missed, so start again
                _close([*rotated, _LogFile(base, current)])
                continue
            files = [*rotated, _LogFile(base, current)]
            return cls(path, files, files[-1].size())
        raise AssertionError("unreachable")  # pragma: no cover

    def close(self) -> None:
        _close(self.files)

    @property
    def current(self) -> _LogFile:
        return self.files[-1]

    def find_start(self, finder: TailFinder) -> tuple[int, int]:
        """(index of the file, offset in it) where the output starts."""
        if finder.unbounded:
            return 0, 0
        last = len(self.files) - 1
        for index in range(last, -1, -1):
            f = self.files[index]
            if f.gz:
                offset, need = forward_start(
                    _gz_lines(f),
                    need=finder.need,
                    since_ns=finder.since_ns,
                )
                finder.need = need
            else:
                end = self.size if index == last else f.size()
                offset = scan_back(f.read, end, finder)
            if offset is not None:
                return index, offset
        return 0, 0

    def chunks(self, index: int, offset: int, *, follow: bool) -> Iterator[bytes]:
        """The content from file `index` at `offset` on, in blocks of at most BLOCK
        bytes, FILE_END between files; the current log up to its size when opened, or
        with `follow` up to its end now (then `offset` says where that was)."""
        last = len(self.files) - 1
        for i in range(index, last + 1):
            f = self.files[i]
            if f.gz:
                skip = offset if i == index else 0
                for data in f.gz_chunks():
                    if skip >= len(data):
                        skip -= len(data)
                        continue
                    yield data[skip:]
                    skip = 0
            else:
                pos = offset if i == index else 0
                end = self.size if i == last and not follow else None
                while end is None or pos < end:
                    data = f.read(pos, BLOCK if end is None else min(BLOCK, end - pos))
                    if not data:
                        break
                    pos += len(data)
                    if i == last:
                        self.offset = pos
                    yield data
                if i == last:
                    self.offset = pos
                    return
            yield FILE_END

    def read_current(self) -> bytes:
        """Up to BLOCK bytes of the current log from `offset` (b"" at its end)."""
        data = self.current.read(self.offset, BLOCK)
        self.offset += len(data)
        return data

    def replaced(self) -> bool:
        """Whether the log path now names another file than the one being read (rotated
        away and reopened by the runtime). A missing path is a rotation in progress."""
        try:
            now = os.stat(self.path)
        except FileNotFoundError:
            return False
        mine = os.fstat(self.current.f.fileno())
        return (now.st_ino, now.st_dev) != (mine.st_ino, mine.st_dev)

    def truncated(self) -> bool:
        return self.current.size() < self.offset

    def advance(self) -> list[_LogFile] | None:
        """Move on to the file the log path now names, read from its start. Returns the
        files rotated in between, opened, oldest first, which the caller reads first
        and closes (a reader slower than the writer may be more than one rotation
        behind; the first file rotated since is the one just read); None, changing
        nothing, when the log path is gone (a rotation in progress)."""
        new = _open(self.path, os.path.basename(self.path))
        if new is None:
            return None
        directory, base = os.path.split(self.path)
        in_use, _ = rotations_of(base, _names(directory))
        fresh = [n for n in in_use if n.removesuffix(COMPRESSED_SUFFIX) not in self.known]
        self.known.update(n.removesuffix(COMPRESSED_SUFFIX) for n in fresh)
        missed = [f for f in (_open(os.path.join(directory, n), n) for n in fresh[1:]) if f]
        self.files[-1].f.close()
        self.files[-1] = new
        self.offset = 0
        return missed


def _whole(f: _LogFile) -> Iterator[bytes]:
    """All of one file, in blocks of at most BLOCK bytes."""
    if f.gz:
        yield from f.gz_chunks()
        return
    pos = 0
    while data := f.read(pos, BLOCK):
        pos += len(data)
        yield data


def _gz_lines(f: _LogFile) -> Callable[[], Iterator[tuple[int, bytes]]]:
    return lambda: _split_lines(f.gz_chunks())


def _names(directory: str) -> list[str]:
    try:
        return os.listdir(directory or ".")
    except OSError:
        return []


def _open(path: str, name: str) -> _LogFile | None:
    try:
        return _LogFile(name, open(path, "rb", buffering=0))  # noqa: SIM115
    except FileNotFoundError:
        return None  # removed by rotation meanwhile


def _close(files: list[_LogFile]) -> None:
    for f in files:
        with contextlib.suppress(OSError):
            f.f.close()


async def stream_log(
    files: LogFiles,
    opts: LogOptions,
    *,
    is_running: Callable[[], Awaitable[bool]],
    policy: FollowPolicy = FollowPolicy(),
    now_ns: Callable[[], int] = time.time_ns,
) -> AsyncIterator[bytes]:
    """The formatted log of `files` (which the caller closes)."""
    since = opts.since_ns(now_ns())
    finder = TailFinder(tail_lines=opts.tail_lines, since_ns=since, follow=opts.follow)
    index, offset = await asyncio.to_thread(files.find_start, finder)
    decoder = LogDecoder()
    limiter = Limiter(opts.limit_bytes)

    def show(data: bytes | None = None) -> bytes:
        records = decoder.flush() if data is None else decoder.feed(data)
        return render_all(records, timestamps=opts.timestamps, limiter=limiter, since_ns=since)

    chunks = files.chunks(index, offset, follow=opts.follow)
    while not limiter.exhausted:
        data = await asyncio.to_thread(next, chunks, None)
        if data is None:
            break
        if data == FILE_END:
            decoder.end_file()
            continue
        if out := show(data):
            yield out
    if not opts.follow:
        if out := show():
            yield out
        return

    idle = 0.0
    running = True
    while not limiter.exhausted:
        data = await asyncio.to_thread(files.read_current)
        if data:
            idle = 0.0
            if out := show(data):
                yield out
            continue
        if await asyncio.to_thread(files.replaced):
            # The runtime may have written to the old file after our last read and
            # before it reopened the log: that was read (to b"") just above, unless
            # it came after; one more pass over the old file catches it.
            while data := await asyncio.to_thread(files.read_current):
                if out := show(data):
                    yield out
            missed = await asyncio.to_thread(files.advance)
            if missed is not None:
                for f in missed:
                    decoder.end_file()
                    blocks = _whole(f)
                    while data := await asyncio.to_thread(next, blocks, b""):
                        if out := show(data):
                            yield out
                    _close([f])
                decoder.end_file()
                continue
        elif await asyncio.to_thread(files.truncated):
            files.offset = 0
            decoder.end_file()
            continue
        if not running:
            if out := show():
                yield out
            return
        await policy.sleep(policy.poll_s)
        idle += policy.poll_s
        if idle >= policy.check_s:
            idle = 0.0
            # One more read after the container stopped catches its last lines.
            running = await is_running()
