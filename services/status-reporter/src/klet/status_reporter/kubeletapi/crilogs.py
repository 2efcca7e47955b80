"""Pure handling of CRI container log files and of the containerLogs query.

The runtime writes one line per write of the container: `<RFC3339Nano time> <stream>
<tags> <content>`, where tags are `F` (full: the content ends a line) or `P` (partial:
the line was split because it was long, more follows); tags may carry more fields
after a ":", only the first counts. A full line's content gets its newline back.

Differences from upstream's reader, on purpose:

- partial lines are joined (per stream) into one logical line carrying the first
  fragment's timestamp, so `timestamps=true` never puts a timestamp mid-line and
  `tailLines` counts the lines the container printed, not the runtime's fragments;
  a logical line longer than MAX_PENDING is passed on in pieces, so memory stays
  bounded whatever a container prints;
- malformed lines are skipped (upstream logs and skips them too).

The query follows upstream's PodLogOptions handling: `tail` is an alias of `tailLines`
("all" = no limit); bare `follow`, `previous`, `timestamps` mean true; booleans accept
Go's ParseBool spellings; an undecodable value is a 400, an invalid one a 422.
Selection is tail first, then since (as upstream: seek back N lines, then skip older
ones), then `limitBytes` over the formatted output (a line may be cut). Where the
selected lines start is decided going backwards from the end (`TailFinder`, or
`forward_start` for a file that can only be read forwards), so the reader never
decodes, nor holds, more of the log than it sends.
"""

from __future__ import annotations

import calendar
import functools
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_FALSE = {"0", "f", "F", "FALSE", "false", "False"}
_RFC3339 = re.compile(
    r"(\d{4})-(\d\d)-(\d\d)[Tt](\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?(Z|z|[+-]\d\d:\d\d)$"
)


class LogOptionsError(ValueError):
    """A bad containerLogs query; `status` is 400 (undecodable) or 422 (invalid)."""

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class LogOptions:
    follow: bool = False
    previous: bool = False
    timestamps: bool = False
    tail_lines: int | None = None
    since_seconds: int | None = None
    since_time_ns: int | None = None
    limit_bytes: int | None = None

    def since_ns(self, now_ns: int) -> int | None:
        """The earliest time to show, in ns since the epoch, or None for all."""
        if self.since_seconds is not None:
            return now_ns - self.since_seconds * 1_000_000_000
        return self.since_time_ns


@dataclass(frozen=True)
class LogRecord:
    timestamp: str
    """As written by the runtime (RFC3339Nano)."""
    time_ns: int
    stream: str
    content: bytes
    """With its trailing newline when the line is complete."""
    continued: bool = False
    """A later piece of a line longer than MAX_PENDING: rendered without a timestamp."""


@functools.lru_cache(maxsize=1024)
def _epoch_seconds(fields: tuple[str, ...]) -> int | None:
    """Seconds since the epoch of a UTC date and time; cached because a log's lines
    share their seconds with their neighbours and timegm dominates the decoding."""
    try:
        return calendar.timegm((*(int(f) for f in fields), 0, 0, 0))
    except (ValueError, OverflowError):
        return None


def parse_time_ns(text: str) -> int | None:
    """Nanoseconds since the epoch of an RFC 3339 time, or None if it is not one."""
    m = _RFC3339.match(text)
    if m is None:
        return None
    seconds = _epoch_seconds(m.group(1, 2, 3, 4, 5, 6))
    if seconds is None:
        return None
    frac, zone = m.group(7) or "", m.group(8)
    if zone not in ("Z", "z"):
        sign = 1 if zone[0] == "+" else -1
        seconds -= sign * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
    return seconds * 1_000_000_000 + int(frac.ljust(9, "0") or 0)


def _bool(query: Mapping[str, Sequence[str]], name: str) -> bool:
    values = query.get(name)
    if not values:
        return False
    value = values[0]
    if value == "" or value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise LogOptionsError("Unable to decode query.", status=400)


def _int(query: Mapping[str, Sequence[str]], name: str) -> int | None:
    values = query.get(name)
    if not values or values[0] == "":
        return None
    try:
        return int(values[0])
    except ValueError:
        raise LogOptionsError("Unable to decode query.", status=400) from None


def parse_log_options(query: Mapping[str, Sequence[str]]) -> LogOptions:
    """PodLogOptions from the containerLogs query. Raises LogOptionsError."""
    q = dict(query)
    tail = q.get("tail")
    if tail and tail[0]:
        q["tailLines"] = [] if tail[0] == "all" else [tail[0]]
    since_time_ns = None
    if q.get("sinceTime") and q["sinceTime"][0]:
        since_time_ns = parse_time_ns(q["sinceTime"][0])
        if since_time_ns is None:
            raise LogOptionsError("Unable to decode query.", status=400)
    opts = LogOptions(
        follow=_bool(q, "follow"),
        previous=_bool(q, "previous"),
        timestamps=_bool(q, "timestamps"),
        tail_lines=_int(q, "tailLines"),
        since_seconds=_int(q, "sinceSeconds"),
        since_time_ns=since_time_ns,
        limit_bytes=_int(q, "limitBytes"),
    )
    problems = []
    if opts.tail_lines is not None and opts.tail_lines < 0:
        problems.append(f"tailLines: Invalid value: {opts.tail_lines}: must be >= 0")
    if opts.limit_bytes is not None and opts.limit_bytes < 1:
        problems.append(f"limitBytes: Invalid value: {opts.limit_bytes}: must be > 0")
    if opts.since_seconds is not None and opts.since_seconds < 1:
        problems.append(f"sinceSeconds: Invalid value: {opts.since_seconds}: must be > 0")
    if opts.since_seconds is not None and opts.since_time_ns is not None:
        problems.append("sinceTime: Forbidden: at most one of sinceTime or sinceSeconds")
    if problems:
        raise LogOptionsError(", ".join(problems), status=422)
    return opts


def parse_line(line: bytes) -> tuple[str, int, str, bool, bytes] | None:
    """(timestamp, time_ns, stream, partial, content) of one CRI log line (no newline)."""
    fields = line.split(b" ", 3)
    if len(fields) < 3:
        return None
    ts = fields[0].decode("ascii", "replace")
    time_ns = parse_time_ns(ts)
    stream = fields[1].decode("ascii", "replace")
    if time_ns is None or stream not in ("stdout", "stderr"):
        return None
    partial = fields[2].split(b":", 1)[0] == b"P"
    content = fields[3] if len(fields) == 4 else b""
    return ts, time_ns, stream, partial, content


MAX_PENDING = 256 * 1024
"""Bytes of one unfinished logical line kept before they are sent on (a container may
print gigabytes without a newline; the runtime splits it into partial lines)."""
MAX_PHYSICAL = 1 << 20
"""Longest physical line kept while looking for its newline; the runtime writes at most
16 KiB of content per line, so a longer one is not a CRI log line and is dropped."""


class LogDecoder:
    """Bytes of a CRI log file in, complete logical lines out, in bounded memory.

    Keeps an unterminated last line and per-stream partial fragments between `feed`
    calls, so a followed file can be decoded as it grows. A logical line longer than
    MAX_PENDING is passed on in pieces (`continued` on all but the first).
    """

    def __init__(self) -> None:
        self._rest = b""
        self._skipping = False
        self._partial: dict[str, tuple[str, int, bytearray, bool]] = {}

    def feed(self, data: bytes) -> list[LogRecord]:
        if self._skipping:
            cut = data.find(b"\n")
            if cut < 0:
                return []
            data, self._skipping = data[cut + 1 :], False
        data = self._rest + data
        *lines, self._rest = data.split(b"\n")
        if len(self._rest) > MAX_PHYSICAL:
            self._rest, self._skipping = b"", True
        out: list[LogRecord] = []
        for line in lines:
            parsed = parse_line(line)
            if parsed is None:
                continue
            ts, time_ns, stream, partial, content = parsed
            pending = self._partial.get(stream)
            if pending is None:
                pending = (ts, time_ns, bytearray(), False)
            pending[2].extend(content)
            if partial:
                if len(pending[2]) >= MAX_PENDING:
                    out.append(
                        LogRecord(pending[0], pending[1], stream, bytes(pending[2]), pending[3])
                    )
                    pending = (pending[0], pending[1], bytearray(), True)
                self._partial[stream] = pending
                continue
            self._partial.pop(stream, None)
            out.append(
                LogRecord(pending[0], pending[1], stream, bytes(pending[2]) + b"\n", pending[3])
            )
        return out

    def end_file(self) -> None:
        """The file ends here: an unterminated physical line will never be completed
        (the next file starts with a new line), but partial lines go on."""
        self._rest, self._skipping = b"", False

    def flush(self) -> list[LogRecord]:
        """The fragments of lines that never completed (the writer is gone), unterminated."""
        out = [LogRecord(ts, t, s, bytes(buf), c) for s, (ts, t, buf, c) in self._partial.items()]
        self._partial.clear()
        return sorted(out, key=lambda r: r.time_ns)


class TailFinder:
    """Where the output starts, decided from the log's physical lines newest first.

    `include(line)` is called with each complete line (no newline) going back from the
    end of the newest file; it answers whether the line belongs to the output, and the
    first False ends the search: the output starts right after that line. The reader
    thus touches only the tail it needs, whatever the size of the log.

    Rules (they match the forward selection: last `tailLines` logical lines, then not
    before since): a logical line ends at a full (`F`) line, or, without `follow`, at
    the last partial line of a stream (the dangling fragment the decoder flushes).
    Once `tailLines` ends are counted, the partial lines of the same stream just before
    the last one counted are its beginning and still belong; anything else stops. An
    end older than since stops too (runtime timestamps only grow). Partial lines of
    the other stream interleaved with a long line are the one approximation: the
    search may stop inside such a line, whose first pieces are then not shown.
    """

    def __init__(self, *, tail_lines: int | None, since_ns: int | None, follow: bool) -> None:
        self.need = tail_lines
        self.since_ns = since_ns
        self.follow = follow
        self._seen: set[str] = set()
        self._extending: str | None = None

    @property
    def unbounded(self) -> bool:
        """Nothing limits the start: the output is the whole log."""
        return self.need is None and self.since_ns is None

    def include(self, line: bytes) -> bool:
        parsed = parse_line(line)
        if parsed is None:
            return self._extending is None  # skipped by the decoder either way
        _, time_ns, stream, partial, _ = parsed
        if self._extending is not None:
            return partial and stream == self._extending
        ends = not partial or (not self.follow and stream not in self._seen)
        self._seen.add(stream)
        if not ends:
            return True
        if self.since_ns is not None and time_ns < self.since_ns:
            return False
        if self.need is None:
            return True
        if self.need == 0:
            return False
        self.need -= 1
        if self.need == 0:
            self._extending = stream
        return True


def forward_start(
    lines: Callable[[], Iterable[tuple[int, bytes]]],
    *,
    need: int | None,
    since_ns: int | None,
) -> tuple[int | None, int | None]:
    """TailFinder's rule for a file that can only be read forward (a gzipped rotated
    log, never the newest): `lines()` yields (offset, line without newline) and may be
    called twice. Returns (offset where the output starts in this file, or None when it
    starts in an older file; the tail lines still needed from the older files)."""
    ends = 0
    since_cut: int | None = None
    for offset, line in lines():
        parsed = parse_line(line)
        if parsed is None or parsed[3]:
            continue
        ends += 1
        if since_ns is not None and parsed[1] < since_ns:
            since_cut = offset + len(line) + 1
    tail_cut: int | None = None
    if need is not None and ends >= need:
        tail_cut = _nth_line_start(lines(), ends - need)
    cuts = [c for c in (tail_cut, since_cut) if c is not None]
    if cuts:
        return max(cuts), 0
    return None, (need - ends if need is not None else None)


def _nth_line_start(lines: Iterable[tuple[int, bytes]], index: int) -> int:
    """Offset where the logical line ending at the `index`-th full line begins (its
    partial lines just before it included); past the last one: the offset after it."""
    seen = 0
    run_start, run_stream = -1, ""
    after_last = 0
    for offset, line in lines:
        parsed = parse_line(line)
        if parsed is None:
            run_start = -1
            continue
        stream, partial = parsed[2], parsed[3]
        if partial:
            if run_start < 0 or run_stream != stream:
                run_start, run_stream = offset, stream
            continue
        if seen == index:
            return run_start if run_start >= 0 and run_stream == stream else offset
        seen += 1
        run_start = -1
        after_last = offset + len(line) + 1
    return after_last


def render(record: LogRecord, *, timestamps: bool) -> bytes:
    if timestamps and not record.continued:
        return record.timestamp.encode() + b" " + record.content
    return record.content


class Limiter:
    """Caps the output at `limit_bytes` (None = no cap)."""

    def __init__(self, limit_bytes: int | None) -> None:
        self.remaining = limit_bytes

    @property
    def exhausted(self) -> bool:
        return self.remaining is not None and self.remaining <= 0

    def take(self, data: bytes) -> bytes:
        if self.remaining is None:
            return data
        data = data[: max(self.remaining, 0)]
        self.remaining -= len(data)
        return data


def render_all(
    records: Iterable[LogRecord], *, timestamps: bool, limiter: Limiter, since_ns: int | None
) -> bytes:
    """The records not before `since_ns`, formatted, within the limiter's budget."""
    out = bytearray()
    for r in records:
        if limiter.exhausted:
            break
        if since_ns is not None and r.time_ns < since_ns:
            continue
        out.extend(limiter.take(render(r, timestamps=timestamps)))
    return bytes(out)
