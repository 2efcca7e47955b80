"""An unlistable static-pod directory is an incomplete snapshot (the last set is kept),
unlike a missing one. The permission error is injected: these tests run as root, who
can list any directory."""

from __future__ import annotations

from pathlib import Path

import pytest
from klet.pod_source.sources import files


def test_unlistable_directory_is_incomplete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(path: object) -> list[str]:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(files.os, "listdir", refuse)
    result = files.scan(tmp_path, node_name="n1")
    assert result.status == "unreadable" and not result.complete
    assert "Permission denied" in result.note
