"""Static pods are serialised by full name on real containerd (upstream's
allowStaticPodStart): an edited manifest is a new pod with a new UID and the same
namespace/name, and its sandbox is created only once the old pod's containers have
stopped. The old pod takes its 4 s grace period to stop (its container ignores
SIGTERM), so a new pod started beside it would show up in CRI while the old container
still runs; every CRI snapshot taken while the replacement happens is checked."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from klet.cri import CRISettings, RuntimeClient
from klet.cri import labels as L
from klet.cri.types import ContainerState
from klet.devstack import DevStack

from tests.harness.node import KletNode
from tests.harness.pods import running
from tests.harness.waiting import wait_for

MANIFEST = """
apiVersion: v1
kind: Pod
metadata:
  name: serial
spec:
  terminationGracePeriodSeconds: 4
  containers:
    - name: main
      image: registry.klet.test/busybox:1.36
      command: ["sh", "-c", "trap 'echo got TERM' TERM; while true; do sleep 1; done # v1"]
"""


async def _snapshot(cri: RuntimeClient, full: str) -> tuple[set[str], set[str]]:
    """(UIDs with a sandbox, UIDs with a running container) of the pod, from CRI."""
    sandboxes = await cri.list_pod_sandboxes(label_selector={L.POD_NAME: full})
    containers = await cri.list_containers(label_selector={L.POD_NAME: full})
    return (
        {s.labels.get(L.POD_UID, "") for s in sandboxes},
        {c.labels.get(L.POD_UID, "") for c in containers if c.state is ContainerState.RUNNING},
    )


async def _watch(
    endpoint: str, full: str, old: str, bound_s: float
) -> list[tuple[set[str], set[str]]]:
    """CRI snapshots every 50 ms until a new UID runs a container (or the bound)."""
    cri = RuntimeClient(CRISettings(runtime_endpoint=endpoint, timeout_s=10))
    seen: list[tuple[set[str], set[str]]] = []
    try:
        deadline = time.monotonic() + bound_s
        while time.monotonic() < deadline:
            seen.append(await _snapshot(cri, full))
            if seen[-1][1] - {old}:
                break
            await asyncio.sleep(0.05)
    finally:
        await cri.close()
    return seen


def test_an_edited_manifests_pod_starts_after_the_old_one_stopped(
    node_factory: Any, manifests: Path, devstack: DevStack
) -> None:
    node: KletNode = node_factory(manifest_dir=manifests)
    node.start()
    path = manifests / "serial.yaml"
    path.write_text(MANIFEST)
    first = wait_for(lambda: running(node, "serial"), timeout_s=20, what="serial Running")
    old = first["metadata"]["uid"]
    full = f"serial-{node.node_name}"
    path.write_text(MANIFEST.replace("# v1", "# v2"))
    seen = asyncio.run(_watch(devstack.runtime_endpoint, full, old, bound_s=60))
    new = seen[-1][1] - {old}
    assert new, "the new pod never ran"
    overlapping = [s for s in seen if (s[0] - {old}) and old in s[1]]
    assert not overlapping, (
        f"a new sandbox beside the old pod's running container: {overlapping[0]}"
    )
    # the old pod really was running while the new one waited (the check had something to see)
    assert any(old in running_uids for _, running_uids in seen)
    second = wait_for(
        lambda: (p := running(node, "serial")) and p["metadata"]["uid"] != old and p,
        timeout_s=20,
        what="the edited pod Running",
    )
    assert {second["metadata"]["uid"]} == new
