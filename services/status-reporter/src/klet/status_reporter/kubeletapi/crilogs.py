"""Pure handling of CRI container log files and of the containerLogs query.

The runtime writes one line per write of the container: `<RFC3339Nano time> <stream>
<tags> <content>`, where tags are `F` (full: the content ends a line) or `P` (partial:
the line was split because it was long, more follows); tags may carry more fields
after a ":", only the first counts. A full line's content gets its newline back.

Differences from upstream's reader, on purpose:

- partial lines are joined (per stream) into one logical line carrying the first
  fragment's timestamp, so `timestamps=true` never puts a timestamp mid-line and
  `tailLines` counts the lines the container printed, not the runtime's fragments;
- malformed lines are skipped (upstream logs and skips them too).

The query follows upstream's PodLogOptions handling: `tail` is an alias of `tailLines`
("all" = no limit); bare `follow`, `previous`, `timestamps` mean true; booleans accept
Go's ParseBool spellings; an undecodable value is a 400, an invalid one a 422.
Selection is tail first, then since (as upstream: seek back N lines, then skip older
ones), then `limitBytes` over the formatted output (a line may be cut).
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Iterable, Mapping, Sequence
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


def parse_time_ns(text: str) -> int | None:
    """Nanoseconds since the epoch of an RFC 3339 time, or None if it is not one."""
    m = _RFC3339.match(text)
    if m is None:
        return None
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    frac, zone = m.group(7) or "", m.group(8)
    try:
        seconds = calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0))
    except (ValueError, OverflowError):
        return None
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


class LogDecoder:
    """Bytes of a CRI log file in, complete logical lines out.

    Keeps an unterminated last line and per-stream partial fragments between `feed`
    calls, so a followed file can be decoded as it grows.
    """

    def __init__(self) -> None:
        self._rest = b""
        self._partial: dict[str, tuple[str, int, bytearray]] = {}

    def feed(self, data: bytes) -> list[LogRecord]:
        data = self._rest + data
        *lines, self._rest = data.split(b"\n")
        out: list[LogRecord] = []
        for line in lines:
            parsed = parse_line(line)
            if parsed is None:
                continue
            ts, time_ns, stream, partial, content = parsed
            pending = self._partial.get(stream)
            if pending is None:
                pending = (ts, time_ns, bytearray())
            pending[2].extend(content)
            if partial:
                self._partial[stream] = pending
                continue
            self._partial.pop(stream, None)
            out.append(LogRecord(pending[0], pending[1], stream, bytes(pending[2]) + b"\n"))
        return out

    def flush(self) -> list[LogRecord]:
        """The fragments of lines that never completed (the writer is gone), unterminated."""
        out = [LogRecord(ts, t, s, bytes(buf)) for s, (ts, t, buf) in self._partial.items()]
        self._partial.clear()
        return sorted(out, key=lambda r: r.time_ns)


def select(records: Sequence[LogRecord], opts: LogOptions, *, now_ns: int) -> list[LogRecord]:
    """The records to show of a file's content: last `tail_lines`, then not before since."""
    chosen = list(records)
    if opts.tail_lines is not None:
        chosen = chosen[len(chosen) - opts.tail_lines :] if opts.tail_lines else []
    since = opts.since_ns(now_ns)
    if since is not None:
        chosen = [r for r in chosen if r.time_ns >= since]
    return chosen


def render(record: LogRecord, *, timestamps: bool) -> bytes:
    if timestamps:
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


def render_all(records: Iterable[LogRecord], *, timestamps: bool, limiter: Limiter) -> bytes:
    out = bytearray()
    for r in records:
        if limiter.exhausted:
            break
        out.extend(limiter.take(render(r, timestamps=timestamps)))
    return bytes(out)
