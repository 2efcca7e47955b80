"""A real database on a csi-hostpath volume keeps its data (issue 38, "A real database
keeps its data").

The database is redis-server from Debian's packages, the `klet-redis` image that
tools/image builds (`make image`; its rootfs layer is cached), pushed with skopeo to the
dev stack's registry and pulled by the node as registry.klet.test/klet-redis. It runs
as a StatefulSet of one replica with `--appendonly yes --appendfsync always --dir /data`
(every write reaches the append-only file before redis-cli gets its reply) and a
volumeClaimTemplate on hostpathplugin v1.16.1, which runs as a host process with
csi-node-driver-registrar and csi-provisioner beside a klet node on the real control
plane, as in test_csi_snapshots.

Keys are written through redis-cli in the container (kubectl exec). Then, while the
server runs: syncloop is SIGKILLed and started again, and hostpathplugin is SIGKILLed and
started again on the same state directory; after each, and after a few more pod syncs
of the new syncloop, the container has the same ID and restartCount 0, the driver has
served no NodeUnpublishVolume, the volume's mount at the pod's publish path is the same
single mount (its mountinfo ID: not remounted), and the keys read back. The new
syncloop may call NodePublishVolume again for the volume it reconstructs, as upstream's
kubelet does (its reconstructed volumes are uncertain and csi_mounter's SetUpAt
publishes without checking for a mount; CSI's NodePublishVolume is idempotent and
hostpathplugin answers an existing mount with success), so the proof of "not
re-published" is the mount table, not the call count. Finally the pod is deleted,
the StatefulSet recreates it on the node on the same claim, and the new server reads
the keys back from the append-only file.

Needs hostpathplugin, csi-node-driver-registrar and csi-provisioner (tools/test.sh builds
them in the background during `make test`'s first session: `make csi-test-binaries`) and
the klet-redis image (its layers cached by the compose tier's build). It runs in `make
test` and `make test-csi`. Without the release sources hostpathplugin and the registrar
are built from (../shared/third_party/kubernetes-csi or $KLET_CSI_SRC), the module
skips before starting anything, with the reason and how to supply them in pytest's
summary (`-rs`).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from klet.devstack import DevStack
from klet.devstack.images import TEST_REGISTRY_HOST
from klet.testbed.cluster import ControlPlane

from tests.harness.clusternode import cluster_node
from tests.harness.csi import (
    Registrar,
    apply,
    csi_binaries,
    csinode_has_driver,
    grpc_calls,
    kget,
    namespace,
    persistent_driver_and_class,
    print_log_tails,
    release_sources_missing,
    start_hostpathplugin,
    start_sidecar,
    stop_process,
)
from tests.harness.node import KletNode
from tests.harness.waiting import wait_for
from tools.image.__main__ import version

NODE = "kletcsidb1"
DRIVER = "hostpath-db.klet.test"
CLASS = "hostpath-db"
KEYS = 50
# One pod sync per --sync-frequency: the syncs after a restart that would remount.
POD_SYNCS = "kubelet_pod_worker_duration_seconds_count"
REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

_missing = release_sources_missing()
if _missing is not None:
    pytest.skip(_missing, allow_module_level=True)


@pytest.fixture(scope="module")
def cp(full_control_plane: ControlPlane) -> ControlPlane:
    return full_control_plane


@pytest.fixture(scope="module")
def image(devstack: DevStack, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The klet-redis image built by tools/image, in the dev stack's registry."""
    out = tmp_path_factory.mktemp("image")
    res = subprocess.run(
        [sys.executable, "-m", "tools.image", "redis", "--out-dir", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    subprocess.run(
        [
            "skopeo",
            "copy",
            "--quiet",
            "--dest-tls-verify=false",
            f"oci-archive:{out / f'klet-redis-{version()}.oci.tar'}",
            f"docker://{devstack.registry_address}/klet-redis:{version()}",
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return f"{TEST_REGISTRY_HOST}/klet-redis:{version()}"


@pytest.fixture(scope="module")
def node(
    cp: ControlPlane, devstack: DevStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KletNode]:
    base = tmp_path_factory.mktemp("csidb")
    with cluster_node(cp, devstack, base, name=NODE, extra_flags=["--sync-frequency=3s"]) as n:
        yield n


@dataclass
class Hostpath:
    """The running hostpathplugin: restartable on the same state directory."""

    binary: Path
    socket: Path
    state: Path
    log: Path
    proc: subprocess.Popen[bytes]

    def kill_and_restart(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.proc = start_hostpathplugin(
            self.binary,
            socket=self.socket,
            driver=DRIVER,
            node=NODE,
            state=self.state,
            log=self.log,
        )

    def calls(self, method: str) -> int:
        return grpc_calls(self.log, method)


@pytest.fixture(scope="module")
def driver(cp: ControlPlane, node: KletNode) -> Iterator[Hostpath]:
    bins = csi_binaries(("hostpathplugin", "csi-node-driver-registrar", "csi-provisioner"))
    workdir = Path(tempfile.mkdtemp(prefix="klet-csidb-"))  # short: the socket path
    state = workdir / "state"
    state.mkdir()
    socket = workdir / "csi.sock"
    for obj in persistent_driver_and_class(DRIVER, CLASS):
        apply(cp, obj)
    log = workdir / "hostpath.log"
    hostpath = Hostpath(
        binary=bins["hostpathplugin"],
        socket=socket,
        state=state,
        log=log,
        proc=start_hostpathplugin(
            bins["hostpathplugin"], socket=socket, driver=DRIVER, node=NODE, state=state, log=log
        ),
    )
    registrar = Registrar.start(
        bins["csi-node-driver-registrar"],
        csi_socket=socket,
        registry=node.root_dir / "plugins_registry",
        log=workdir / "registrar.log",
    )
    provisioner = start_sidecar(
        bins["csi-provisioner"],
        socket=socket,
        kubeconfig=cp.admin_kubeconfig,
        log=workdir / "csi-provisioner.log",
    )
    wait_for(
        lambda: csinode_has_driver(cp, NODE, DRIVER), timeout_s=60, what="the driver in the CSINode"
    )
    try:
        yield hostpath
    finally:
        print_log_tails(sorted(workdir.glob("*.log")))
        registrar.stop()
        stop_process(provisioner, grace_s=15)
        stop_process(hostpath.proc, grace_s=15)
        cp.kubectl("delete", "storageclass", CLASS, "--ignore-not-found")
        cp.kubectl("delete", "csidriver", DRIVER, "--ignore-not-found")
        shutil.rmtree(workdir, ignore_errors=True)


def statefulset(image: str) -> dict[str, Any]:
    server = {
        "name": "redis",
        "image": image,
        "command": ["redis-server"],
        "args": [
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--dir",
            "/data",
            "--port",
            "6379",
            "--bind",
            "127.0.0.1",
            "--protected-mode",
            "no",
        ],
        # The volume's directory is root's (hostpathplugin makes it so); the image's
        # user is redis (6379).
        "securityContext": {"runAsUser": 0, "runAsGroup": 0},
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "db"},
        "spec": {
            "serviceName": "db",
            "replicas": 1,
            "selector": {"matchLabels": {"app": "db"}},
            "template": {
                "metadata": {"labels": {"app": "db"}},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": NODE},
                    "terminationGracePeriodSeconds": 5,
                    "containers": [server],
                },
            },
            "volumeClaimTemplates": [
                {
                    "metadata": {"name": "data"},
                    "spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "storageClassName": CLASS,
                        "resources": {"requests": {"storage": "10Mi"}},
                    },
                }
            ],
        },
    }


def redis_cli(cp: ControlPlane, ns: str, *args: str) -> str:
    res = cp.kubectl("exec", "db-0", "-n", ns, "-c", "redis", "--", "redis-cli", *args)
    assert res.returncode == 0, f"redis-cli {args}: {res.returncode} {res.stdout} {res.stderr}"
    return str(res.stdout).strip()


def answers(cp: ControlPlane, ns: str) -> bool:
    res = cp.kubectl("exec", "db-0", "-n", ns, "-c", "redis", "--", "redis-cli", "ping")
    return res.returncode == 0 and "PONG" in res.stdout


def read_keys(cp: ControlPlane, ns: str) -> list[str]:
    return redis_cli(cp, ns, "mget", *(f"key{i}" for i in range(KEYS))).splitlines()


def running(cp: ControlPlane, ns: str) -> dict[str, Any] | None:
    res = cp.kubectl("get", "pod", "db-0", "-n", ns, "-o", "json")
    if res.returncode != 0:
        return None
    p: dict[str, Any] = kget(cp, "pod", "db-0", "-n", ns)
    statuses = p["status"].get("containerStatuses") or []
    ok = p["status"].get("phase") == "Running" and statuses and statuses[0].get("ready")
    return p if ok else None


def publish_mount_id(node: KletNode, uid: str) -> str:
    """The mountinfo ID of the single CSI volume mounted in pod `uid`'s directory."""
    base = node.root_dir / "pods" / uid / "volumes" / "kubernetes.io~csi"
    [volume] = sorted(base.glob("*"))
    target = str(volume / "mount")
    ids = [
        line.split()[0]
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if line.split()[4] == target
    ]
    assert len(ids) == 1, (target, ids)
    return ids[0]


def test_a_redis_statefulset_on_csi_hostpath_keeps_its_data(
    cp: ControlPlane, node: KletNode, driver: Hostpath, image: str
) -> None:
    with namespace(cp, "csidb") as ns:
        try:
            apply(cp, statefulset(image), ns)
            first = wait_for(lambda: running(cp, ns), timeout_s=240, what="db-0 Running")
            wait_for(lambda: answers(cp, ns), timeout_s=60, what="redis answering")
            uid = first["metadata"]["uid"]
            before = first["status"]["containerStatuses"][0]
            for i in range(KEYS):
                assert redis_cli(cp, ns, "set", f"key{i}", f"value{i}-{ns}") == "OK"
            expected = [f"value{i}-{ns}" for i in range(KEYS)]
            assert read_keys(cp, ns) == expected
            assert driver.calls("NodePublishVolume") == 1
            mount = publish_mount_id(node, uid)

            def unchanged(after: str) -> None:
                node.wait_passes("syncloop", POD_SYNCS, 3, timeout_s=60)
                status = kget(cp, "pod", "db-0", "-n", ns)["status"]["containerStatuses"][0]
                assert (status["containerID"], status["restartCount"]) == (
                    before["containerID"],
                    0,
                ), after
                assert driver.calls("NodeUnpublishVolume") == 0, after
                assert publish_mount_id(node, uid) == mount, after
                assert read_keys(cp, ns) == expected, after

            node.kill("syncloop")
            node.start("syncloop")
            unchanged("syncloop SIGKILLed and restarted")

            driver.kill_and_restart()
            unchanged("hostpathplugin SIGKILLed and restarted")

            cp.kubectl("delete", "pod", "db-0", "-n", ns, "--wait=false", check=True)
            again = wait_for(
                lambda: (p := running(cp, ns)) and p["metadata"]["uid"] != uid and p,
                timeout_s=240,
                what="db-0 recreated and Running",
            )
            assert again["spec"]["nodeName"] == NODE
            wait_for(lambda: answers(cp, ns), timeout_s=60, what="the new redis answering")
            assert read_keys(cp, ns) == expected
            assert driver.calls("NodeUnpublishVolume") == 1
        finally:
            cp.kubectl("delete", "statefulset", "db", "-n", ns, "--wait=false")
            cp.kubectl("delete", "pod", "db-0", "-n", ns, "--wait=false")
            cp.kubectl("delete", "pvc", "data-db-0", "-n", ns, "--wait=false")
