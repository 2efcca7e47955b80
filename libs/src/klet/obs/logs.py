"""Service logs: klog-style text lines by default, one JSON object per line on request.

Libraries only call `logging.getLogger(__name__)` and pass context as fields,
`log.info("pod started", extra={"pod": "ns/name", "uid": uid})`; entry points call
`configure_logging(service=..., verbosity=..., fmt=...)` once. Every `extra=` key (any
LogRecord attribute that logging itself does not define) becomes a field of the line,
so a reader can filter on `pod` without parsing messages.

The text form (`--logging-format text`, the default, as upstream's) reads like klog's,
one line per record (wrapped here):

    I1127 17:14:01.123456   12345 syncloop/pods/controller.py:330] "pod no longer desired"
        service="syncloop" uid="3f1c…"

a level letter (I, W, E, F; DEBUG is an I line, as klog's -v lines are), month and day,
the time with microseconds, the process id, the source, `]`, the quoted message, then
`key=value` pairs: strings quoted, numbers and booleans bare, lists and maps as JSON, a
multi-line string (a traceback under `exc_info`) as klog writes one, `key=<` then each
line indented by a tab and a closing ` >`. Unlike klog, the time is UTC (the JSON form's
too), and the source is the path below the `klet` package (`obs/logs.py`), not the bare
file name: five services have a `wiring.py` and an `app.py`.

The JSON form (`--logging-format json` or the configuration's `logging.format: json`)
keeps klet's keys: `{"ts", "level", "service", "logger", "caller", "msg", ...}`.

Verbosity follows klog's `-v`: 0-3 log INFO and above, 4 and more add DEBUG; 6 and more
also let the HTTP client libraries (httpx, httpcore) log their per-request detail.

`OnceLogger` / `log_once_per_change` implement STYLE rule 17, "a repeated error is
logged once per change": a loop that fails every second logs the failure when it starts
or its cause changes, and one recovery line when it clears. Every service uses them
instead of keeping a "last error" field of its own.

Trade-off: the formatters walk the record's __dict__ on every line; that is cheap next
to the I/O and spares callers a custom logging API.
"""

from __future__ import annotations

import functools
import json
import logging
import sys
import threading
import traceback
from collections.abc import Hashable, Iterable
from datetime import UTC, datetime
from pathlib import PurePath
from typing import Any, TextIO

__all__ = [
    "FORMATS",
    "JsonFormatter",
    "OnceLogger",
    "TextFormatter",
    "configure_logging",
    "level_for_verbosity",
    "level_letter",
    "log_once_per_change",
]

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_RECORD_ATTRS = frozenset(
    logging.LogRecord("", 0, "", 0, "", (), None).__dict__.keys()
    | {"message", "asctime", "taskName"}
)
_CORE_KEYS = ("ts", "level", "service", "logger", "caller", "msg")
_HANDLER_MARK = "_klet_handler"
_NOISY_LOGGERS = ("httpx", "httpcore", "hpack", "uvicorn")
FORMATS = ("text", "json")
_LEVEL_LETTERS = ((logging.CRITICAL, "F"), (logging.ERROR, "E"), (logging.WARNING, "W"))


def _timestamp(record: logging.LogRecord) -> str:
    moment = datetime.fromtimestamp(record.created, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


@functools.lru_cache(maxsize=1024)
def _source_path(pathname: str) -> str:
    """`syncloop/pods/relisting.py` for a module of the klet namespace (below its last
    `klet` directory), the file name for any other."""
    parts = PurePath(pathname).parts
    for i in range(len(parts) - 2, -1, -1):
        if parts[i] == "klet":
            return "/".join(parts[i + 1 :])
    return parts[-1] if parts else ""


def _caller(record: logging.LogRecord) -> str:
    return f"{_source_path(record.pathname)}:{record.lineno}"


def _extra_fields(record: logging.LogRecord) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for key, value in record.__dict__.items():
        if key in _RECORD_ATTRS or key.startswith("_"):
            continue
        fields[f"extra_{key}" if key in _CORE_KEYS else key] = value
    return fields


def _exception_text(record: logging.LogRecord) -> str | None:
    if record.exc_info and record.exc_info[0] is not None:
        return "".join(traceback.format_exception(*record.exc_info)).rstrip()
    if record.exc_text:
        return record.exc_text
    return None


class JsonFormatter(logging.Formatter):
    """`{"ts", "level", "service", "logger", "caller", "msg", <extra fields>,
    "exc_info"?, "stack_info"?}` per line."""

    def __init__(self, *, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "service": self.service,
            "logger": record.name,
            "caller": _caller(record),
            "msg": record.getMessage(),
        }
        line.update(_extra_fields(record))
        if (exc := _exception_text(record)) is not None:
            line["exc_info"] = exc
        if record.stack_info:
            line["stack_info"] = record.stack_info
        return json.dumps(line, default=str, ensure_ascii=False)


def _quoted(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _text_value(value: Any) -> str:
    """One value as klog's text form writes it (see the module docstring)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)  # an IntEnum as its number, as in the JSON form
    if value is None:
        return "null"
    if isinstance(value, set | frozenset):
        value = sorted(value, key=str)
    if isinstance(value, list | tuple | dict):
        return json.dumps(value, default=str, ensure_ascii=False)
    text = value if isinstance(value, str) else str(value)
    if "\n" in text.rstrip("\n"):
        indented = "".join(f"\n\t{line}" for line in text.rstrip("\n").split("\n"))
        return f"<{indented}\n >"
    return _quoted(text)


def _pairs_text(fields: dict[str, Any]) -> str:
    return " ".join(f"{key}={_text_value(value)}" for key, value in fields.items())


def fields_text(record: logging.LogRecord) -> str:
    """The record's `extra=` fields as `key=value ...`, valued as the text form's."""
    return _pairs_text(_extra_fields(record))


def level_letter(levelno: int) -> str:
    """klog's severity letter: F, E, W, or I (INFO and DEBUG alike)."""
    for floor, letter in _LEVEL_LETTERS:
        if levelno >= floor:
            return letter
    return "I"


class TextFormatter(logging.Formatter):
    """klog's text line: `I1127 17:14:01.123456   12345 obs/logs.py:42] "msg" service="x"
    key=value ...`, the traceback, if any, as a multi-line `exc_info` value."""

    def __init__(self, *, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        moment = datetime.fromtimestamp(record.created, tz=UTC)
        header = (
            f"{level_letter(record.levelno)}{moment:%m%d %H:%M:%S}.{moment.microsecond:06d} "
            f"{record.process or 0:>7} {_caller(record)}]"
        )
        fields: dict[str, Any] = {"service": self.service, **_extra_fields(record)}
        if (exc := _exception_text(record)) is not None:
            fields["exc_info"] = exc
        if record.stack_info:
            fields["stack_info"] = record.stack_info
        return f"{header} {_quoted(record.getMessage())} {_pairs_text(fields)}"


def level_for_verbosity(verbosity: int) -> int:
    """klog -v to a logging level: 0-3 INFO, 4+ DEBUG."""
    return logging.DEBUG if verbosity >= 4 else logging.INFO


def configure_logging(
    *,
    service: str,
    verbosity: int,
    fmt: str = "text",
    stream: TextIO | None = None,
) -> logging.Handler:
    """Send the root logger to `stream` (default: sys.stderr at call time) in `fmt`
    ("text", klog's form, or "json"). Calling it again replaces the handler it
    installed before.

    Returns the installed handler (tests remove it again)."""
    if fmt not in FORMATS:
        raise ValueError(f"log format must be text or json, got {fmt!r}")
    formatter: logging.Formatter = (
        JsonFormatter(service=service) if fmt == "json" else TextFormatter(service=service)
    )
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(formatter)
    setattr(handler, _HANDLER_MARK, True)
    root = logging.getLogger()
    for old in list(root.handlers):
        if getattr(old, _HANDLER_MARK, False):
            root.removeHandler(old)
            old.close()
    root.addHandler(handler)
    root.setLevel(level_for_verbosity(verbosity))
    noisy_level = logging.NOTSET if verbosity >= 6 else logging.WARNING
    for name in _NOISY_LOGGERS:
        logging.getLogger(name).setLevel(noisy_level)
    return handler


class OnceLogger:
    """Logs a condition once per change of its cause, and once when it clears.

    Keyed by any hashable (an endpoint, a pod UID, a container ID, "redis"):
    `error(key, msg)` logs only when the cause differs from the last one logged for
    `key` (the cause is `msg` unless `cause=` names it, e.g. the error text under a
    fixed message); `clear(key)` logs a recovery line if `key` had an error; `retain`
    forgets, silently, the keys whose objects are gone. Thread-safe; `error` and
    `clear` return whether they logged.
    """

    def __init__(self, logger: logging.Logger, *, level: int = logging.ERROR) -> None:
        self.logger = logger
        self.level = level
        self._active: dict[Hashable, str] = {}
        self._causes: dict[Hashable, Hashable] = {}
        self._lock = threading.Lock()

    def error(
        self,
        key: Hashable,
        message: str,
        *,
        cause: Hashable = None,
        level: int | None = None,
        **fields: Any,
    ) -> bool:
        seen = message if cause is None else cause
        with self._lock:
            if key in self._active and self._causes[key] == seen:
                return False
            self._active[key] = message
            self._causes[key] = seen
        self.logger.log(
            self.level if level is None else level,
            message,
            extra=_safe_extra(fields),
            stacklevel=2,
        )
        return True

    def clear(self, key: Hashable, message: str | None = None, **fields: Any) -> bool:
        with self._lock:
            previous = self._active.pop(key, None)
            self._causes.pop(key, None)
        if previous is None:
            return False
        text = message or f"recovered: {previous}"
        self.logger.info(
            text, extra=_safe_extra({**fields, "previous_error": previous}), stacklevel=2
        )
        return True

    def retain(self, keys: Iterable[Hashable]) -> None:
        """Forget, without a recovery line, every key not in `keys` (objects gone)."""
        keep = set(keys)
        with self._lock:
            for key in [k for k in self._active if k not in keep]:
                del self._active[key]
                del self._causes[key]

    def active(self) -> dict[Hashable, str]:
        """The conditions currently logged as failing, by key."""
        with self._lock:
            return dict(self._active)


def _safe_extra(fields: dict[str, Any]) -> dict[str, Any]:
    """Rename fields logging refuses in `extra=` (name, msg, args, ...)."""
    return {(f"{k}_" if k in _RECORD_ATTRS else k): v for k, v in fields.items()}


_ONCE_LOGGERS: dict[str, OnceLogger] = {}
_ONCE_LOCK = threading.Lock()


def log_once_per_change(
    logger: logging.Logger, key: Hashable, message: str | None, **fields: Any
) -> bool:
    """Log `message` as an error for `key` unless it is the one last logged for it;
    `message=None` marks the condition cleared and logs a recovery line if it was set.

    State is kept per logger name for the life of the process; a component that wants
    its own state (tests, short-lived objects) should hold an OnceLogger instead.
    """
    with _ONCE_LOCK:
        once = _ONCE_LOGGERS.get(logger.name)
        if once is None or once.logger is not logger:
            once = _ONCE_LOGGERS[logger.name] = OnceLogger(logger)
    if message is None:
        return once.clear(key, **fields)
    return once.error(key, message, **fields)
