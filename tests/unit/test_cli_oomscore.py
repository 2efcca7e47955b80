"""oomScoreAdj (klet.cli.oomscore): each service writes the value to its own
oom_score_adj at start (skipping the write when it already holds it); when the host
refuses, the service runs on with a WARNING naming the field, the wish and the value it
keeps. The shared entry sequence applies the configured value, default -999."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from klet.cli import service
from klet.cli.oomscore import apply_oom_score_adj
from klet.config import Settings


class FakeOomFile:
    """/proc/self/oom_score_adj: the value, the writes, and optionally a host that
    refuses negative values (EIO, as the test hosts do)."""

    def __init__(self, value: str, *, refuse_negative: bool = False) -> None:
        self.value = value
        self.refuse_negative = refuse_negative
        self.writes: list[str] = []

    def read_text(self) -> str:
        return self.value + "\n"

    def write_text(self, text: str) -> int:
        self.writes.append(text)
        if self.refuse_negative and int(text) < 0:
            raise OSError(5, "Input/output error")
        self.value = text
        return len(text)

    def __str__(self) -> str:
        return "/proc/self/oom_score_adj"


def test_the_value_is_written(tmp_path: Path) -> None:
    path = tmp_path / "oom_score_adj"
    path.write_text("0\n")
    assert apply_oom_score_adj(-999, path=path) == ""
    assert path.read_text() == "-999"


def test_a_value_already_held_is_not_written() -> None:
    path = FakeOomFile("-999")
    assert apply_oom_score_adj(-999, path=path) == ""  # type: ignore[arg-type]
    assert path.writes == []


def test_a_refusing_host_warns_naming_the_field(caplog: pytest.LogCaptureFixture) -> None:
    path = FakeOomFile("0", refuse_negative=True)
    with caplog.at_level(logging.WARNING):
        problem = apply_oom_score_adj(-999, path=path)  # type: ignore[arg-type]
    assert problem == "writing /proc/self/oom_score_adj: Input/output error"
    assert path.value == "0"
    (record,) = caplog.records
    assert record.getMessage() == (
        "oomScoreAdj: cannot set this process's oom_score_adj to -999 "
        "(writing /proc/self/oom_score_adj: Input/output error); it stays 0"
    )
    # a positive value is allowed there
    assert apply_oom_score_adj(500, path=path) == ""  # type: ignore[arg-type]
    assert path.value == "500"


def test_an_unreadable_file_warns(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        problem = apply_oom_score_adj(-999, path=tmp_path / "absent")
    assert problem.startswith("cannot read ")
    assert "oomScoreAdj" in caplog.records[0].getMessage()


@pytest.mark.parametrize(("argv", "value"), [([], -999), (["--oom-score-adj", "-500"], -500)])
def test_every_service_applies_oom_score_adj(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], value: int
) -> None:
    applied: list[int] = []
    monkeypatch.setattr(service, "apply_oom_score_adj", lambda v: applied.append(v) or "")
    monkeypatch.setattr(service, "swap_problem", lambda fail_swap_on: None)
    monkeypatch.setattr(service, "configure_logging", lambda **_: None)
    monkeypatch.setattr(service, "apply_open_files_limit", lambda want, **_: None)

    async def start(settings: Settings) -> int:
        return 0

    assert service.run_service("image-gc", argv, start) == 0
    assert applied == [value]
