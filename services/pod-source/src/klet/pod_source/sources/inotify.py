"""A minimal inotify binding (ctypes on libc) that wakes an asyncio loop.

Only the file source uses it, and only as an accelerator: the directory is still listed
every fileCheckFrequency, so a missed or unavailable notification costs latency, never
correctness. That is why the binding is this small (no event objects, no per-file
watches) and why it prefers ctypes over a new dependency.

Watched events are the ones that mean "a file's final content is in place or gone":
close-after-write, renames in and out, deletes, attribute changes, and the watched
directory itself being deleted or moved. Plain creation and modification are left out
on purpose: they fire while a writer is still writing, and reading then would report a
half-written manifest as broken. A symlink created in place (no close-write) is picked
up by the next poll.

The kernel drops a watch when its directory goes away (IN_IGNORED); `watch()` is then
called again by the source at each poll until the directory is back.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import errno
import logging
import os
import struct
from pathlib import Path

log = logging.getLogger(__name__)

IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

WATCH_MASK = (
    IN_CLOSE_WRITE
    | IN_MOVED_TO
    | IN_MOVED_FROM
    | IN_DELETE
    | IN_ATTRIB
    | IN_DELETE_SELF
    | IN_MOVE_SELF
    | IN_ONLYDIR
)

_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (then len bytes of name)


class InotifyUnavailable(OSError):
    """This platform or process cannot use inotify (not Linux, no libc, limits hit)."""


def _libc() -> ctypes.CDLL:
    name = ctypes.util.find_library("c") or "libc.so.6"
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        libc.inotify_init1.argtypes = [ctypes.c_int]
        libc.inotify_init1.restype = ctypes.c_int
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        libc.inotify_add_watch.restype = ctypes.c_int
    except (OSError, AttributeError) as err:
        raise InotifyUnavailable(f"no inotify in {name}: {err}") from err
    return libc


class DirWatcher:
    """One inotify instance watching one directory, setting an event on any change."""

    def __init__(self) -> None:
        self._libc = _libc()
        fd = self._libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            code = ctypes.get_errno()
            raise InotifyUnavailable(code, f"inotify_init1: {os.strerror(code)}")
        self._fd = fd
        self._wd: int | None = None
        self._dir: Path | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.changed = asyncio.Event()

    @property
    def watching(self) -> bool:
        return self._wd is not None

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        loop.add_reader(self._fd, self._on_readable)

    def watch(self, directory: Path) -> bool:
        """Watch `directory` (again); False if it does not exist (yet)."""
        if self._wd is not None and self._dir == directory:
            return True
        wd = self._libc.inotify_add_watch(self._fd, os.fsencode(directory), WATCH_MASK)
        if wd < 0:
            code = ctypes.get_errno()
            if code in (errno.ENOENT, errno.ENOTDIR):
                return False
            if code == errno.ENOSPC:
                raise InotifyUnavailable(
                    code, "inotify watch limit reached (fs.inotify.max_user_watches)"
                )
            raise InotifyUnavailable(code, f"inotify_add_watch {directory}: {os.strerror(code)}")
        self._wd, self._dir = wd, directory
        return True

    def close(self) -> None:
        if self._loop is not None:
            self._loop.remove_reader(self._fd)
            self._loop = None
        os.close(self._fd)

    def _on_readable(self) -> None:
        while True:
            try:
                data = os.read(self._fd, 64 * 1024)
            except BlockingIOError:
                break
            except OSError as err:
                log.debug("inotify read failed", extra={"error": str(err)})
                break
            if not data:
                break
            self._parse(data)
        self.changed.set()

    def _parse(self, data: bytes) -> None:
        offset = 0
        while offset + _EVENT.size <= len(data):
            wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
            offset += _EVENT.size + length
            if mask & IN_IGNORED and wd == self._wd:
                # The directory is gone (deleted, unmounted); re-added by the next poll.
                self._wd = None
