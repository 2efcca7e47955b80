"""Upstream's DRA test driver registers through klet's plugin watcher and prepares and
unprepares a claim over the DRA gRPC API (issue 40 item 5, the first layer).

The driver is k8s.io/kubernetes v1.34.4's test/e2e/dra/test-driver in its kubelet-plugin
mode (tools/dra/build.sh), against the harness's apiserver: it publishes a ResourceSlice
for the node and, on NodePrepareResources, reads the claim from the apiserver. syncloop's
registration path runs in-process: the plugin watcher on a scratch root dir's
`plugins_registry/`, the registrar asking GetInfo over the real socket and handing the
`DRAPlugin` to `DRADrivers`, the driver told the outcome (NotifyRegistrationStatus), and
`klet.rpc.dra` calling the service the registration chose. Covers: the registration is
accepted (v1.DRAPlugin chosen, the endpoint under `<root-dir>/plugins/<driver>/`, the
driver's log says it was registered); NodePrepareResources of a ResourceClaim made here
and allocated to a device of the driver's ResourceSlice answers that device with its
CDI device ID, and the driver's CDI spec file with that device appears;
NodeUnprepareResources removes the file; the driver stopped (its registration socket
removed) withdraws it. No pod: pods with resourceClaims are still refused at admission.
Only `make test-dra` (KLET_DRA_TESTS=1) collects it.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from klet.bus import NodeBus
from klet.csi import CSIClient, RegistrationClient
from klet.model.dra import DRA_PLUGIN, SERVICE_V1, ClaimRef, PreparedDevice, PrepareResult
from klet.rpc.dra import GrpcDRAPlugin
from klet.syncloop.dra.registration import DRADrivers, DriverInstance
from klet.syncloop.plugins.csidrivers import CSIRegistrar
from klet.syncloop.plugins.watcher import PluginWatcher
from klet.testbed.cluster import ControlPlane
from klet.testbed.fakes.bus import FakeBus

from tests.harness.dra import (
    DRATestDriver,
    allocated_claim,
    dra_test_driver_binary,
    slice_devices,
)

NODE = "kletdra1"
DRIVER = "dra.klet.test"
NAMESPACE = "default"


@pytest.fixture(scope="module")
def binary() -> Path:
    return dra_test_driver_binary()


@pytest.fixture(scope="module")
def node_object(control_plane: ControlPlane) -> Iterator[str]:
    """The Node the driver publishes its ResourceSlice for (its owner)."""
    manifest = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}
    control_plane.kubectl("apply", "-f", "-", input=json.dumps(manifest), check=True)
    yield NODE
    control_plane.kubectl("delete", "node", NODE, "--wait=false")


def _connect(instance: DriverInstance) -> GrpcDRAPlugin:
    return GrpcDRAPlugin(instance.endpoint, driver=instance.driver, service=instance.service)


@pytest.fixture
async def watched(tmp_path: Path) -> AsyncIterator[tuple[Path, DRADrivers[GrpcDRAPlugin]]]:
    """syncloop's registration path on a scratch root dir, polled every 0.1 s."""
    root = tmp_path / "root"
    drivers = DRADrivers(root_dir=root, connect=_connect)
    registrar = CSIRegistrar(
        NodeBus.of(FakeBus(), service="syncloop").csidrivers,  # the CSI table: unused here
        registration=RegistrationClient,
        driver=CSIClient,
        handlers={DRA_PLUGIN: drivers},
    )
    watcher = PluginWatcher(root / "plugins_registry", registrar, interval_s=0.1)
    task = asyncio.create_task(watcher.run(), name="plugin-watcher")
    try:
        yield root, drivers
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def _until(check: Any, *, what: str, timeout_s: float = 60.0) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        got = check()
        if got:
            return got
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.2)


def _cdi_specs(cdi_dir: Path) -> dict[str, Any]:
    return {p.name: json.loads(p.read_text()) for p in sorted(cdi_dir.glob("*.json"))}


async def test_the_test_driver_registers_prepares_and_unprepares(
    control_plane: ControlPlane,
    node_object: str,
    binary: Path,
    watched: tuple[Path, DRADrivers[GrpcDRAPlugin]],
    tmp_path: Path,
) -> None:
    root, drivers = watched
    cdi_dir = tmp_path / "cdi"
    driver = DRATestDriver.start(
        binary,
        kubeconfig=control_plane.admin_kubeconfig,
        driver=DRIVER,
        node=node_object,
        root_dir=root,
        cdi_dir=cdi_dir,
        log=tmp_path / "dra-test-driver.log",
    )
    name = f"claim-{uuid.uuid4().hex[:8]}"
    try:
        instance = await _until(lambda: drivers.current(DRIVER), what="the driver registered")
        assert instance.service == SERVICE_V1
        assert instance.endpoint.parent == root / "plugins" / DRIVER
        await _until(
            lambda: re.search(r"(?i)plugin_?registered:\s*true", driver.text()),
            what="NotifyRegistrationStatus (registered) in the driver's log",
        )
        devices = await _until(
            lambda: slice_devices(control_plane, DRIVER, NODE), what="the driver's ResourceSlice"
        )
        uid = allocated_claim(control_plane, name, NAMESPACE, DRIVER, NODE, devices[0])
        ref = ClaimRef(namespace=NAMESPACE, name=name, uid=uid)
        cdi_id = f"{DRIVER}/test=claim-{uid}-req-0"

        plugin = drivers.client(DRIVER)
        try:
            got = await plugin.prepare([ref])
            assert got == {
                uid: PrepareResult(
                    devices=(
                        PreparedDevice(
                            pool_name=NODE,
                            device_name=devices[0],
                            request_names=("req-0",),
                            cdi_device_ids=(cdi_id,),
                        ),
                    )
                )
            }, driver.text()[-3000:]
            specs = _cdi_specs(cdi_dir)
            assert len(specs) == 1, specs
            [spec] = specs.values()
            assert spec["kind"] == f"{DRIVER}/test"
            assert [d["name"] for d in spec["devices"]] == [f"claim-{uid}-req-0"]

            assert await plugin.unprepare([ref]) == {uid: ""}
            assert _cdi_specs(cdi_dir) == {}
        finally:
            await plugin.close()
    finally:
        driver.stop()
        control_plane.kubectl("delete", "resourceclaim", name, "-n", NAMESPACE, "--wait=false")
    await _until(lambda: drivers.current(DRIVER) is None, what="the driver withdrawn")
