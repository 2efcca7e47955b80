"""Content volumes of a static pod on a standalone node (no apiserver), on real containerd.

A downwardAPI volume shows the pod's name, its labels and annotations as sorted
`key="value"` lines (values quoted as Go's %q), one label by key and a container's
memory limit with a divisor, read by the container itself; on the node the volume is
a tmpfs with the atomic writer's `..data` layout and the item's mode. (A static pod
with a configMap volume is refused by pod-source: test_static_pod_api_references.py.)"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from klet.syncloop.volumes import fs

from tests.harness.node import KletNode
from tests.harness.waiting import wait_for

DOWNWARD_POD = """
apiVersion: v1
kind: Pod
metadata:
  name: downward
  labels: {app: dw, tier: web}
  annotations: {note: 'a "quoted" value'}
spec:
  containers:
    - name: main
      image: registry.klet.test/busybox:1.36
      command:
        - sh
        - -c
        - |
          for f in name tier mem labels annotations; do echo "== $f"; cat /etc/info/$f; echo; done
          sleep 100000
      resources:
        limits: {memory: 64Mi}
      volumeMounts:
        - {name: info, mountPath: /etc/info}
  volumes:
    - name: info
      downwardAPI:
        items:
          - {path: name, fieldRef: {fieldPath: metadata.name}, mode: 0400}
          - {path: tier, fieldRef: {fieldPath: "metadata.labels['tier']"}}
          - {path: labels, fieldRef: {fieldPath: metadata.labels}}
          - {path: annotations, fieldRef: {fieldPath: metadata.annotations}}
          - path: mem
            resourceFieldRef: {containerName: main, resource: limits.memory, divisor: 1Mi}
"""


def sections(lines: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    current = ""
    for line in lines:
        if line.startswith("== "):
            current = line[3:]
            out[current] = []
        elif line:
            out[current].append(line)
    return out


def test_downward_api_volume_inside_the_container(node_factory: Any, manifests: Path) -> None:
    node: KletNode = node_factory(manifest_dir=manifests)
    node.start()
    (manifests / "downward.yaml").write_text(DOWNWARD_POD)
    full = f"downward-{node.node_name}"
    pod = wait_for(
        lambda: (p := node.pods().get(full)) and p["status"]["phase"] == "Running" and p,
        timeout_s=30,
        what="downward Running",
    )
    log_dir = next(node.logs_dir.glob(f"default_{full}_*")) / "main"

    def printed() -> dict[str, list[str]] | None:
        found = sections(_log_lines(log_dir / "0.log"))
        return found if "annotations" in found else None

    found = wait_for(printed, timeout_s=15, what="the container's output")
    assert found["name"] == [full]
    assert found["tier"] == ["web"]
    assert found["mem"] == ["64"]
    assert found["labels"] == ['app="dw"', 'tier="web"']
    annotations = found["annotations"]
    assert annotations == sorted(annotations)  # static pods also carry config.* annotations
    assert 'note="a \\"quoted\\" value"' in annotations
    assert all("=" in line and line.endswith('"') for line in annotations)

    host = (
        node.root_dir
        / "pods"
        / pod["metadata"]["uid"]
        / "volumes"
        / "kubernetes.io~downward-api"
        / "info"
    )
    assert fs.fs_type(host) == "tmpfs"
    assert os.readlink(host / "name") == "..data/name"
    assert os.readlink(host / "..data").startswith("..")
    assert oct(os.stat(host / "name").st_mode & 0o777) == "0o400"


def _log_lines(path: Path) -> list[str]:
    return [line.split(" ", 3)[3] for line in path.read_text().splitlines()]
