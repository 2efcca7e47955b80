"""Raw block CSI volumes on a klet node with the real hostpath driver (issue 38 item 3).

hostpathplugin v1.16.1 (built from its release sources by tools/csi) runs as a host
process, registered with the node by upstream's csi-node-driver-registrar, and
csi-provisioner creates its volumes; kube-controller-manager binds the claims. A
`volumeMode: Block` claim's volume is a file of the driver's state directory behind a
loop device, which the driver bind-mounts at the file klet asks it to publish to.

Covers: a pod whose container lists the claim in `volumeDevices` runs; klet staged it at
upstream's `plugins/kubernetes.io/csi/volumeDevices/staging/<pv>` and published it to
`volumeDevices/publish/<pv>/<pod uid>`, linked from the pod's `volumeDevices/
kubernetes.io~csi/<pv>` (the device handed to the runtime); what the container writes to
its device is in the driver's backing file on the host; the Node lists the volume in
`volumesInUse`; the pod deleted → NodeUnpublishVolume then NodeUnstageVolume (the
driver's log), the link, publish file and staging gone before the pod object is; a second
pod on the same claim reads what the first wrote. A pod whose claim is readOnly gets
NodePublishVolume with readonly set and the device with cgroup permission "r": it reads
what a writer left and its write is refused (hostpathplugin itself ignores readonly for
a block volume, so the refusal is the permission klet gave the runtime).

Needs hostpathplugin, csi-node-driver-registrar and csi-provisioner (minutes to build
cold): only `make test-csi` (KLET_CSI_TESTS=1) collects it.
"""

from __future__ import annotations

import shutil
import subprocess
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
from tests.harness.waiting import wait_for

NODE = "kletcsiblk1"
DRIVER = "hostpath-blk.klet.test"
CLASS = "hostpath-blk"
IMAGE = "registry.klet.test/busybox:1.36"
DEVICE = "/dev/xvda"
COMPONENTS = ("hostpathplugin", "csi-node-driver-registrar", "csi-provisioner")

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def cp(full_control_plane: ControlPlane) -> ControlPlane:
    return full_control_plane


@pytest.fixture(scope="module")
def node(
    cp: ControlPlane, devstack: DevStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KletNode]:
    base = tmp_path_factory.mktemp("csiblk")
    with cluster_node(cp, devstack, base, name=NODE, extra_flags=["--sync-frequency=3s"]) as n:
        yield n


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="klet-csib-"))  # short: the socket path
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def driver(cp: ControlPlane, node: KletNode, workdir: Path) -> Iterator[Path]:
    """hostpathplugin, its registrar and csi-provisioner; yields the driver's log."""
    bins = csi_binaries(COMPONENTS)
    state = workdir / "state"
    state.mkdir()
    socket = workdir / "csi.sock"
    log = workdir / "hostpath.log"
    for obj in persistent_driver_and_class(DRIVER, CLASS):
        apply(cp, obj)
    procs: list[subprocess.Popen[bytes]] = []
    procs.append(
        start_hostpathplugin(
            bins["hostpathplugin"], socket=socket, driver=DRIVER, node=NODE, state=state, log=log
        )
    )
    registrar = Registrar.start(
        bins["csi-node-driver-registrar"],
        csi_socket=socket,
        registry=node.root_dir / "plugins_registry",
        log=workdir / "registrar.log",
    )
    procs.append(
        start_sidecar(
            bins["csi-provisioner"],
            socket=socket,
            kubeconfig=cp.admin_kubeconfig,
            log=workdir / "provisioner.log",
            args=("--v=4", "--timeout=30s"),
        )
    )
    wait_for(
        lambda: csinode_has_driver(cp, NODE, DRIVER), timeout_s=60, what="the driver in the CSINode"
    )
    try:
        yield log
    finally:
        print_log_tails([workdir / n for n in ("hostpath.log", "registrar.log", "provisioner.log")])
        registrar.stop()
        for proc in procs:
            stop_process(proc, grace_s=15)
        # The driver's loop devices over its state directory's files.
        for image in state.glob("*"):
            found = subprocess.run(
                ["losetup", "-j", str(image), "-O", "NAME", "-n"],
                check=False,
                capture_output=True,
                text=True,
            ).stdout.split()
            for dev in found:
                subprocess.run(["losetup", "-d", dev], check=False)
        cp.kubectl("delete", "storageclass", CLASS, "--ignore-not-found")
        cp.kubectl("delete", "csidriver", DRIVER, "--ignore-not-found")


@pytest.fixture
def ns(cp: ControlPlane, node: KletNode) -> Iterator[str]:
    with namespace(cp, "csiblk") as name:
        yield name


def block_pod(name: str, script: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": NODE,
            "terminationGracePeriodSeconds": 1,
            "volumes": [{"name": "raw", "persistentVolumeClaim": {"claimName": "raw"}}],
            "containers": [
                {
                    "name": "main",
                    "image": IMAGE,
                    "command": ["sh", "-c", f"{script}; sleep 100000"],
                    "volumeDevices": [{"name": "raw", "devicePath": DEVICE}],
                }
            ],
        },
    }


def logs(cp: ControlPlane, ns: str, name: str) -> str:
    return cp.kubectl("logs", name, "-n", ns).stdout


def csi_calls(log: Path) -> list[str]:
    """The Node service calls hostpathplugin logged (`GRPC call: /csi.v1.Node/...`)."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        _, sep, rest = line.partition("GRPC call: /csi.v1.Node/")
        if sep:
            out.append(rest.split()[0])
    return out


def test_a_block_claim_is_a_device_in_the_container_and_torn_down(
    cp: ControlPlane, node: KletNode, driver: Path, ns: str
) -> None:
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "raw"},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "volumeMode": "Block",
            "storageClassName": CLASS,
            "resources": {"requests": {"storage": "1Mi"}},
        },
    }
    apply(cp, claim, ns)
    wait_for(
        lambda: kget(cp, "pvc", "raw", "-n", ns)["status"].get("phase") == "Bound",
        timeout_s=90,
        what="the claim bound",
    )
    pv = kget(cp, "pvc", "raw", "-n", ns)["spec"]["volumeName"]
    handle = kget(cp, "pv", pv)["spec"]["csi"]["volumeHandle"]
    script = f"echo klet-block-{ns} > {DEVICE}; read line < {DEVICE}; echo read: $line"
    apply(cp, block_pod("writer", script), ns)
    wait_for(
        lambda: f"read: klet-block-{ns}" in logs(cp, ns, "writer"),
        timeout_s=120,
        what="the writer's read-back in its log",
    )
    uid = kget(cp, "pod", "writer", "-n", ns)["metadata"]["uid"]
    devices = node.root_dir / "plugins/kubernetes.io/csi/volumeDevices"
    link = node.root_dir / "pods" / uid / "volumeDevices/kubernetes.io~csi" / pv
    publish = devices / "publish" / pv / uid
    staging = devices / "staging" / pv
    assert Path(str(link.readlink())) == publish
    assert publish.is_block_device()  # the driver's bind of its loop device
    assert staging.is_dir()
    # What the container wrote is in the driver's backing file on the host.
    backing = driver.parent / "state" / handle
    assert backing.read_bytes().startswith(f"klet-block-{ns}\n".encode())
    unique = f"kubernetes.io/csi/{DRIVER}^{handle}"
    wait_for(
        lambda: unique in (kget(cp, "node", NODE)["status"].get("volumesInUse") or []),
        timeout_s=30,
        what="the volume in the Node's volumesInUse",
    )
    assert csi_calls(driver).count("NodeStageVolume") == 1
    assert csi_calls(driver).count("NodePublishVolume") >= 1

    cp.kubectl("delete", "pod", "writer", "-n", ns, "--wait=false", check=True)
    wait_for(
        lambda: cp.kubectl("get", "pod", "writer", "-n", ns).returncode != 0,
        timeout_s=90,
        what="the writer gone",
    )
    calls = csi_calls(driver)
    assert "NodeUnpublishVolume" in calls and "NodeUnstageVolume" in calls
    assert calls.index("NodeUnstageVolume") > calls.index("NodeUnpublishVolume")
    assert not link.is_symlink() and not publish.exists() and not staging.exists()
    assert not (devices / pv).exists()

    # The data stays with the volume: a second pod reads it.
    apply(cp, block_pod("reader", f"read line < {DEVICE}; echo read: $line"), ns)
    wait_for(
        lambda: f"read: klet-block-{ns}" in logs(cp, ns, "reader"),
        timeout_s=120,
        what="the reader's line in its log",
    )


def publish_requests(log: Path) -> list[str]:
    """The requests of the NodePublishVolume calls hostpathplugin logged (the
    `GRPC request: {...}` line after each `GRPC call: /csi.v1.Node/NodePublishVolume`)."""
    out, after_call = [], False
    for line in log.read_text(errors="replace").splitlines():
        if "GRPC call: /csi.v1.Node/" in line:
            after_call = "NodePublishVolume" in line
        elif after_call and "GRPC request:" in line:
            out.append(line)
            after_call = False
    return out


def test_a_read_only_block_claim_is_published_read_only_and_cannot_be_written(
    cp: ControlPlane, node: KletNode, driver: Path, ns: str
) -> None:
    """A claim the pod mounts readOnly: NodePublishVolume with readonly set and the device
    given to the container with cgroup permission "r" (upstream's makeBlockVolumes): the
    container reads what a writer left, its write is refused, the volume is unchanged."""
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "raw"},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "volumeMode": "Block",
            "storageClassName": CLASS,
            "resources": {"requests": {"storage": "1Mi"}},
        },
    }
    apply(cp, claim, ns)
    wait_for(
        lambda: kget(cp, "pvc", "raw", "-n", ns)["status"].get("phase") == "Bound",
        timeout_s=90,
        what="the claim bound",
    )
    pv = kget(cp, "pvc", "raw", "-n", ns)["spec"]["volumeName"]
    handle = kget(cp, "pv", pv)["spec"]["csi"]["volumeHandle"]
    apply(cp, block_pod("writer", f"echo klet-ro-{ns} > {DEVICE}; echo written"), ns)
    wait_for(lambda: "written" in logs(cp, ns, "writer"), timeout_s=120, what="the write")
    cp.kubectl("delete", "pod", "writer", "-n", ns, "--wait=false", check=True)
    wait_for(
        lambda: cp.kubectl("get", "pod", "writer", "-n", ns).returncode != 0,
        timeout_s=90,
        what="the writer gone",
    )
    seen = len(publish_requests(driver))
    script = (
        f"read line < {DEVICE}; echo read: $line; "
        f"if (echo overwritten > {DEVICE}) 2>/dev/null; then echo write: done; "
        "else echo write: refused; fi"
    )
    reader = block_pod("reader", script)
    reader["spec"]["volumes"][0]["persistentVolumeClaim"]["readOnly"] = True
    apply(cp, reader, ns)
    wait_for(
        lambda: "write: " in logs(cp, ns, "reader"),
        timeout_s=120,
        what="the reader's lines in its log",
    )
    out = logs(cp, ns, "reader")
    assert f"read: klet-ro-{ns}" in out and "write: refused" in out, out
    backing = driver.parent / "state" / handle
    assert backing.read_bytes().startswith(f"klet-ro-{ns}\n".encode())
    [request] = publish_requests(driver)[seen:]
    assert '"readonly":true' in request, request
