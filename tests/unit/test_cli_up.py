"""`klet up` refuses to start a node without all five services, naming the missing ones,
and gives the three services that read the runtime their CRI proxy socket as runtime and
image endpoint (syncloop and pod-source keep theirs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from klet.cli import up as up_module


def test_a_service_that_is_not_installed_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = up_module.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name in ("klet.eviction", "klet.image_gc") else real(name, *args)

    monkeypatch.setattr(up_module, "find_spec", find_spec)
    assert up_module.up(["--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert (
        "not installed: eviction (no module klet.eviction; its distribution is klet-eviction)"
        in err
    )
    assert "image-gc (no module klet.image_gc" in err
    assert not (tmp_path / "run").exists()  # nothing started


def test_readers_get_their_cri_proxy_socket(tmp_path: Path) -> None:
    for service in ("status-reporter", "eviction", "image-gc"):
        sock = f"unix://{tmp_path}/cri/{service}.sock"
        assert up_module._filtered_runtime_flags(service, tmp_path) == [
            "--container-runtime-endpoint",
            sock,
            "--image-service-endpoint",
            sock,
        ]
    for service in ("pod-source", "syncloop"):
        assert up_module._filtered_runtime_flags(service, tmp_path) == []
