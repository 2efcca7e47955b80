"""Fixtures shared by unit tests of several packages."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def host_root(tmp_path: Path) -> Iterator[Path]:
    """A stand-in for /proc/1/root (the host's root as a klet in a pod sees it) on
    another filesystem than tmp_path's and /'s, a tmpfs under /dev/shm, so a statfs of
    the wrong path shows. Skipped where /dev/shm is not a filesystem of its own: there
    the two readings could not be told apart."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev in (os.stat("/").st_dev, os.stat(tmp_path).st_dev):
        pytest.skip("needs /dev/shm on a filesystem of its own")
    root = Path(tempfile.mkdtemp(dir=shm))
    try:
        yield root
    finally:
        shutil.rmtree(root)
