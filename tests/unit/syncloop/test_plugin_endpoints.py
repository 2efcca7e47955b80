"""klet.syncloop.plugins.endpoints: the endpoint check CSI drivers, watched device
plugins and DRA drivers share: a normalised absolute unix socket path (bare or
`unix://`), no control character, at most 107 bytes, and, when directories are given,
strictly inside one of them."""

from __future__ import annotations

from pathlib import Path

import pytest
from klet.syncloop.plugins.endpoints import SOCKET_PATH_MAX, endpoint_problem, socket_path

DIRS = [Path("/var/lib/klet/plugins"), Path("/var/lib/klet/plugins_registry")]


def test_socket_path_drops_the_unix_scheme_only() -> None:
    assert socket_path("unix:///run/x.sock") == "/run/x.sock"
    assert socket_path("/run/x.sock") == "/run/x.sock"


@pytest.mark.parametrize(
    "endpoint",
    ["/run/csi/x.sock", "unix:///run/csi/x.sock", "/" + "d" * (SOCKET_PATH_MAX - 1)],
)
def test_sound_paths_pass_without_directories(endpoint: str) -> None:
    assert endpoint_problem(endpoint) is None


@pytest.mark.parametrize(
    ("endpoint", "why"),
    [
        ("x.sock", "is not an absolute unix socket path (or unix://<path>)"),
        ("unix://x.sock", "is not an absolute unix socket path"),
        ("/run//x.sock", "not a normalised path"),
        ("/run/./x.sock", "not a normalised path"),
        ("/run/../x.sock", "not a normalised path"),
        ("/run/x.sock/", "not a normalised path"),
        ("/run/x\x7f.sock", "control character"),
        ("/run/x\n.sock", "control character"),
        ("/" + "d" * SOCKET_PATH_MAX, f"longer than a unix socket path may be ({SOCKET_PATH_MAX}"),
    ],
)
def test_unsound_paths_are_refused_naming_the_endpoint(endpoint: str, why: str) -> None:
    problem = endpoint_problem(endpoint)
    assert problem is not None
    assert why in problem
    assert repr(endpoint) in problem


def test_directories_hold_the_endpoint_strictly_inside() -> None:
    assert endpoint_problem("/var/lib/klet/plugins/d/x.sock", DIRS) is None
    assert endpoint_problem("unix:///var/lib/klet/plugins_registry/x.sock", DIRS) is None
    outside = endpoint_problem("/run/x.sock", DIRS)
    assert outside == (
        "endpoint '/run/x.sock' is not under /var/lib/klet/plugins or "
        "/var/lib/klet/plugins_registry"
    )
    assert endpoint_problem("/var/lib/klet/plugins", DIRS) is not None  # the directory itself
