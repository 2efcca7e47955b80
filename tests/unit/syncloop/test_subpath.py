"""subPath opening and bind-mount targets without touching the node's mount table.

The walk from the volume root's descriptor (both with openat2 and with the per-element
O_NOFOLLOW fallback) refuses a symlink anywhere on the path, even one pointing inside
the volume, refuses `..` and absolute paths, and opens files and directories; missing
directories are created one element at a time with the volume root's mode and never
through a symlink. `SubPathMounter` resolves in-volume symlinks once (ConfigMap `..data`
links), refuses what resolves outside, and bind-mounts the opened descriptor, not a
path, onto `volume-subpaths/<volume>/<container>/<index>` (a recording binder stands in
for mount(2)); a container's earlier targets are unmounted and removed first, and a
target that stays mounted is never deleted through.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from klet.syncloop.volumes import subpath
from klet.syncloop.volumes.subpath import SubPathError, SubPathMounter


class RecordingBinder:
    """Records what each bind would mount: the file the descriptor holds at bind time."""

    def __init__(self) -> None:
        self.bound: dict[Path, str] = {}
        self.unmounted: list[Path] = []
        self.stuck: set[Path] = set()
        self.on_bind: list[tuple[Path, tuple[int, int]]] = []

    def bind(self, fd: int, target: Path) -> None:
        st = os.fstat(fd)
        self.on_bind.append((target, (st.st_dev, st.st_ino)))
        self.bound[target] = os.readlink(f"/proc/self/fd/{fd}")

    def unmount_all(self, target: Path) -> None:
        if target in self.stuck:
            raise SubPathError(f"cannot unmount {target}: Device or resource busy")
        self.unmounted.append(target)
        self.bound.pop(target, None)


@pytest.fixture(params=[True, False], ids=["openat2", "walk"])
def use_openat2(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


@pytest.fixture
def volume(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    vol = tmp_path / "vol"
    (vol / "a" / "b").mkdir(parents=True)
    (vol / "a" / "file").write_text("x")
    (vol / "a" / "inside").symlink_to(vol / "a" / "b")
    (vol / "root").symlink_to("/")
    (vol / "a" / "up").symlink_to("..")
    fd = os.open(vol, os.O_RDONLY | os.O_DIRECTORY)
    yield vol, fd
    os.close(fd)


def pod_dir(tmp_path: Path) -> Path:
    """The pod directory (the volume manager made it before any container starts)."""
    path = tmp_path / "pod"
    path.mkdir(exist_ok=True)
    return path


def opened(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


def test_open_beneath_opens_directories_and_files(
    volume: tuple[Path, int], use_openat2: bool
) -> None:
    vol, fd = volume
    assert opened(subpath.open_beneath(fd, "a/b", use_openat2=use_openat2)) == str(vol / "a/b")
    assert opened(subpath.open_beneath(fd, "./a//file", use_openat2=use_openat2)) == str(
        vol / "a/file"
    )


@pytest.mark.parametrize(
    "rel",
    ["root", "root/etc", "a/inside", "a/inside/x", "a/up", "a/up/a", "a/file/x"],
)
def test_open_beneath_refuses_any_symlink_or_non_directory_on_the_way(
    volume: tuple[Path, int], use_openat2: bool, rel: str
) -> None:
    _, fd = volume
    with pytest.raises(SubPathError):
        subpath.open_beneath(fd, rel, use_openat2=use_openat2)


@pytest.mark.parametrize(
    ("rel", "why"), [("..", "contains '..'"), ("a/../..", "'..'"), ("/etc", "absolute")]
)
def test_open_beneath_refuses_dotdot_and_absolute(
    volume: tuple[Path, int], use_openat2: bool, rel: str, why: str
) -> None:
    _, fd = volume
    with pytest.raises(SubPathError, match=why):
        subpath.open_beneath(fd, rel, use_openat2=use_openat2)


def test_open_beneath_reports_a_missing_element(
    volume: tuple[Path, int], use_openat2: bool
) -> None:
    _, fd = volume
    with pytest.raises(FileNotFoundError):
        subpath.open_beneath(fd, "a/nope/x", use_openat2=use_openat2)


def test_make_dirs_beneath_creates_with_the_mode_and_not_through_symlinks(
    volume: tuple[Path, int], tmp_path: Path
) -> None:
    vol, fd = volume
    old = os.umask(0o077)
    try:
        subpath.make_dirs_beneath(fd, "a/new/deeper", mode=0o2775)
    finally:
        os.umask(old)
    assert stat.S_IMODE((vol / "a" / "new").stat().st_mode) == 0o2775
    assert stat.S_IMODE((vol / "a" / "new" / "deeper").stat().st_mode) == 0o2775
    assert stat.S_IMODE((vol / "a").stat().st_mode) != 0o2775  # existing ones untouched
    outside = tmp_path / "outside"
    outside.mkdir()
    (vol / "out").symlink_to(outside)
    for rel in ("out/x", "root/tmp/x", "a/inside/x", "a/file/x", "../x"):
        with pytest.raises(SubPathError):
            subpath.make_dirs_beneath(fd, rel, mode=0o755)
    assert list(outside.iterdir()) == []
    assert not (vol / "a" / "b" / "x").exists()


def test_mount_binds_the_opened_directory_onto_the_target(tmp_path: Path) -> None:
    vol = tmp_path / "vol"
    (vol / "real").mkdir(parents=True)
    (vol / "cfg").mkdir()
    (vol / "cfg" / "key").write_text("v")
    (vol / "inside").symlink_to("real")  # a link that stays inside: resolved once, fine
    binder = RecordingBinder()
    m = SubPathMounter(pod_dir(tmp_path), binder)
    target = m.mount(vol, "inside", volume="data", container="app", index=2)
    assert target == tmp_path / "pod" / "volume-subpaths" / "data" / "app" / "2"
    assert target.is_dir() and stat.S_IMODE(target.stat().st_mode) == 0o750
    assert binder.bound[target] == str(vol / "real")
    file_target = m.mount(vol, "cfg/key", volume="data", container="app", index=3)
    assert file_target.is_file() and binder.bound[file_target] == str(vol / "cfg" / "key")


def test_mount_creates_a_missing_subpath_with_the_volume_mode(tmp_path: Path) -> None:
    vol = tmp_path / "vol"
    vol.mkdir()
    os.chmod(vol, 0o777)
    binder = RecordingBinder()
    target = SubPathMounter(pod_dir(tmp_path), binder).mount(
        vol, "x/y", volume="v", container="c", index=0
    )
    assert stat.S_IMODE((vol / "x" / "y").stat().st_mode) == 0o777
    assert binder.bound[target] == str(vol / "x" / "y")


@pytest.mark.parametrize("sub_path", ["escape", "escape/new", "dangling", "root", "up/secret"])
def test_mount_refuses_what_resolves_outside_the_volume(tmp_path: Path, sub_path: str) -> None:
    vol = tmp_path / "vol"
    vol.mkdir()
    outside = tmp_path / "secret"
    outside.mkdir()
    (vol / "escape").symlink_to(outside)
    (vol / "dangling").symlink_to(tmp_path / "nowhere")
    (vol / "root").symlink_to("/")
    (vol / "up").symlink_to("..")
    binder = RecordingBinder()
    with pytest.raises(SubPathError, match="outside the volume"):
        SubPathMounter(pod_dir(tmp_path), binder).mount(
            vol, sub_path, volume="v", container="c", index=0
        )
    assert binder.bound == {} and list(outside.iterdir()) == []
    assert not (tmp_path / "nowhere").exists()


def test_a_swap_after_the_check_is_refused_not_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race of CVE-2021-25741: the directory becomes a symlink to / right after
    symlinks were resolved; the open that follows refuses it."""
    vol = tmp_path / "vol"
    (vol / "d").mkdir(parents=True)
    real_resolve = subpath.resolve_inside

    def resolve_then_swap(base: str, sub_path: str) -> str:
        rel = real_resolve(base, sub_path)
        (vol / "d").rmdir()
        (vol / "d").symlink_to("/")
        return rel

    monkeypatch.setattr(subpath, "resolve_inside", resolve_then_swap)
    binder = RecordingBinder()
    with pytest.raises(SubPathError, match="symlink"):
        SubPathMounter(pod_dir(tmp_path), binder).mount(
            vol, "d", volume="v", container="c", index=0
        )
    assert binder.bound == {}


def test_clear_unmounts_and_removes_only_that_containers_targets(tmp_path: Path) -> None:
    vol = tmp_path / "vol"
    (vol / "d").mkdir(parents=True)
    binder = RecordingBinder()
    m = SubPathMounter(pod_dir(tmp_path), binder)
    mine = [m.mount(vol, "d", volume=v, container="app", index=i) for i, v in enumerate("xy")]
    other = m.mount(vol, "d", volume="x", container="side", index=0)
    m.clear("app")
    assert set(binder.unmounted) == set(mine)
    assert not any(p.exists() for p in mine) and not (m.root / "x" / "app").exists()
    assert other.exists() and other in binder.bound
    # remounting the same target takes the earlier mount off first (no stacking)
    again = m.mount(vol, "d", volume="x", container="side", index=0)
    assert again == other and binder.unmounted[-1] == other


def test_clear_never_deletes_through_a_target_that_stays_mounted(tmp_path: Path) -> None:
    vol = tmp_path / "vol"
    (vol / "d").mkdir(parents=True)
    binder = RecordingBinder()
    m = SubPathMounter(pod_dir(tmp_path), binder)
    target = m.mount(vol, "d", volume="x", container="app", index=0)
    binder.stuck.add(target)
    with pytest.raises(SubPathError, match="Device or resource busy"):
        m.clear("app")
    assert target.is_dir()


@pytest.mark.parametrize(("volume", "container"), [("..", "c"), ("v", "a/b"), ("", "c")])
def test_target_names_are_single_path_elements(tmp_path: Path, volume: str, container: str) -> None:
    with pytest.raises(SubPathError, match="invalid"):
        SubPathMounter(tmp_path, RecordingBinder()).target(
            volume=volume, container=container, index=0
        )
