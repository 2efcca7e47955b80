"""The atomic writer of content volumes (upstream's AtomicWriter layout): the payload in a
timestamped `..<time>` directory, `..data` pointing at it, one top-level link per visible
path into `..data`; an update swaps `..data` in one rename and removes the old payload
directory and the links of vanished paths; an unchanged payload leaves the volume
untouched (same directory, same inodes); file modes are exact whatever the umask;
fsGroup ownership; upstream's path validation messages."""

from __future__ import annotations

import os
import stat
from datetime import UTC, datetime
from pathlib import Path

import pytest
from klet.syncloop.volumes import atomic
from klet.syncloop.volumes.atomic import FileProjection, PayloadError

T0 = datetime(2025, 1, 31, 12, 0, 0, tzinfo=UTC)


def files(**contents: str) -> dict[str, FileProjection]:
    return {k.replace("__", "/"): FileProjection(v.encode(), 0o644) for k, v in contents.items()}


def payload_dirs(target: Path) -> list[str]:
    return sorted(
        e.name
        for e in os.scandir(target)
        if e.name.startswith("..") and e.is_dir(follow_symlinks=False)
    )


def test_first_write_layout(tmp_path: Path) -> None:
    written = atomic.write(tmp_path, files(a="1", sub__b="2"), now=lambda: T0)
    assert written
    data = os.readlink(tmp_path / "..data")
    assert data.startswith("..2025_01_31_12_00_00.")
    assert payload_dirs(tmp_path) == [data]
    assert os.readlink(tmp_path / "a") == "..data/a"
    assert os.readlink(tmp_path / "sub") == "..data/sub"
    assert (tmp_path / "a").read_text() == "1"
    assert (tmp_path / "sub" / "b").read_text() == "2"
    assert sorted(os.listdir(tmp_path)) == sorted(["..data", data, "a", "sub"])
    assert stat.S_IMODE(os.stat(tmp_path / data).st_mode) == 0o755


def test_update_swaps_data_link_and_removes_old_payload(tmp_path: Path) -> None:
    atomic.write(tmp_path, files(a="1", gone="x", sub__b="2"))
    old = os.readlink(tmp_path / "..data")
    assert atomic.write(tmp_path, files(a="changed", sub__c="3"))
    new = os.readlink(tmp_path / "..data")
    assert new != old
    assert payload_dirs(tmp_path) == [new]  # the old payload directory is gone
    assert (tmp_path / "a").read_text() == "changed"
    assert not os.path.lexists(tmp_path / "gone")  # the link of a vanished key
    assert os.listdir(tmp_path / "sub") == ["c"]  # sub/ now resolves into the new payload
    assert not (tmp_path / "..data_tmp").exists()


def test_unchanged_payload_is_not_rewritten(tmp_path: Path) -> None:
    atomic.write(tmp_path, files(a="1", sub__b="2"))
    data = os.readlink(tmp_path / "..data")
    inode = os.stat(tmp_path / "a").st_ino
    assert not atomic.write(tmp_path, files(a="1", sub__b="2"))
    assert os.readlink(tmp_path / "..data") == data
    assert os.stat(tmp_path / "a").st_ino == inode


def test_unchanged_payload_restores_a_missing_link(tmp_path: Path) -> None:
    atomic.write(tmp_path, files(a="1"))
    os.unlink(tmp_path / "a")
    assert not atomic.write(tmp_path, files(a="1"))
    assert (tmp_path / "a").read_text() == "1"


def test_removed_key_alone_triggers_a_write(tmp_path: Path) -> None:
    atomic.write(tmp_path, files(a="1", b="2"))
    assert atomic.write(tmp_path, files(a="1"))
    assert sorted(p for p in os.listdir(tmp_path) if not p.startswith("..")) == ["a"]


def test_empty_payload(tmp_path: Path) -> None:
    assert atomic.write(tmp_path, {})
    assert [p for p in os.listdir(tmp_path) if not p.startswith("..")] == []
    assert (tmp_path / "..data").is_dir()


def test_modes_are_exact_whatever_the_umask(tmp_path: Path) -> None:
    payload = {
        "private": FileProjection(b"s", 0o400),
        "open": FileProjection(b"o", 0o777),
        "default": FileProjection(b"d", 0o644),
    }
    old_umask = os.umask(0o077)
    try:
        atomic.write(tmp_path, payload)
    finally:
        os.umask(old_umask)
    modes = {name: stat.S_IMODE(os.stat(tmp_path / name).st_mode) for name in payload}
    assert modes == {"private": 0o400, "open": 0o777, "default": 0o644}


def test_leftovers_of_an_interrupted_write_are_cleaned(tmp_path: Path) -> None:
    atomic.write(tmp_path, files(a="1"))
    (tmp_path / "..2020_01_01_00_00_00.stale").mkdir()
    os.symlink("..2020_01_01_00_00_00.stale", tmp_path / "..data_tmp")
    atomic.write(tmp_path, files(a="2"))
    assert payload_dirs(tmp_path) == [os.readlink(tmp_path / "..data")]
    assert (tmp_path / "a").read_text() == "2"


def test_set_perms_runs_before_the_swap(tmp_path: Path) -> None:
    seen: list[str | None] = []

    def set_perms(root: Path) -> None:
        assert root == tmp_path
        seen.append(os.readlink(root / "..data") if os.path.lexists(root / "..data") else None)

    atomic.write(tmp_path, files(a="1"), set_perms=set_perms)
    first = os.readlink(tmp_path / "..data")
    atomic.write(tmp_path, files(a="2"), set_perms=set_perms)
    assert seen == [None, first]  # each time the old content was still the visible one


def test_group_ownership(tmp_path: Path) -> None:
    gid = 4321
    atomic.write(
        tmp_path,
        {"f": FileProjection(b"x", 0o400), "d/g": FileProjection(b"y", 0o600)},
        set_perms=lambda root: atomic.set_group_ownership(root, gid),
    )
    data = tmp_path / os.readlink(tmp_path / "..data")
    assert os.stat(data / "f").st_gid == gid
    assert stat.S_IMODE(os.stat(data / "f").st_mode) == 0o440
    assert stat.S_IMODE(os.stat(data / "d" / "g").st_mode) == 0o640
    dir_mode = os.stat(data / "d").st_mode
    assert dir_mode & stat.S_ISGID and stat.S_IMODE(dir_mode) & 0o050 == 0o050
    assert os.lstat(tmp_path / "f").st_gid == gid  # the link itself too


def test_file_owner(tmp_path: Path) -> None:
    atomic.write(tmp_path, {"token": FileProjection(b"t", 0o600, fs_user=1234)})
    assert os.stat(tmp_path / "token").st_uid == 1234


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("", "invalid path: must not be empty: ''"),
        ("/abs", "invalid path: must be relative path: /abs"),
        ("a/../b", "invalid path: must not contain '..': a/../b"),
        ("..data", "invalid path: must not start with '..': ..data"),
        ("x" * 256, "invalid path: filenames must be less than or equal to 255 characters"),
        ("a/" * 2100, "invalid path: must be less than or equal to 4096 characters"),
    ],
)
def test_invalid_paths(tmp_path: Path, path: str, message: str) -> None:
    with pytest.raises(PayloadError) as err:
        atomic.write(tmp_path, {path: FileProjection(b"", 0o644)})
    assert str(err.value) == message
    assert os.listdir(tmp_path) == []  # nothing written


def test_paths_are_normalised(tmp_path: Path) -> None:
    atomic.write(tmp_path, {"a//b/./c": FileProjection(b"1", 0o644)})
    assert (tmp_path / "a" / "b" / "c").read_text() == "1"
