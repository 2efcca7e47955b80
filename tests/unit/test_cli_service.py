"""The entry sequence of every service (klet.cli.service.run_service): a private port
file left by an earlier run of the same container is gone before the service starts,
so `klet healthcheck` cannot pass on it meanwhile; without one configured nothing is
touched. A default klet does not honour is a WARNING of the service that would act on
it, and only of that one. The service logs klog's text lines unless --logging-format or
the file's logging.format says json; -v (or logging.verbosity) 4 and up adds DEBUG; a
deprecated flag is a WARNING naming it. `--version` prints the version before any
configuration is read (a bad one does not stop it), and upstream's values klet lacks are
refused by name. `klet bootstrap <service>` runs the TLS bootstrap with the service's
settings and exits without starting anything; without its two flags it fails."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from klet.cli import service
from klet.config import Settings
from klet.obs import configure_logging
from klet.portfiles import PortRecord


@pytest.fixture(autouse=True)
def quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(service, "apply_open_files_limit", lambda want, **_: None)
    monkeypatch.setattr(service, "apply_oom_score_adj", lambda value: "")
    monkeypatch.setattr(service, "swap_problem", lambda fail_swap_on: None)
    monkeypatch.setattr(service, "configure_logging", lambda **_: None)


def test_a_stale_port_file_is_removed_before_the_service_starts(tmp_path: Path) -> None:
    stale = tmp_path / "klet-service-port.json"
    stale.write_text(PortRecord("eviction", "127.0.0.1", 40000, 1, "old").to_json())
    seen: list[bool] = []

    async def start(settings: Settings) -> int:
        assert settings.klet.service_port_file == stale
        seen.append(stale.exists())
        return 0

    argv = ["--service-port", "0", "--service-port-file", str(stale)]
    assert service.run_service("eviction", argv, start) == 0
    assert seen == [False]


def test_no_port_file_configured(tmp_path: Path) -> None:
    async def start(settings: Settings) -> int:
        assert settings.klet.service_port_file is None
        return 0

    assert service.run_service("eviction", [], start) == 0


@pytest.mark.parametrize(
    ("name", "warned"),
    [("syncloop", ["makeIPTablesUtilChains"]), ("eviction", [])],
)
def test_defaults_klet_does_not_honour_are_warned(
    caplog: pytest.LogCaptureFixture, name: str, warned: list[str]
) -> None:
    async def start(settings: Settings) -> int:
        return 0

    with caplog.at_level(logging.WARNING, logger="klet.cli.service"):
        assert service.run_service(name, [], start) == 0
    assert [r.getMessage().split(":")[0] for r in caplog.records] == warned


@pytest.fixture
def logged(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    """What the service's real logging configuration writes."""
    stream = io.StringIO()
    monkeypatch.setattr(
        service, "configure_logging", lambda **kw: configure_logging(**kw, stream=stream)
    )
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield stream
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)


async def log_two_lines(settings: Settings) -> int:
    log = logging.getLogger("klet.test.service")
    log.debug("detail")
    log.info("started", extra={"pods": 0})
    return 0


@pytest.mark.parametrize(
    ("argv", "config", "form", "debug"),
    [
        ([], "", "text", False),
        (["--logging-format", "json"], "", "json", False),
        (["--logging-format=text"], "logging: {format: json}\n", "text", False),
        ([], "logging: {format: json}\n", "json", False),
        ([], "logging: {format: json, verbosity: 4}\n", "json", True),
        (["-v=4"], "", "text", True),
        (["--v", "3"], "", "text", False),
        (["-v", "6"], "logging: {verbosity: 1}\n", "text", True),
        (["-v", "0"], "logging: {verbosity: 5}\n", "text", False),
    ],
)
def test_log_format_and_verbosity(
    logged: io.StringIO, tmp_path: Path, argv: list[str], config: str, form: str, debug: bool
) -> None:
    path = tmp_path / "kubelet.yaml"
    path.write_text(
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n" + config
    )
    assert service.run_service("eviction", ["--config", str(path), *argv], log_two_lines) == 0
    # This module's lines (at debug level, asyncio logs its selector too).
    lines = [line for line in logged.getvalue().splitlines() if "test_cli_service.py:" in line]
    assert len(lines) == (2 if debug else 1)
    if form == "json":
        found = [json.loads(line) for line in lines]
        assert [(f["level"], f["msg"]) for f in found][-1] == ("info", "started")
        assert found[-1]["service"] == "eviction" and found[-1]["pods"] == 0
    else:
        assert lines[-1].startswith("I")
        assert lines[-1].endswith('] "started" service="eviction" pods=0')
    assert ('"detail"' in lines[0]) is debug


def test_a_deprecated_flag_is_warned_about(logged: io.StringIO) -> None:
    assert service.run_service("eviction", ["--log-format", "json"], log_two_lines) == 0
    first, started = (json.loads(line) for line in logged.getvalue().splitlines())
    assert (first["level"], first["msg"]) == (
        "warning",
        "--log-format is deprecated: use --logging-format or the configuration's logging.format",
    )
    assert started["msg"] == "started"


async def never(settings: Settings) -> int:
    raise AssertionError("the service started")


@pytest.mark.parametrize(
    "argv",
    [
        ["--version"],
        ["--version=true"],
        # answered before the configuration is read, as upstream
        ["--no-such-flag", "--config", "/nonexistent.yaml", "--version"],
        ["--version=false", "--version"],
    ],
)
def test_version_is_printed_before_anything_starts(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    assert service.run_service("image-gc", argv, never) == 0
    out, err = capsys.readouterr()
    assert re.fullmatch(r"klet image-gc \S+ \(kubelet v1\.\d+\.\d+\)\n", out)
    assert err == ""


def test_version_false_is_as_if_absent() -> None:
    assert service.run_service("image-gc", ["--version=false"], log_two_lines) == 0


@pytest.mark.parametrize("value", ["raw", "v1.35.0"])
def test_upstream_version_values_klet_lacks_are_refused(
    capsys: pytest.CaptureFixture[str], value: str
) -> None:
    assert service.run_service("image-gc", [f"--version={value}"], never) == 1
    assert capsys.readouterr().err.startswith(f"image-gc: --version={value}: klet implements")


def test_single_process_oom_kill_false_is_refused_on_cgroup_v1_only() -> None:
    """upstream's validation: false asks for memory.oom.group, which cgroup v1 lacks."""
    from klet.cli.service import oom_kill_problem

    assert "needs cgroup v2" in (oom_kill_problem(False, cgroup_version=1) or "")
    assert oom_kill_problem(False, cgroup_version=2) is None
    assert oom_kill_problem(None, cgroup_version=1) is None
    assert oom_kill_problem(True, cgroup_version=1) is None


def test_bootstrap_alone(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from klet.kube import bootstrap

    calls: list[tuple[Path, Path, Path]] = []

    async def ensure(s: bootstrap.BootstrapSettings, connect: object) -> None:
        calls.append((s.kubeconfig, s.bootstrap_kubeconfig, s.cert_dir))

    monkeypatch.setattr(bootstrap, "ensure_client_certificate", ensure)
    argv = [
        "--kubeconfig", str(tmp_path / "pki" / "kubelet.conf"),
        "--bootstrap-kubeconfig", str(tmp_path / "bootstrap.conf"),
        "--cert-dir", str(tmp_path / "pki"),
    ]  # fmt: skip
    assert service.bootstrap_service("status-reporter", argv) == 0
    assert calls == [
        (tmp_path / "pki" / "kubelet.conf", tmp_path / "bootstrap.conf", tmp_path / "pki")
    ]
    assert service.bootstrap_service("status-reporter", argv[:2]) == 1  # no bootstrap flag
    assert len(calls) == 1
