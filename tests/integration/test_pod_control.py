"""PodControl over syncloop's unix socket (mode 0600): ListPods and GetPodStatus return
the computed statuses; KillPod stops a running pod with the given grace, marks it Failed
with the reason and message, returns once its containers are stopped, and the pod is
not restarted; an unknown UID answers found=false."""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path
from typing import Any

from klet.devstack import DevStack
from klet.model.layout import SYNCLOOP, grpc_socket
from klet.model.types import PodUID
from klet.rpc.podcontrol import PodControlClient

from tests.harness.node import RELISTS, KletNode
from tests.harness.pods import WEB, running, runtime_containers
from tests.harness.waiting import wait_for


def test_kill_pod_over_grpc(node_factory: Any, manifests: Path, devstack: DevStack) -> None:
    node: KletNode = node_factory(manifest_dir=manifests)
    node.start()
    (manifests / "web.yaml").write_text(WEB)
    pod = wait_for(lambda: running(node, "web"), timeout_s=15, what="web Running")
    uid = PodUID(pod["metadata"]["uid"])
    socket_path = grpc_socket(node.dir / "run", SYNCLOOP)
    assert stat.S_IMODE(socket_path.stat().st_mode) == 0o600

    async def drive() -> None:
        client = PodControlClient(socket_path, timeout_s=30)
        try:
            listed = {p.uid: p for p in await client.list_pods()}
            assert listed[uid].phase == "Running" and listed[uid].name == f"web-{node.node_name}"
            assert (await client.get_pod_status(uid)).status["podIP"]  # type: ignore[union-attr]
            assert await client.get_pod_status(PodUID("nope")) is None
            assert not await client.kill_pod(
                PodUID("nope"), grace_period_s=0, reason="Test", message="x"
            )
            found = await client.kill_pod(
                uid, grace_period_s=0, reason="Evicted", message="testing KillPod"
            )
            assert found
            after = await client.get_pod_status(uid)
            assert after is not None and after.phase == "Failed"
            assert (
                after.status["reason"] == "Evicted" and after.status["message"] == "testing KillPod"
            )
        finally:
            await client.close()

    asyncio.run(drive())
    full = f"web-{node.node_name}"
    states = runtime_containers(devstack, full).values()
    assert states and all(state == "CONTAINER_EXITED" for state in states)
    status = wait_for(
        lambda: (
            node.pods()[full]["status"]
            if node.pods()[full]["status"]["phase"] == "Failed"
            else None
        ),
        timeout_s=10,
        what="Failed in /pods",
    )
    assert status["reason"] == "Evicted"
    # Nothing restarts the killed pod: three more relists see its containers still exited.
    node.wait_passes("syncloop", RELISTS, 3, timeout_s=15)
    states = runtime_containers(devstack, full).values()
    assert states and all(state == "CONTAINER_EXITED" for state in states), "restarted"
