"""The host's mount table and removals that never reach into a mounted filesystem.

A pod's volume directory may hold a tmpfs (emptyDir `medium: Memory`, secrets) or any
other mount; deleting it with `rmtree` while something is still mounted there would
delete the mounted filesystem's contents (upstream's kubelet refuses to do that as
well). So removal unmounts every mount under the directory first, deepest first, and
then deletes only what lies on the directory's own filesystem; anything that stays
mounted is left alone and reported.

Mounting and unmounting use the host's `mount`/`umount` commands, as upstream's mount
utilities do; they run as child processes so the event loop never blocks on them.

Reading `/proc/self/mountinfo` is what a pod's tear-down costs most (issue 42: 37% of
syncloop's samples in `make bench-volumes` on a host with some 900 mounts): the
kernel prints the whole table at each read, whatever the question. So a removal reads it
once more only when it unmounted something (to see what is still there), a question
about one path parses only the lines that name it, and a volume directory that shares
its parent's device is no mount point without reading the table at all
(`likely_mount_point`, upstream's IsLikelyNotMountPoint). Where klet knows what was
mounted, no table is read at all: a content volume's own tmpfs is unmounted and its
directory removed by rmdir (`remove_own_mount`), and a CSI directory the driver has
unmounted goes by rmdir and the unlink of klet's own record (`remove_emptied`); rmdir
refuses a mount point and a non-empty directory, so anything unexpected there falls
back to `remove_tree`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from pathlib import Path

log = logging.getLogger(__name__)

MOUNTINFO = Path("/proc/self/mountinfo")


class MountError(Exception):
    """A mount or umount command failed; the text is the command's own message."""


_ESCAPES = {" ": "\\040", "\t": "\\011", "\n": "\\012", "\\": "\\134"}


def _escape(path: str) -> str:
    """A path as mountinfo prints it (the inverse of `_unescape`)."""
    return "".join(_ESCAPES.get(c, c) for c in path)


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal (`\\040`)."""
    if "\\" not in field:
        return field
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit() and i + 3 < len(field):
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[tuple[str, str]]:
    """(mount point, filesystem type) of every line of a mountinfo table."""
    out: list[tuple[str, str]] = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 7 or "-" not in parts[6:]:
            continue
        sep = parts.index("-", 6)
        fstype = parts[sep + 1] if sep + 1 < len(parts) else ""
        out.append((_unescape(parts[4]), fstype))
    return out


def read_mountinfo() -> str:
    """This process's mount table as the kernel prints it ("" when unreadable)."""
    try:
        return MOUNTINFO.read_text()
    except OSError:
        return ""


def mounts(naming: str = "") -> list[tuple[str, str]]:
    """(mount point, filesystem type) of this process's mount table; with `naming`, only
    of the lines that hold that path (as mountinfo escapes it) somewhere: every mount at
    or below it, and a few others the caller filters out."""
    text = read_mountinfo()
    if naming:
        needle = _escape(naming)
        text = "\n".join(line for line in text.splitlines() if needle in line)
    return parse_mountinfo(text)


def mounts_under(path: Path, table: list[tuple[str, str]] | None = None) -> list[str]:
    """Mount points at or below `path`, deepest first (the order to unmount them in)."""
    top = os.path.realpath(path)
    prefix = top.rstrip("/") + "/"
    found = {
        point
        for point, _ in (mounts(top) if table is None else table)
        if point == top or point.startswith(prefix)
    }
    return sorted(found, key=lambda p: (p.count("/"), p), reverse=True)


def fs_type(path: Path) -> str | None:
    """The filesystem type mounted exactly at `path`, or None when it is no mount point."""
    top = os.path.realpath(path)
    found = [fstype for point, fstype in mounts(top) if point == top]
    return found[-1] if found else None


def likely_mount_point(path: Path) -> bool:
    """Whether something is mounted at `path`, from two stats (its device differs from its
    parent's) instead of the mount table: upstream's IsLikelyNotMountPoint, with its one
    blind spot, a bind mount of a directory of the same filesystem. For a directory klet
    made and mounts its own tmpfs on. False when `path` does not exist."""
    try:
        here = os.stat(path)
        parent = os.stat(os.path.dirname(os.path.realpath(path)))
    except FileNotFoundError:
        return False
    return here.st_dev != parent.st_dev


async def run(*argv: str) -> None:
    """Run a mount-related command; `MountError` with its output when it fails."""
    await _run(*argv)


async def _run(*argv: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        text = out.decode(errors="replace").strip()
        raise MountError(f"{' '.join(argv)} failed: exit status {proc.returncode}: {text}")


async def mount_tmpfs(path: Path, *, options: tuple[str, ...] = ()) -> None:
    """Mount a new tmpfs at `path` (`mount -t tmpfs -o <options> tmpfs <path>`)."""
    argv = ["mount", "-t", "tmpfs"]
    if options:
        argv += ["-o", ",".join(options)]
    await _run(*argv, "tmpfs", str(path))


async def mount_device(
    device: str, path: Path, *, fs_type: str, options: tuple[str, ...] = ()
) -> None:
    """Mount a block device's filesystem at `path`."""
    argv = ["mount", "-t", fs_type]
    if options:
        argv += ["-o", ",".join(options)]
    await _run(*argv, device, str(path))


def mount_args(
    source: str, path: Path, *, fs_type: str, options: tuple[str, ...] = ()
) -> tuple[str, ...]:
    """The arguments of `mount -t <fs_type> [-o <options>] <source> <path>`, in the order
    upstream's mount-utils builds them."""
    args: tuple[str, ...] = ("-t", fs_type)
    if options:
        args += ("-o", ",".join(options))
    return (*args, source, str(path))


def mount_failed_text(args: tuple[str, ...], code: int, output: str) -> str:
    """A failed mount in upstream mount-utils' words (the FailedMount cause operators
    know: the exit status, the command, its arguments and the helper's output)."""
    return (
        f"mount failed: exit status {code}\nMounting command: mount\n"
        f"Mounting arguments: {' '.join(args)}\nOutput: {output}"
    )


async def mount_source(
    source: str, path: Path, *, fs_type: str, options: tuple[str, ...] = ()
) -> None:
    """Mount a filesystem named by `source` (an NFS `server:/export`) at `path`; the
    host's mount helper (`mount.nfs`) does the work. `MountError` in upstream's text."""
    args = mount_args(source, path, fs_type=fs_type, options=options)
    proc = await asyncio.create_subprocess_exec(
        "mount", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        text = out.decode(errors="replace")
        raise MountError(mount_failed_text(args, int(proc.returncode or 0), text))


class HostMounter:
    """The host's mount table and mount commands, for a plugin that takes a mounter."""

    def is_mount_point(self, path: Path) -> bool:
        return fs_type(path) is not None

    async def mount(
        self, source: str, path: Path, *, fs_type: str, options: tuple[str, ...]
    ) -> None:
        await mount_source(source, path, fs_type=fs_type, options=options)

    async def unmount(self, path: Path) -> None:
        await unmount(path)


async def bind(source: Path, path: Path) -> None:
    """Bind-mount `source` at `path`."""
    await _run("mount", "--bind", str(source), str(path))


async def unmount(path: Path) -> None:
    await _run("umount", str(path))


async def remove_tree(path: Path) -> list[str]:
    """Unmount everything under `path`, then delete it; the problems, empty when gone.

    Nothing is deleted below a mount point that could not be unmounted, nor on any
    other filesystem than the one `path` itself lives on.
    """
    if not await asyncio.to_thread(os.path.lexists, path):
        return []
    problems: list[str] = []
    points = mounts_under(path)
    for point in points:
        try:
            await unmount(Path(point))
        except MountError as err:
            problems.append(str(err))
    # Read again only after unmounting: a stacked mount may remain where one went.
    still = set(mounts_under(path)) if points else set()
    problems += await asyncio.to_thread(_delete, path, still)
    return problems


async def remove_own_mount(path: Path) -> bool:
    """Remove the directory `path` on which klet mounted a filesystem of its own (a
    content volume's tmpfs): unmount it when its device says it is mounted, then rmdir,
    which removes nothing but an empty directory and refuses a mount point, so no read
    of the mount table (issue 42: two per such volume). False when that is not enough
    (umount refused, say for a mount below it, or something is left or still mounted
    there): the caller then takes the careful way, `remove_tree`."""
    if await asyncio.to_thread(likely_mount_point, path):
        try:
            await unmount(path)
        except MountError:
            return False
    return await asyncio.to_thread(_rmdir, path)


def remove_emptied(path: Path, *, files: tuple[str, ...] = ()) -> bool:
    """Remove the directory `path` whose mounts were all taken away (a CSI publish or
    staging directory after the driver's unpublish or unstage): its subdirectories by
    rmdir (which refuses a mount point and a non-empty directory), the regular `files`
    named in `path` itself, then `path` by rmdir; no read of the mount table (issue 42:
    one per directory). False, having removed at most empty subdirectories, when
    anything else is there: the caller then takes the careful way, `remove_tree`."""
    try:
        entries = list(os.scandir(path))
    except FileNotFoundError:
        return True
    except OSError:
        return False
    plain = [e for e in entries if e.name in files and e.is_file(follow_symlinks=False)]
    for entry in entries:
        if entry in plain:
            continue
        if not entry.is_dir(follow_symlinks=False) or not _rmdir(Path(entry.path)):
            return False
    try:
        for entry in plain:
            os.unlink(entry.path)
    except FileNotFoundError:
        pass
    except OSError:
        return False
    return _rmdir(path)


def _rmdir(path: Path) -> bool:
    """rmdir: True when `path` is gone (or was never there)."""
    try:
        os.rmdir(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def _delete(path: Path, mounted: set[str]) -> list[str]:
    """Delete `path` bottom-up without crossing into another filesystem or a mount."""
    try:
        top = os.lstat(path)
    except FileNotFoundError:
        return []
    if not stat.S_ISDIR(top.st_mode):
        os.unlink(path)
        return []
    problems: list[str] = []
    kept = _delete_dir(str(path), top.st_dev, mounted, problems)
    if not kept:
        try:
            os.rmdir(path)
        except OSError as err:
            problems.append(f"cannot remove {path}: {err.strerror}")
    return problems


def _delete_dir(path: str, dev: int, mounted: set[str], problems: list[str]) -> bool:
    """Empty the directory `path`; True when something had to stay in it."""
    kept = False
    if os.path.realpath(path) in mounted:
        problems.append(f"{path} is still a mount point: not removed")
        return True
    try:
        entries = list(os.scandir(path))
    except OSError as err:
        problems.append(f"cannot list {path}: {err.strerror}")
        return True
    for entry in entries:
        try:
            st = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(st.st_mode):
            if st.st_dev != dev or os.path.realpath(entry.path) in mounted:
                problems.append(f"{entry.path} is on another filesystem: not removed")
                kept = True
                continue
            if _delete_dir(entry.path, dev, mounted, problems):
                kept = True
                continue
            try:
                os.rmdir(entry.path)
            except OSError as err:
                problems.append(f"cannot remove {entry.path}: {err.strerror}")
                kept = True
        else:
            try:
                os.unlink(entry.path)
            except FileNotFoundError:
                pass
            except OSError as err:
                problems.append(f"cannot remove {entry.path}: {err.strerror}")
                kept = True
    return kept
