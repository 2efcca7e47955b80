"""Volume snapshots with the real hostpath CSI driver on a klet node (issue 38 item 2).

The cluster tier's full control plane gets the snapshot.storage.k8s.io v1 CRDs and
snapshot-controller (tests/harness/snapshots.py: the release's volumesnapshots addon);
hostpathplugin v1.16.1 runs as a host process with the sidecars of upstream's
csi-hostpath StatefulSet that this needs: csi-node-driver-registrar (registers it with
klet), csi-provisioner and csi-snapshotter v8.3.0 on the driver's socket, each with the
args the manifest gives it (`-v=5`, the CSI address) plus the admin kubeconfig.

Covers, end to end: a claim on the driver written by a pod on the klet node; a
VolumeSnapshot of it (a VolumeSnapshotClass naming the driver) is bound to a
VolumeSnapshotContent whose snapshotHandle is the archive hostpathplugin's
CreateSnapshot wrote to its state directory, and becomes readyToUse with a restoreSize;
the source claim is then overwritten by another pod; a new claim with the snapshot as
its dataSource is provisioned as a different volume from the snapshot, and a pod on the
klet node reads from it what was written before the snapshot, not after. Deleting the
VolumeSnapshot (class deletionPolicy Delete) removes the content and the driver's
archive.

Needs hostpathplugin, csi-node-driver-registrar, csi-provisioner, csi-snapshotter and
snapshot-controller (minutes to build cold): only `make test-csi` (KLET_CSI_TESTS=1)
collects it.
"""

from __future__ import annotations

import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from klet.devstack import DevStack
from klet.testbed.cluster import ControlPlane

from tests.harness.clusternode import cluster_node
from tests.harness.csi import (
    Registrar,
    apply,
    csi_binaries,
    csinode_has_driver,
    kget,
    namespace,
    persistent_driver_and_class,
    print_log_tails,
    start_hostpathplugin,
    start_sidecar,
    stop_process,
)
from tests.harness.node import KletNode
from tests.harness.snapshots import (
    CRD_NAMES,
    SnapshotController,
    install_snapshot_crds,
    served_versions,
)
from tests.harness.waiting import wait_for

NODE = "kletcsisnap1"
DRIVER = "hostpath-snap.klet.test"
CLASS = "hostpath-snap"
SNAPSHOT_CLASS = "hostpath-snap"
IMAGE = "registry.klet.test/busybox:1.36"
COMPONENTS = (
    "hostpathplugin",
    "csi-node-driver-registrar",
    "csi-provisioner",
    "csi-snapshotter",
    "snapshot-controller",
)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def cp(full_control_plane: ControlPlane) -> ControlPlane:
    return full_control_plane


@pytest.fixture(scope="module")
def node(
    cp: ControlPlane, devstack: DevStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KletNode]:
    base = tmp_path_factory.mktemp("csisnap")
    with cluster_node(cp, devstack, base, name=NODE, extra_flags=["--sync-frequency=3s"]) as n:
        yield n


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="klet-csisn-"))  # short: the socket path
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def driver(cp: ControlPlane, node: KletNode, workdir: Path) -> Iterator[Path]:
    """The CRDs, snapshot-controller, hostpathplugin and its sidecars; yields the
    driver's state directory (its volumes and snapshot archives)."""
    bins = csi_binaries(COMPONENTS)
    install_snapshot_crds(cp)
    state = workdir / "state"
    state.mkdir()
    socket = workdir / "csi.sock"
    for obj in persistent_driver_and_class(DRIVER, CLASS):
        apply(cp, obj)
    apply(
        cp,
        {
            "apiVersion": "snapshot.storage.k8s.io/v1",
            "kind": "VolumeSnapshotClass",
            "metadata": {"name": SNAPSHOT_CLASS},
            "driver": DRIVER,
            "deletionPolicy": "Delete",
        },
    )
    controller = SnapshotController.start(
        bins["snapshot-controller"], cp, workdir / "snapshot-controller.log"
    )
    procs: list[subprocess.Popen[bytes]] = []
    procs.append(
        start_hostpathplugin(
            bins["hostpathplugin"],
            socket=socket,
            driver=DRIVER,
            node=NODE,
            state=state,
            log=workdir / "hostpath.log",
        )
    )
    registrar = Registrar.start(
        bins["csi-node-driver-registrar"],
        csi_socket=socket,
        registry=node.root_dir / "plugins_registry",
        log=workdir / "registrar.log",
    )
    for sidecar in ("csi-provisioner", "csi-snapshotter"):
        procs.append(
            start_sidecar(
                bins[sidecar],
                socket=socket,
                kubeconfig=cp.admin_kubeconfig,
                log=workdir / f"{sidecar}.log",
            )
        )
    wait_for(
        lambda: csinode_has_driver(cp, NODE, DRIVER), timeout_s=60, what="the driver in the CSINode"
    )
    try:
        yield state
    finally:
        print_log_tails(sorted(workdir.glob("*.log")))
        registrar.stop()
        for proc in procs:
            stop_process(proc, grace_s=15)
        controller.stop()
        cp.kubectl("delete", "volumesnapshotclass", SNAPSHOT_CLASS, "--ignore-not-found")
        cp.kubectl("delete", "storageclass", CLASS, "--ignore-not-found")
        cp.kubectl("delete", "csidriver", DRIVER, "--ignore-not-found")


@pytest.fixture
def ns(cp: ControlPlane, node: KletNode) -> Iterator[str]:
    with namespace(cp, "csisnap") as name:
        yield name


def claim(name: str, data_source: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "storageClassName": CLASS,
        "resources": {"requests": {"storage": "1Mi"}},
    }
    if data_source is not None:
        spec["dataSource"] = data_source
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name},
        "spec": spec,
    }


def pod(name: str, claim_name: str, script: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": NODE,
            "terminationGracePeriodSeconds": 1,
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim_name}}],
            "containers": [
                {
                    "name": "main",
                    "image": IMAGE,
                    "command": ["sh", "-c", f"{script}; sleep 100000"],
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                }
            ],
        },
    }


def logs(cp: ControlPlane, ns: str, name: str) -> str:
    return cp.kubectl("logs", name, "-n", ns).stdout


def bound(cp: ControlPlane, ns: str, name: str) -> bool:
    phase: str | None = kget(cp, "pvc", name, "-n", ns)["status"].get("phase")
    return phase == "Bound"


def run_to_line(cp: ControlPlane, ns: str, obj: dict[str, Any], line: str) -> None:
    """Create pod `obj`, wait for `line` in its log, delete it and wait until it is gone
    (klet unmounted its volume)."""
    name = obj["metadata"]["name"]
    apply(cp, obj, ns)
    wait_for(lambda: line in logs(cp, ns, name), timeout_s=120, what=f"{line!r} in {name}'s log")
    cp.kubectl("delete", "pod", name, "-n", ns, "--wait=false", check=True)
    wait_for(
        lambda: cp.kubectl("get", "pod", name, "-n", ns).returncode != 0,
        timeout_s=90,
        what=f"{name} gone",
    )


def test_the_crds_are_served_at_v1(cp: ControlPlane, driver: Path) -> None:
    for crd in CRD_NAMES:
        assert "v1" in served_versions(cp, crd), crd


def test_a_claim_restored_from_a_snapshot_holds_the_data_of_the_snapshot(
    cp: ControlPlane, node: KletNode, driver: Path, ns: str
) -> None:
    apply(cp, claim("source"), ns)
    wait_for(lambda: bound(cp, ns, "source"), timeout_s=90, what="the source claim bound")
    script = f"echo before-{ns} > /data/file && sync && echo written"
    run_to_line(cp, ns, pod("writer", "source", script), "written")

    apply(
        cp,
        {
            "apiVersion": "snapshot.storage.k8s.io/v1",
            "kind": "VolumeSnapshot",
            "metadata": {"name": "snap"},
            "spec": {
                "volumeSnapshotClassName": SNAPSHOT_CLASS,
                "source": {"persistentVolumeClaimName": "source"},
            },
        },
        ns,
    )

    def ready() -> dict[str, Any] | None:
        status = kget(cp, "volumesnapshot", "snap", "-n", ns).get("status") or {}
        return status if status.get("readyToUse") is True else None

    status = wait_for(ready, timeout_s=120, what="the VolumeSnapshot readyToUse")
    assert status["restoreSize"] == "1Mi", status  # the source volume's capacity
    content = kget(cp, "volumesnapshotcontent", status["boundVolumeSnapshotContentName"])
    assert content["spec"]["driver"] == DRIVER
    assert content["spec"]["volumeSnapshotRef"]["name"] == "snap"
    assert content["spec"]["volumeSnapshotRef"]["namespace"] == ns
    handle = content["status"]["snapshotHandle"]
    # hostpathplugin's CreateSnapshot: a tar archive of the volume in its state directory.
    archive = driver / f"{handle}.snap"
    with tarfile.open(archive) as tar:
        member = tar.extractfile("./file")
        assert member is not None
        assert member.read() == f"before-{ns}\n".encode()

    # The source changes after the snapshot; the restored claim must not see it.
    run_to_line(
        cp, ns, pod("overwriter", "source", "echo after > /data/file && sync && echo over"), "over"
    )

    source = {"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": "snap"}
    apply(cp, claim("restored", source), ns)
    wait_for(lambda: bound(cp, ns, "restored"), timeout_s=90, what="the restored claim bound")
    source_pv = kget(cp, "pvc", "source", "-n", ns)["spec"]["volumeName"]
    restored_pv = kget(cp, "pvc", "restored", "-n", ns)["spec"]["volumeName"]
    source_handle = kget(cp, "pv", source_pv)["spec"]["csi"]["volumeHandle"]
    restored_handle = kget(cp, "pv", restored_pv)["spec"]["csi"]["volumeHandle"]
    assert restored_handle != source_handle

    apply(cp, pod("reader", "restored", "echo read: $(cat /data/file)"), ns)
    wait_for(lambda: "read: " in logs(cp, ns, "reader"), timeout_s=120, what="the reader's line")
    assert f"read: before-{ns}" in logs(cp, ns, "reader")
    uid = kget(cp, "pod", "reader", "-n", ns)["metadata"]["uid"]
    # The restored volume is mounted by klet at the pod's CSI mount path.
    mount = node.root_dir / "pods" / uid / "volumes/kubernetes.io~csi" / restored_pv / "mount"
    assert (mount / "file").read_text() == f"before-{ns}\n"

    # deletionPolicy Delete: the snapshot deleted takes its content and the archive.
    cp.kubectl("delete", "volumesnapshot", "snap", "-n", ns, check=True, timeout_s=90)
    name = content["metadata"]["name"]
    wait_for(
        lambda: cp.kubectl("get", "volumesnapshotcontent", name).returncode != 0,
        timeout_s=60,
        what="the VolumeSnapshotContent deleted",
    )
    assert not archive.exists()
