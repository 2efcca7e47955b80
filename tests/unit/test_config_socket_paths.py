"""--root-dir and --run-dir are refused at start when a unix socket klet listens on under
them would be longer than a socket path can be (klet.model.layout.served_sockets): the
bind would otherwise fail only when the service reached it (syncloop's device-plugin
registration and PodResources sockets did, under a long pytest directory), ending it."""

from __future__ import annotations

from pathlib import Path

import pytest
from klet.config import ConfigError, load_settings
from klet.model.layout import UNIX_PATH_MAX, served_sockets


def test_every_socket_klet_serves_is_listed() -> None:
    names = {str(p) for p in served_sockets(Path("/run/klet"), Path("/var/lib/kubelet"))}
    assert "/var/lib/kubelet/device-plugins/kubelet.sock" in names
    assert "/var/lib/kubelet/pod-resources/kubelet.sock" in names
    assert "/run/klet/grpc/syncloop/syncloop.sock" in names
    assert "/run/klet/cri/status-reporter.sock" in names
    assert "/run/klet/redis/redis.sock" in names
    assert max(len(n) for n in names) <= UNIX_PATH_MAX  # upstream's default paths fit


def test_a_root_dir_too_long_for_its_sockets_is_refused_naming_it() -> None:
    root = "/var/lib/" + "k" * 80
    with pytest.raises(ConfigError) as info:
        load_settings(["--root-dir", root], env={}, service="syncloop", hostname="n")
    [problem] = [p for p in info.value.problems if "socket" in p]
    assert problem.startswith("--root-dir")
    assert f"{root}/device-plugins/kubelet.sock" in problem
    assert f"at most {UNIX_PATH_MAX}" in problem


def test_a_run_dir_too_long_is_refused_and_one_that_fits_is_not() -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(["--run-dir", "/run/" + "r" * 90], env={}, service="syncloop", hostname="n")
    assert any(p.startswith("--run-dir") and "grpc" in p for p in info.value.problems)
    fits = "/r" + "x" * (UNIX_PATH_MAX - len("/r/grpc/syncloop/syncloop.sock"))
    settings = load_settings(["--run-dir", fits], env={}, service="syncloop", hostname="n")
    assert str(settings.klet.run_dir) == fits
