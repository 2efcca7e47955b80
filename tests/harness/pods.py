"""How integration tests look at a static pod: its `/pods` view (`running`) and its
objects in the runtime, straight from CRI (`runtime_containers`, `runtime_sandboxes`),
plus `WEB`, the two-container manifest several tests run.

Helpers only; the tests live beside the behaviour they cover (tests/integration).
"""

from __future__ import annotations

import asyncio
from typing import Any

from klet.cri import CRISettings, RuntimeClient
from klet.cri import labels as L
from klet.devstack import DevStack

from tests.harness.node import KletNode

WEB = """
apiVersion: v1
kind: Pod
metadata:
  name: web
spec:
  terminationGracePeriodSeconds: 3
  containers:
    - name: httpd
      image: registry.klet.test/httpd:1.36
      command: ["sh", "-c", "echo served-by-klet > /www/index.html && exec httpd -f -p 80 -h /www"]
    - name: sleeper
      image: registry.klet.test/busybox:1.36
      command: ["sleep", "100000"]
"""


def running(node: KletNode, name: str) -> dict[str, Any] | None:
    """The static pod `name` (manifest name, without `-<node>`) from `/pods` once it is
    Running with every container ready (and at least one container reported), else None."""
    pod = node.pods().get(f"{name}-{node.node_name}")
    if not pod or pod["status"].get("phase") != "Running":
        return None
    statuses = pod["status"].get("containerStatuses") or []
    if statuses and all(c["ready"] for c in statuses):
        return pod
    return None


def runtime_containers(stack: DevStack, pod_name: str) -> dict[str, str]:
    """container id -> state for one pod, straight from CRI."""

    async def go() -> dict[str, str]:
        cri = RuntimeClient(CRISettings(runtime_endpoint=stack.runtime_endpoint, timeout_s=10))
        try:
            return {
                c.id: c.state.value
                for c in await cri.list_containers(label_selector={L.POD_NAME: pod_name})
            }
        finally:
            await cri.close()

    return asyncio.run(go())


def runtime_sandboxes(stack: DevStack, pod_name: str) -> list[str]:
    """The ids of one pod's sandboxes, straight from CRI."""

    async def go() -> list[str]:
        cri = RuntimeClient(CRISettings(runtime_endpoint=stack.runtime_endpoint, timeout_s=10))
        try:
            return [
                s.id for s in await cri.list_pod_sandboxes(label_selector={L.POD_NAME: pod_name})
            ]
        finally:
            await cri.close()

    return asyncio.run(go())
