"""The entry sequence of every service (klet.cli.service.run_service): a private port
file left by an earlier run of the same container is gone before the service starts,
so `klet healthcheck` cannot pass on it meanwhile; without one configured nothing is
touched. A default klet does not honour is a WARNING of the service that would act on
it, and only of that one."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from klet.cli import service
from klet.config import Settings
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
