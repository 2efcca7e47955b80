"""Pod directories keep other host users out, on real containerd (issue 11, file
permissions).

A static pod running as user 1000 (no fsGroup) reads its downwardAPI volume (a tmpfs,
like a Secret's), writes to its emptyDir and to its termination-message file; on the
node, `pods/` and the pod's directory are 0750 and root's, and an unprivileged host
user (nobody, through setpriv) can neither list the pod directory nor read the
volume's file, the emptyDir's file or the termination message. The root directory
is made 0755 beforehand (as a distribution's /var/lib/kubelet may be; klet leaves
an existing one alone) and the child starts in it, so what refuses is what klet made.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path
from typing import Any

from tests.harness.node import KletNode
from tests.harness.waiting import wait_for

NOBODY = 65534

POD = """
apiVersion: v1
kind: Pod
metadata: {name: private}
spec:
  securityContext: {runAsUser: 1000, runAsGroup: 1000}
  containers:
    - name: main
      image: registry.klet.test/busybox:1.36
      command:
        - sh
        - -c
        - |
          echo "read $(cat /etc/info/name)"
          echo scratch-data > /scratch/file && echo "wrote scratch"
          echo bye > /dev/termination-log
          sleep 100000
      volumeMounts:
        - {name: info, mountPath: /etc/info}
        - {name: scratch, mountPath: /scratch}
  volumes:
    - name: info
      downwardAPI:
        items:
          - {path: name, fieldRef: {fieldPath: metadata.name}}
    - {name: scratch, emptyDir: {}}
"""


def as_nobody(cwd: Path, *argv: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv],
        cwd=cwd,
        capture_output=True,
        check=False,
        timeout=30,
    )


def test_host_users_cannot_reach_a_pods_files(node_factory: Any, manifests: Path) -> None:
    node: KletNode = node_factory(manifest_dir=manifests)
    node.root_dir.mkdir(parents=True)
    os.chmod(node.root_dir, 0o755)
    node.start()
    (manifests / "private.yaml").write_text(POD)
    full = f"private-{node.node_name}"
    pod = wait_for(
        lambda: (p := node.pods().get(full)) and p["status"]["phase"] == "Running" and p,
        timeout_s=30,
        what="private Running",
    )
    log = next(node.logs_dir.glob(f"default_{full}_*")) / "main" / "0.log"
    wait_for(
        lambda: log.exists() and "wrote scratch" in log.read_text(),
        timeout_s=15,
        what="the container's output",
    )
    assert f"read {full}" in log.read_text()  # user 1000 reads its volume

    uid = pod["metadata"]["uid"]
    pod_dir = Path("pods") / uid
    volumes = pod_dir / "volumes"
    private = {
        "downwardAPI file": volumes / "kubernetes.io~downward-api" / "info" / "name",
        "emptyDir file": volumes / "kubernetes.io~empty-dir" / "scratch" / "file",
    }
    private["termination message"] = next(
        p.relative_to(node.root_dir)
        for p in (node.root_dir / pod_dir / "containers").rglob("*")
        if p.is_file()
    )
    # root (the runtime, klet) sees the files
    assert (node.root_dir / private["emptyDir file"]).read_text() == "scratch-data\n"
    assert (node.root_dir / private["termination message"]).read_text() == "bye\n"
    for what, rel in private.items():
        refused = as_nobody(node.root_dir, "cat", str(rel))
        assert refused.returncode != 0 and b"Permission denied" in refused.stderr, what
    listing = as_nobody(node.root_dir, "ls", str(pod_dir))
    assert listing.returncode != 0 and b"Permission denied" in listing.stderr
    assert stat.S_IMODE(os.stat(node.root_dir).st_mode) == 0o755  # the operator's, kept
    for d in (Path("pods"), pod_dir):
        info = os.lstat(node.root_dir / d)
        assert (oct(stat.S_IMODE(info.st_mode)), info.st_uid, info.st_gid) == ("0o750", 0, 0), d
