"""Volumes on real containerd, observed from inside the containers and on the host.

An emptyDir is shared: a file one container writes, the other reads; a readOnly mount
refuses writes; `medium: Memory` is a tmpfs of the size asked for, both in the
container's /proc/mounts and in the host's mount table under the pod's directory;
subPath and subPathExpr mount directories created inside the volume; a hostPath
DirectoryOrCreate is created on the node. A hostPath whose `type: File` check fails
keeps its pod ContainerCreating with upstream's FailedMount event while another pod
runs, and the pod starts once the file exists; Bidirectional propagation in an
unprivileged container is a CreateContainerConfigError. (A static pod with a PVC is
refused by pod-source: test_static_pod_api_references.py.)
Removing the manifest unmounts and removes the pod's volume directories (a hostPath
stays). A pod directory left by a crash, with a filesystem still mounted in it, is
removed at start by unmounting first: the mounted filesystem's files survive.
"""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

from klet.cri import CRISettings, RuntimeClient
from klet.model.types import ContainerID

from tests.harness.node import KletNode, bus_events, container_status
from tests.harness.pods import running
from tests.harness.waiting import wait_for

IMAGE = "registry.klet.test/busybox:1.36"
EMPTY_DIR = "kubernetes.io~empty-dir"

SHARED = f"""
apiVersion: v1
kind: Pod
metadata: {{name: vols}}
spec:
  volumes:
    - {{name: shared, emptyDir: {{}}}}
    - {{name: mem, emptyDir: {{medium: Memory, sizeLimit: 16Mi}}}}
    - name: host
      hostPath: {{path: "{{host}}", type: DirectoryOrCreate}}
  containers:
    - name: writer
      image: {IMAGE}
      command: ["sh", "-c", "echo from-writer > /shared/msg; echo sub > /sub/file; sleep 100000"]
      volumeMounts:
        - {{name: shared, mountPath: /shared}}
        - {{name: shared, mountPath: /sub, subPath: sub/dir}}
        - {{name: mem, mountPath: /mem}}
    - name: reader
      image: {IMAGE}
      command: ["sleep", "100000"]
      env:
        - name: POD_NAME
          valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}
      volumeMounts:
        - {{name: shared, mountPath: /shared, readOnly: true}}
        - {{name: shared, mountPath: /mine, subPathExpr: "per-pod/$(POD_NAME)"}}
        - {{name: host, mountPath: /host}}
"""

NEEDS_FILE = f"""
apiVersion: v1
kind: Pod
metadata: {{name: needsfile}}
spec:
  volumes:
    - name: conf
      hostPath: {{path: "{{path}}", type: File}}
  containers:
    - name: main
      image: {IMAGE}
      command: ["sleep", "100000"]
      volumeMounts: [{{name: conf, mountPath: /etc/app.conf, readOnly: true}}]
"""

PLAIN = f"""
apiVersion: v1
kind: Pod
metadata: {{name: {{name}}}}
spec:
  volumes: [{{name: scratch, emptyDir: {{}}}}]
  containers:
    - name: main
      image: {IMAGE}
      command: ["sleep", "100000"]
      volumeMounts: [{{name: scratch, mountPath: /scratch}}]
"""

BIDIRECTIONAL = f"""
apiVersion: v1
kind: Pod
metadata: {{name: bidi}}
spec:
  volumes: [{{name: scratch, emptyDir: {{}}}}]
  containers:
    - name: main
      image: {IMAGE}
      command: ["sleep", "100000"]
      volumeMounts:
        - {{name: scratch, mountPath: /scratch, mountPropagation: Bidirectional}}
"""


def exec_in(node: KletNode, pod: dict[str, Any], container: str, *cmd: str) -> tuple[int, str]:
    """Run `cmd` in the container through CRI ExecSync: exit code and stdout + stderr."""
    cid = container_status(pod, container)["containerID"].split("://", 1)[1]

    async def go() -> tuple[int, bytes, bytes]:
        cri = RuntimeClient(CRISettings(runtime_endpoint=node.stack.runtime_endpoint, timeout_s=30))
        try:
            return await cri.exec_sync(ContainerID(cid), list(cmd), timeout_s=20)
        finally:
            await cri.close()

    code, out, err = asyncio.run(go())
    return code, (out + err).decode()


def host_mounts() -> dict[str, str]:
    """Mount point → filesystem type, from this host's /proc/self/mountinfo."""
    out: dict[str, str] = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        out[left.split()[4]] = right.split()[0]
    return out


def mounts_below(path: Path) -> list[str]:
    prefix = str(path).rstrip("/") + "/"
    return [m for m in host_mounts() if m.startswith(prefix)]


def waiting(node: KletNode, name: str) -> dict[str, Any] | None:
    pod = node.pods().get(f"{name}-{node.node_name}")
    if not pod:
        return None
    statuses = pod["status"].get("containerStatuses") or []
    return statuses[0]["state"].get("waiting") if statuses else None


def test_empty_dir_memory_read_only_subpaths_and_removal(
    node_factory: Any, manifests: Path, tmp_path: Path
) -> None:
    node: KletNode = node_factory(manifest_dir=manifests)
    node.start()
    host_dir = tmp_path / "created" / "deep"
    (manifests / "vols.yaml").write_text(SHARED.replace("{host}", str(host_dir)))
    pod = wait_for(lambda: running(node, "vols"), timeout_s=60, what="vols Running")
    uid = pod["metadata"]["uid"]
    volumes = node.root_dir / "pods" / uid / "volumes" / EMPTY_DIR

    # one container writes, the other reads; the reader's read-only mount refuses writes
    wait_for(
        lambda: exec_in(node, pod, "reader", "cat", "/shared/msg") == (0, "from-writer\n"),
        timeout_s=30,
        what="the writer's file seen by the reader",
    )
    code, out = exec_in(node, pod, "reader", "sh", "-c", "echo x > /shared/other")
    assert code != 0 and "Read-only file system" in out
    assert not (volumes / "shared" / "other").exists()

    # medium: Memory is a tmpfs of the requested size, inside and on the host
    code, out = exec_in(node, pod, "writer", "cat", "/proc/mounts")
    [mem] = [line.split() for line in out.splitlines() if line.split()[1] == "/mem"]
    assert mem[2] == "tmpfs" and "size=16384k" in mem[3].split(","), mem
    assert host_mounts().get(str(volumes / "mem")) == "tmpfs"
    assert host_mounts().get(str(volumes / "shared")) is None  # a disk emptyDir is no mount

    # subPath: a directory made inside the volume; subPathExpr: expanded from the env
    assert (volumes / "shared" / "sub" / "dir" / "file").read_text() == "sub\n"
    assert exec_in(node, pod, "reader", "sh", "-c", "echo mine > /mine/f")[0] == 0
    full = f"vols-{node.node_name}"
    assert (volumes / "shared" / "per-pod" / full / "f").read_text() == "mine\n"

    # hostPath DirectoryOrCreate made the directory on the node (0755), mounted as it is
    assert host_dir.is_dir() and stat.S_IMODE(host_dir.stat().st_mode) == 0o755
    (host_dir / "from-host").write_text("node")
    assert exec_in(node, pod, "reader", "cat", "/host/from-host") == (0, "node")

    # the pod's removal unmounts and removes its volumes; the hostPath stays
    (manifests / "vols.yaml").unlink()
    wait_for(lambda: full not in node.pods(), timeout_s=60, what="vols gone")
    wait_for(
        lambda: not (node.root_dir / "pods" / uid).exists(),
        timeout_s=30,
        what="the pod directory removed",
    )
    assert mounts_below(node.root_dir) == []
    assert (host_dir / "from-host").read_text() == "node"


def test_failed_mounts_wait_and_retry_without_blocking_other_pods(
    node_factory: Any, manifests: Path, tmp_path: Path
) -> None:
    node: KletNode = node_factory(manifest_dir=manifests)
    node.start()
    conf = tmp_path / "later.conf"
    (manifests / "needsfile.yaml").write_text(NEEDS_FILE.replace("{path}", str(conf)))
    (manifests / "bidi.yaml").write_text(BIDIRECTIONAL)
    (manifests / "other.yaml").write_text(PLAIN.replace("{name}", "other"))

    wait_for(lambda: running(node, "other"), timeout_s=60, what="other Running")
    needs = wait_for(
        lambda: (w := waiting(node, "needsfile")) and w.get("reason") == "ContainerCreating" and w,
        timeout_s=30,
        what="needsfile waiting in ContainerCreating",
    )
    assert needs == {"reason": "ContainerCreating"}
    mount_failed = f'MountVolume.SetUp failed for volume "conf" : hostPath {conf} doesn\'t exist'
    wait_for(
        lambda: any(
            e.type == "Warning" and e.reason == "FailedMount" and e.message == mount_failed
            for e in bus_events(node, "needsfile")
        ),
        timeout_s=30,
        what="needsfile's FailedMount event",
    )
    bidi = wait_for(
        lambda: (
            (w := waiting(node, "bidi")) and w.get("reason") == "CreateContainerConfigError" and w
        ),
        timeout_s=30,
        what="bidi waiting in CreateContainerConfigError",
    )
    assert bidi["message"] == (
        "spec.containers[0].volumeMounts[0].mountPropagation: Forbidden: Bidirectional "
        "mount propagation is available only to privileged containers"
    )

    # the check is retried: the pod starts once the file exists
    conf.write_text("level=debug\n")
    pod = wait_for(lambda: running(node, "needsfile"), timeout_s=60, what="needsfile Running")
    assert exec_in(node, pod, "main", "cat", "/etc/app.conf") == (0, "level=debug\n")
    assert exec_in(node, pod, "main", "sh", "-c", "echo x >> /etc/app.conf")[0] != 0
    assert conf.read_text() == "level=debug\n"


def test_orphaned_pod_directory_is_unmounted_then_removed_at_start(
    node_factory: Any, manifests: Path, tmp_path: Path
) -> None:
    node: KletNode = node_factory(manifest_dir=manifests)
    # What a crash leaves: a pod directory of a pod nobody wants, a filesystem mounted in it.
    backing = tmp_path / "backing"
    backing.mkdir()
    orphan = node.root_dir / "pods" / "0rphan-0000-4000-8000-000000000000"
    volume = orphan / "volumes" / EMPTY_DIR / "mem"
    volume.mkdir(parents=True)
    (orphan / "etc-hosts").write_text("127.0.0.1 localhost\n")
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(backing)], check=True)
    try:
        (backing / "precious").write_text("must survive")
        subprocess.run(["mount", "--bind", str(backing), str(volume)], check=True)
        assert (volume / "precious").exists()
        (manifests / "keeper.yaml").write_text(PLAIN.replace("{name}", "keeper"))
        node.start()
        pod = wait_for(lambda: running(node, "keeper"), timeout_s=60, what="keeper Running")
        wait_for(lambda: not orphan.exists(), timeout_s=60, what="the orphan directory removed")
        assert mounts_below(node.root_dir) == []
        # unmounted before anything was deleted: the mounted filesystem kept its files
        assert (backing / "precious").read_text() == "must survive"
        keeper = node.root_dir / "pods" / pod["metadata"]["uid"] / "volumes" / EMPTY_DIR
        assert (keeper / "scratch").is_dir()  # a wanted pod's directory stays
    finally:
        for point in sorted(mounts_below(tmp_path), key=len, reverse=True):
            subprocess.run(["umount", point], check=False)
        subprocess.run(["umount", str(backing)], check=False)
    assert not os.path.ismount(backing)
