"""Fixtures for end-to-end tests: a KletNode (the services as processes) per test.

Each node gets a unique name so its static pods do not collide with another test's, and
on teardown every sandbox it created is stopped and removed through CRI, so the shared
containerd is clean for the next test (whose syncloop would otherwise see leftovers as
orphans).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Collection, Iterator
from pathlib import Path

import pytest
from klet.cri import CRISettings, RuntimeClient
from klet.cri import labels as L
from klet.cri.errors import CRIError
from klet.devstack import DevStack

from tests.harness.node import KletNode

_seq = itertools.count(1)


async def remove_node_pods(
    endpoint: str, node_name: str, *, uids: Collection[str] = (), attempts: int = 3
) -> None:
    """Stop and remove every sandbox of `node_name`'s static pods (their names end in
    `-<node>`) and of the pods with UIDs `uids` (the apiserver's pods bound to the node:
    CRI does not say which node ran a sandbox). A stop can fail when the runtime loses a
    container's shim under load ("ttrpc: closed"); containerd notices the shim is gone
    within a second, so the clean-up tries each sandbox again."""
    cri = RuntimeClient(CRISettings(runtime_endpoint=endpoint, timeout_s=30))
    try:
        for s in await cri.list_pod_sandboxes():
            if not (
                s.labels.get(L.POD_NAME, "").endswith(f"-{node_name}")
                or s.labels.get(L.POD_UID, "") in uids
            ):
                continue
            for attempt in range(1, attempts + 1):
                try:
                    await cri.stop_pod_sandbox(s.id)
                    await cri.remove_pod_sandbox(s.id)
                    break
                except CRIError:
                    if attempt == attempts:
                        raise
                    await asyncio.sleep(1.0)
    finally:
        await cri.close()


@pytest.fixture
def manifests(tmp_path: Path) -> Path:
    d = tmp_path / "manifests"
    d.mkdir()
    return d


@pytest.fixture
def node_factory(devstack: DevStack, tmp_path: Path) -> Iterator[object]:
    nodes: list[KletNode] = []

    def make(**kwargs: object) -> KletNode:
        name = f"node{next(_seq)}"
        node = KletNode(devstack, tmp_path / name, node_name=name, **kwargs)  # type: ignore[arg-type]
        nodes.append(node)
        return node

    yield make
    for node in nodes:
        node.stop()
        asyncio.run(remove_node_pods(devstack.runtime_endpoint, node.node_name))
        node.release_mounts()
