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

import json
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from klet.model.dra import SERVICE_V1, ClaimRef, PreparedDevice, PrepareResult
from klet.rpc.dra import GrpcDRAPlugin
from klet.syncloop.dra.registration import DRADrivers
from klet.testbed.cluster import ControlPlane

from tests.harness.dra import (
    DRATestDriver,
    allocated_claim,
    dra_test_driver_binary,
    node_object,
    slice_devices,
    until,
    watched_drivers,
)

NODE = "kletdra1"
DRIVER = "dra.klet.test"
NAMESPACE = "default"


@pytest.fixture(scope="module")
def binary() -> Path:
    return dra_test_driver_binary()


@pytest.fixture(scope="module")
def node(control_plane: ControlPlane) -> Iterator[str]:
    with node_object(control_plane, NODE) as name:
        yield name


@pytest.fixture
async def watched(tmp_path: Path) -> AsyncIterator[tuple[Path, DRADrivers[GrpcDRAPlugin]]]:
    root = tmp_path / "root"
    async with watched_drivers(root) as drivers:
        yield root, drivers


def _cdi_specs(cdi_dir: Path) -> dict[str, Any]:
    return {p.name: json.loads(p.read_text()) for p in sorted(cdi_dir.glob("*.json"))}


async def test_the_test_driver_registers_prepares_and_unprepares(
    control_plane: ControlPlane,
    node: str,
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
        node=node,
        root_dir=root,
        cdi_dir=cdi_dir,
        log=tmp_path / "dra-test-driver.log",
    )
    name = f"claim-{uuid.uuid4().hex[:8]}"
    try:
        instance = await until(lambda: drivers.current(DRIVER), what="the driver registered")
        assert instance.service == SERVICE_V1
        assert instance.endpoint.parent == root / "plugins" / DRIVER
        await until(
            lambda: re.search(r"(?i)plugin_?registered:\s*true", driver.text()),
            what="NotifyRegistrationStatus (registered) in the driver's log",
        )
        devices = await until(
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
    await until(lambda: drivers.current(DRIVER) is None, what="the driver withdrawn")
