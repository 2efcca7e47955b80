"""The node's pod directories: `<root-dir>`, `<root-dir>/pods` and `<root-dir>/pods/<uid>`.

A pod directory holds what must stay between the pod and root: its Secret and
service-account-token volumes, its emptyDirs, its termination-message files and its
/etc/hosts. The files themselves carry the modes the pod spec asks for (a Secret's
`defaultMode` is 0644 unless the pod says otherwise, so that a container running as any
user can read it), so the fence against other users of the host is the directory above
them: like upstream's kubelet, each of the three directories is mode 0750 and root's,
and nobody but root (and root's group) can reach below `pods/`. Containers are not
affected: the runtime bind-mounts a volume as root, and the container sees only the
mounted directory, never its ancestors on the host.

`mkdir` is subject to the process umask, so every directory is chmodded explicitly after
it is made. `pods/` and the pod directories belong to klet alone and are put back to
0750 root-owned whenever they are found otherwise (a directory made by an older klet
under a 022 umask was 0755); the root directory is set up only when klet creates it,
since an operator may have chosen its mode (and may be a symbolic link an operator made).

A symbolic link or a file where `pods/` or a pod directory belongs is refused rather
than followed, also one swapped in after the check: each is made (`mkdir`) and opened
relative to its parent's descriptor with `O_NOFOLLOW`, and its owner and mode are
changed through that descriptor (`fchown`/`fchmod`), never by name. Checking with
`lstat` and then `chmod`ing the path would follow a link put there in between, and
syncloop, root in the host's PID namespace, would then open whatever it points at to
root's group.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from klet.model.layout import pod_dir, pods_dir

DIR_MODE = 0o750
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class PodDirError(OSError):
    """A pod directory cannot be made safe; the message names the path and the cause."""


def ensure_root_dir(root_dir: Path) -> None:
    """Create `<root-dir>` 0750 when it is missing, and `<root-dir>/pods` 0750 root-owned."""
    root = _open_root(root_dir)
    try:
        os.close(_ensure_at(root, pods_dir(root_dir), enforce=True))
    finally:
        os.close(root)


def ensure_pod_dir(root_dir: Path, uid: str) -> Path:
    """`<root-dir>/pods/<uid>`, created (with the directories above) 0750 root-owned."""
    if not uid or "/" in uid or uid in (".", ".."):
        raise PodDirError(f"invalid pod UID {uid!r}: not usable as a directory name")
    path = pod_dir(root_dir, uid)
    root = _open_root(root_dir)
    try:
        pods = _ensure_at(root, pods_dir(root_dir), enforce=True)
        try:
            os.close(_ensure_at(pods, path, enforce=True))
        finally:
            os.close(pods)
    finally:
        os.close(root)
    return path


def _open_root(root_dir: Path) -> int:
    """A descriptor of `<root-dir>`, made 0750 (and root's) when it is missing; an
    existing one is left as the operator made it, a symbolic link included."""
    if root_dir.is_dir():
        return os.open(root_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    root_dir.parent.mkdir(parents=True, exist_ok=True)
    parent = os.open(root_dir.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return _ensure_at(parent, root_dir, enforce=False)
    finally:
        os.close(parent)


def _ensure_at(parent: int, path: Path, *, enforce: bool) -> int:
    """Make `path`, an entry of the directory open as `parent`, a 0750 directory and
    return a descriptor of it; an existing one gets its mode and owner fixed only if
    `enforce`. Raises PodDirError naming `path` when it is anything but a directory."""
    try:
        os.mkdir(path.name, DIR_MODE, dir_fd=parent)
        made = True
    except FileExistsError:
        made = False
    try:
        fd = os.open(path.name, _DIR_FLAGS, dir_fd=parent)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR):
            raise PodDirError(f"{path}: exists and is not a directory") from None
        raise
    try:
        if made or enforce:
            info = os.fstat(fd)
            if os.geteuid() == 0 and (info.st_uid, info.st_gid) != (0, 0):
                os.fchown(fd, 0, 0)
            if stat.S_IMODE(info.st_mode) != DIR_MODE:
                os.fchmod(fd, DIR_MODE)  # mkdir honours the umask; an old directory may be wider
    except BaseException:
        os.close(fd)
        raise
    return fd
