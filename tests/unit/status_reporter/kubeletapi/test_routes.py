"""Streaming requests: which paths are exec/attach/portForward (with and without the pod
UID, percent-decoded, nothing else), their query options (the tty/stderr rule, at least
one stream, WebSocket port lists), and upgrade detection."""

from __future__ import annotations

import pytest
from klet.status_reporter.kubeletapi.routes import (
    BadRequest,
    StreamOptions,
    StreamTarget,
    is_upgrade,
    is_websocket,
    parse_stream_path,
    stream_options,
)


@pytest.mark.parametrize(
    ("path", "target"),
    [
        ("/exec/ns/pod/c", StreamTarget("exec", "ns", "pod", container="c")),
        ("/exec/ns/pod/uid1/c", StreamTarget("exec", "ns", "pod", uid="uid1", container="c")),
        ("/attach/ns/pod/c", StreamTarget("attach", "ns", "pod", container="c")),
        ("/portForward/ns/pod", StreamTarget("portForward", "ns", "pod")),
        ("/portForward/ns/pod/uid1", StreamTarget("portForward", "ns", "pod", uid="uid1")),
        ("/exec/ns/my%2Dpod/c", StreamTarget("exec", "ns", "my-pod", container="c")),
        ("/exec/ns/pod", None),
        ("/exec/ns/pod/a/b/c", None),
        ("/exec/ns//c", None),
        ("/portForward/ns", None),
        ("/portForward/ns/pod/uid/x", None),
        ("/containerLogs/ns/pod/c", None),
        ("exec/ns/pod/c", None),
        ("/", None),
    ],
)
def test_parse_stream_path(path: str, target: StreamTarget | None) -> None:
    assert parse_stream_path(path) == target


def test_exec_options() -> None:
    q = {"command": ["sh", "-c", "echo hi"], "input": ["1"], "output": ["1"], "error": ["1"]}
    assert stream_options("exec", q) == StreamOptions(
        stdin=True, stdout=True, stderr=True, command=("sh", "-c", "echo hi")
    )
    tty = stream_options("exec", {"command": ["sh"], "tty": ["1"], "output": ["1"], "error": ["1"]})
    assert tty.tty and tty.stdout and not tty.stderr
    attach = stream_options("attach", {"command": ["ignored"], "output": ["true"]})
    assert attach == StreamOptions(stdout=True)
    with pytest.raises(BadRequest, match="at least 1"):
        stream_options("exec", {"command": ["ls"], "output": ["0"]})
    with pytest.raises(BadRequest, match="at least 1"):
        stream_options("attach", {"tty": ["1"], "error": ["1"]})


def test_port_forward_options() -> None:
    assert stream_options("portForward", {}) == StreamOptions()
    assert stream_options("portForward", {"port": ["80,8080", "9000"]}, websocket=True).ports == (
        80,
        8080,
        9000,
    )
    for bad in ({}, {"port": [""]}, {"port": ["x"]}, {"port": ["0"]}, {"port": ["70000"]}):
        with pytest.raises(BadRequest):
            stream_options("portForward", bad, websocket=True)


def test_upgrade_detection() -> None:
    spdy = {"connection": "Upgrade", "upgrade": "SPDY/3.1"}
    ws = {"connection": "keep-alive, Upgrade", "upgrade": "websocket"}
    assert is_upgrade(spdy) and not is_websocket(spdy)
    assert is_upgrade(ws) and is_websocket(ws)
    assert not is_upgrade({"upgrade": "websocket"})
    assert not is_upgrade({"connection": "upgrade"})
