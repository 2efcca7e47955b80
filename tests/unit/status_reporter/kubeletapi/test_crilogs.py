"""CRI log files and the containerLogs query: line parsing (tags, timestamps with and
without fractions or offsets, malformed lines), partial lines joined per stream across
feeds, tail/since/limitBytes/timestamps selection in upstream's order, and the query's
decoding (tail alias, bare flags, Go booleans) with its 400 and 422 answers."""

from __future__ import annotations

import pytest
from klet.status_reporter.kubeletapi import crilogs
from klet.status_reporter.kubeletapi.crilogs import (
    Limiter,
    LogDecoder,
    LogOptions,
    LogOptionsError,
    TailFinder,
    forward_start,
    parse_line,
    parse_log_options,
    parse_time_ns,
    render_all,
)

T0 = 1_700_000_000_000_000_000


def ts(offset_s: float) -> str:
    ns = T0 + int(offset_s * 1e9)
    seconds, frac = divmod(ns, 1_000_000_000)
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{frac:09d}Z"


def line(offset_s: float, text: str, *, stream: str = "stdout", tag: str = "F") -> bytes:
    return f"{ts(offset_s)} {stream} {tag} {text}\n".encode()


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("2023-11-14T22:13:20Z", T0),
        ("2023-11-14T22:13:20.5Z", T0 + 500_000_000),
        ("2023-11-14T22:13:20.123456789Z", T0 + 123_456_789),
        ("2023-11-15T00:13:20.000000001+02:00", T0 + 1),
        ("2023-11-14T21:13:20-01:00", T0),
        ("2023-11-14 22:13:20Z", None),
        ("yesterday", None),
        ("2023-13-14T22:13:20Z", None),
    ],
)
def test_parse_time(text: str, ns: int | None) -> None:
    assert parse_time_ns(text) == ns


def test_parse_line() -> None:
    assert parse_line(line(0, "hello world")[:-1]) == (ts(0), T0, "stdout", False, b"hello world")
    assert parse_line(line(0, "x", tag="P")[:-1])[3] is True  # type: ignore[index]
    assert parse_line(line(0, "x", tag="F:extra")[:-1])[3] is False  # type: ignore[index]
    assert parse_line(f"{ts(0)} stderr F".encode()) == (ts(0), T0, "stderr", False, b"")
    assert parse_line(f"{ts(0)} stdout F ".encode())[4] == b""  # type: ignore[index]
    assert parse_line(b"garbage") is None
    assert parse_line(f"{ts(0)} stdin F x".encode()) is None
    assert parse_line(b"notatime stdout F x") is None


def test_decoder_joins_partials_per_stream_across_feeds() -> None:
    d = LogDecoder()
    data = (
        line(0, "one")
        + line(1, "long-", tag="P")
        + line(1.5, "err", stream="stderr")
        + line(2, "er ", tag="P")
    )
    out = d.feed(data + line(3, "line")[:10])
    assert [(r.stream, r.content) for r in out] == [("stdout", b"one\n"), ("stderr", b"err\n")]
    out = d.feed(line(3, "line")[10:] + b"junk\n")
    assert [(r.timestamp, r.content) for r in out] == [(ts(1), b"long-er line\n")]
    d.feed(line(4, "dangling", tag="P"))
    assert [r.content for r in d.flush()] == [b"dangling"]
    assert d.flush() == []


def select(data: bytes, opts: LogOptions, *, now_ns: int) -> list[str]:
    """The whole pipeline over one file's bytes: the start found backwards (TailFinder),
    then decoded forwards, since-filtered and rendered."""
    since = opts.since_ns(now_ns)
    finder = TailFinder(tail_lines=opts.tail_lines, since_ns=since, follow=opts.follow)
    complete = data[: data.rfind(b"\n") + 1]
    start = 0
    offset = len(complete)
    for line in reversed(complete.split(b"\n")[:-1]):
        offset -= len(line) + 1
        if not finder.include(line):
            start = offset + len(line) + 1
            break
    decoder = LogDecoder()
    records = decoder.feed(data[start:])
    if not opts.follow:
        records += decoder.flush()
    out = render_all(records, timestamps=False, limiter=Limiter(None), since_ns=since)
    return out.decode().splitlines()


FIVE = b"".join(line(i, f"l{i}") for i in range(5))


@pytest.mark.parametrize(
    ("opts", "expected"),
    [
        (LogOptions(), ["l0", "l1", "l2", "l3", "l4"]),
        (LogOptions(tail_lines=2), ["l3", "l4"]),
        (LogOptions(tail_lines=0), []),
        (LogOptions(tail_lines=10), ["l0", "l1", "l2", "l3", "l4"]),
        (LogOptions(since_seconds=2), ["l3", "l4"]),  # now = T0 + 5 s
        (LogOptions(since_time_ns=T0 + 1_000_000_000), ["l1", "l2", "l3", "l4"]),
        (LogOptions(tail_lines=3, since_seconds=4), ["l2", "l3", "l4"]),
        (LogOptions(tail_lines=3, since_seconds=2), ["l3", "l4"]),
    ],
)
def test_select(opts: LogOptions, expected: list[str]) -> None:
    assert select(FIVE, opts, now_ns=T0 + 5_000_000_000) == expected


PARTIALS = (
    line(0, "a")
    + line(1, "long-", tag="P")
    + line(2, "middle-", tag="P")
    + line(3, "end")
    + line(4, "err", stream="stderr")
    + line(5, "dangling", tag="P")
    + b"2024-01-01T00:00:00Z stdout F unfinished-physical-line"
)


@pytest.mark.parametrize(
    ("opts", "expected"),
    [
        # tail counts logical lines: the dangling fragment is one, the joined line one
        (LogOptions(tail_lines=1), ["dangling"]),
        (LogOptions(tail_lines=3), ["long-middle-end", "err", "dangling"]),
        (LogOptions(tail_lines=4), ["a", "long-middle-end", "err", "dangling"]),
        # following, the dangling fragment is not a line yet (it waits for its end)
        (LogOptions(tail_lines=1, follow=True), ["err"]),
        (LogOptions(tail_lines=0, follow=True), []),
    ],
)
def test_tail_counts_logical_lines(opts: LogOptions, expected: list[str]) -> None:
    assert select(PARTIALS, opts, now_ns=T0) == expected


def numbered_lines(n: int) -> list[bytes]:
    """A log with partial lines in it: every third line is split in two pieces."""
    out = []
    for i in range(n):
        if i % 3 == 0:
            out += [line(i, f"p{i}-", tag="P"), line(i + 0.5, f"q{i}")]
        else:
            out.append(line(i, f"l{i}", stream="stderr" if i % 4 == 0 else "stdout"))
    return out


@pytest.mark.parametrize("need", [0, 1, 2, 3, 5, 8, 30])
@pytest.mark.parametrize("since_s", [None, 0, 4, 7.2, 40])
def test_forward_start_agrees_with_the_backward_finder(need: int, since_s: float | None) -> None:
    """A gzipped file is scanned forwards: same start as the backward search, and what
    is still needed from older files when the start is not in it."""
    lines = numbered_lines(12)
    data = b"".join(lines)
    since = None if since_s is None else T0 + int(since_s * 1e9)
    finder = TailFinder(tail_lines=need, since_ns=since, follow=False)
    backward = None
    offset = len(data)
    for raw in reversed(lines):
        offset -= len(raw)
        if not finder.include(raw[:-1]):
            backward = offset + len(raw)
            break

    def forward_lines() -> list[tuple[int, bytes]]:
        out, pos = [], 0
        for raw in lines:
            out.append((pos, raw[:-1]))
            pos += len(raw)
        return out

    # the forward rule has no dangling fragments: this log has none
    start, still = forward_start(forward_lines, need=need, since_ns=since)
    assert start == backward
    if start is None:
        assert still == finder.need


def test_decoder_passes_on_overlong_lines_in_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(crilogs, "MAX_PENDING", 10)
    d = LogDecoder()
    out = d.feed(b"".join(line(0, "0123456", tag="P") for _ in range(4)) + line(1, "end"))
    assert [(r.content, r.continued) for r in out] == [
        (b"01234560123456", False),
        (b"01234560123456", True),
        (b"end\n", True),
    ]
    recs = render_all(out, timestamps=True, limiter=Limiter(None), since_ns=None)
    assert recs == f"{ts(0)} ".encode() + b"0123456" * 4 + b"end\n"


def test_decoder_drops_an_endless_physical_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(crilogs, "MAX_PHYSICAL", 100)
    d = LogDecoder()
    assert d.feed(b"x" * 150) == []
    assert d.feed(b"y" * 50) == []
    assert [r.content for r in d.feed(b"zz\n" + line(0, "after"))] == [b"after\n"]
    d.feed(line(0, "unfinished")[:20])
    d.end_file()
    assert [r.content for r in d.feed(line(1, "next file"))] == [b"next file\n"]


def test_render_with_timestamps_and_limit() -> None:
    recs = LogDecoder().feed(b"".join(line(i, f"l{i}") for i in range(3)))
    assert render_all(recs, timestamps=False, limiter=Limiter(None), since_ns=None) == (
        b"l0\nl1\nl2\n"
    )
    assert render_all(recs, timestamps=True, limiter=Limiter(None), since_ns=None).splitlines()[
        0
    ] == (f"{ts(0)} l0".encode())
    limiter = Limiter(4)
    assert render_all(recs, timestamps=False, limiter=limiter, since_ns=None) == b"l0\nl"
    assert limiter.exhausted
    assert limiter.take(b"more") == b""


@pytest.mark.parametrize(
    ("query", "opts"),
    [
        ({}, LogOptions()),
        (
            {"follow": [""], "previous": ["true"], "timestamps": ["1"]},
            LogOptions(follow=True, previous=True, timestamps=True),
        ),
        ({"follow": ["false"], "timestamps": ["F"]}, LogOptions()),
        ({"tailLines": ["5"]}, LogOptions(tail_lines=5)),
        ({"tail": ["7"]}, LogOptions(tail_lines=7)),
        ({"tail": ["all"], "tailLines": ["3"]}, LogOptions()),
        (
            {"sinceSeconds": ["10"], "limitBytes": ["100"]},
            LogOptions(since_seconds=10, limit_bytes=100),
        ),
        ({"sinceTime": ["2023-11-14T22:13:20Z"]}, LogOptions(since_time_ns=T0)),
    ],
)
def test_parse_log_options(query: dict[str, list[str]], opts: LogOptions) -> None:
    assert parse_log_options(query) == opts


@pytest.mark.parametrize(
    ("query", "status"),
    [
        ({"follow": ["maybe"]}, 400),
        ({"tailLines": ["x"]}, 400),
        ({"sinceTime": ["noon"]}, 400),
        ({"tailLines": ["-1"]}, 422),
        ({"limitBytes": ["0"]}, 422),
        ({"sinceSeconds": ["0"]}, 422),
        ({"sinceSeconds": ["5"], "sinceTime": ["2023-11-14T22:13:20Z"]}, 422),
    ],
)
def test_parse_log_options_errors(query: dict[str, list[str]], status: int) -> None:
    with pytest.raises(LogOptionsError) as err:
        parse_log_options(query)
    assert err.value.status == status
