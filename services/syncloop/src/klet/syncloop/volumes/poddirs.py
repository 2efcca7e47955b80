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
since an operator may have chosen its mode. A symbolic link or a file where a directory
belongs is refused rather than followed.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from klet.model.layout import pod_dir, pods_dir

DIR_MODE = 0o750


class PodDirError(OSError):
    """A pod directory cannot be made safe; the message names the path and the cause."""


def ensure_root_dir(root_dir: Path) -> None:
    """Create `<root-dir>` 0750 when it is missing, and `<root-dir>/pods` 0750 root-owned."""
    if not root_dir.is_dir():
        root_dir.parent.mkdir(parents=True, exist_ok=True)
        _ensure(root_dir, enforce=False)
    _ensure(pods_dir(root_dir), enforce=True)


def ensure_pod_dir(root_dir: Path, uid: str) -> Path:
    """`<root-dir>/pods/<uid>`, created (with the directories above) 0750 root-owned."""
    if not uid or "/" in uid or uid in (".", ".."):
        raise PodDirError(f"invalid pod UID {uid!r}: not usable as a directory name")
    ensure_root_dir(root_dir)
    path = pod_dir(root_dir, uid)
    _ensure(path, enforce=True)
    return path


def _ensure(path: Path, *, enforce: bool) -> None:
    """Make `path` a 0750 directory; when it exists, fix its mode and owner only if
    `enforce`."""
    try:
        os.mkdir(path, DIR_MODE)
    except FileExistsError:
        info = os.lstat(path)
        if not stat.S_ISDIR(info.st_mode):
            raise PodDirError(f"{path}: exists and is not a directory") from None
        if not enforce:
            return
    else:
        info = os.lstat(path)
    if os.geteuid() == 0 and (info.st_uid, info.st_gid) != (0, 0):
        os.lchown(path, 0, 0)
    if stat.S_IMODE(info.st_mode) != DIR_MODE:
        os.chmod(path, DIR_MODE)  # mkdir honours the umask; an old directory may be wider
