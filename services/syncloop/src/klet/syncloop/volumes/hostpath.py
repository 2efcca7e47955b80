"""hostPath: a file or directory of the node, mounted as it is.

The volume's host path is the path itself; nothing is created under the pod's
directory and nothing is removed with the pod. `type` checks the path before every
set-up with upstream's rules and messages: "" checks nothing, `DirectoryOrCreate` and
`FileOrCreate` create what is missing (0755 directory, 0644 empty file), and the other
types require the path to exist and be of that kind. Symlinks are followed, as
upstream's os.Stat does.

The path is the host's: the runtime on the host mounts it. A syncloop in a pod (the Helm
chart) checks and creates it through the host's root (`klet.hostfs.on_host`); it used to
refuse a `Directory`, `File` or `Socket` that only the host has ("doesn't exist"), and
to create an `*OrCreate` path inside its own container (containerd then made an empty
directory on the host, whatever the type).
"""

from __future__ import annotations

import asyncio
import functools
import os
import stat
from pathlib import Path

from klet.hostfs import HOST_ROOT, on_host
from klet.model.types import JSON
from klet.syncloop.volumes import fs
from klet.syncloop.volumes.base import VolumeContext, VolumeError

DIR_NAME = "kubernetes.io~host-path"

# hostPath `type` → (the file type it requires, how upstream's message names it)
_REQUIRED = {
    "DirectoryOrCreate": ("Directory", "directory"),
    "Directory": ("Directory", "directory"),
    "FileOrCreate": ("File", "file"),
    "File": ("File", "file"),
    "Socket": ("Socket", "socket file"),
    "CharDevice": ("CharDevice", "character device"),
    "BlockDevice": ("BlockDevice", "block device"),
}

_FILE_TYPES = {
    stat.S_IFSOCK: "Socket",
    stat.S_IFBLK: "BlockDevice",
    stat.S_IFCHR: "CharDevice",
    stat.S_IFDIR: "Directory",
    stat.S_IFREG: "File",
}


def file_type(path: str) -> str:
    """The upstream file type name of what `path` is; raises OSError or ValueError."""
    kind = _FILE_TYPES.get(stat.S_IFMT(os.stat(path).st_mode))
    if kind is None:
        raise ValueError(
            "only recognise file, directory, socket, block device and character device"
        )
    return kind


def check_type(path: str, *, path_type: str, host_root: Path = HOST_ROOT) -> None:
    """Upstream's hostPath type check (creating what the *OrCreate types allow), on the
    host's `path`; messages name `path` as the pod gives it."""
    if path_type == "":
        return
    if path_type not in _REQUIRED:
        raise VolumeError(f"{path_type} is an invalid volume type")
    _check_type(str(on_host(Path(path), host_root=host_root)), path, path_type=path_type)


def _check_type(real: str, path: str, *, path_type: str) -> None:
    """The check on `real` (the host's file), reported as `path`."""
    if path_type.endswith("OrCreate") and not os.path.exists(real):
        try:
            if path_type == "DirectoryOrCreate":
                os.makedirs(real, mode=0o755, exist_ok=True)
            else:
                os.close(os.open(real, os.O_CREAT | os.O_RDONLY, 0o644))
        except OSError as err:
            verb = "mkdir" if path_type == "DirectoryOrCreate" else "open"
            raise VolumeError(f"{verb} {path}: {_go_text(err)}") from err
        return
    want, described = _REQUIRED[path_type]
    if not os.path.exists(real):
        raise VolumeError(f"hostPath {path} doesn't exist")
    try:
        kind = file_type(real)
    except (OSError, ValueError) as err:
        detail = f"stat {path}: {_go_text(err)}" if isinstance(err, OSError) else str(err)
        raise VolumeError(
            f"hostPath type check failed, {path} is not a {described}, "
            f"unable to determine its type: {detail}"
        ) from err
    if kind != want:
        raise VolumeError(f"hostPath type check failed: {path} is not a {described}, it's a {kind}")


def _go_text(err: OSError) -> str:
    """An errno's text as Go prints it (lower case: `no such file or directory`)."""
    text = err.strerror or str(err)
    return text[:1].lower() + text[1:]


class HostPathPlugin:
    """`VolumePlugin` for hostPath volumes."""

    dir_name = DIR_NAME

    def handles(self, volume: JSON) -> bool:
        return isinstance(volume.get("hostPath"), dict)

    async def set_up(self, volume: JSON, ctx: VolumeContext) -> Path:
        source: JSON = volume.get("hostPath") or {}
        path = str(source.get("path") or "")
        if not path:
            raise VolumeError("hostPath has no path")
        await asyncio.to_thread(
            functools.partial(check_type, path, path_type=str(source.get("type") or ""))
        )
        return Path(path)

    async def tear_down(self, path: Path) -> None:
        """Only reached for a directory under the pod's `volumes` (hostPath makes none);
        removes it without touching a mounted filesystem, never the host path itself."""
        problems = await fs.remove_tree(path)
        if problems:
            raise OSError(f"{path} not removed: {'; '.join(problems)}")
