"""A Filesystem-mode `local` PV whose path is a block device: formatted when blank,
mounted once for the node, bound into each pod that uses it, unmounted with the last.

As upstream's local volume plugin does: the device is mounted at
`<root-dir>/plugins/kubernetes.io/local-volume/mounts/<pv name>` (formatted first with
the PV's `fsType`, ext4 by default, when `blkid` finds no filesystem on it; one of
another type is refused rather than overwritten), and each pod gets a bind mount of that
at `<pod dir>/volumes/kubernetes.io~local-volume/<pv name>`, the path its containers
mount. Tearing a pod's volumes down removes its bind mount; the node's mount goes when
no pod directory holds the PV any more. Both are on disk (the mount table and the pod
directories), so a restarted syncloop finds them as they are and mounts nothing twice.

A `local` PV whose path is a directory is not handled here: it is handed to the runtime
as it is (see `csi`).
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

from klet.syncloop.volumes import fs
from klet.syncloop.volumes.base import VolumeError

log = logging.getLogger(__name__)

DIR_NAME = "kubernetes.io~local-volume"
MOUNTS_DIR = Path("plugins") / "kubernetes.io" / "local-volume" / "mounts"
DEFAULT_FS_TYPE = "ext4"
# mkfs arguments as upstream formats: ext* without reserved blocks, forced (the device
# was checked to hold nothing).
_MKFS_ARGS = {"ext2": ("-F", "-m0"), "ext3": ("-F", "-m0"), "ext4": ("-F", "-m0")}


async def _output(*argv: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await proc.communicate()
    return int(proc.returncode or 0), out.decode(errors="replace").strip()


async def filesystem_of(device: str) -> str:
    """The filesystem type on `device`, "" when it holds none (blkid's exit status 2)."""
    code, out = await _output("blkid", "-p", "-s", "TYPE", "-o", "value", device)
    if code == 2:
        return ""
    if code != 0:
        raise VolumeError(f"blkid {device} failed: exit status {code}: {out}")
    return out.splitlines()[0] if out else ""


class LocalDeviceMounts:
    """The node's mounts of block-device `local` PVs and the pods' binds of them."""

    dir_name = DIR_NAME

    def __init__(self, root_dir: Path) -> None:
        self.root_dir = root_dir
        self._locks: dict[str, asyncio.Lock] = {}

    def global_path(self, pv_name: str) -> Path:
        return self.root_dir / MOUNTS_DIR / pv_name

    async def set_up(
        self,
        pv_name: str,
        device: str,
        *,
        fs_type: str,
        options: tuple[str, ...],
        pod_volume: Path,
    ) -> Path:
        """Mount the device for the node if it is not, bind it at `pod_volume` if that
        is not; returns `pod_volume`."""
        async with self._locks.setdefault(pv_name, asyncio.Lock()):
            node_mount = self.global_path(pv_name)
            if fs.fs_type(node_mount) is None:
                await self._mount_device(device, node_mount, fs_type or DEFAULT_FS_TYPE, options)
            if fs.fs_type(pod_volume) is None:
                await asyncio.to_thread(pod_volume.mkdir, parents=True, exist_ok=True)
                try:
                    await fs.bind(node_mount, pod_volume)
                except fs.MountError as err:
                    raise VolumeError(str(err)) from err
        return pod_volume

    async def _mount_device(
        self, device: str, target: Path, fs_type: str, options: tuple[str, ...]
    ) -> None:
        found = await filesystem_of(device)
        if found and found != fs_type:
            raise VolumeError(
                f"failed to mount {device} as {fs_type!r}: it already contains {found!r}"
            )
        try:
            if not found:
                log.info("formatting a local volume's device", extra={"device": device})
                await fs.run("mkfs", "-t", fs_type, *_MKFS_ARGS.get(fs_type, ()), device)
            await asyncio.to_thread(target.mkdir, parents=True, exist_ok=True)
            await fs.mount_device(device, target, fs_type=fs_type, options=options)
        except fs.MountError as err:
            raise VolumeError(str(err)) from err

    async def tear_down(self, path: Path) -> None:
        """Remove a pod's bind of a PV; unmount the PV from the node when it was the last."""
        pv_name = path.name
        async with self._locks.setdefault(pv_name, asyncio.Lock()):
            problems = await fs.remove_tree(path)
            if problems:
                raise OSError(f"{path} not removed: {'; '.join(problems)}")
            if await asyncio.to_thread(self._in_use, pv_name):
                return
            node_mount = self.global_path(pv_name)
            problems = await fs.remove_tree(node_mount)
            if problems:
                raise OSError(f"{node_mount} not removed: {'; '.join(problems)}")
        self._locks.pop(pv_name, None)

    def _in_use(self, pv_name: str) -> bool:
        pods = self.root_dir / "pods"
        return any(os.path.lexists(p) for p in pods.glob(f"*/volumes/{DIR_NAME}/{pv_name}"))
