"""failSwapOn (klet.cli.swap): /proc/swaps lines past the header are active swap; with
swap on every service refuses to start before its loop runs, naming the field and the
devices (with failSwapOn false too, since klet sets no NoSwap limits); a node without
swap, or without /proc/swaps, starts; an unreadable /proc/swaps is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from klet.cli import service, swap
from klet.cli.swap import swap_devices, swap_problem
from klet.config import Settings

HEADER = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"
ON = HEADER + "/dev/sda2                               partition\t2097148\t\t0\t\t-2\n"


@pytest.mark.parametrize(
    ("text", "devices"),
    [
        (HEADER, []),
        ("", []),
        (ON, ["/dev/sda2"]),
        (ON + "/swapfile file 1024 0 -3\n\n", ["/dev/sda2", "/swapfile"]),
    ],
)
def test_swap_devices(text: str, devices: list[str]) -> None:
    assert swap_devices(text) == devices


def test_swap_off_starts(tmp_path: Path) -> None:
    swaps = tmp_path / "swaps"
    swaps.write_text(HEADER)
    assert swap_problem(True, swaps) is None
    assert swap_problem(False, swaps) is None


def test_no_proc_swaps_is_no_swap(tmp_path: Path) -> None:
    assert swap_problem(True, tmp_path / "absent") is None


def test_swap_on_is_refused_naming_the_field(tmp_path: Path) -> None:
    swaps = tmp_path / "swaps"
    swaps.write_text(ON)
    problem = swap_problem(True, swaps)
    assert problem is not None
    assert problem.startswith(f"failSwapOn: swap is on (/dev/sda2 in {swaps});")


def test_swap_on_with_fail_swap_on_false_starts_where_containers_can_be_kept_out(
    tmp_path: Path,
) -> None:
    swaps = tmp_path / "swaps"
    swaps.write_text(ON)
    assert swap_problem(False, swaps, swap_control="memsw") is None
    assert swap_problem(False, swaps, swap_control="swap.max") is None


def test_swap_on_with_fail_swap_on_false_and_no_swap_controller_is_refused(
    tmp_path: Path,
) -> None:
    swaps = tmp_path / "swaps"
    swaps.write_text(ON)
    problem = swap_problem(False, swaps, swap_control="")
    assert problem is not None
    assert problem.startswith("failSwapOn: false with swap on (/dev/sda2 in")
    assert "NoSwap" in problem and "swapaccount=1" in problem


def test_an_unreadable_proc_swaps_is_refused(tmp_path: Path) -> None:
    problem = swap_problem(True, tmp_path)  # a directory: EISDIR
    assert problem is not None
    assert problem.startswith("failSwapOn: cannot tell whether swap is on")


@pytest.mark.parametrize("fail_swap_on", [True, False])
def test_a_service_does_not_start_with_swap_on(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    fail_swap_on: bool,
) -> None:
    swaps = tmp_path / "swaps"
    swaps.write_text(ON)
    monkeypatch.setattr(
        service, "swap_problem", lambda f: swap.swap_problem(f, swaps, swap_control="")
    )
    monkeypatch.setattr(service, "configure_logging", lambda **_: None)
    monkeypatch.setattr(service, "apply_oom_score_adj", lambda value: "")
    monkeypatch.setattr(service, "apply_open_files_limit", lambda want, **_: None)
    config = tmp_path / "kubelet.json"
    config.write_text(
        json.dumps(
            {
                "apiVersion": "kubelet.config.k8s.io/v1beta1",
                "kind": "KubeletConfiguration",
                "failSwapOn": fail_swap_on,
            }
        )
    )
    started: list[Settings] = []

    async def start(settings: Settings) -> int:
        started.append(settings)
        return 0

    assert service.run_service("eviction", ["--config", str(config)], start) == 1
    assert started == []
    assert capsys.readouterr().err.startswith("eviction: failSwapOn: ")
