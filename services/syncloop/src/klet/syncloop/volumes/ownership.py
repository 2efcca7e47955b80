"""A pod's fsGroup applied to every file of a volume, without following what a pod planted.

Upstream's SetVolumeOwnership walks the volume, `lstat`s each entry, `lchown`s it and
then `chmod`s it by name. The pod can write into the volume while the walk runs, so an
entry that was a file at the `lstat` may be a symbolic link by the `chmod`, and `chmod`
follows links: syncloop runs as root in the host's PID namespace, so a link to
`/proc/1/root/etc/shadow` would make the host's file group-readable. Here every entry is
opened relative to its parent directory's descriptor with `O_NOFOLLOW` and changed
through that descriptor, so what is changed is the inode the walk looked at, wherever a
link swapped in afterwards points:

- each entry is opened `O_PATH|O_NOFOLLOW` (nothing is read, a device is not opened)
  and its type taken from that descriptor (`fstat`);
- a directory is then opened for reading through `/proc/self/fd/<n>`, which names the
  descriptor's own inode (no path is looked up again), changed with `fchown`/`fchmod`
  and listed through that descriptor, so the walk never leaves the volume through a
  link swapped in for a directory;
- a symbolic link gets the group only, by `fchownat(..., AT_SYMLINK_NOFOLLOW)` on its
  parent's descriptor (a link's mode means nothing, and a chmod would reach its
  target);
- anything else is changed through `/proc/self/fd/<n>` (the way glibc changes a file it
  holds only an `O_PATH` descriptor of).

The modes are upstream's: group read (read-only) or read-write on top of each mode,
directories also group search and the set-group-ID bit, so new files inherit the
group. Unlike upstream, a file never keeps its set-user-ID or set-group-ID bit: the
kernel clears them when it changes an executable's group, and upstream puts them back
from the mode it read before (a pod user's set-group-ID program would come out
set-group-ID to the fsGroup). Directories are changed after their contents, as
upstream's walk does, so the root (which `fsGroupChangePolicy: OnRootMismatch` checks)
is changed last. An entry removed while the walk runs is passed over.

The functions here block; callers run them with `asyncio.to_thread`.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

READ_WRITE = 0o660
READ_ONLY = 0o440
SEARCH = 0o110
SET_ID = stat.S_ISUID | stat.S_ISGID

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


def new_mode(mode: int, *, is_dir: bool, read_only: bool) -> int:
    """The permission bits an entry of mode `mode` gets: the group's access added, a
    directory's set-group-ID bit set, a file's set-user-ID and set-group-ID bits
    dropped."""
    bits = stat.S_IMODE(mode) | (READ_ONLY if read_only else READ_WRITE)
    if is_dir:
        return (bits | SEARCH | stat.S_ISGID) & ~stat.S_ISUID
    return bits & ~SET_ID


def set_volume_ownership(root: Path, gid: int, *, read_only: bool) -> None:
    """Give `root` and everything below it the group `gid` (see the module docstring).

    Raises OSError when `root` is not a directory (a symbolic link included) or an
    entry cannot be changed."""
    top = os.open(root, _DIR_FLAGS)
    # each frame: a directory's descriptor and the names in it still to visit
    stack: list[tuple[int, list[str]]] = []
    try:
        stack.append((top, os.listdir(top)))
    except BaseException:
        os.close(top)
        raise
    try:
        while stack:
            fd, names = stack[-1]
            if names:
                child = _visit(names.pop(), fd, gid, read_only=read_only)
                if child is not None:
                    stack.append(child)
                continue
            stack.pop()
            try:
                os.fchown(fd, -1, gid)
                os.fchmod(fd, new_mode(os.fstat(fd).st_mode, is_dir=True, read_only=read_only))
            finally:
                os.close(fd)
    finally:
        for fd, _ in stack:
            os.close(fd)


def _visit(name: str, parent: int, gid: int, *, read_only: bool) -> tuple[int, list[str]] | None:
    """Change entry `name` of directory `parent`; for a directory, return its open
    descriptor and listing instead (it is changed once its contents are)."""
    try:
        fd = os.open(name, _PATH_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        return None
    try:
        info = os.fstat(fd)
        inode = f"/proc/self/fd/{fd}"
        if stat.S_ISDIR(info.st_mode):
            # the same inode, opened for reading: no path is looked up again
            directory = os.open(inode, _DIR_FLAGS & ~os.O_NOFOLLOW)
            try:
                return directory, os.listdir(directory)
            except BaseException:
                os.close(directory)
                raise
        if stat.S_ISLNK(info.st_mode):
            try:
                os.chown(name, -1, gid, dir_fd=parent, follow_symlinks=False)
            except FileNotFoundError:
                pass
            return None
        os.chown(inode, -1, gid)
        os.chmod(inode, new_mode(info.st_mode, is_dir=False, read_only=read_only))
        return None
    finally:
        os.close(fd)
