"""The fsGroup walk (`klet.syncloop.volumes.ownership`): group and modes as upstream's
SetVolumeOwnership gives them, nothing outside the volume changed through a symbolic
link (one already there, or one a pod swaps in for a file or a directory while the walk
runs), and no file left set-user-ID or set-group-ID. Used by configMap/secret/projected
payloads (`atomic.set_group_ownership`) and CSI volumes (`csi.set_ownership`)."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from klet.syncloop.volumes import atomic, csi, ownership

GID = 4321

Walk = Callable[[Path], None]

WALKS: dict[str, Walk] = {
    "ownership-rw": lambda root: ownership.set_volume_ownership(root, GID, read_only=False),
    "ownership-ro": lambda root: ownership.set_volume_ownership(root, GID, read_only=True),
    "atomic": lambda root: atomic.set_group_ownership(root, GID),
    "csi": lambda root: csi.set_ownership(root, GID, read_only=False, on_root_mismatch=False),
}


@pytest.fixture(params=sorted(WALKS))
def walk(request: pytest.FixtureRequest) -> Walk:
    return WALKS[request.param]


@pytest.fixture
def outside(tmp_path: Path) -> Iterator[Path]:
    """A host file beside the volume, root's and private: the walk must leave it so."""
    path = tmp_path / "host" / "shadow"
    path.parent.mkdir()
    path.write_text("secret")
    os.chown(path, 0, 0)
    os.chmod(path, 0o600)
    yield path
    assert path.read_text() == "secret"


def host_state(path: Path) -> tuple[int, int]:
    info = os.stat(path)
    return info.st_gid, stat.S_IMODE(info.st_mode)


def test_modes_and_group(tmp_path: Path) -> None:
    vol = tmp_path / "vol"
    (vol / "d").mkdir(parents=True, mode=0o700)
    (vol / "d" / "f").write_text("x")
    os.chmod(vol / "d" / "f", 0o600)
    os.chmod(vol, 0o750)
    ownership.set_volume_ownership(vol, GID, read_only=False)
    assert host_state(vol) == (GID, 0o2770)
    assert host_state(vol / "d") == (GID, 0o2770)
    assert host_state(vol / "d" / "f") == (GID, 0o660)
    os.chmod(vol / "d" / "f", 0o600)
    ownership.set_volume_ownership(vol, GID, read_only=True)
    assert host_state(vol / "d" / "f") == (GID, 0o640)


def test_a_link_in_the_volume_is_regrouped_and_its_target_left_alone(
    tmp_path: Path, outside: Path, walk: Walk
) -> None:
    vol = tmp_path / "vol"
    vol.mkdir()
    (vol / "file-link").symlink_to(outside)
    (vol / "dir-link").symlink_to(outside.parent)
    walk(vol)
    assert host_state(outside) == (0, 0o600)
    assert host_state(outside.parent)[0] == 0
    assert os.lstat(vol / "file-link").st_gid == GID
    assert os.lstat(vol / "dir-link").st_gid == GID


Arm = Callable[..., None]


@pytest.fixture
def swap_on_first_change(monkeypatch: pytest.MonkeyPatch) -> Arm:
    """`arm(victim, target, when=path)`: replace `victim` by a symbolic link to `target`
    the moment the walk first changes the group of `when` (default: `victim`), by name
    or by descriptor: after the walk has looked at it and before it sets its mode, the
    window a pod writing into its volume can hit."""
    armed: dict[str, Path] = {}

    def resolve(what: int | str | os.PathLike[str], dir_fd: int | None) -> str:
        if isinstance(what, int):
            return os.readlink(f"/proc/self/fd/{what}")
        text = os.fspath(what)
        if text.startswith("/proc/self/fd/"):
            return os.readlink(text)
        if dir_fd is not None:
            return os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), text)
        return text

    def swap(what: int | str | os.PathLike[str], dir_fd: int | None = None) -> None:
        if "victim" in armed and resolve(what, dir_fd) == str(armed["when"]):
            victim, target = armed.pop("victim"), armed.pop("target")
            if victim.is_dir() and not victim.is_symlink():
                victim.rename(victim.with_name(victim.name + ".moved"))
            else:
                victim.unlink()
            victim.symlink_to(target)

    real_chown, real_lchown, real_fchown = os.chown, os.lchown, os.fchown

    def chown(path: str, uid: int, gid: int, **kw: object) -> None:
        swap(path, kw.get("dir_fd"))  # type: ignore[arg-type]
        real_chown(path, uid, gid, **kw)  # type: ignore[arg-type]

    def lchown(path: str, uid: int, gid: int) -> None:
        swap(path)
        real_lchown(path, uid, gid)

    def fchown(fd: int, uid: int, gid: int) -> None:
        swap(fd)
        real_fchown(fd, uid, gid)

    monkeypatch.setattr(os, "chown", chown)
    monkeypatch.setattr(os, "lchown", lchown)
    monkeypatch.setattr(os, "fchown", fchown)

    def arm(victim: Path, target: Path, *, when: Path | None = None) -> None:
        armed.update(victim=victim, target=target, when=when or victim)

    return arm


def test_a_file_swapped_for_a_link_mid_walk_leaves_the_target_alone(
    tmp_path: Path,
    outside: Path,
    walk: Walk,
    swap_on_first_change: Arm,
) -> None:
    vol = tmp_path / "vol"
    vol.mkdir()
    (vol / "f").write_text("x")
    os.chmod(vol / "f", 0o600)
    swap_on_first_change(vol / "f", outside)
    walk(vol)
    assert (vol / "f").is_symlink()  # the swap happened
    assert host_state(outside) == (0, 0o600)


def test_a_directory_swapped_for_a_link_mid_walk_is_not_walked_into(
    tmp_path: Path, walk: Walk, swap_on_first_change: Arm
) -> None:
    host = tmp_path / "host"
    host.mkdir()
    (host / "f").write_text("host")
    os.chmod(host / "f", 0o600)
    vol = tmp_path / "vol"
    (vol / "d").mkdir(parents=True)
    (vol / "d" / "f").write_text("x")
    os.chmod(vol / "d" / "f", 0o600)
    # while the walk is inside d, d becomes a link to the host's directory
    swap_on_first_change(vol / "d", host, when=vol / "d" / "f")
    walk(vol)
    assert (vol / "d").is_symlink()
    assert host_state(host / "f") == (0, 0o600)
    assert host_state(host)[0] == 0


def test_set_id_bits_are_dropped_from_files_kept_on_directories(tmp_path: Path) -> None:
    vol = tmp_path / "vol"
    (vol / "d").mkdir(parents=True)
    for name, mode in (("suid", 0o4755), ("sgid", 0o2755), ("sticky", 0o1644)):
        (vol / name).write_text("#!/bin/sh\n")
        os.chmod(vol / name, mode)
    ownership.set_volume_ownership(vol, GID, read_only=False)
    assert host_state(vol / "suid") == (GID, 0o775)
    assert host_state(vol / "sgid") == (GID, 0o775)
    assert host_state(vol / "sticky") == (GID, 0o1664)
    assert host_state(vol / "d") == (GID, 0o2775)


def test_special_files_are_changed_without_being_opened(tmp_path: Path) -> None:
    vol = tmp_path / "vol"
    vol.mkdir()
    os.mkfifo(vol / "fifo", 0o600)  # opening it for reading would block
    ownership.set_volume_ownership(vol, GID, read_only=False)
    assert host_state(vol / "fifo") == (GID, 0o660)


def test_the_root_must_be_a_directory_not_a_link(tmp_path: Path, outside: Path) -> None:
    (tmp_path / "vol").symlink_to(outside.parent)
    with pytest.raises(OSError):
        ownership.set_volume_ownership(tmp_path / "vol", GID, read_only=False)
    assert host_state(outside.parent)[0] == 0


def test_new_mode() -> None:
    assert ownership.new_mode(0o100600, is_dir=False, read_only=True) == 0o640
    assert ownership.new_mode(0o106755, is_dir=False, read_only=False) == 0o775
    assert ownership.new_mode(0o40700, is_dir=True, read_only=True) == 0o2750
    assert ownership.new_mode(0o44700, is_dir=True, read_only=False) == 0o2770
