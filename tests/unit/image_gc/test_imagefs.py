"""Image GC's image filesystem size: statfs of the mount point CRI ImageFsInfo names,
read under the host's root when image-gc runs in a pod that does not mount it (it
failed with "cannot read image fs stats: No such file or directory" there)."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from klet.image_gc.imagefs import statfs_usage


@pytest.fixture
def host_root(tmp_path: Path) -> Iterator[Path]:
    """A stand-in for /proc/1/root on a filesystem of its own (a tmpfs)."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev in (os.stat("/").st_dev, os.stat(tmp_path).st_dev):
        pytest.skip("needs /dev/shm on a filesystem of its own")
    root = Path(tempfile.mkdtemp(dir=shm))
    try:
        yield root
    finally:
        shutil.rmtree(root)


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
