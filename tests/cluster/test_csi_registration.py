"""CSI drivers register with a klet node as with the upstream kubelet, against the real
apiserver and a real CSI server.

The driver is csi-mock (the storage e2e suite's mock CSI driver, tools/csi), which with
--registration-socket also serves the kubelet plugin registration API on a socket in the
node's `<root-dir>/plugins_registry/`, as node-driver-registrar does (the module proxy
refuses that module here). Covers: the socket appearing registers the driver (GetInfo,
NodeGetInfo, NotifyRegistrationStatus): the node's CSINode, owned by the Node, lists it
with its node ID, topology keys and volume limit, and the Node carries the
`csi.volume.kubernetes.io/nodeid` annotation and the topology label; syncloop restarted
while the driver runs keeps it registered (the driver is asked again); the driver
stopped (its sockets removed) while syncloop is down is dropped by the restarted
syncloop; a driver stopped while syncloop runs leaves the CSINode.
"""

from __future__ import annotations

import json
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from klet.devstack import DevStack
from klet.testbed.cluster import ControlPlane

from tests.harness.clusternode import cluster_node
from tests.harness.csi import MockDriver, csi_binaries
from tests.harness.node import KletNode
from tests.harness.waiting import wait_for

NODE = "kletcsireg1"
DRIVER = "csi-mock.klet.test"
MOCK_TOPOLOGY_KEY = "io.kubernetes.storage.mock/node"


@pytest.fixture(scope="module")
def node(
    control_plane: ControlPlane, devstack: DevStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KletNode]:
    base = tmp_path_factory.mktemp("csiregnode")
    with cluster_node(control_plane, devstack, base, name=NODE) as kletnode:
        yield kletnode


@pytest.fixture(scope="module")
def mock_binary() -> Path:
    return csi_binaries(["csi-mock"])["csi-mock"]


def start_driver(node: KletNode, binary: Path, workdir: Path) -> MockDriver:
    registration = node.root_dir / "plugins_registry" / f"{DRIVER}-reg.sock"
    registration.parent.mkdir(parents=True, exist_ok=True)
    return MockDriver.start(
        binary,
        workdir,
        name=DRIVER,
        args=[f"--registration-socket={registration}", "--attach-limit=5", "--enable-topology"],
    )


def stop_driver(driver: MockDriver) -> None:
    """A clean stop: the driver removes both of its sockets."""
    driver.proc.send_signal(signal.SIGTERM)
    driver.proc.wait(10)


def csinode_drivers(cp: ControlPlane) -> list[dict[str, Any]] | None:
    res = cp.kubectl("get", "csinode", NODE, "-o", "json")
    if res.returncode != 0:
        return None
    return list(json.loads(res.stdout).get("spec", {}).get("drivers") or [])


def node_object(cp: ControlPlane) -> dict[str, Any]:
    res = cp.kubectl("get", "node", NODE, "-o", "json", check=True)
    out: dict[str, Any] = json.loads(res.stdout)
    return out


def registered(cp: ControlPlane) -> list[dict[str, Any]] | None:
    drivers = csinode_drivers(cp)
    return drivers if drivers and drivers[0]["name"] == DRIVER else None


def withdrawn(cp: ControlPlane) -> bool:
    return csinode_drivers(cp) == []


def test_a_driver_registers_and_withdraws(
    node: KletNode, control_plane: ControlPlane, mock_binary: Path
) -> None:
    with tempfile.TemporaryDirectory(prefix="csi-", dir="/tmp") as work:
        driver = start_driver(node, mock_binary, Path(work))
        try:
            [entry] = wait_for(
                lambda: registered(control_plane), timeout_s=60, what="the driver in the CSINode"
            )
            assert entry["topologyKeys"] == [MOCK_TOPOLOGY_KEY]
            assert entry["allocatable"] == {"count": 5}
            node_id = entry["nodeID"]
            assert node_id
            n = node_object(control_plane)
            annotation = n["metadata"]["annotations"]["csi.volume.kubernetes.io/nodeid"]
            assert json.loads(annotation) == {DRIVER: node_id}
            assert MOCK_TOPOLOGY_KEY in n["metadata"]["labels"]
            csinode = json.loads(
                control_plane.kubectl("get", "csinode", NODE, "-o", "json", check=True).stdout
            )
            [owner] = csinode["metadata"]["ownerReferences"]
            assert (owner["kind"], owner["name"], owner["uid"]) == (
                "Node",
                NODE,
                n["metadata"]["uid"],
            )
            assert "GetInfo" in driver.log.read_text()  # asked through the registration socket
            assert "/csi.v1.Node/NodeGetInfo" in driver.grpc_methods()

            # syncloop restarted while the driver runs: it is asked again and stays.
            node.stop("syncloop")
            node.start("syncloop")
            wait_for(
                lambda: driver.log.read_text().count("registration: registered") >= 2,
                timeout_s=60,
                what="the driver registered again by the new syncloop",
            )
            assert registered(control_plane)
        finally:
            stop_driver(driver)
        wait_for(lambda: withdrawn(control_plane), timeout_s=60, what="the driver withdrawn")
        n = node_object(control_plane)
        assert "csi.volume.kubernetes.io/nodeid" not in (n["metadata"].get("annotations") or {})


def test_a_driver_gone_while_syncloop_was_down_is_dropped(
    node: KletNode, control_plane: ControlPlane, mock_binary: Path
) -> None:
    with tempfile.TemporaryDirectory(prefix="csi-", dir="/tmp") as work:
        driver = start_driver(node, mock_binary, Path(work))
        try:
            wait_for(lambda: registered(control_plane), timeout_s=60, what="the driver registered")
            node.stop("syncloop")
        finally:
            stop_driver(driver)
        node.start("syncloop")
        wait_for(lambda: withdrawn(control_plane), timeout_s=60, what="the stale driver dropped")
