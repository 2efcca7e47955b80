"""`/logs/` through the apiserver's node proxy, as an operator reads a node's logs:
`kubectl get --raw /api/v1/nodes/<node>/proxy/logs/...` on a klet node joined to the
real control plane (InternalIP a non-loopback address, so the apiserver proxies).

The node's /var/log is the machine's: the test writes a file of its own there (and a
symlink to /etc/hostname), reads the listing and the file through kubectl as the
cluster admin (authorized by the apiserver's SubjectAccessReview for nodes/log), and
finds the symlink refused; both are removed afterwards.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from klet.devstack import DevStack
from klet.testbed.cluster import ControlPlane

from tests.harness.clusternode import cluster_node, wait_node_ready
from tests.harness.node import KletNode
from tests.harness.nodeaddress import host_address

NODE = "kletlogs1"


@pytest.fixture(scope="module")
def node(
    control_plane: ControlPlane, devstack: DevStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KletNode]:
    base = tmp_path_factory.mktemp("logsnode")
    with host_address() as address:
        flags = control_plane.node_flags(NODE, address)
        with cluster_node(control_plane, devstack, base, name=NODE, node_flags=flags) as kletnode:
            wait_node_ready(control_plane, NODE)
            yield kletnode


def test_node_logs_through_the_node_proxy(control_plane: ControlPlane, node: KletNode) -> None:
    cp = control_plane
    name = f"klet-test-{uuid.uuid4().hex[:8]}"
    log, escape = Path("/var/log") / f"{name}.log", Path("/var/log") / f"{name}-escape"
    log.write_text("logged for the test\n")
    escape.symlink_to("/etc/hostname")
    try:
        base = f"/api/v1/nodes/{NODE}/proxy/logs/"
        listing = cp.kubectl("get", "--raw", base, check=True).stdout
        assert f'<a href="{name}.log">{name}.log</a>' in listing
        read = cp.kubectl("get", "--raw", f"{base}{name}.log", check=True).stdout
        assert read == "logged for the test\n"
        refused = cp.kubectl("get", "--raw", f"{base}{name}-escape")
        assert refused.returncode != 0
        assert "Forbidden" in refused.stderr, refused.stderr
    finally:
        log.unlink()
        escape.unlink()
