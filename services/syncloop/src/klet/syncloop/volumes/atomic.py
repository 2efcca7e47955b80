"""Writes a set of files into a volume so that a reader never sees half an update.

The layout is upstream's AtomicWriter, which applications rely on (they watch `..data`
with inotify to learn of an update):

    <volume>/..2025_01_31_12_00_00.123456789/   the payload (a fresh directory per update)
    <volume>/..data -> ..2025_01_31_12_00_00.123456789
    <volume>/key    -> ..data/key                one link per top-level path of the payload
    <volume>/dir    -> ..data/dir                (a nested path is reached through its top)

An update writes the new payload into a new timestamped directory, points a new link
`..data_tmp` at it and renames that link over `..data`: one rename(2), so every path
of the volume switches from the old content to the new at once. Then the top-level
links of paths that are gone are removed, and so are the old payload directories.
When the payload on disk already has the same content nothing is written at all
(only missing top-level links are put back), so a sync that finds the object
unchanged does not touch the volume, and inotify watchers see no event.

The functions here block (file I/O); callers run them with `asyncio.to_thread`.
Paths are validated as upstream does: relative, no `..` element, not starting with
`..` (those names belong to the writer), names of at most 255 and paths of at most 4096
characters.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from klet.syncloop.volumes import ownership

DATA_DIR = "..data"
NEW_DATA_DIR = "..data_tmp"
MAX_FILE_NAME = 255
MAX_PATH = 4096


@dataclass(frozen=True)
class FileProjection:
    """One file of a payload: its bytes, permission bits and, when set, its owner."""

    data: bytes
    mode: int
    fs_user: int | None = None


class PayloadError(ValueError):
    """A payload path is not acceptable; the message is upstream's."""


def validate_path(path: str) -> None:
    if path == "":
        raise PayloadError(f"invalid path: must not be empty: {path!r}")
    if path.startswith("/"):
        raise PayloadError(f"invalid path: must be relative path: {path}")
    if len(path) > MAX_PATH:
        raise PayloadError(f"invalid path: must be less than or equal to {MAX_PATH} characters")
    items = path.split("/")
    for item in items:
        if item == "..":
            raise PayloadError(f"invalid path: must not contain '..': {path}")
        if len(item) > MAX_FILE_NAME:
            raise PayloadError(
                f"invalid path: filenames must be less than or equal to {MAX_FILE_NAME} characters"
            )
    if items[0].startswith("..") and len(items[0]) > 2:
        raise PayloadError(f"invalid path: must not start with '..': {path}")


def clean_payload(payload: Mapping[str, FileProjection]) -> dict[str, FileProjection]:
    """The payload with validated, normalised paths (`a//b/./c` → `a/b/c`)."""
    out: dict[str, FileProjection] = {}
    for path, projection in payload.items():
        validate_path(path)
        out[os.path.normpath(path)] = projection
    return out


def _timestamp_prefix(now: datetime) -> str:
    return now.astimezone(UTC).strftime("..%Y_%m_%d_%H_%M_%S.")


def current_data_dir(target: Path) -> Path | None:
    """The payload directory `..data` points at, or None before the first write."""
    try:
        name = os.readlink(target / DATA_DIR)
    except (FileNotFoundError, OSError):
        return None
    return target / name


def _paths_in(directory: Path) -> set[str]:
    """Every file and directory below `directory`, relative to it."""
    found: set[str] = set()
    for root, dirs, files in os.walk(directory):
        rel = os.path.relpath(root, directory)
        for name in dirs + files:
            found.add(name if rel == "." else f"{rel}/{name}")
    return found


def _with_parents(paths: Mapping[str, FileProjection]) -> set[str]:
    out: set[str] = set()
    for path in paths:
        while path:
            out.add(path)
            path = os.path.dirname(path)
    return out


def _unchanged(payload: Mapping[str, FileProjection], data_dir: Path) -> bool:
    for path, projection in payload.items():
        try:
            if (data_dir / path).read_bytes() != projection.data:
                return False
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return False
    return True


def _write_payload(payload: Mapping[str, FileProjection], directory: Path) -> None:
    for path, projection in payload.items():
        full = directory / path
        full.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, projection.data)
        finally:
            os.close(fd)
        os.chmod(full, projection.mode & 0o7777)  # whatever the umask
        if projection.fs_user is not None:
            os.chown(full, projection.fs_user, -1)


def _link_top_level(target: Path, payload: Mapping[str, FileProjection]) -> None:
    for top in {path.split("/", 1)[0] for path in payload}:
        link = target / top
        if not link.is_symlink():
            os.symlink(f"{DATA_DIR}/{top}", link)


def write(
    target: Path,
    payload: Mapping[str, FileProjection],
    *,
    set_perms: Callable[[Path], None] | None = None,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> bool:
    """Make `target` (an existing directory) hold exactly `payload`; True if written.

    `set_perms`, when given, runs on `target` after the new payload directory is
    filled and before it becomes visible (upstream applies the pod's fsGroup there).
    Raises `PayloadError` for an invalid path and `OSError` when the disk refuses.
    """
    payload = clean_payload(payload)
    old = current_data_dir(target)
    remove: set[str] = set()
    if old is not None:
        remove = _paths_in(old) - _with_parents(payload) if old.is_dir() else set()
        if old.is_dir() and not remove and _unchanged(payload, old):
            _link_top_level(target, payload)
            return False
    new = Path(tempfile.mkdtemp(prefix=_timestamp_prefix(now()), dir=target))
    try:
        os.chmod(new, 0o755)  # group and others must be able to traverse it
        _write_payload(payload, new)
        if set_perms is not None:
            set_perms(target)
        _link_top_level(target, payload)
        tmp_link = target / NEW_DATA_DIR
        if tmp_link.is_symlink() or tmp_link.exists():
            tmp_link.unlink()  # left by an interrupted write
        os.symlink(new.name, tmp_link)
        os.rename(tmp_link, target / DATA_DIR)
    except BaseException:
        shutil.rmtree(new, ignore_errors=True)
        raise
    for path in remove:
        if "/" not in path:  # only the top-level links live outside the payload dirs
            (target / path).unlink(missing_ok=True)
    _remove_stale_payloads(target, keep=new.name)
    return True


def _remove_stale_payloads(target: Path, *, keep: str) -> None:
    """Remove every payload directory but `keep` (the previous one, and any left behind
    by a write that was interrupted before its swap)."""
    for entry in os.scandir(target):
        if (
            entry.name.startswith("..")
            and entry.name not in (DATA_DIR, NEW_DATA_DIR, keep)
            and entry.is_dir(follow_symlinks=False)
        ):
            shutil.rmtree(entry.path, ignore_errors=True)


def set_group_ownership(root: Path, gid: int) -> None:
    """Give everything under `root` to group `gid`, readable by it, as upstream's
    SetVolumeOwnership does for a read-only volume (`ownership.set_volume_ownership`:
    through descriptors, never following a link)."""
    ownership.set_volume_ownership(root, gid, read_only=True)
