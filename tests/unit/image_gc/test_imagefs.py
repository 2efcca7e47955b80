"""Image GC's image filesystem size: statfs of the mount point CRI ImageFsInfo names,
read under the host's root when image-gc runs in a pod that does not mount it (it
failed with "cannot read image fs stats: No such file or directory" there)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from klet.image_gc.imagefs import statfs_usage


def test_a_mount_point_only_the_host_sees_is_measured_there(host_root: Path) -> None:
    mountpoint = f"/var/lib/containerd-{uuid.uuid4().hex}/io.containerd.snapshotter.v1.overlayfs"
    (host_root / mountpoint.lstrip("/")).mkdir(parents=True)
    usage = statfs_usage(mountpoint, host_root=host_root)
    st = os.statvfs(host_root)
    assert usage.capacity == st.f_blocks * st.f_frsize
    assert usage.mountpoint == mountpoint


def test_a_mount_point_seen_nowhere_is_an_error(host_root: Path) -> None:
    with pytest.raises(FileNotFoundError):
        statfs_usage(f"/var/lib/nowhere-{uuid.uuid4().hex}", host_root=host_root)
