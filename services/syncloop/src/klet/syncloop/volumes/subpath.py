"""subPath mounts that a container sharing the volume cannot redirect (CVE-2021-25741).

A volumeMount's `subPath` names something inside a volume that other containers of the
pod may write to. Checking the path (even with `realpath`) and then handing the path
string to the runtime leaves a window: between the check and the runtime's own mount a
container can replace a directory of the path with a symlink to `/`, and the runtime,
following it, mounts the node's root into the container. So, as upstream does, the
path string never leaves this module:

1. symlinks in the subPath are resolved once (`realpath`) and the result must lie inside
   the volume; symlinks that stay inside (a ConfigMap volume's `..data` links) are fine;
2. the resolved path is opened from a descriptor of the volume root without following
   any symlink and without `..` (`openat2` with RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS on a
   kernel that has it, else one `openat(O_NOFOLLOW)` per component), so a swap after
   step 1 makes the open fail instead of leaving the volume;
3. the opened descriptor itself (`/proc/self/fd/N`) is bind-mounted onto a per-pod,
   per-container, per-mount target `<pod dir>/volume-subpaths/<volume>/<container>/<i>`
   that only root can reach, and that target is what the runtime mounts.

A missing subPath is created the same way, one directory at a time from the volume
root's descriptor with `mkdirat` and no symlink followed, each with the volume root's
mode (upstream's SafeMakeDir). Before a container's mounts are made, whatever an
earlier instance of that container left under `volume-subpaths` is unmounted and
removed; the pod's tear-down unmounts the rest (`VolumeManager.tear_down`).

Mounting is behind the small `Binder` protocol so the walk and the target layout are
unit-tested without touching the node's mount table; `KernelBinder` calls mount(2) and
umount2(2) directly (the mount(8) command would canonicalise the /proc magic link back
into a path string and reopen the window).
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from pathlib import Path
from typing import Protocol

SUBPATHS_DIR = "volume-subpaths"
DIR_MODE = 0o750
"""Mode of the directories under `volume-subpaths` (root only, like the pod directory)."""

_SYS_OPENAT2 = 437  # the same number on every Linux architecture
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_BENEATH = 0x08
_MS_BIND = 4096
_MNT_DETACH = 2
_MAX_STACKED = 64
"""How many mounts stacked on one target are taken off before giving up."""

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_openat2_missing = False


class SubPathError(Exception):
    """The subPath cannot be mounted safely; the text says which part and why."""


class Binder(Protocol):
    """Puts a bind mount of an open descriptor on a target and takes mounts off it."""

    def bind(self, fd: int, target: Path) -> None: ...

    def unmount_all(self, target: Path) -> None: ...


class _OpenHow(ctypes.Structure):
    _fields_ = (
        ("flags", ctypes.c_uint64),
        ("mode", ctypes.c_uint64),
        ("resolve", ctypes.c_uint64),
    )


def components(rel: str) -> list[str]:
    """The elements of a relative path; refuses an absolute path and `..`."""
    if rel.startswith("/"):
        raise SubPathError(f"{rel!r} is an absolute path")
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise SubPathError(f"{rel!r} contains '..'")
    return parts


def _openat2(base_fd: int, rel: str, flags: int) -> int | None:
    """openat2 confined beneath `base_fd` with no symlinks; None where the kernel (or a
    seccomp filter) does not offer it."""
    global _openat2_missing
    if _openat2_missing:
        return None
    how = _OpenHow(
        flags=flags,
        mode=0,
        resolve=_RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS,
    )
    fd = _libc.syscall(
        ctypes.c_long(_SYS_OPENAT2),
        ctypes.c_int(base_fd),
        ctypes.c_char_p(os.fsencode(rel)),
        ctypes.byref(how),
        ctypes.c_size_t(ctypes.sizeof(how)),
    )
    if fd >= 0:
        return int(fd)
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EPERM):
        _openat2_missing = True
        return None
    raise OSError(err, os.strerror(err), rel)


def _walk(base_fd: int, parts: list[str], flags: int) -> int:
    """openat one element at a time, never following a symlink."""
    fd = os.dup(base_fd)
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            how = flags if last else os.O_PATH | os.O_DIRECTORY
            nxt = os.open(part, how | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_beneath(base_fd: int, rel: str, *, use_openat2: bool = True) -> int:
    """An O_PATH descriptor of `rel` below the directory `base_fd`, reached without
    following any symlink (not even a final one) and without `..`.

    Raises SubPathError when something on the way is a symlink or not a directory,
    FileNotFoundError when an element is missing."""
    parts = components(rel)
    flags = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = _openat2(base_fd, "/".join(parts) or ".", flags) if use_openat2 else None
        if fd is None:
            fd = _walk(base_fd, parts, flags)
    except FileNotFoundError:
        raise
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR, errno.EXDEV):
            raise SubPathError(f"{rel!r} goes through a symlink or a non-directory") from err
        raise
    if stat.S_ISLNK(os.fstat(fd).st_mode):  # a final symlink is opened as itself
        os.close(fd)
        raise SubPathError(f"{rel!r} is a symlink")
    return fd


def make_dirs_beneath(base_fd: int, rel: str, *, mode: int) -> None:
    """Create the missing directories of `rel` below `base_fd`, one at a time with
    `mkdirat`, never following a symlink; each new directory gets `mode` exactly."""
    fd = os.dup(base_fd)
    try:
        for part in components(rel):
            try:
                os.mkdir(part, mode, dir_fd=fd)
                made = True
            except FileExistsError:
                made = False
            try:
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as err:
                if err.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise SubPathError(f"{part!r} in {rel!r} is a symlink or a file") from err
                raise
            os.close(fd)
            fd = nxt
            if made:
                os.fchmod(fd, mode)  # mkdir is subject to the umask
    finally:
        os.close(fd)


def resolve_inside(base: str, sub_path: str) -> str:
    """`sub_path` with its symlinks resolved, relative to the (resolved) volume `base`;
    refuses a result outside the volume. What does not exist yet stays as written."""
    components(sub_path)
    resolved = os.path.realpath(os.path.join(base, sub_path))
    if resolved != base and not resolved.startswith(base.rstrip("/") + "/"):
        raise SubPathError(f"{sub_path!r} resolves to {resolved}, outside the volume")
    return os.path.relpath(resolved, base)


def _check_name(kind: str, name: str) -> str:
    if not name or "/" in name or name in (".", ".."):
        raise SubPathError(f"invalid {kind} name {name!r} for a subPath mount")
    return name


class SubPathMounter:
    """The subPath bind mounts of one pod, under `<pod dir>/volume-subpaths`."""

    def __init__(self, pod_dir: Path, binder: Binder, *, use_openat2: bool = True) -> None:
        self.root = pod_dir / SUBPATHS_DIR
        self.binder = binder
        self.use_openat2 = use_openat2

    def target(self, *, volume: str, container: str, index: int) -> Path:
        """Where the subPath of the container's `index`-th volumeMount is bind-mounted."""
        return (
            self.root
            / _check_name("volume", volume)
            / _check_name("container", container)
            / str(index)
        )

    def clear(self, container: str) -> None:
        """Unmount and remove what earlier instances of `container` left; raises
        SubPathError when something stays mounted (nothing below it is deleted)."""
        _check_name("container", container)
        try:
            volumes = list(os.scandir(self.root))
        except (FileNotFoundError, NotADirectoryError):  # no subPath was ever mounted
            return
        for vol in volumes:
            cdir = Path(vol.path) / container
            if not cdir.is_dir() or cdir.is_symlink():
                continue
            with os.scandir(cdir) as entries:
                paths = [Path(e.path) for e in entries]
            for path in paths:
                self._remove_target(path)
            cdir.rmdir()

    def _remove_target(self, path: Path) -> None:
        self.binder.unmount_all(path)
        try:
            if path.is_dir() and not path.is_symlink():
                path.rmdir()  # never recursive: a leftover mount makes this fail
            else:
                path.unlink()
        except FileNotFoundError:
            pass
        except OSError as err:
            raise SubPathError(f"cannot remove {path}: {err.strerror}") from err

    def mount(
        self, volume_path: Path, sub_path: str, *, volume: str, container: str, index: int
    ) -> Path:
        """Bind-mount `sub_path` of the volume (created as a directory when missing)
        onto its target and return the target; raises SubPathError or OSError."""
        target = self.target(volume=volume, container=container, index=index)
        base = os.path.realpath(volume_path)
        base_fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            rel = resolve_inside(base, sub_path)
            try:
                fd = open_beneath(base_fd, rel, use_openat2=self.use_openat2)
            except FileNotFoundError:
                make_dirs_beneath(base_fd, rel, mode=stat.S_IMODE(os.fstat(base_fd).st_mode))
                fd = open_beneath(base_fd, rel, use_openat2=self.use_openat2)
        finally:
            os.close(base_fd)
        try:
            is_dir = stat.S_ISDIR(os.fstat(fd).st_mode)
            self._make_target(target, is_dir=is_dir)
            self.binder.bind(fd, target)
        finally:
            os.close(fd)
        return target

    def _make_target(self, target: Path, *, is_dir: bool) -> None:
        for d in (self.root, target.parent.parent, target.parent):
            try:
                os.mkdir(d, DIR_MODE)
            except FileExistsError:
                pass
        if os.path.lexists(target):
            self._remove_target(target)
        if is_dir:
            os.mkdir(target, DIR_MODE)
        else:
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o640))


class KernelBinder:
    """mount(2)/umount2(2) on the node's mount table (syncloop runs as root)."""

    def bind(self, fd: int, target: Path) -> None:
        # The kernel follows the /proc magic link to the very file the descriptor holds.
        source = f"/proc/self/fd/{fd}".encode()
        if _libc.mount(source, os.fsencode(target), None, ctypes.c_ulong(_MS_BIND), None) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"bind mount failed: {os.strerror(err)}", str(target))

    def unmount_all(self, target: Path) -> None:
        for _ in range(_MAX_STACKED):
            if _libc.umount2(os.fsencode(target), ctypes.c_int(_MNT_DETACH)) == 0:
                continue
            err = ctypes.get_errno()
            if err in (errno.EINVAL, errno.ENOENT):  # not (or no longer) a mount point
                return
            raise SubPathError(f"cannot unmount {target}: {os.strerror(err)}")
        raise SubPathError(f"cannot unmount {target}: more than {_MAX_STACKED} mounts on it")
