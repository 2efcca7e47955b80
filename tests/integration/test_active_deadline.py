"""activeDeadlineSeconds on real containerd: a pod running past its deadline is stopped
and reported Failed with reason DeadlineExceeded, and is not restarted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from klet.devstack import DevStack

from tests.harness.node import RELISTS, KletNode
from tests.harness.pods import running, runtime_containers
from tests.harness.waiting import wait_for

POD = """
apiVersion: v1
kind: Pod
metadata: {name: deadline}
spec:
  activeDeadlineSeconds: 4
  terminationGracePeriodSeconds: 2
  containers:
    - name: main
      image: registry.klet.test/busybox:1.36
      command: ["sleep", "100000"]
"""


def test_pod_past_its_deadline_fails(
    node_factory: Any, manifests: Path, devstack: DevStack
) -> None:
    node: KletNode = node_factory(manifest_dir=manifests)
    node.start()
    (manifests / "deadline.yaml").write_text(POD)
    wait_for(lambda: running(node, "deadline"), timeout_s=15, what="deadline pod Running")
    full = f"deadline-{node.node_name}"

    def failed() -> dict[str, Any] | None:
        status: dict[str, Any] = node.pods()[full]["status"]
        return status if status["phase"] == "Failed" else None

    status = wait_for(failed, timeout_s=4 + 10, what="Failed after activeDeadlineSeconds")
    assert status["reason"] == "DeadlineExceeded"
    assert "deadline" in status["message"]
    # Stopped and not restarted: three more relists still see only exited containers.
    node.wait_passes("syncloop", RELISTS, 3, timeout_s=15)
    states = runtime_containers(devstack, full).values()
    assert states and all(state == "CONTAINER_EXITED" for state in states)
