"""Container GC on real containerd, seen through CRI and the pod log directory.

A static pod whose container keeps exiting (restartPolicy Always) piles up dead
instances; ContainerGC passes against the devstack's CRI, reading the sources and
desired tables of the node's Redis, then: with a fresh Redis (no source ready yet)
remove nothing at all; with two dead instances allowed per container remove the oldest
ones and keep the newest two; with upstream's default keep only the newest. Once the
manifest is removed, a pass leaves the pod alone while its sandbox still runs (syncloop
would be killing it) and, once the sandbox is stopped, removes its last dead container,
its sandbox and its log directory.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from klet.bus import Bus, NodeBus
from klet.cri import CRISettings, RuntimeClient
from klet.cri import labels as L
from klet.cri.types import Container, ContainerState, Sandbox
from klet.devstack import DevStack, RedisServer
from klet.image_gc.containergc import ContainerGC, ContainerGCResult
from klet.image_gc.containerselect import ContainerGCSettings
from klet.model import records

from tests.harness.node import KletNode
from tests.harness.waiting import wait_for

BUSYBOX = "registry.klet.test/busybox:1.36"
CRASHER = f"""
apiVersion: v1
kind: Pod
metadata: {{name: gcloop}}
spec:
  restartPolicy: Always
  terminationGracePeriodSeconds: 0
  containers:
    - name: crash
      image: {BUSYBOX}
      command: ["sh", "-c", "echo attempt; exit 1"]
"""
# The restart back-off capped at 1 s, so dead instances pile up in seconds.
CONFIG = """\
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
crashLoopBackOff:
  maxContainerRestartPeriod: 1s
"""
DEAD_WANTED = 4


def cri_client(stack: DevStack) -> RuntimeClient:
    return RuntimeClient(CRISettings(runtime_endpoint=stack.runtime_endpoint, timeout_s=30))


def runtime(stack: DevStack, pod_name: str) -> tuple[list[Sandbox], list[Container]]:
    """The pod's sandboxes and containers (oldest attempt first), straight from CRI."""

    async def go() -> tuple[list[Sandbox], list[Container]]:
        cri = cri_client(stack)
        try:
            selector = {L.POD_NAME: pod_name}
            sandboxes = await cri.list_pod_sandboxes(label_selector=selector)
            containers = await cri.list_containers(label_selector=selector)
            return sandboxes, sorted(containers, key=lambda c: c.attempt)
        finally:
            await cri.close()

    return asyncio.run(go())


def everything(stack: DevStack) -> tuple[set[str], set[str]]:
    """IDs of every sandbox and container of the runtime."""

    async def go() -> tuple[set[str], set[str]]:
        cri = cri_client(stack)
        try:
            sandboxes = {s.id for s in await cri.list_pod_sandboxes()}
            return sandboxes, {c.id for c in await cri.list_containers()}
        finally:
            await cri.close()

    return asyncio.run(go())


def gc_pass(
    stack: DevStack,
    *,
    redis: RedisServer,
    node_name: str,
    logs_dir: Path,
    settings: ContainerGCSettings,
) -> ContainerGCResult:
    """One ContainerGC pass whose sources and desired pods come from `redis`, read as
    image-gc's user of the node."""

    async def go() -> ContainerGCResult:
        auth = redis.credentials(node_name, "image-gc")
        raw = Bus.from_url(redis.url, node_name, auth=auth, timeout_s=5.0)
        bus = NodeBus.of(raw, service="image-gc")
        cri = cri_client(stack)

        async def sources_ready() -> bool:
            return records.sources_ready(await bus.sources.all())

        async def desired_uids() -> set[str]:
            return set(await bus.desired.all())

        try:
            gc = ContainerGC(
                runtime=cri,
                settings=settings,
                sources_ready=sources_ready,
                desired_uids=desired_uids,
                pod_logs_dir=logs_dir,
                stats=cri,
            )
            return await gc.collect()
        finally:
            await cri.close()
            await bus.bus.close()

    return asyncio.run(go())


def desired(node: KletNode) -> set[str]:
    async def go() -> set[str]:
        bus = node.bus(service="image-gc")
        try:
            return set(await NodeBus.of(bus, service="syncloop").desired.all())
        finally:
            await bus.close()

    return asyncio.run(go())


def dead(containers: list[Container]) -> list[Container]:
    return [c for c in containers if c.state != ContainerState.RUNNING]


@pytest.mark.timeout(300)
def test_dead_containers_deleted_pods_and_sources_not_ready(
    node_factory: Any,
    manifests: Path,
    devstack: DevStack,
    redis_server: RedisServer,
    tmp_path: Path,
) -> None:
    config = tmp_path / "kubelet.yaml"
    config.write_text(CONFIG)
    node: KletNode = node_factory(manifest_dir=manifests, extra_flags=["--config", str(config)])
    # Without the image-gc service: its own container GC loop would remove dead instances
    # at moments the test does not choose; here the test drives every pass itself.
    node.start("pod-source", "syncloop", "status-reporter")
    full = f"gcloop-{node.node_name}"
    (manifests / "gcloop.yaml").write_text(CRASHER)

    wait_for(
        lambda: len(dead(runtime(devstack, full)[1])) >= DEAD_WANTED,
        timeout_s=180,
        what=f"{DEAD_WANTED} dead instances of the crashing container",
        interval_s=0.5,
    )
    # No more restarts from here on, so what a pass sees is what the test saw. A start
    # in flight when syncloop stops runs to its end before syncloop exits (the CRI
    # client's drain): it used to be abandoned by containerd seconds later, and until
    # then the container was "in starting state" and could not be removed.
    node.stop("syncloop")
    wait_for(
        lambda: not any(c.state == ContainerState.RUNNING for c in runtime(devstack, full)[1]),
        timeout_s=30,
        what="the last instance to exit",
    )
    sandboxes, containers = runtime(devstack, full)
    assert len(sandboxes) == 1
    uid = sandboxes[0].labels[L.POD_UID]
    log_dir = node.logs_dir / f"default_{full}_{uid}"
    assert log_dir.is_dir() and len(containers) >= DEAD_WANTED

    def run(settings: ContainerGCSettings, redis: RedisServer | None = None) -> ContainerGCResult:
        return gc_pass(
            devstack,
            redis=redis or node.redis,
            node_name=node.node_name,
            logs_dir=node.logs_dir,
            settings=settings,
        )

    # A fresh Redis has no sources table: not ready, nothing at all is removed.
    before = everything(devstack)
    result = run(ContainerGCSettings(max_per_pod_container=0, max_containers=0), redis_server)
    assert not result.sources_ready and result.containers_removed == 0
    assert everything(devstack) == before and log_dir.is_dir()

    # Two dead instances kept per container: the oldest go, the newest two stay.
    result = run(ContainerGCSettings(max_per_pod_container=2))
    assert result.sources_ready and result.errors == 0
    left = runtime(devstack, full)[1]
    assert [c.id for c in left] == [c.id for c in containers[-2:]]
    assert result.containers_removed >= len(containers) - 2

    # Upstream's default: only the newest dead instance stays.
    run(ContainerGCSettings())
    assert [c.id for c in runtime(devstack, full)[1]] == [containers[-1].id]
    assert log_dir.is_dir() and runtime(devstack, full)[0] == sandboxes

    # The manifest goes; while its sandbox still runs the pod is being killed: kept.
    (manifests / "gcloop.yaml").unlink()
    wait_for(
        lambda: uid not in desired(node), timeout_s=30, what="the pod to leave the desired table"
    )
    run(ContainerGCSettings())
    assert [c.id for c in runtime(devstack, full)[1]] == [containers[-1].id]
    assert log_dir.is_dir()

    # Stopped (what syncloop's kill does): its last container, sandbox and logs go.
    async def stop_sandbox() -> None:
        cri = cri_client(devstack)
        try:
            await cri.stop_pod_sandbox(sandboxes[0].id)
        finally:
            await cri.close()

    asyncio.run(stop_sandbox())
    result = run(ContainerGCSettings())
    assert runtime(devstack, full) == ([], [])
    assert not log_dir.exists()
    assert result.containers_removed >= 1 and result.sandboxes_removed >= 1
    assert result.log_dirs_removed >= 1 and result.errors == 0
