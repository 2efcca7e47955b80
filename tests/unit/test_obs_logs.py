"""The text form of service logs (klet.obs.logs.TextFormatter), klog's line.

Covers: the header (level letter, month and day, UTC time with microseconds, the pid
right-aligned in seven columns, the source below the `klet` package or the bare file
name, `]`), the quoted message and `service=` first among the `key=value` pairs, how each
kind of value is written (strings quoted and escaped, numbers and booleans bare, lists
and maps as JSON, multi-line strings and tracebacks as klog's `key=<` block), the level
letters, and text as configure_logging's default.
"""

from __future__ import annotations

import io
import logging
import re
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from http import HTTPStatus
from pathlib import Path
from typing import Any

import pytest
from klet.obs import TextFormatter, configure_logging
from klet.obs.logs import level_letter

# 2026-11-27 17:14:01.123456 UTC
CREATED = datetime(2026, 11, 27, 17, 14, 1, 123456, tzinfo=UTC).timestamp()
HEADER = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d{6} {1,7}\d+ [\w./]+\.py:\d+\] ")


def record(
    msg: str = "pod started",
    *,
    level: int = logging.INFO,
    pathname: str = "/srv/app/site-packages/klet/syncloop/pods/relisting.py",
    extra: dict[str, Any] | None = None,
    exc_info: Any = None,
) -> logging.LogRecord:
    rec = logging.LogRecord("klet.syncloop.pods.relisting", level, pathname, 42, msg, (), exc_info)
    rec.created = CREATED
    rec.process = 12345
    for key, value in (extra or {}).items():
        setattr(rec, key, value)
    return rec


def text(rec: logging.LogRecord) -> str:
    return TextFormatter(service="syncloop").format(rec)


def test_a_line_reads_as_klogs() -> None:
    line = text(record(extra={"pod": "default/web", "restarts": 2}))
    assert line == (
        'I1127 17:14:01.123456   12345 syncloop/pods/relisting.py:42] "pod started" '
        'service="syncloop" pod="default/web" restarts=2'
    )
    assert HEADER.match(line)


@pytest.mark.parametrize(
    ("pathname", "source"),
    [
        ("/work/main/libs/src/klet/obs/logs.py", "obs/logs.py"),
        # the last `klet` directory counts: a checkout may itself be called klet
        ("/home/u/klet/services/eviction/src/klet/eviction/app.py", "eviction/app.py"),
        # another package's module: its file name, as klog writes it
        ("/usr/lib/python3/dist-packages/httpx/_client.py", "_client.py"),
        ("/srv/klet", "klet"),
        ("", ""),
    ],
)
def test_source_is_the_path_below_the_klet_package(pathname: str, source: str) -> None:
    assert f" {source}:42] " in text(record(pathname=pathname))


@pytest.mark.parametrize(
    ("value", "written"),
    [
        ("default/web", '"default/web"'),
        ("a b=c", '"a b=c"'),
        ("", '""'),
        ('say "hi"\\', r'"say \"hi\"\\"'),
        ("naïve", '"naïve"'),
        ("trailing newline\n", r'"trailing newline\n"'),
        (3, "3"),
        (-1.5, "-1.5"),
        (True, "true"),
        (False, "false"),
        (None, "null"),
        (["a", 1], '["a", 1]'),
        (("x",), '["x"]'),
        ({"b", "a"}, '["a", "b"]'),
        (HTTPStatus.NOT_FOUND, "404"),
        ({"cpu": "100m"}, '{"cpu": "100m"}'),
        (Path("/var/lib/kubelet"), '"/var/lib/kubelet"'),
        (ValueError("bad value"), '"bad value"'),
        ("one\ntwo", "<\n\tone\n\ttwo\n >"),
    ],
)
def test_values_are_written_as_klog_writes_them(value: Any, written: str) -> None:
    line = text(record(extra={"v": value}))
    assert line.endswith(f'service="syncloop" v={written}')


def test_the_message_is_quoted_and_escaped_on_one_line() -> None:
    line = text(record('refused "x"\nnext'))
    assert '] "refused \\"x\\"\\nnext" service=' in line
    assert "\n" not in line


def test_a_field_named_like_a_core_key_keeps_the_services() -> None:
    line = text(record(extra={"service": "other"}))
    assert line.endswith('service="syncloop" extra_service="other"')


@pytest.mark.parametrize(
    ("level", "letter"),
    [
        (logging.DEBUG, "I"),  # klog's -v lines are I lines
        (logging.INFO, "I"),
        (logging.WARNING, "W"),
        (logging.ERROR, "E"),
        (logging.CRITICAL, "F"),
        (logging.INFO + 5, "I"),
        (logging.ERROR + 5, "E"),
    ],
)
def test_level_letters(level: int, letter: str) -> None:
    assert level_letter(level) == letter
    assert text(record(level=level)).startswith(f"{letter}1127 ")


def test_a_traceback_is_a_multi_line_exc_info_value() -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        exc_info = sys.exc_info()
    line = text(record("sync failed", level=logging.ERROR, exc_info=exc_info))
    first, *rest = line.split("\n")
    assert first.startswith("E1127 17:14:01.123456   12345 ")
    assert first.endswith('] "sync failed" service="syncloop" exc_info=<')
    assert rest[0] == "\tTraceback (most recent call last):"
    assert rest[-2] == "\tRuntimeError: boom"
    assert rest[-1] == " >"
    assert all(part.startswith("\t") for part in rest[:-1])


@pytest.fixture
def root_logger() -> Iterator[logging.Logger]:
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield root
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)


def test_text_is_configure_loggings_default(root_logger: logging.Logger) -> None:
    stream = io.StringIO()
    configure_logging(service="image-gc", verbosity=0, stream=stream)
    logging.getLogger("klet.test").warning("disk low", extra={"percent": 91})
    [line] = stream.getvalue().splitlines()
    assert HEADER.match(line) and line.startswith("W")
    assert line.endswith('] "disk low" service="image-gc" percent=91')
    assert isinstance(root_logger.handlers[-1].formatter, TextFormatter)
