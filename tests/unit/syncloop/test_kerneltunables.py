"""protectKernelDefaults: the decision over the six sysctls upstream's kubelet relies on,
read from a fake /proc/sys; true refuses syncloop's start naming each mismatching
sysctl, false never writes the host's values."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest
from klet.config import KubeletConfiguration, Settings
from klet.config.settings import KletSettings
from klet.syncloop import __main__ as entry
from klet.syncloop.kerneltunables import (
    DESIRED,
    check_kernel_defaults,
    read_tunables,
    tunable_problems,
)

GOOD = {name: str(value) + "\n" for name, value in DESIRED.items()}


def proc_sys(tmp_path: Path, values: dict[str, str]) -> Path:
    root = tmp_path / "sys"
    for name, text in values.items():
        f = root / name.replace(".", "/")
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    return root


def test_upstream_values() -> None:
    assert DESIRED == {
        "vm.overcommit_memory": 1,
        "vm.panic_on_oom": 0,
        "kernel.panic": 10,
        "kernel.panic_on_oops": 1,
        "kernel.keys.root_maxkeys": 1000000,
        "kernel.keys.root_maxbytes": 25000000,
    }


@pytest.mark.parametrize(
    ("observed", "expected"),
    [
        (GOOD, []),
        ({**GOOD, "kernel.panic": "0\n"}, ["kernel tunable kernel.panic: expected 10, got 0"]),
        (
            {**GOOD, "vm.overcommit_memory": "0", "kernel.panic_on_oops": "0"},
            [
                "kernel tunable vm.overcommit_memory: expected 1, got 0",
                "kernel tunable kernel.panic_on_oops: expected 1, got 0",
            ],
        ),
        (
            {**GOOD, "vm.panic_on_oom": None},
            ["kernel tunable vm.panic_on_oom: cannot be read (expected 0)"],
        ),
        ({**GOOD, "kernel.panic": "ten"}, ["kernel tunable kernel.panic: expected 10, got 'ten'"]),
    ],
)
def test_tunable_problems(observed: dict[str, str | None], expected: list[str]) -> None:
    assert tunable_problems(observed) == expected


def test_read_tunables(tmp_path: Path) -> None:
    root = proc_sys(tmp_path, {"kernel.panic": "10\n"})
    got = read_tunables(DESIRED, root)
    assert got["kernel.panic"] == "10\n"
    assert got["vm.overcommit_memory"] is None


def test_protect_refuses_naming_each_sysctl(tmp_path: Path) -> None:
    root = proc_sys(tmp_path, {**GOOD, "kernel.panic": "1", "vm.overcommit_memory": "0"})
    assert check_kernel_defaults(True, root) == [
        "protectKernelDefaults: kernel tunable vm.overcommit_memory: expected 1, got 0",
        "protectKernelDefaults: kernel tunable kernel.panic: expected 10, got 1",
    ]
    assert check_kernel_defaults(True, proc_sys(tmp_path, GOOD)) == []


def test_unprotected_logs_and_leaves_the_host_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    values = {**GOOD, "kernel.panic": "1\n", "vm.overcommit_memory": "0\n"}
    root = proc_sys(tmp_path, values)
    with caplog.at_level(logging.INFO, logger="klet.syncloop.kerneltunables"):
        assert check_kernel_defaults(False, root) == []
    assert "differ" in caplog.text
    # nothing was rewritten
    assert read_tunables(DESIRED, root) == values


def settings(protect: bool) -> Settings:
    cfg = dataclasses.replace(KubeletConfiguration(), protect_kernel_defaults=protect)
    return Settings(kubelet=cfg, klet=KletSettings(service="syncloop", node_name="n"))


async def test_syncloop_refuses_to_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = proc_sys(tmp_path, {**GOOD, "kernel.panic_on_oops": "0"})
    assert await entry.start(settings(True), proc_sys=root) == 1
    err = capsys.readouterr().err
    assert "protectKernelDefaults: kernel tunable kernel.panic_on_oops: expected 1, got 0" in err
