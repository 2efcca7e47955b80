"""The storage suite's CSI controller sidecars against the real apiserver and a real CSI
driver: what the volume manager will find on the API when a PVC is provisioned and
expanded (issue 26, groundwork).

Covers: csi-provisioner v5.1.0 (tools/csi) with csi-mock on a private socket and the
admin kubeconfig: a PVC of a StorageClass naming the driver, carrying the
`volume.kubernetes.io/storage-provisioner` annotation that the PV controller would set,
gets a PV of the requested size with `spec.csi.driver` the driver, the volume handle
csi-mock's CreateVolume returned, the claimRef of the PVC and the class's reclaim
policy; csi-resizer v1.13.1 then expands it: once the claim is bound (spec.volumeName and
status set here, as the binder would), a larger request leads to ControllerExpandVolume
on the driver, the PV's capacity and, as the mock asks for no node expansion, the
PVC's status capacity grow to the new size.

Also: upstream's csi-node-driver-registrar v2.13.0 (built from its release sources)
registers csi-mock with a klet node (as test_csi_registration and test_csi_volumes do):
the registrar's socket in the node's `plugins_registry/` leads to the driver in the
node's CSINode with the node ID the driver gave, and the registrar logs that the node
told it it was registered; the registrar stopped (SIGTERM: it removes its socket)
withdraws the driver from the CSINode.

No kube-controller-manager: the persistentvolume-binder's part (the annotation, the
binding) is done by the test through the API, so only the sidecars and the driver are
under test. Only `make test-csi` collects it (it builds the sidecars first).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from klet.devstack import DevStack
from klet.testbed.cluster import ControlPlane

from tests.harness.clusternode import cluster_node
from tests.harness.csi import MockDriver, Registrar, csi_binaries
from tests.harness.waiting import wait_for

SIDECARS = ("csi-provisioner", "csi-resizer")

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.timeout(300),
]


@pytest.fixture
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="klet-csis-"))  # short: the socket path
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def driver(workdir: Path) -> Iterator[MockDriver]:
    mock = csi_binaries(["csi-mock"])["csi-mock"]
    d = MockDriver.start(mock, workdir, name=f"mock-{uuid.uuid4().hex[:8]}.csi.klet.test")
    yield d
    d.stop()


@pytest.fixture
def sidecars(
    control_plane: ControlPlane, driver: MockDriver, workdir: Path
) -> Iterator[dict[str, Path]]:
    """csi-provisioner and csi-resizer on the driver's socket, as the admin."""
    bins = csi_binaries(SIDECARS)
    common = [
        f"--csi-address={driver.socket}",
        f"--kubeconfig={control_plane.admin_kubeconfig}",
        "--v=5",
        "--timeout=30s",
    ]
    args = {
        # The mock's CSI driver pod runs it so (csi-mock-driver.yaml), less the Topology gate.
        "csi-provisioner": [*common, "--default-fstype=ext4", "--worker-threads=2"],
        "csi-resizer": [*common, "--workers=2"],
    }
    procs = []
    logs = {}
    for name in SIDECARS:
        logs[name] = workdir / f"{name}.log"
        with logs[name].open("wb") as out:
            procs.append(
                subprocess.Popen(
                    [str(bins[name]), *args[name]], stdout=out, stderr=subprocess.STDOUT
                )
            )
    try:
        yield logs
    finally:
        # Shown by pytest when the test failed.
        for name, log in logs.items():
            print(f"--- {name} (last lines)\n" + "\n".join(log.read_text().splitlines()[-30:]))
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def kget(cp: ControlPlane, *args: str) -> Any:
    return json.loads(cp.kubectl("get", *args, "-o", "json", check=True).stdout)


def apply(cp: ControlPlane, obj: dict[str, Any]) -> None:
    cp.kubectl("apply", "-f", "-", input=json.dumps(obj), check=True)


def test_provision_and_expand(
    control_plane: ControlPlane, driver: MockDriver, sidecars: dict[str, Path]
) -> None:
    cp = control_plane
    suffix = uuid.uuid4().hex[:8]
    sc, claim = f"csi-mock-{suffix}", f"data-{suffix}"
    apply(
        cp,
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": sc},
            "provisioner": driver.name,
            "reclaimPolicy": "Retain",
            "allowVolumeExpansion": True,
            "volumeBindingMode": "Immediate",
        },
    )
    pv_name = ""
    try:
        apply(
            cp,
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {
                    "name": claim,
                    "namespace": "default",
                    # What the persistentvolume-binder sets for a class of an external
                    # provisioner; the provisioner acts only on claims that carry it.
                    "annotations": {"volume.kubernetes.io/storage-provisioner": driver.name},
                },
                "spec": {
                    "storageClassName": sc,
                    "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "1Mi"}},
                },
            },
        )
        pvc = kget(cp, "pvc", "-n", "default", claim)

        def provisioned() -> dict[str, Any] | None:
            for pv in kget(cp, "pv")["items"]:
                if pv["spec"].get("claimRef", {}).get("uid") == pvc["metadata"]["uid"]:
                    return dict(pv)
            return None

        pv = wait_for(provisioned, timeout_s=60, what=f"a PV for {claim}")
        pv_name = pv["metadata"]["name"]
        assert pv["spec"]["csi"]["driver"] == driver.name
        assert pv["spec"]["capacity"]["storage"] == "1Mi"
        assert pv["spec"]["storageClassName"] == sc
        assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
        assert pv["spec"]["claimRef"]["name"] == claim
        created = [m for m in driver.grpc_methods() if m == "/csi.v1.Controller/CreateVolume"]
        assert len(created) == 1
        handle = pv["spec"]["csi"]["volumeHandle"]
        assert handle and handle in driver.log.read_text()

        # Bind as the persistentvolume-binder would, then ask for more.
        cp.kubectl(
            "patch", "pvc", "-n", "default", claim, "--type=merge",
            "-p", json.dumps({"spec": {"volumeName": pv_name}}), check=True,
        )  # fmt: skip
        cp.kubectl(
            "patch", "pvc", "-n", "default", claim, "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": {"phase": "Bound", "accessModes": ["ReadWriteOnce"],
                                         "capacity": {"storage": "1Mi"}}}),
            check=True,
        )  # fmt: skip
        cp.kubectl(
            "patch", "pv", pv_name, "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": {"phase": "Bound"}}), check=True,
        )  # fmt: skip
        cp.kubectl(
            "patch", "pvc", "-n", "default", claim, "--type=merge",
            "-p", json.dumps({"spec": {"resources": {"requests": {"storage": "2Mi"}}}}),
            check=True,
        )  # fmt: skip

        def expanded() -> bool:
            pv_size = kget(cp, "pv", pv_name)["spec"]["capacity"]["storage"]
            pvc_size = kget(cp, "pvc", "-n", "default", claim)["status"]["capacity"]["storage"]
            return bool(pv_size == "2Mi" and pvc_size == "2Mi")

        wait_for(expanded, timeout_s=60, what=f"{claim} and {pv_name} to grow to 2Mi")
        assert "/csi.v1.Controller/ControllerExpandVolume" in driver.grpc_methods()
    finally:
        cp.kubectl("delete", "pvc", "-n", "default", claim, "--wait=false", "--ignore-not-found")
        if pv_name:
            # Its finalizers belong to controllers that are not running here.
            cp.kubectl(
                "patch", "pv", pv_name, "--type=merge",
                "-p", json.dumps({"metadata": {"finalizers": None}}),
            )  # fmt: skip
            cp.kubectl("delete", "pv", pv_name, "--wait=false", "--ignore-not-found")
        cp.kubectl(
            "patch", "pvc", "-n", "default", claim, "--type=merge",
            "-p", json.dumps({"metadata": {"finalizers": None}}),
        )  # fmt: skip
        cp.kubectl("delete", "storageclass", sc, "--ignore-not-found")


def test_node_driver_registrar_registers_a_driver_with_klet(
    control_plane: ControlPlane,
    devstack: DevStack,
    driver: MockDriver,
    workdir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    node_name = "kletcsiregistrar1"
    registrar_bin = csi_binaries(["csi-node-driver-registrar"])["csi-node-driver-registrar"]
    base = tmp_path_factory.mktemp("registrarnode")

    def drivers() -> list[dict[str, Any]] | None:
        res = control_plane.kubectl("get", "csinode", node_name, "-o", "json")
        if res.returncode != 0:
            return None
        return list(json.loads(res.stdout).get("spec", {}).get("drivers") or [])

    with cluster_node(control_plane, devstack, base, name=node_name) as node:
        registry = node.root_dir / "plugins_registry"
        registrar = Registrar.start(
            registrar_bin,
            csi_socket=driver.socket,
            registry=registry,
            log=workdir / "registrar.log",
        )
        try:
            [entry] = wait_for(
                lambda: [d for d in drivers() or [] if d["name"] == driver.name],
                timeout_s=60,
                what="the driver in the CSINode",
            )
            assert entry["nodeID"] == driver.name  # the mock's node ID is its driver name
            assert (registry / f"{driver.name}-reg.sock").is_socket()
            wait_for(
                lambda: "PluginRegistered:true" in registrar.log.read_text(),
                timeout_s=30,
                what="the registrar told it is registered",
            )
            assert "/csi.v1.Identity/GetPluginInfo" in driver.grpc_methods()
        finally:
            registrar.stop()
        assert not (registry / f"{driver.name}-reg.sock").exists()
        wait_for(lambda: drivers() == [], timeout_s=60, what="the driver withdrawn")
