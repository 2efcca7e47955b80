"""`klet why`'s argument handling (the reading itself runs against real Redis in
tests/integration/test_probes.py and test_eviction.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from klet.cli.main import main
from klet.cli.why import why


def test_a_pod_that_is_not_namespace_slash_name_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert why(["/web"], env={}) == 2
    assert "'/web' is not <namespace>/<name>" in capsys.readouterr().err


def test_no_bus_to_be_found_is_a_usage_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert why(["web", "-n", "kube-system", "--run-dir", str(tmp_path)], env={}) == 2
    err = capsys.readouterr().err
    assert err.startswith("klet why: no --redis-url or --redis-username, and no klet up in ")


def test_the_command_is_listed(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert "why <namespace>/<pod>" in capsys.readouterr().out
