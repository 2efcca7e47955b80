"""Pure parsing of the kubelet API's streaming requests (exec, attach, portForward).

Paths, as upstream registers them:

    /exec/{namespace}/{pod}/{container}          /exec/{namespace}/{pod}/{uid}/{container}
    /attach/{namespace}/{pod}/{container}        /attach/{namespace}/{pod}/{uid}/{container}
    /portForward/{namespace}/{pod}               /portForward/{namespace}/{pod}/{uid}

Query parameters of exec and attach are the apiserver's: `command` (repeated, exec
only), `input`, `output`, `error`, `tty` ("1" turns one on; "true" is accepted too). A
tty merges stderr into stdout, so `error` is dropped with `tty`, and at least one of
the three streams must be asked for. portForward names its ports in the SPDY stream
headers, except over WebSocket, where the `port` query parameter (repeated or
comma-separated, 1..65535) is required.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import unquote

STREAM_KINDS = ("exec", "attach", "portForward")


class BadRequest(ValueError):
    """The request cannot be served as asked: the message is the 400 body."""


@dataclass(frozen=True)
class StreamTarget:
    kind: str
    """exec, attach or portForward."""
    namespace: str
    pod: str
    uid: str = ""
    """The pod UID when the path names one ("" otherwise)."""
    container: str = ""
    """"" for portForward."""


@dataclass(frozen=True)
class StreamOptions:
    stdin: bool = False
    stdout: bool = False
    stderr: bool = False
    tty: bool = False
    command: tuple[str, ...] = ()
    ports: tuple[int, ...] = ()


def parse_stream_path(path: str) -> StreamTarget | None:
    """The target of a streaming path, or None when `path` is not one."""
    parts = path.split("/")
    if len(parts) < 2 or parts[0] != "" or parts[1] not in STREAM_KINDS:
        return None
    kind, rest = parts[1], [unquote(p) for p in parts[2:]]
    if any(not p for p in rest):
        return None
    if kind == "portForward":
        if len(rest) == 2:
            return StreamTarget(kind, rest[0], rest[1])
        if len(rest) == 3:
            return StreamTarget(kind, rest[0], rest[1], uid=rest[2])
        return None
    if len(rest) == 3:
        return StreamTarget(kind, rest[0], rest[1], container=rest[2])
    if len(rest) == 4:
        return StreamTarget(kind, rest[0], rest[1], uid=rest[2], container=rest[3])
    return None


def _flag(query: Mapping[str, Sequence[str]], name: str) -> bool:
    values = query.get(name) or ()
    return bool(values) and values[0] in ("1", "true")


def stream_options(
    kind: str, query: Mapping[str, Sequence[str]], *, websocket: bool = False
) -> StreamOptions:
    """The options of a streaming request. Raises BadRequest."""
    if kind == "portForward":
        return StreamOptions(ports=_ports(query) if websocket else ())
    tty = _flag(query, "tty")
    stdin, stdout = _flag(query, "input"), _flag(query, "output")
    stderr = _flag(query, "error") and not tty
    if not (stdin or stdout or stderr):
        raise BadRequest("you must specify at least 1 of stdin, stdout, stderr")
    command = tuple(query.get("command", ())) if kind == "exec" else ()
    return StreamOptions(stdin=stdin, stdout=stdout, stderr=stderr, tty=tty, command=command)


def _ports(query: Mapping[str, Sequence[str]]) -> tuple[int, ...]:
    values = query.get("port")
    if not values:
        raise BadRequest('query parameter "port" is required')
    ports: list[int] = []
    for value in values:
        if not value:
            raise BadRequest('query parameter "port" cannot be empty')
        for item in value.split(","):
            if not item.isdigit() or int(item) > 65535:
                raise BadRequest(f"unable to parse {value!r} as a port")
            if int(item) < 1:
                raise BadRequest(f"port {value!r} must be > 0")
            ports.append(int(item))
    return tuple(ports)


def header_tokens(headers: Mapping[str, str], name: str) -> set[str]:
    """The comma-separated tokens of a header, lowercased."""
    return {t.strip().lower() for t in headers.get(name, "").split(",") if t.strip()}


def is_upgrade(headers: Mapping[str, str]) -> bool:
    return "upgrade" in header_tokens(headers, "connection") and bool(headers.get("upgrade"))


def is_websocket(headers: Mapping[str, str]) -> bool:
    return is_upgrade(headers) and headers.get("upgrade", "").strip().lower() == "websocket"
