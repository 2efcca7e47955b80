"""`--version` (klet.cli.version): the line names klet's release, from the installed
distribution, and the upstream kubelet release whose gates klet follows; the flag takes
Go's boolean spellings, the last one given wins, nothing after `--` counts, and upstream's
`raw` and `vX.Y.Z` values are refused; `klet --version` prints the line (klet.cli.main)."""

from __future__ import annotations

from importlib.metadata import version

import pytest
from klet.cli.main import main
from klet.cli.version import split_version_flag, version_line
from klet.config.gates import KUBERNETES_VERSION


def test_the_line_names_klets_release_and_the_kubelets() -> None:
    assert version_line() == f"klet {version('klet-libs')} (kubelet {KUBERNETES_VERSION})"
    assert version_line("syncloop") == (
        f"klet syncloop {version('klet-syncloop')} (kubelet {KUBERNETES_VERSION})"
    )


def test_a_distribution_that_is_not_installed_says_so() -> None:
    assert version_line("no-such-service").startswith("klet no-such-service (not installed) ")


@pytest.mark.parametrize(
    ("argv", "asked", "rest"),
    [
        ([], False, []),
        (["--v", "4"], False, ["--v", "4"]),
        (["--version"], True, []),
        (["--port", "1", "--version=true", "-v", "2"], True, ["--port", "1", "-v", "2"]),
        (["--version=1"], True, []),
        (["--version=false"], False, []),
        (["--version", "--version=F"], False, []),
        (["--version=0", "--version=T"], True, []),
        (["--", "--version"], False, ["--", "--version"]),
        (["--versions"], False, ["--versions"]),
    ],
)
def test_split_version_flag(argv: list[str], asked: bool, rest: list[str]) -> None:
    assert split_version_flag(argv) == (asked, rest)


@pytest.mark.parametrize("value", ["raw", "v1.34.4", "yes", ""])
def test_values_klet_does_not_implement_are_refused(value: str) -> None:
    with pytest.raises(ValueError, match=f"--version={value}: klet implements only"):
        split_version_flag([f"--version={value}"])


def test_klet_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == version_line() + "\n"


def test_klet_version_refuses_a_raw_request(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version=raw"]) == 2
    assert capsys.readouterr().err.startswith("klet: --version=raw: klet implements only")
