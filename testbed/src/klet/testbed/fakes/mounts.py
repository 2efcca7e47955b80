"""A stateful fake of a volume plugin's mounter (klet.syncloop.volumes.nfs.Mounter) for
unit tests: a mount table by path, a call log, and an error to raise at the next mount
or unmount.

Like the kernel's table, a path is a mount point after a successful mount until it is
unmounted; unmounting what is not mounted fails as umount does. The mount point's
directory must exist (mount(8) refuses a missing one). It serves unit tests only: the
real mounts need a kernel with the filesystem (NFS cannot be mounted on the test VM).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path


class FakeMountError(Exception):
    """Raised by the fake for a mount on a missing directory or an unmount of nothing;
    tests inject the plugin's own error type through `fail_next` instead."""


@dataclass(frozen=True)
class FakeMount:
    source: str
    fs_type: str
    options: tuple[str, ...]


class FakeMounter:
    def __init__(self) -> None:
        self.table: dict[Path, FakeMount] = {}
        self.calls: list[tuple[str, ...]] = []
        self.fail_next: Exception | None = None
        self.mounted_despite_failure = False
        """When set, a failed mount still leaves its mount in the table (a helper that
        mounted and then failed), which the plugin must undo."""

    def is_mount_point(self, path: Path) -> bool:
        return path in self.table

    async def mount(
        self, source: str, path: Path, *, fs_type: str, options: tuple[str, ...]
    ) -> None:
        self.calls.append(("mount", source, str(path), fs_type, ",".join(options)))
        if not await asyncio.to_thread(path.is_dir):
            raise FakeMountError(f"mount point {path} does not exist")
        if self.fail_next is not None:
            err, self.fail_next = self.fail_next, None
            if self.mounted_despite_failure:
                self.table[path] = FakeMount(source, fs_type, options)
            raise err
        self.table[path] = FakeMount(source, fs_type, options)

    async def unmount(self, path: Path) -> None:
        self.calls.append(("unmount", str(path)))
        if self.fail_next is not None:
            err, self.fail_next = self.fail_next, None
            raise err
        if path not in self.table:
            raise FakeMountError(f"umount: {path}: not mounted")
        del self.table[path]
