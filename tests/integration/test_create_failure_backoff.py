"""A pod whose container cannot be created, on real containerd: a Bidirectional mount
of a host directory that is not a shared mount (the root mount is private on this host,
so containerd refuses the CreateContainer). upstream's pod worker retries a failed
sync after its 10 s back-off (with jitter, up to 15 s); klet used to retry about 12 times
a second (issue 37). The count comes from syncloop's own
kubelet_runtime_operations_total{operation_type="create_container"}."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tests.harness.node import KletNode, bus_events
from tests.harness.waiting import wait_for

WINDOW_S = 30.0
"""Back-off 10 s (at most 15 with jitter): at most one first attempt and 30 / 10 = 3
retries in the window, whatever the machine's speed."""


def bidirectional_pod(host_dir: Path) -> str:
    return f"""
apiVersion: v1
kind: Pod
metadata:
  name: unmountable
spec:
  containers:
    - name: main
      image: registry.klet.test/busybox:1.36
      command: ["sleep", "100000"]
      securityContext:
        privileged: true
      volumeMounts:
        - name: host
          mountPath: /host
          mountPropagation: Bidirectional
  volumes:
    - name: host
      hostPath:
        path: {host_dir}
        type: Directory
"""


def _creates(node: KletNode) -> float:
    ops = "kubelet_runtime_operations_total"
    return node.metric("syncloop", ops, operation_type="create_container") or 0.0


def test_container_that_cannot_be_created_is_retried_after_the_backoff(
    node_factory: Any, manifests: Path, tmp_path: Path
) -> None:
    host_dir = tmp_path / "private-dir"
    host_dir.mkdir()
    node: KletNode = node_factory(manifest_dir=manifests)
    node.start()
    (manifests / "unmountable.yaml").write_text(bidirectional_pod(host_dir))
    wait_for(lambda: _creates(node) >= 1, timeout_s=30, what="the first CreateContainer")
    first = _creates(node)
    began = time.monotonic()
    time.sleep(WINDOW_S)
    attempts = _creates(node) - first
    took = time.monotonic() - began
    print(f"{attempts:.0f} CreateContainer calls in {took:.1f}s after the first")
    assert attempts <= took / 10 + 1, attempts
    assert attempts >= 1, "the failed create is retried"
    failed = [e for e in bus_events(node, "unmountable") if e.reason == "Failed"]
    assert failed and all(e.type == "Warning" for e in failed)
    status = node.pods()[f"unmountable-{node.node_name}"]["status"]
    waiting = status["containerStatuses"][0]["state"]["waiting"]
    assert waiting["reason"] == "CreateContainerError", waiting
