"""tests/kubeadm's fixtures: the node's namespace set-up and its dev stack, one per
module (each module runs its own kubeadm init; see kubeadmnode.py)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from klet.devstack import DevStack

from tests.kubeadm.kubeadmnode import isolated, new_top
from tests.kubeadm.kubeadmnode import node_host as setup_node_host


@pytest.fixture(scope="module")
def node_host() -> Iterator[Path]:
    """The namespace's network and overlays (kubeadmnode.node_host), under a directory of
    the test's that goes at the end."""
    assert isolated(), "run through `make test-kubeadm` (unshare --mount --net)"
    top = new_top()
    try:
        yield from setup_node_host(top)
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture(scope="module")
def stack(node_host: Path) -> Iterator[DevStack]:
    s = DevStack(node_host / "stack")
    s.start()
    try:
        yield s
    finally:
        s.stop()
