"""The image filesystem's size, as image GC measures it: CRI ImageFsInfo names the
filesystem (its mount point), statfs of that mount point gives capacity and available
bytes, as upstream's stats provider does for ImageFsStats.

Trade-off: statfs counts everything on that filesystem, not only images; that is what
the thresholds are about (a full disk), and what upstream measures too.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable

from klet.cri.errors import CRIError
from klet.cri.types import FilesystemUsageInfo
from klet.image_gc.imageselect import FsUsage

ImageFsInfo = Callable[[], Awaitable[tuple[list[FilesystemUsageInfo], list[FilesystemUsageInfo]]]]


def statfs_usage(path: str) -> FsUsage:
    """Capacity and bytes available to unprivileged users of the filesystem at `path`."""
    st = os.statvfs(path)
    return FsUsage(
        capacity=st.f_blocks * st.f_frsize, available=st.f_bavail * st.f_frsize, mountpoint=path
    )


class ImageFs:
    """`usage()` of the filesystem the runtime keeps its images on."""

    def __init__(self, image_fs_info: ImageFsInfo) -> None:
        self._image_fs_info = image_fs_info

    async def usage(self) -> FsUsage:
        image_filesystems, _ = await self._image_fs_info()
        mounts = [f.mountpoint for f in image_filesystems if f.mountpoint]
        if not mounts:
            raise CRIError("ImageFsInfo: the runtime reports no image filesystem")
        return await asyncio.to_thread(statfs_usage, mounts[0])
