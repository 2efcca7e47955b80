"""A real CSI driver on a private unix socket, spoken to by klet's CSI client and by
csi-test's csi-sanity: groundwork for the volume manager (issue 26).

Covers: tools/csi/build.sh builds csi-mock (the mock CSI driver that Kubernetes' storage
e2e suite embeds, k8s.io/kubernetes v1.34.4) and csi-sanity (csi-test v5.3.1) from their
Go modules, and reports them cached on a second run with nothing on stderr; csi-mock
started as a host process with its own socket and state answers klet.csi.CSIClient:
GetPluginInfo with the driver name it was given and upstream's vendor version,
NodeGetInfo with the node ID (the mock's is its driver name), the attach limit and the
topology segment, NodeGetCapabilities with STAGE_UNSTAGE_VOLUME, GET_VOLUME_STATS and
(when asked) EXPAND_VOLUME; csi-sanity's Identity, Controller and Node specs pass
against it (stage, publish, unpublish, unstage on real directories under the test's own
tree, each call in the driver's gRPC log); a driver stopped by SIGTERM removes its socket
and the client then says DriverUnavailable.

Why not the hostpath plugin and node-driver-registrar, the pair upstream's suite
deploys: they are built from their release sources (tools/csi/build.sh), minutes cold,
outside what `make test` spends on builds; `make test-csi` runs the registrar against a
klet node (tests/cluster/test_csi_sidecars.py).

csi-sanity's ModifyVolume specs and its "invalid volume attribute class" spec are left
out: the e2e mock accepts any mutable parameters (the suite's VolumeAttributesClass tests
rely on that), which those specs check it refuses.

Cost: the first run on a machine builds both binaries (csi-mock reuses the k8s.io
packages that tools/e2e and tools/cluster compiled; csi-sanity compiles csi-test's
dependencies): about 20 s with those caches warm, longer on empty Go caches (hence the
module timeout). Cached, the module takes about 2 s.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest
from klet.csi import CSIClient, DriverUnavailable

from tests.harness.csi import BUILD_SH, MockDriver, csi_binaries

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

DRIVER = "mock.csi.klet.test"
# Upstream's mock: its GetPluginInfo vendor version and its one topology segment.
MOCK_VENDOR_VERSION = "0.3.0"
MOCK_TOPOLOGY = {"io.kubernetes.storage.mock/node": "some-mock-node"}
SANITY_SKIP = r"ModifyVolume|invalid volume attribute class"


@pytest.fixture(scope="module")
def binaries() -> dict[str, Path]:
    """csi-mock and csi-sanity from tools/csi/build.sh (built when not cached)."""
    return csi_binaries(["csi-mock", "csi-sanity"])


@pytest.fixture
def workdir() -> Iterator[Path]:
    # A short path of its own: a unix socket's path must fit in 108 bytes.
    path = Path(tempfile.mkdtemp(prefix="klet-csi-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def mock_driver(binaries: dict[str, Path], workdir: Path) -> Iterator[MockDriver]:
    driver = MockDriver.start(
        binaries["csi-mock"],
        workdir,
        name=DRIVER,
        args=["--attach-limit=7", "--enable-topology", "--node-expand-required"],
    )
    yield driver
    driver.stop()


def test_build_is_cached(binaries: dict[str, Path]) -> None:
    res = subprocess.run(
        ["bash", str(BUILD_SH), "csi-mock", "csi-sanity"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert res.stderr == ""
    assert res.stdout.split() == [
        "csi-mock",
        str(binaries["csi-mock"]),
        "csi-sanity",
        str(binaries["csi-sanity"]),
    ]
    # k8s.io/kubernetes's version, and the digest of our main.go (a changed one rebuilds).
    assert binaries["csi-mock"].parent.name.startswith("v1.34.4-klet.")
    assert binaries["csi-sanity"].parent.name == "v5.3.1"


async def test_identity_and_node_info(mock_driver: MockDriver) -> None:
    client = CSIClient(mock_driver.socket, timeout_s=5)
    try:
        info = await client.plugin_info()
        assert (info.name, info.vendor_version) == (DRIVER, MOCK_VENDOR_VERSION)
        node = await client.node_info()
        assert node.node_id == DRIVER
        assert node.max_volumes_per_node == 7
        assert node.topology == MOCK_TOPOLOGY
        caps = await client.node_capabilities()
        assert {"STAGE_UNSTAGE_VOLUME", "GET_VOLUME_STATS", "EXPAND_VOLUME"} <= caps
    finally:
        await client.close()
    assert mock_driver.grpc_methods() == [
        "/csi.v1.Identity/GetPluginInfo",
        "/csi.v1.Node/NodeGetInfo",
        "/csi.v1.Node/NodeGetCapabilities",
    ]


async def test_node_without_options(binaries: dict[str, Path], workdir: Path) -> None:
    driver = MockDriver.start(binaries["csi-mock"], workdir, name=DRIVER)
    client = CSIClient(driver.socket, timeout_s=5)
    try:
        node = await client.node_info()
        assert (node.max_volumes_per_node, node.topology) == (0, {})
        assert "EXPAND_VOLUME" not in await client.node_capabilities()
    finally:
        await client.close()
        driver.stop()


def test_csi_sanity(binaries: dict[str, Path], mock_driver: MockDriver, workdir: Path) -> None:
    report = workdir / "sanity.xml"
    res = subprocess.run(
        [
            str(binaries["csi-sanity"]),
            f"--csi.endpoint={mock_driver.socket}",
            f"--csi.mountdir={workdir / 'target'}",
            f"--csi.stagingdir={workdir / 'staging'}",
            f"--ginkgo.skip={SANITY_SKIP}",
            f"--ginkgo.junit-report={report}",
            "--ginkgo.no-color",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert res.returncode == 0, res.stdout[-4000:]
    suite = ET.parse(report).getroot()
    tests, failures, errors = (int(suite.get(k, "0")) for k in ("tests", "failures", "errors"))
    skipped = int(suite.get("skipped", "0")) + int(suite.get("disabled", "0"))
    assert (failures, errors) == (0, 0)
    assert tests - skipped >= 60, f"only {tests - skipped} of {tests} specs ran"
    methods = set(mock_driver.grpc_methods())
    for m in (
        "/csi.v1.Controller/CreateVolume",
        "/csi.v1.Node/NodeStageVolume",
        "/csi.v1.Node/NodePublishVolume",
        "/csi.v1.Node/NodeUnpublishVolume",
        "/csi.v1.Node/NodeUnstageVolume",
        "/csi.v1.Controller/DeleteVolume",
    ):
        assert m in methods, f"csi-sanity never called {m}"


async def test_stopped_driver_is_unavailable(mock_driver: MockDriver) -> None:
    mock_driver.proc.send_signal(signal.SIGTERM)
    assert mock_driver.proc.wait(timeout=10) == 0
    assert not mock_driver.socket.exists()
    client = CSIClient(mock_driver.socket, timeout_s=2)
    try:
        with pytest.raises(DriverUnavailable):
            await client.plugin_info()
    finally:
        await client.close()
