"""CRI log files and the containerLogs query: line parsing (tags, timestamps with and
without fractions or offsets, malformed lines), partial lines joined per stream across
feeds, tail/since/limitBytes/timestamps selection in upstream's order, and the query's
decoding (tail alias, bare flags, Go booleans) with its 400 and 422 answers."""

from __future__ import annotations

import pytest
from klet.status_reporter.kubeletapi.crilogs import (
    Limiter,
    LogDecoder,
    LogOptions,
    LogOptionsError,
    LogRecord,
    parse_line,
    parse_log_options,
    parse_time_ns,
    render_all,
    select,
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


def records(n: int) -> list[LogRecord]:
    return LogDecoder().feed(b"".join(line(i, f"l{i}") for i in range(n)))


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
    chosen = select(records(5), opts, now_ns=T0 + 5_000_000_000)
    assert [r.content.decode().strip() for r in chosen] == expected


def test_render_with_timestamps_and_limit() -> None:
    recs = records(3)
    assert render_all(recs, timestamps=False, limiter=Limiter(None)) == b"l0\nl1\nl2\n"
    assert render_all(recs, timestamps=True, limiter=Limiter(None)).splitlines()[0] == (
        f"{ts(0)} l0".encode()
    )
    limiter = Limiter(4)
    assert render_all(recs, timestamps=False, limiter=limiter) == b"l0\nl"
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
