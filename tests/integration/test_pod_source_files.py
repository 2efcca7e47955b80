"""The static-pod directory scan on a real filesystem: which entries are read (every
non-dot regular file, any extension, symlinks followed; no dotfiles, subdirectories or
FIFOs), a single-file path, a missing path (empty and complete), and the decode cache
(an unchanged file is not read again, a changed one is)."""

from __future__ import annotations

import os
from pathlib import Path

from klet.pod_source.sources.files import scan

NODE = "n1"


def pod_text(name: str) -> str:
    return (
        "apiVersion: v1\nkind: Pod\n"
        f"metadata: {{name: {name}}}\n"
        "spec: {containers: [{name: c, image: busybox}]}\n"
    )


def names(pods: list[dict[str, object]]) -> list[str]:
    return [p["metadata"]["name"] for p in pods]  # type: ignore[index]


def test_entries_read_and_skipped(tmp_path: Path) -> None:
    (tmp_path / "b.yaml").write_text(pod_text("b"))
    (tmp_path / "a.manifest").write_text(pod_text("a"))  # any extension
    (tmp_path / "c").write_text(pod_text("c"))  # or none
    (tmp_path / ".d.yaml").write_text(pod_text("d"))
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "e.yaml").write_text(pod_text("e"))
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "target.yaml.txt").write_text(pod_text("f"))
    (tmp_path / "f-link").symlink_to(tmp_path / "target.yaml.txt")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")

    result = scan(tmp_path, node_name=NODE)
    assert result.status == "ok" and result.complete
    # File-name order; the symlink and its target are two files with the same pod name:
    # the merge keeps the first by name and drops the other.
    assert names(result.pods) == ["a-n1", "b-n1", "c-n1", "f-n1", "f-n1"]
    assert result.bad == {}


def test_single_file_path(tmp_path: Path) -> None:
    path = tmp_path / "only.yaml"
    path.write_text(pod_text("only"))
    (tmp_path / "other.yaml").write_text(pod_text("other"))
    result = scan(path, node_name=NODE)
    assert names(result.pods) == ["only-n1"]
    assert result.pods[0]["metadata"]["annotations"]["kubernetes.io/config.source"] == "file"


def test_missing_path_is_an_empty_complete_snapshot(tmp_path: Path) -> None:
    result = scan(tmp_path / "absent", node_name=NODE)
    assert (result.status, result.pods, result.complete) == ("missing", [], True)


def test_not_a_directory_or_file_is_incomplete(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    result = scan(tmp_path / "fifo", node_name=NODE)
    assert not result.complete


def test_unchanged_files_come_from_the_cache(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(pod_text("good"))
    bad.write_text("kind: [")
    first = scan(tmp_path, node_name=NODE)
    assert set(first.bad) == {str(bad)} and first.bad[str(bad)].reason == "parse"

    again = scan(tmp_path, node_name=NODE, cache=first.cache)
    assert again.pods[0] is first.pods[0]  # not decoded again
    assert again.bad == first.bad

    good.write_text(pod_text("renamed"))
    bad.write_text(pod_text("fixed"))
    changed = scan(tmp_path, node_name=NODE, cache=again.cache)
    assert names(changed.pods) == ["fixed-n1", "renamed-n1"] and changed.bad == {}

    good.unlink()
    assert set(scan(tmp_path, node_name=NODE, cache=changed.cache).cache) == {str(bad)}
