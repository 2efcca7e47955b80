"""Pods with persistent and CSI volumes on a klet node: the volume manager against the real
apiserver, kube-controller-manager (the PV binder, attach-detach, the protection,
ephemeral-volume and StatefulSet controllers), csi-provisioner and a real CSI driver.

The driver is csi-mock (the storage e2e suite's mock driver, tools/csi), registered
with the node by upstream's csi-node-driver-registrar v2.13.0 beside it (built by
tools/csi from its release sources), as the suite's CSI Mock pods run them, with a
CSIDriver object that needs no attach (the module proxy here serves no external-attacher) and
asks for pod info on mount; csi-provisioner creates its volumes for the claims. csi-mock
keeps volumes in memory and publishes one by making the target directory, so what these
tests see of a "mount" is that directory and the driver's log of CSI calls.

Covers: a claim's pod gets NodeStageVolume at the node's global path and
NodePublishVolume at the pod's volume directory (upstream's layout and vol_data.json),
runs, and the pod's fsGroup owns what it writes; the Node lists it in volumesInUse and
status-reporter's kubelet_volume_stats_* give the driver's NodeGetVolumeStats; the PV
grown with the claim waiting for the node → NodeExpandVolume, the claim's status
capacity grown and FileSystemResizeSuccessful on the pod and the claim; the pod deleted
→ NodeUnpublishVolume and then NodeUnstageVolume, no directory left, before the API
object is gone; syncloop SIGKILLed while such a pod runs → no container restarted, the
volume still there, and torn down by the new syncloop when the pod goes; an inline CSI
volume and a generic ephemeral volume; a local PV (its claim's
kubelet_volume_stats_capacity_bytes the statfs total of its directory); a Block-mode
local PV on a loop device, written through `volumeDevices` (and refused in
`volumeMounts`); a Filesystem-mode local PV on a blank loop device, formatted, mounted
for the node and bound into the pod, unmounted with its last pod, its data there for
the next; a
StatefulSet's pod deleted and recreated reads the data it wrote (on a local PV: the mock
keeps no data); bad input (a claim
that does not exist, one that is not bound, a driver that is not registered, a driver
that does not answer) → FailedMount Events naming the cause while the pod waits in
ContainerCreating, and retried once the cause is gone; a CSIDriver that requires attach
→ the attach-detach controller makes its VolumeAttachment, the pod waits for the Node's
volumesAttached (FailedMount naming it) and stages with the VolumeAttachment's metadata
once the test, playing external-attacher, marks it attached; detached only once the
node has unmounted it.

The tests that use the driver need the registrar: without the release sources it is
built from (../shared/third_party/kubernetes-csi or $KLET_CSI_SRC) they skip at
collection, naming the directory and how to supply it (pytest's `-rs` summary); the
local PV tests run either way.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import signal
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
    MockDriver,
    Registrar,
    apply,
    csi_binaries,
    csinode_has_driver,
    kget,
    namespace,
    print_log_tails,
    release_sources_missing,
)
from tests.harness.node import KletNode
from tests.harness.waiting import wait_for

NODE = "kletcsivol1"
DRIVER = "csi-mock-vol.klet.test"
CLASS = "csi-mock-vol"
IMAGE = "registry.klet.test/busybox:1.36"

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

_missing = release_sources_missing()
# On each test that takes the `driver` fixture.
needs_registrar = pytest.mark.skipif(_missing is not None, reason=_missing or "")


@pytest.fixture(scope="module")
def cp(full_control_plane: ControlPlane) -> ControlPlane:
    return full_control_plane


@pytest.fixture(scope="module")
def node(
    cp: ControlPlane, devstack: DevStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KletNode]:
    base = tmp_path_factory.mktemp("csivol")
    with cluster_node(
        cp,
        devstack,
        base,
        name=NODE,
        extra_flags=["--volume-stats-agg-period=1s", "--sync-frequency=3s"],
    ) as kletnode:
        yield kletnode


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="klet-csiv-"))  # short: the socket paths
    yield path
    shutil.rmtree(path, ignore_errors=True)


def start_mock(workdir: Path) -> MockDriver:
    return MockDriver.start(
        csi_binaries(["csi-mock"])["csi-mock"],
        workdir,
        name=DRIVER,
        args=["--disable-attach", "--node-expand-required"],
    )


@pytest.fixture(scope="module")
def driver(cp: ControlPlane, node: KletNode, workdir: Path) -> Iterator[dict[str, Any]]:
    """csi-mock registered by csi-node-driver-registrar (key "registrar"), its CSIDriver
    and StorageClass, and csi-provisioner; a dict so that a test may replace the driver
    process (key "mock")."""
    apply(cp, csidriver(attach=False))
    apply(
        cp,
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": CLASS},
            "provisioner": DRIVER,
            "reclaimPolicy": "Delete",
            "volumeBindingMode": "Immediate",
        },
    )
    state: dict[str, Any] = {"mock": start_mock(workdir)}
    state["registrar"] = Registrar.start(
        csi_binaries(["csi-node-driver-registrar"])["csi-node-driver-registrar"],
        csi_socket=state["mock"].socket,
        registry=node.root_dir / "plugins_registry",
        log=workdir / "registrar.log",
    )
    provisioner_log = workdir / "provisioner.log"
    with provisioner_log.open("wb") as out:
        provisioner = subprocess.Popen(
            [
                str(csi_binaries(["csi-provisioner"])["csi-provisioner"]),
                f"--csi-address={state['mock'].socket}",
                f"--kubeconfig={cp.admin_kubeconfig}",
                "--v=4",
                "--timeout=30s",
                "--worker-threads=2",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    wait_for(
        lambda: csinode_has_driver(cp, NODE, DRIVER), timeout_s=60, what="the driver in the CSINode"
    )
    try:
        yield state
    finally:
        print_log_tails([provisioner_log, state["registrar"].log], lines=30)
        provisioner.terminate()
        provisioner.wait(15)
        state["registrar"].stop()
        state["mock"].stop()
        cp.kubectl("delete", "storageclass", CLASS, "--ignore-not-found")
        cp.kubectl("delete", "csidriver", DRIVER, "--ignore-not-found")


def csidriver(*, attach: bool) -> dict[str, Any]:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "CSIDriver",
        "metadata": {"name": DRIVER},
        "spec": {
            "attachRequired": attach,
            "podInfoOnMount": True,
            "volumeLifecycleModes": ["Persistent", "Ephemeral"],
            "fsGroupPolicy": "File",
        },
    }


@pytest.fixture
def ns(cp: ControlPlane, node: KletNode) -> Iterator[str]:
    with namespace(cp, "csivol") as name:
        yield name


def claim(name: str, *, storage_class: str = CLASS, size: str = "1Mi") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": storage_class,
            "resources": {"requests": {"storage": size}},
        },
    }


def pod(name: str, volume: dict[str, Any], *, fs_group: int | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeName": NODE,
        "terminationGracePeriodSeconds": 1,
        "volumes": [{"name": "data", **volume}],
        "containers": [
            {
                "name": "main",
                "image": IMAGE,
                "command": ["sh", "-c", "echo written-by-$HOSTNAME > /data/file; sleep 100000"],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            }
        ],
    }
    if fs_group is not None:
        spec["securityContext"] = {"fsGroup": fs_group}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def create(cp: ControlPlane, ns: str, obj: dict[str, Any]) -> None:
    cp.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(obj), check=True)


def running(cp: ControlPlane, ns: str, name: str) -> dict[str, Any] | None:
    p = kget(cp, "pod", name, "-n", ns)
    return p if p["status"].get("phase") == "Running" else None


def waiting_reason(cp: ControlPlane, ns: str, name: str) -> str | None:
    statuses = kget(cp, "pod", name, "-n", ns)["status"].get("containerStatuses") or []
    return next((s["state"].get("waiting", {}).get("reason") for s in statuses), None)


def failed_mount(cp: ControlPlane, ns: str, name: str, text: str) -> bool:
    events = kget(cp, "events", "-n", ns, f"--field-selector=involvedObject.name={name}")
    return any(
        e["reason"] == "FailedMount" and e["type"] == "Warning" and text in e["message"]
        for e in events["items"]
    )


def resize_succeeded(cp: ControlPlane, ns: str, kind: str, name: str, message: str) -> bool:
    events = kget(cp, "events", "-n", ns, f"--field-selector=involvedObject.name={name}")
    return any(
        e["reason"] == "FileSystemResizeSuccessful"
        and e["type"] == "Normal"
        and e["involvedObject"]["kind"] == kind
        and e["message"] == message
        for e in events["items"]
    )


def volume_dirs(node: KletNode, uid: str) -> list[Path]:
    return sorted((node.root_dir / "pods" / uid / "volumes" / "kubernetes.io~csi").glob("*"))


def staged(node: KletNode) -> list[Path]:
    """The driver's volumes' directories under the node's global path (`<sha256>`)."""
    return sorted((node.root_dir / "plugins" / "kubernetes.io" / "csi" / DRIVER).glob("*"))


def volumes_in_use(cp: ControlPlane) -> list[str]:
    return list(kget(cp, "node", NODE)["status"].get("volumesInUse") or [])


def delete_pod(cp: ControlPlane, ns: str, name: str) -> None:
    cp.kubectl("delete", "pod", name, "-n", ns, "--wait=false", check=True)
    wait_for(
        lambda: cp.kubectl("get", "pod", name, "-n", ns).returncode != 0,
        timeout_s=90,
        what=f"pod {name} gone",
    )


@needs_registrar
def test_a_claims_volume_is_staged_published_and_torn_down(
    cp: ControlPlane, node: KletNode, driver: dict[str, Any], ns: str
) -> None:
    mock: MockDriver = driver["mock"]
    create(cp, ns, claim("data"))
    create(cp, ns, pod("app", {"persistentVolumeClaim": {"claimName": "data"}}, fs_group=4321))
    p = wait_for(lambda: running(cp, ns, "app"), timeout_s=120, what="app Running")
    uid = p["metadata"]["uid"]
    pv = kget(cp, "pvc", "data", "-n", ns)["spec"]["volumeName"]
    handle = kget(cp, "pv", pv)["spec"]["csi"]["volumeHandle"]

    [volume_dir] = volume_dirs(node, uid)
    assert volume_dir.name == pv  # upstream's layout: the PV's name
    data = json.loads((volume_dir / "vol_data.json").read_text())
    assert data["driverName"] == DRIVER and data["volumeHandle"] == handle
    [global_dir] = staged(node)
    assert sorted(p.name for p in global_dir.iterdir()) == ["globalmount", "vol_data.json"]
    assert json.loads((global_dir / "vol_data.json").read_text())["volumeHandle"] == handle
    written = wait_for(
        lambda: (volume_dir / "mount" / "file").exists() and volume_dir / "mount" / "file",
        timeout_s=30,
        what="the container's file in the published volume",
    )
    assert written.read_text() == "written-by-app\n"
    assert (volume_dir / "mount").stat().st_gid == 4321  # fsGroupPolicy File
    methods = mock.grpc_methods()
    assert methods.index("/csi.v1.Node/NodeStageVolume") < methods.index(
        "/csi.v1.Node/NodePublishVolume"
    )
    unique = f"kubernetes.io/csi/{DRIVER}^{handle}"
    wait_for(lambda: unique in volumes_in_use(cp), timeout_s=60, what="volumesInUse")
    capacity = wait_for(
        lambda: node.metric(
            "status-reporter",
            "kubelet_volume_stats_capacity_bytes",
            namespace=ns,
            persistentvolumeclaim="data",
        ),
        timeout_s=60,
        what="the claim's volume stats metric",
    )
    assert capacity == 1 << 20  # what csi-mock's NodeGetVolumeStats says: the claim's size

    # Online expansion, the controller side done by hand as csi-resizer would leave it:
    # the PV grown, the claim waiting for the node.
    cp.kubectl(
        "patch",
        "pv",
        pv,
        "--type=merge",
        "-p",
        '{"spec":{"capacity":{"storage":"2Mi"}}}',
        check=True,
    )
    resize = {
        "status": {
            "allocatedResourceStatuses": {"storage": "NodeResizePending"},
            "conditions": [{"type": "FileSystemResizePending", "status": "True"}],
        }
    }
    cp.kubectl(
        "patch",
        "pvc",
        "data",
        "-n",
        ns,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(resize),
        check=True,
    )
    grown = wait_for(
        lambda: (
            (c := kget(cp, "pvc", "data", "-n", ns))["status"]["capacity"]["storage"] == "2Mi" and c
        ),
        timeout_s=60,
        what="the claim's status capacity grown by the node",
    )
    assert not grown["status"].get("conditions")
    assert "/csi.v1.Node/NodeExpandVolume" in mock.grpc_methods()
    # upstream's FileSystemResizeSuccessful, on the pod and on the claim
    success = f'MountVolume.NodeExpandVolume succeeded for volume "{pv}" {node.node_name}'
    for kind, name in (("Pod", "app"), ("PersistentVolumeClaim", "data")):
        wait_for(
            functools.partial(resize_succeeded, cp, ns, kind, name, success),
            timeout_s=30,
            what=f"FileSystemResizeSuccessful on the {kind}",
        )

    delete_pod(cp, ns, "app")
    # The API object goes only once the volume is unpublished and unstaged (upstream's
    # status manager waits for the volumes too).
    assert "/csi.v1.Node/NodeUnstageVolume" in mock.grpc_methods()
    assert volume_dirs(node, uid) == []
    methods = mock.grpc_methods()
    assert methods.index("/csi.v1.Node/NodeUnpublishVolume") < methods.index(
        "/csi.v1.Node/NodeUnstageVolume"
    )
    assert staged(node) == []
    wait_for(lambda: unique not in volumes_in_use(cp), timeout_s=60, what="out of volumesInUse")


@needs_registrar
def test_syncloop_killed_while_a_csi_volume_is_in_use(
    cp: ControlPlane, node: KletNode, driver: dict[str, Any], ns: str
) -> None:
    mock: MockDriver = driver["mock"]
    create(cp, ns, claim("kept"))
    create(cp, ns, pod("kept", {"persistentVolumeClaim": {"claimName": "kept"}}))
    p = wait_for(lambda: running(cp, ns, "kept"), timeout_s=120, what="kept Running")
    uid = p["metadata"]["uid"]
    before = p["status"]["containerStatuses"][0]
    [volume_dir] = volume_dirs(node, uid)

    node.kill("syncloop")
    node.start("syncloop")
    wait_for(
        lambda: node.pods().get("kept", {}).get("status", {}).get("phase") == "Running",
        timeout_s=60,
        what="kept Running after the restart",
    )
    after = kget(cp, "pod", "kept", "-n", ns)["status"]["containerStatuses"][0]
    assert (after["containerID"], after["restartCount"]) == (before["containerID"], 0)
    assert (volume_dir / "mount" / "file").read_text() == "written-by-kept\n"

    unpublished = mock.grpc_methods().count("/csi.v1.Node/NodeUnpublishVolume")
    delete_pod(cp, ns, "kept")
    wait_for(
        lambda: mock.grpc_methods().count("/csi.v1.Node/NodeUnpublishVolume") > unpublished,
        timeout_s=60,
        what="the new syncloop unpublishing the volume",
    )
    wait_for(lambda: not volume_dirs(node, uid), timeout_s=30, what="the volume removed")
    wait_for(lambda: staged(node) == [], timeout_s=30, what="the volume unstaged")


@needs_registrar
def test_inline_and_generic_ephemeral_volumes(
    cp: ControlPlane, node: KletNode, driver: dict[str, Any], ns: str
) -> None:
    create(cp, ns, pod("inline", {"csi": {"driver": DRIVER}}))
    template = {"spec": claim("unused")["spec"]}
    create(cp, ns, pod("generic", {"ephemeral": {"volumeClaimTemplate": template}}))
    inline = wait_for(lambda: running(cp, ns, "inline"), timeout_s=120, what="inline Running")
    generic = wait_for(lambda: running(cp, ns, "generic"), timeout_s=120, what="generic Running")
    [inline_dir] = volume_dirs(node, inline["metadata"]["uid"])
    assert inline_dir.name == "data"  # an inline volume: the pod's volume name
    data = json.loads((inline_dir / "vol_data.json").read_text())
    assert data["volumeLifecycleMode"] == "Ephemeral"
    owner = kget(cp, "pvc", "generic-data", "-n", ns)["metadata"]["ownerReferences"][0]
    assert owner["uid"] == generic["metadata"]["uid"]
    [generic_dir] = volume_dirs(node, generic["metadata"]["uid"])
    assert json.loads((generic_dir / "vol_data.json").read_text())["volumeLifecycleMode"] == (
        "Persistent"
    )
    for name in ("inline", "generic"):
        delete_pod(cp, ns, name)
    assert volume_dirs(node, inline["metadata"]["uid"]) == []


def local_pv(
    cp: ControlPlane,
    name: str,
    path: Path,
    *,
    storage_class: str,
    claim_ref: Any = None,
    block: bool = False,
) -> None:
    """A `local` PV of `path` on the node (node affinity to it)."""
    term = {
        "matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [NODE]}]
    }
    spec: dict[str, Any] = {
        "capacity": {"storage": "1Mi"},
        "accessModes": ["ReadWriteOnce"],
        "storageClassName": storage_class,
        "persistentVolumeReclaimPolicy": "Retain",
        "local": {"path": str(path)},
        "nodeAffinity": {"required": {"nodeSelectorTerms": [term]}},
    }
    if claim_ref:
        spec["claimRef"] = claim_ref
    if block:
        spec["volumeMode"] = "Block"
    apply(
        cp,
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name}, "spec": spec},
    )


def test_a_local_pv(cp: ControlPlane, node: KletNode, ns: str, tmp_path: Path) -> None:
    local = tmp_path / "disk"
    local.mkdir()
    (local / "hello").write_text("from the node\n")
    name = f"local-{ns}"
    local_pv(
        cp, name, local, storage_class="local-test", claim_ref={"namespace": ns, "name": "local"}
    )
    try:
        create(cp, ns, claim("local", storage_class="local-test"))
        create(cp, ns, pod("local", {"persistentVolumeClaim": {"claimName": "local"}}))
        wait_for(lambda: running(cp, ns, "local"), timeout_s=120, what="local Running")
        wait_for(lambda: (local / "file").exists(), timeout_s=30, what="the pod's file")
        assert (local / "file").read_text() == "written-by-local\n"
        # Its usage as upstream's MetricsStatFS gives it: statfs of the directory's
        # filesystem, under the claim (the total, which nothing here changes).
        fs = os.statvfs(local)
        capacity = wait_for(
            lambda: node.metric(
                "status-reporter",
                "kubelet_volume_stats_capacity_bytes",
                namespace=ns,
                persistentvolumeclaim="local",
            ),
            timeout_s=60,
            what="the local PV claim's volume stats metric",
        )
        assert capacity == fs.f_blocks * fs.f_frsize
        delete_pod(cp, ns, "local")
        assert (local / "hello").exists()  # the node's data is left alone
    finally:
        cp.kubectl("delete", "pvc", "local", "-n", ns, "--wait=false")
        cp.kubectl("delete", "pv", name, "--wait=false")


@pytest.fixture
def loop_device(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB file behind a loop device (a real block device node of the host)."""
    backing = tmp_path / "disk.img"
    backing.write_bytes(bytes(1 << 20))
    res = subprocess.run(
        ["losetup", "--find", "--show", str(backing)], capture_output=True, text=True, check=True
    )
    device = Path(res.stdout.strip())
    yield device
    subprocess.run(["losetup", "--detach", str(device)], check=False)


def test_a_block_mode_local_pv(
    cp: ControlPlane, node: KletNode, ns: str, loop_device: Path, tmp_path: Path
) -> None:
    name = f"block-{ns}"
    local_pv(
        cp,
        name,
        loop_device,
        storage_class="local-block",
        claim_ref={"namespace": ns, "name": "raw"},
        block=True,
    )
    try:
        raw = claim("raw", storage_class="local-block")
        raw["spec"]["volumeMode"] = "Block"
        create(cp, ns, raw)
        p = pod("raw", {"persistentVolumeClaim": {"claimName": "raw"}})
        container = p["spec"]["containers"][0]
        container.pop("volumeMounts")
        container["volumeDevices"] = [{"name": "data", "devicePath": "/dev/xvda"}]
        container["command"] = [
            "sh",
            "-c",
            "echo written-through-the-device | dd of=/dev/xvda conv=notrunc; sleep 100000",
        ]
        create(cp, ns, p)
        wait_for(lambda: running(cp, ns, "raw"), timeout_s=120, what="raw Running")
        backing = tmp_path / "disk.img"
        wait_for(
            lambda: backing.read_bytes().startswith(b"written-through-the-device\n"),
            timeout_s=30,
            what="the container's bytes on the loop device's file",
        )
        # The same volume in volumeMounts is refused, naming the mode.
        wrong = pod("wrong", {"persistentVolumeClaim": {"claimName": "raw"}})
        create(cp, ns, wrong)
        wait_for(
            lambda: waiting_reason(cp, ns, "wrong") == "CreateContainerConfigError",
            timeout_s=60,
            what="the filesystem use of a block volume refused",
        )
        delete_pod(cp, ns, "wrong")
        delete_pod(cp, ns, "raw")
    finally:
        cp.kubectl("delete", "pvc", "raw", "-n", ns, "--wait=false")
        cp.kubectl("delete", "pv", name, "--wait=false")


def test_a_local_pv_on_a_blank_block_device_is_formatted_and_mounted(
    cp: ControlPlane, node: KletNode, ns: str, loop_device: Path
) -> None:
    """upstream's [Volume type: blockfswithoutformat]: a Filesystem-mode local PV whose
    path is a device without a filesystem."""
    name = f"fsdev-{ns}"
    local_pv(
        cp,
        name,
        loop_device,
        storage_class="local-fsdev",
        claim_ref={"namespace": ns, "name": "fsdev"},
    )
    node_mount = node.root_dir / "plugins/kubernetes.io/local-volume/mounts" / name
    try:
        create(cp, ns, claim("fsdev", storage_class="local-fsdev"))
        first = pod("first", {"persistentVolumeClaim": {"claimName": "fsdev"}})
        create(cp, ns, first)
        p = wait_for(lambda: running(cp, ns, "first"), timeout_s=120, what="first Running")
        uid = p["metadata"]["uid"]
        wait_for(lambda: (node_mount / "file").exists(), timeout_s=30, what="the pod's file")
        assert (node_mount / "file").read_text() == "written-by-first\n"
        assert str(node_mount) in mount_points()
        bind = node.root_dir / "pods" / uid / "volumes/kubernetes.io~local-volume" / name
        assert str(bind) in mount_points()
        fs_type = subprocess.run(
            ["blkid", "-p", "-s", "TYPE", "-o", "value", str(loop_device)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert fs_type == "ext4"
        delete_pod(cp, ns, "first")
        assert str(node_mount) not in mount_points()  # unmounted with its last pod
        assert str(bind) not in mount_points()

        second = pod("second", {"persistentVolumeClaim": {"claimName": "fsdev"}})
        second["spec"]["containers"][0]["command"] = [
            "sh",
            "-c",
            "cat /data/file > /data/seen; sleep 100000",
        ]
        create(cp, ns, second)
        wait_for(lambda: running(cp, ns, "second"), timeout_s=120, what="second Running")
        wait_for(lambda: (node_mount / "seen").exists(), timeout_s=30, what="the second's copy")
        assert (node_mount / "seen").read_text() == "written-by-first\n"  # not formatted again
        delete_pod(cp, ns, "second")
        assert str(node_mount) not in mount_points()
    finally:
        cp.kubectl("delete", "pvc", "fsdev", "-n", ns, "--wait=false")
        cp.kubectl("delete", "pv", name, "--wait=false")


def mount_points() -> set[str]:
    return {line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()}


def test_a_statefulset_pod_reads_back_what_it_wrote(
    cp: ControlPlane, node: KletNode, ns: str, tmp_path: Path
) -> None:
    """On a local PV: csi-mock keeps no data (it makes an empty directory per publish
    and removes it at unpublish), so persistence across pods is shown with a volume
    whose data lives on the node."""
    disk = tmp_path / "sts"
    disk.mkdir()
    storage_class = f"local-sts-{ns}"
    pv = f"sts-{ns}"
    local_pv(cp, pv, disk, storage_class=storage_class)
    script = (
        "[ -f /data/first ] || echo $HOSTNAME-$RANDOM$RANDOM > /data/first;"
        " cp /data/first /data/read-by-$POD_UID; sleep 100000"
    )
    container = {
        "name": "db",
        "image": IMAGE,
        "command": ["sh", "-c", script],
        "env": [{"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}],
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
    }
    template = {
        "metadata": {"labels": {"app": "db"}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "terminationGracePeriodSeconds": 1,
            "containers": [container],
        },
    }
    claim_template = {
        "metadata": {"name": "data"},
        "spec": claim("x", storage_class=storage_class)["spec"],
    }
    statefulset = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "db", "namespace": ns},
        "spec": {
            "serviceName": "db",
            "replicas": 1,
            "selector": {"matchLabels": {"app": "db"}},
            "template": template,
            "volumeClaimTemplates": [claim_template],
        },
    }
    try:
        apply(cp, statefulset)
        first = wait_for(lambda: running(cp, ns, "db-0"), timeout_s=180, what="db-0 Running")
        first_uid = first["metadata"]["uid"]
        wait_for(lambda: (disk / f"read-by-{first_uid}").exists(), timeout_s=30, what="written")
        written = (disk / "first").read_text()
        cp.kubectl("delete", "pod", "db-0", "-n", ns, "--wait=false", check=True)
        again = wait_for(
            lambda: (p := running(cp, ns, "db-0")) and p["metadata"]["uid"] != first_uid and p,
            timeout_s=180,
            what="db-0 recreated and Running",
        )
        read = disk / f"read-by-{again['metadata']['uid']}"
        wait_for(read.exists, timeout_s=30, what="the new pod's copy")
        assert read.read_text() == written
        assert kget(cp, "pvc", "data-db-0", "-n", ns)["spec"]["volumeName"] == pv
    finally:
        cp.kubectl("delete", "statefulset", "db", "-n", ns)
        cp.kubectl("delete", "pvc", "data-db-0", "-n", ns, "--wait=false")
        cp.kubectl("delete", "pv", pv, "--wait=false")


@needs_registrar
def test_a_driver_that_needs_attach_waits_for_its_volume_attachment(
    cp: ControlPlane, node: KletNode, driver: dict[str, Any], ns: str
) -> None:
    """kube-controller-manager's attach-detach controller makes the VolumeAttachment and
    the test plays external-attacher (the module proxy here serves none): until it is
    attached the pod waits with a FailedMount naming volumesAttached; then the
    controller lists the volume in the Node's status, the node reads the
    VolumeAttachment through the Node authorizer and stages with its attachment
    metadata. The pod deleted, the node unmounts and drops the volume from volumesInUse,
    and only then does the controller detach (delete the VolumeAttachment)."""
    create(cp, ns, claim("attached"))
    pv = wait_for(
        lambda: kget(cp, "pvc", "attached", "-n", ns)["spec"].get("volumeName"),
        timeout_s=60,
        what="the claim bound",
    )
    handle = kget(cp, "pv", pv)["spec"]["csi"]["volumeHandle"]
    # attachRequired is immutable: the CSIDriver is made again, and put back after.
    cp.kubectl("delete", "csidriver", DRIVER, check=True)
    apply(cp, csidriver(attach=True))
    name = "csi-" + hashlib.sha256(f"{handle}{DRIVER}{NODE}".encode()).hexdigest()
    unique = f"kubernetes.io/csi/{DRIVER}^{handle}"

    def attachment() -> dict[str, Any] | None:
        got = cp.kubectl("get", "volumeattachment", name, "-o", "json", "--ignore-not-found")
        return json.loads(got.stdout) if got.stdout.strip() else None

    def node_volumes(field: str) -> list[str]:
        return [
            v["name"] if isinstance(v, dict) else v
            for v in kget(cp, "node", NODE)["status"].get(field) or []
        ]

    mock: MockDriver = driver["mock"]

    def stage_calls() -> list[str]:
        this = f'"volume_id":"{handle}"'
        log = mock.log.read_text(errors="replace").splitlines()
        return [line for line in log if "NodeStageVolume" in line and this in line]

    try:
        create(cp, ns, pod("attached", {"persistentVolumeClaim": {"claimName": "attached"}}))
        made = wait_for(attachment, timeout_s=60, what="the controller's VolumeAttachment")
        assert made["spec"] == {
            "attacher": DRIVER,
            "nodeName": NODE,
            "source": {"persistentVolumeName": pv},
        }
        wait_for(
            lambda: failed_mount(cp, ns, "attached", "is not in the Node's status.volumesAttached"),
            timeout_s=60,
            what="the FailedMount naming volumesAttached",
        )
        assert waiting_reason(cp, ns, "attached") == "ContainerCreating"
        # in use before anything is mounted (upstream's guard against a detach under it)
        assert unique in node_volumes("volumesInUse")
        assert stage_calls() == []
        status = {"status": {"attached": True, "attachmentMetadata": {"device": "/dev/klet-test"}}}
        cp.kubectl(
            "patch",
            "volumeattachment",
            name,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps(status),
            check=True,
        )
        wait_for(
            lambda: unique in node_volumes("volumesAttached"),
            timeout_s=60,
            what="the controller listing the volume in volumesAttached",
        )
        wait_for(lambda: running(cp, ns, "attached"), timeout_s=120, what="attached Running")
        assert any("/dev/klet-test" in line for line in stage_calls())
        delete_pod(cp, ns, "attached")
        wait_for(
            lambda: unique not in node_volumes("volumesInUse"),
            timeout_s=60,
            what="the volume dropped from volumesInUse",
        )
        wait_for(lambda: attachment() is None, timeout_s=120, what="the controller detaching")
        wait_for(
            lambda: unique not in node_volumes("volumesAttached"),
            timeout_s=60,
            what="the volume dropped from volumesAttached",
        )
    finally:
        cp.kubectl("delete", "pod", "attached", "-n", ns, "--ignore-not-found", "--wait=false")
        cp.kubectl("delete", "volumeattachment", name, "--ignore-not-found")
        cp.kubectl("delete", "csidriver", DRIVER, check=True)
        apply(cp, csidriver(attach=False))


@needs_registrar
def test_bad_claims_and_drivers_are_failed_mounts(
    cp: ControlPlane, node: KletNode, driver: dict[str, Any], ns: str, workdir: Path
) -> None:
    """Last in the module: it kills the driver, and csi-provisioner exits when its
    driver's connection drops (as the sidecars do)."""
    create(cp, ns, pod("noclaim", {"persistentVolumeClaim": {"claimName": "nope"}}))
    create(cp, ns, claim("unbound", storage_class="no-such-class"))
    create(cp, ns, pod("unbound", {"persistentVolumeClaim": {"claimName": "unbound"}}))
    create(cp, ns, pod("nodriver", {"csi": {"driver": "not-here.klet.test"}}))
    create(cp, ns, pod("healthy", {"emptyDir": {}}))
    causes = {
        "noclaim": 'persistentvolumeclaims "nope" not found',
        "unbound": f"PVC {ns}/unbound: the PVC is not bound",
        "nodriver": "driver name not-here.klet.test not found in the list of registered CSI",
    }
    for name, text in causes.items():
        wait_for(
            lambda n=name, t=text: failed_mount(cp, ns, n, t),
            timeout_s=60,
            what=f"{name}'s FailedMount naming the cause",
        )
        assert waiting_reason(cp, ns, name) == "ContainerCreating"
    wait_for(lambda: running(cp, ns, "healthy"), timeout_s=60, what="the other pod Running")

    # The driver stops answering (killed: the registrar beside it runs on, so it stays
    # registered): an inline volume fails naming it, and the pod starts once the driver
    # is back on its socket (as the driver's container restarted in its pod).
    mock: MockDriver = driver["mock"]
    mock.proc.send_signal(signal.SIGKILL)
    mock.proc.wait(10)
    create(cp, ns, pod("driverdown", {"csi": {"driver": DRIVER}}))
    wait_for(
        lambda: (
            failed_mount(cp, ns, "driverdown", f"driver {DRIVER}: Node")
            and failed_mount(cp, ns, "driverdown", ": UNAVAILABLE: ")
        ),
        timeout_s=60,
        what="driverdown's FailedMount naming the driver",
    )
    (workdir / "csi.sock").unlink(missing_ok=True)  # start_mock waits for a new one
    driver["mock"] = start_mock(workdir)
    wait_for(lambda: running(cp, ns, "driverdown"), timeout_s=120, what="driverdown Running")
    assert running(cp, ns, "healthy")
