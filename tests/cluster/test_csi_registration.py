"""CSI drivers register with a klet node as with the upstream kubelet, against the real
apiserver, a real CSI server and upstream's registrar.

The driver is csi-mock (the storage e2e suite's mock CSI driver, tools/csi) with
upstream's csi-node-driver-registrar v2.13.0 beside it (built by tools/csi from its
release sources), as the suite's CSI Mock pods run them: the registrar asks the driver
for its name and serves the kubelet plugin registration API at
`<root-dir>/plugins_registry/<driver>-reg.sock`. Covers: that socket appearing registers
the driver (GetInfo, NodeGetInfo on the driver, NotifyRegistrationStatus): the node's
CSINode, owned by the Node, lists it with its node ID, topology keys and volume limit,
and the Node carries the `csi.volume.kubernetes.io/nodeid` annotation and the topology
label; syncloop restarted while the driver runs keeps it registered (the registrar is
asked again and told again); the driver stopped while syncloop is down (both processes
SIGTERMed, as the kubelet stops a driver's pod: the registrar removes its socket) is
dropped by the restarted syncloop; a driver stopped so while syncloop runs leaves the
CSINode and the Node's annotation.

Without the release sources the registrar is built from (../shared/third_party/
kubernetes-csi or $KLET_CSI_SRC), the module skips at collection, naming the directory
and how to supply it, in pytest's summary (`-rs`).
"""

from __future__ import annotations

import json
import signal
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from klet.devstack import DevStack
from klet.testbed.cluster import ControlPlane

from tests.harness.clusternode import cluster_node
from tests.harness.csi import MockDriver, Registrar, csi_binaries, release_sources_missing
from tests.harness.node import KletNode
from tests.harness.waiting import wait_for

NODE = "kletcsireg1"
DRIVER = "csi-mock.klet.test"
MOCK_TOPOLOGY_KEY = "io.kubernetes.storage.mock/node"
BINARIES = ("csi-mock", "csi-node-driver-registrar")

_missing = release_sources_missing()
if _missing is not None:
    pytest.skip(_missing, allow_module_level=True)


@pytest.fixture(scope="module")
def node(
    control_plane: ControlPlane, devstack: DevStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KletNode]:
    base = tmp_path_factory.mktemp("csiregnode")
    with cluster_node(control_plane, devstack, base, name=NODE) as kletnode:
        yield kletnode


@pytest.fixture(scope="module")
def binaries() -> dict[str, Path]:
    return csi_binaries(BINARIES)


@dataclass
class Driver:
    """csi-mock and the registrar beside it: the driver's node plugin, as a pod of two
    containers."""

    mock: MockDriver
    registrar: Registrar
    registration: Path  # the registrar's socket in the node's plugins_registry


def start_driver(node: KletNode, binaries: dict[str, Path], workdir: Path) -> Driver:
    mock = MockDriver.start(
        binaries["csi-mock"],
        workdir,
        name=DRIVER,
        args=["--attach-limit=5", "--enable-topology"],
    )
    registry = node.root_dir / "plugins_registry"
    registrar = Registrar.start(
        binaries["csi-node-driver-registrar"],
        csi_socket=mock.socket,
        registry=registry,
        log=workdir / "registrar.log",
    )
    return Driver(mock=mock, registrar=registrar, registration=registry / f"{DRIVER}-reg.sock")


def stop_driver(driver: Driver) -> None:
    """A clean stop, as the kubelet stops a driver's pod: SIGTERM to both processes; the
    registrar removes its registration socket and exits 0, the mock removes its CSI
    socket."""
    driver.registrar.stop()
    driver.mock.proc.send_signal(signal.SIGTERM)
    driver.mock.proc.wait(10)
    assert driver.registrar.proc.returncode == 0, driver.registrar.log.read_text()[-3000:]
    assert not driver.registration.exists()


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
    node: KletNode, control_plane: ControlPlane, binaries: dict[str, Path]
) -> None:
    with tempfile.TemporaryDirectory(prefix="csi-", dir="/tmp") as work:
        driver = start_driver(node, binaries, Path(work))
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
            assert driver.registration.is_socket()
            assert driver.registrar.info_requests() >= 1  # asked through its socket
            wait_for(
                lambda: driver.registrar.registrations() >= 1,
                timeout_s=30,
                what="the registrar told the driver is registered",
            )
            assert "/csi.v1.Node/NodeGetInfo" in driver.mock.grpc_methods()

            # syncloop restarted while the driver runs: it is asked again and stays.
            node.stop("syncloop")
            node.start("syncloop")
            wait_for(
                lambda: driver.registrar.registrations() >= 2,
                timeout_s=60,
                what="the driver registered again by the new syncloop",
            )
            assert driver.registrar.info_requests() >= 2
            assert registered(control_plane)
        finally:
            stop_driver(driver)
        wait_for(lambda: withdrawn(control_plane), timeout_s=60, what="the driver withdrawn")
        n = node_object(control_plane)
        assert "csi.volume.kubernetes.io/nodeid" not in (n["metadata"].get("annotations") or {})


def test_a_driver_gone_while_syncloop_was_down_is_dropped(
    node: KletNode, control_plane: ControlPlane, binaries: dict[str, Path]
) -> None:
    with tempfile.TemporaryDirectory(prefix="csi-", dir="/tmp") as work:
        driver = start_driver(node, binaries, Path(work))
        try:
            wait_for(lambda: registered(control_plane), timeout_s=60, what="the driver registered")
            node.stop("syncloop")
        finally:
            stop_driver(driver)
        node.start("syncloop")
        wait_for(lambda: withdrawn(control_plane), timeout_s=60, what="the stale driver dropped")
