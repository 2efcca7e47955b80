"""emptyDir: a directory that lives as long as the pod, shared by its containers.

On disk it is a plain directory under the pod's directory (mode 0777, plus the sticky
bit when `stickyBit` asks for it, as upstream). `medium: Memory` mounts a tmpfs there
whose size is the smallest of the node's memory, the pod's memory limit (when every
container declares one, as the pod cgroup has it) and the volume's `sizeLimit`:
upstream's rule, so a memory volume can never hold more than the pod may use. HugePages
media are not supported and fail the mount with a clear message.

With a pod `fsGroup`, the fresh directory gets that group and the setgid bit so files
the containers create inherit the group (upstream's volume ownership for a new
volume). Tear-down unmounts the tmpfs before anything is deleted.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from klet.model.types import JSON
from klet.model.units import parse_quantity_int
from klet.syncloop.model import resources
from klet.syncloop.volumes import fs
from klet.syncloop.volumes.base import VolumeContext, VolumeError

DIR_NAME = "kubernetes.io~empty-dir"
DEFAULT_MODE = 0o777
STICKY = 0o1000


def directory_mode(source: JSON) -> int:
    return DEFAULT_MODE | (STICKY if source.get("stickyBit") else 0)


def tmpfs_size(pod: JSON, source: JSON, *, node_memory_bytes: int) -> int:
    """The tmpfs size in bytes for a `medium: Memory` emptyDir; 0 means the kernel default."""
    size = node_memory_bytes
    limit = resources.pod_resources(
        pod, resources.NodeLimits(memory_capacity_bytes=node_memory_bytes)
    ).memory_limit_bytes
    if limit is not None and 0 < limit and (size <= 0 or limit <= size):
        size = limit
    raw = source.get("sizeLimit")
    if raw not in (None, ""):
        try:
            wanted = parse_quantity_int(str(raw))
        except ValueError as err:
            raise VolumeError(f"invalid sizeLimit {raw!r}: {err}") from err
        if 0 < wanted and (size <= 0 or wanted <= size):
            size = wanted
    return max(size, 0)


def fs_group(pod: JSON) -> int | None:
    value = ((pod.get("spec") or {}).get("securityContext") or {}).get("fsGroup")
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


class EmptyDirPlugin:
    """`VolumePlugin` for emptyDir volumes."""

    dir_name = DIR_NAME

    def handles(self, volume: JSON) -> bool:
        return isinstance(volume.get("emptyDir"), dict)

    async def set_up(self, volume: JSON, ctx: VolumeContext) -> Path:
        source: JSON = volume.get("emptyDir") or {}
        path = ctx.volume_dir(self, str(volume["name"]))
        medium = str(source.get("medium") or "")
        if medium not in ("", "Memory"):
            raise VolumeError(f'unsupported storage medium "{medium}": klet supports "" and Memory')
        fresh = not path.exists()
        mode = directory_mode(source)
        path.mkdir(parents=True, exist_ok=True)
        if medium == "Memory" and fs.fs_type(path) != "tmpfs":
            size = tmpfs_size(ctx.pod, source, node_memory_bytes=ctx.node.memory_bytes)
            try:
                await fs.mount_tmpfs(path, options=(f"size={size}",) if size else ())
            except fs.MountError as err:
                raise VolumeError(str(err)) from err
            fresh = True  # a new filesystem: its root needs the mode and group
        if fresh:
            await asyncio.to_thread(_prepare, path, mode=mode, group=fs_group(ctx.pod))
        return path

    async def tear_down(self, path: Path) -> None:
        problems = await fs.remove_tree(path)
        if problems:
            raise OSError(f"emptyDir {path} not removed: {'; '.join(problems)}")


def _prepare(path: Path, *, mode: int, group: int | None) -> None:
    """Set the volume root's mode (mkdir is subject to the umask) and fsGroup ownership."""
    if group is not None:
        os.chown(path, -1, group)
        mode |= 0o2000 | 0o070  # setgid: new files inherit the group; the group may rwx
    os.chmod(path, mode)
