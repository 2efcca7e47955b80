"""The image filesystem's size, as image GC measures it: CRI ImageFsInfo names the
filesystem (its mount point), statfs of that mount point gives capacity and available
bytes, as upstream's stats provider does for ImageFsStats.

Trade-off: statfs counts everything on that filesystem, not only images; that is what
the thresholds are about (a full disk), and what upstream measures too.

The mount point is a host path; image-gc in a pod that does not mount it reads it
through the host's root (`klet.stats.host.host_view`), as the stats provider does.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

from klet.cri.errors import CRIError
from klet.cri.types import FilesystemUsageInfo
from klet.image_gc.imageselect import FsUsage
from klet.stats.host import HOST_ROOT, host_view

ImageFsInfo = Callable[[], Awaitable[tuple[list[FilesystemUsageInfo], list[FilesystemUsageInfo]]]]


def statfs_usage(path: str, *, host_root: Path = HOST_ROOT) -> FsUsage:
    """Capacity and bytes available to unprivileged users of the filesystem at `path`
    (here, or under the host's root: `host_view`)."""
    st = os.statvfs(host_view(Path(path), host_root=host_root))
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
