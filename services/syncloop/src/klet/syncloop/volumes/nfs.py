"""nfs: an NFS export mounted into the pod, inline (`volumes[].nfs`) or as a PV's `spec.nfs`.

As upstream's in-tree NFS plugin (`kubernetes.io/nfs`): the export is mounted with
`mount -t nfs [-o <options>] <server>:<path> <pod volume dir>`, the volume directory
being `<pod dir>/volumes/kubernetes.io~nfs/<name>` (the pod volume's name inline, the
PV's name for a claim). The host's `mount.nfs` helper does the NFS work, as upstream
relies on it too; klet only decides the source and options and runs `mount`.

The decisions are pure (`inline_mount`, `pv_mount`): the options are the PV's mount
options (its `volume.beta.kubernetes.io/mount-options` annotation first, then
`spec.mountOptions`; an inline volume has none) joined with `ro` when the volume is
read-only, without duplicates and sorted, as upstream's JoinMountOptions returns them;
an IPv6 server is bracketed (`[fd00::1]:/export`). Read-only comes from the inline
source's `readOnly`, or for a PV from the pod volume's `persistentVolumeClaim.readOnly`
(upstream ignores the PV's own `spec.nfs.readOnly` when mounting: its volume spec takes
the claim reference's flag).

Set-up mounts only what is not mounted yet (it runs at every sync); a mount that fails
leaves no mount and no directory behind, and its error is upstream's text (the exit
status, the mount command, its arguments and mount.nfs's output), which becomes the
pod's FailedMount cause while the pod waits and the mount is retried: an unreachable
server never kills a pod. Tear-down unmounts and removes the directory. The mounts go
through a `Mounter` (the host's `fs.HostMounter` in production).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from klet.model.types import JSON
from klet.syncloop.volumes import fs
from klet.syncloop.volumes.base import VolumeContext, VolumeError, volume_path

log = logging.getLogger(__name__)

DIR_NAME = "kubernetes.io~nfs"
PLUGIN_NAME = "kubernetes.io/nfs"
FS_TYPE = "nfs"
MOUNT_OPTIONS_ANNOTATION = "volume.beta.kubernetes.io/mount-options"
DIR_MODE = 0o750


class Mounter(Protocol):
    """The mount table and mount commands the plugin needs."""

    def is_mount_point(self, path: Path) -> bool: ...

    async def mount(
        self, source: str, path: Path, *, fs_type: str, options: tuple[str, ...]
    ) -> None:
        """Raises `fs.MountError` with the command's text when it fails."""
        ...

    async def unmount(self, path: Path) -> None: ...


@dataclass(frozen=True)
class NfsMount:
    """What to mount: `mount -t nfs -o <options> <source> <dir>`."""

    source: str
    options: tuple[str, ...]


def server_address(server: str) -> str:
    """The server as the mount source spells it: an IPv6 address in brackets."""
    try:
        is_v6 = isinstance(ipaddress.ip_address(server), ipaddress.IPv6Address)
    except ValueError:
        is_v6 = False
    return f"[{server}]" if is_v6 else server


def join_options(user: Iterable[str], system: Iterable[str]) -> tuple[str, ...]:
    """The user's options (empty ones dropped) and the system's, without duplicates,
    sorted (upstream's JoinMountOptions returns a sorted set)."""
    return tuple(sorted({o for o in user if o} | set(system)))


def pv_mount_options(pv: JSON) -> list[str]:
    """A PV's mount options: its beta annotation when present, else `spec.mountOptions`."""
    annotations = (pv.get("metadata") or {}).get("annotations") or {}
    if MOUNT_OPTIONS_ANNOTATION in annotations:
        return str(annotations[MOUNT_OPTIONS_ANNOTATION]).split(",")
    return [str(o) for o in (pv.get("spec") or {}).get("mountOptions") or []]


def _mount(source: JSON, *, where: str, options: Iterable[str], read_only: bool) -> NfsMount:
    server = str(source.get("server") or "")
    path = str(source.get("path") or "")
    if not server:
        raise VolumeError(f"{where}.server: the NFS server is not set")
    if not path:
        raise VolumeError(f"{where}.path: the exported path is not set")
    return NfsMount(
        source=f"{server_address(server)}:{path}",
        options=join_options(options, ("ro",) if read_only else ()),
    )


def inline_mount(volume: JSON) -> NfsMount:
    """The mount of a pod's inline `nfs` volume (no mount options: only PVs have them)."""
    source: JSON = volume.get("nfs") or {}
    where = f'volume "{volume.get("name") or ""}": nfs'
    return _mount(source, where=where, options=(), read_only=bool(source.get("readOnly")))


def pv_mount(pv: JSON, *, read_only: bool) -> NfsMount:
    """The mount of an NFS PV; `read_only` is the pod's claim reference's `readOnly`."""
    where = f"PV {(pv.get('metadata') or {}).get('name') or ''}: spec.nfs"
    source: JSON = (pv.get("spec") or {}).get("nfs") or {}
    return _mount(source, where=where, options=pv_mount_options(pv), read_only=read_only)


class NfsPlugin:
    """`VolumePlugin` for inline nfs volumes; the claim plugin calls `mount_at` for NFS PVs."""

    dir_name = DIR_NAME

    def __init__(self, mounter: Mounter | None = None) -> None:
        self.mounter: Mounter = mounter if mounter is not None else fs.HostMounter()
        # Set-up and tear-down of one directory never overlap.
        self._locks: dict[Path, asyncio.Lock] = {}

    def handles(self, volume: JSON) -> bool:
        return isinstance(volume.get("nfs"), dict)

    async def set_up(self, volume: JSON, ctx: VolumeContext) -> Path:
        wanted = inline_mount(volume)
        return await self.mount_at(wanted, ctx.volume_dir(self, str(volume.get("name") or "")))

    def pv_dir(self, pod_dir: Path, pv_name: str) -> Path:
        """Where an NFS PV is mounted for the pod: the plugin directory, by PV name."""
        return volume_path(pod_dir, dir_name=DIR_NAME, name=pv_name)

    async def mount_at(self, wanted: NfsMount, target: Path) -> Path:
        """Mount `wanted` at `target` unless something is mounted there; returns `target`."""
        async with self._locks.setdefault(target, asyncio.Lock()):
            if self.mounter.is_mount_point(target):
                return target
            await asyncio.to_thread(_make_dir, target)
            try:
                await self.mounter.mount(
                    wanted.source, target, fs_type=FS_TYPE, options=wanted.options
                )
            except fs.MountError as err:
                await self._undo(target)
                raise VolumeError(str(err)) from err
            log.info("mounted an NFS volume", extra={"source": wanted.source, "path": str(target)})
        return target

    async def _undo(self, target: Path) -> None:
        """After a failed mount: unmount whatever got mounted and remove the directory,
        as upstream does (a later sync tries again from scratch)."""
        if self.mounter.is_mount_point(target):
            try:
                await self.mounter.unmount(target)
            except fs.MountError as err:
                log.warning(
                    "NFS volume still mounted after a failed mount",
                    extra={"path": str(target), "error": str(err)},
                )
                return
        try:
            await asyncio.to_thread(_remove_dir, target)
        except OSError as err:
            log.warning("NFS volume directory kept", extra={"path": str(target), "error": str(err)})

    async def tear_down(self, path: Path) -> None:
        async with self._locks.setdefault(path, asyncio.Lock()):
            if self.mounter.is_mount_point(path):
                try:
                    await self.mounter.unmount(path)
                except fs.MountError as err:
                    raise VolumeError(f"nfs volume {path} not unmounted: {err}") from err
            await asyncio.to_thread(_remove_dir, path)
        self._locks.pop(path, None)


def _make_dir(path: Path) -> None:
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)


def _remove_dir(path: Path) -> None:
    """Remove the (unmounted, hence empty) volume directory; gone already is fine."""
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass
