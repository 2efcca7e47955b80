"""Where a raw block CSI volume (a claim whose PV has `volumeMode: Block`) lives on the
node, and the files a pod's use of it leaves there: upstream's csi_block.go layout.

Below `<root-dir>/plugins/kubernetes.io/csi/volumeDevices/`:

- `staging/<pv>`: the staging path given to NodeStageVolume (a driver with
  STAGE_UNSTAGE_VOLUME), once per volume on the node;
- `publish/<pv>/<pod uid>`: the file NodePublishVolume makes the device at (a driver
  bind-mounts its device node there), one per pod;
- `<pv>/data/vol_data.json`: the driver and handle of a staged volume, so a staging left
  by a crash is found and unstaged (`CSIVolumePlugin.sweep`).

Each pod gets upstream's symbolic link `<pod dir>/volumeDevices/kubernetes.io~csi/<pv>`
to its publish path, which is what the runtime is handed as the device of the
container's `volumeDevices` (the runtime resolves the link, as for upstream's kubelet).
Upstream's further map of the device (a bind under `volumeDevices/<pv>/dev` and a loop
device held open as a lock against detach) is not made: klet keeps the volume in the
Node's `volumesInUse` from its pod record instead. That record is the
`vol_data.json` in `<pod dir>/volumes/kubernetes.io~csi/<pv>/`, as for a filesystem
volume, with `volumeMode: Block`: the volume manager's tear-down and the volume stats
find block volumes where they find the others.

Every path here is made from the PV's name and the pod's UID, each checked to be one
path component; none is read from a file.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from klet.model.podvalidation import checked_component

DEVICES_DIR = Path("plugins") / "kubernetes.io" / "csi" / "volumeDevices"
POD_DEVICES_DIR = "volumeDevices"
BLOCK_MODE = "Block"
DIR_MODE = 0o750


def staging_path(root_dir: Path, pv: str) -> Path:
    return root_dir / DEVICES_DIR / "staging" / checked_component(pv, what="PV name")


def publish_dir(root_dir: Path, pv: str) -> Path:
    return root_dir / DEVICES_DIR / "publish" / checked_component(pv, what="PV name")


def publish_path(root_dir: Path, pv: str, pod_uid: str) -> Path:
    return publish_dir(root_dir, pv) / checked_component(pod_uid, what="pod UID")


def data_dir(root_dir: Path, pv: str) -> Path:
    """`volumeDevices/<pv>/data`, which holds the staged volume's `vol_data.json`."""
    return root_dir / DEVICES_DIR / checked_component(pv, what="PV name") / "data"


def pod_map_path(pod_dir: Path, dir_name: str, pv: str) -> Path:
    """The pod's link to its publish path (the device the runtime is given)."""
    return pod_dir / POD_DEVICES_DIR / dir_name / checked_component(pv, what="PV name")


def ensure_link(link: Path, target: Path) -> None:
    """`link` a symbolic link to `target`, made or corrected (nothing else is replaced:
    a file or directory there is an error)."""
    link.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    try:
        if os.readlink(link) == str(target):
            return
        os.unlink(link)
    except FileNotFoundError:
        pass
    os.symlink(target, link)


def remove_link(link: Path) -> None:
    """Remove the pod's link (never what it points to); gone already is fine."""
    if not os.path.lexists(link):
        return
    if not link.is_symlink():
        raise IsADirectoryError(f"{link} is not a symbolic link; left in place")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(link)


def remove_empty(path: Path) -> None:
    """Remove the directory `path` if it is there and empty (another pod's publish file
    in it keeps it)."""
    with contextlib.suppress(OSError):
        os.rmdir(path)


def publishes_left(root_dir: Path, pv: str) -> bool:
    """Whether any pod's publish file of the volume is still there."""
    try:
        return any(True for _ in os.scandir(publish_dir(root_dir, pv)))
    except (FileNotFoundError, NotADirectoryError):
        return False
