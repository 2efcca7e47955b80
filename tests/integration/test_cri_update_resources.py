"""CRI UpdateContainerResources against real containerd (what an in-place resize calls):
a running container's CPU quota, shares and memory limit go up and then down in place,
read back from its own cgroup files (cgroup v1 here: cpu.cfs_quota_us, cpu.shares,
memory.limit_in_bytes), with the same container ID and process still running."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from klet.cri import CRISettings, RuntimeClient
from klet.cri.types import (
    ContainerConfig,
    ContainerState,
    LinuxContainerSecurity,
    LinuxResources,
    SandboxConfig,
)
from klet.devstack import DevStack
from klet.model.types import ContainerID, SandboxID

from tests.harness.procfs import cgroup_v1_value

IMAGE = "registry.klet.test/busybox:1.36"
MI = 1024 * 1024


@dataclass
class Pod:
    cri: RuntimeClient
    sandbox: SandboxID
    config: SandboxConfig


@pytest.fixture
async def pod(devstack: DevStack) -> AsyncIterator[Pod]:
    cri = RuntimeClient(CRISettings(runtime_endpoint=devstack.runtime_endpoint, timeout_s=30))
    config = SandboxConfig("resize", "default", "uid-cri-resize", 0, "resize", "/tmp/klet-resize")
    await cri.pull_image(IMAGE)
    sandbox = await cri.run_pod_sandbox(config)
    try:
        yield Pod(cri, sandbox, config)
    finally:
        await cri.stop_pod_sandbox(sandbox)
        await cri.remove_pod_sandbox(sandbox)
        await cri.close()


def resources(quota: int, shares: int, memory: int) -> LinuxResources:
    return LinuxResources(
        cpu_shares=shares, cpu_quota=quota, cpu_period=100000, memory_limit_bytes=memory
    )


async def test_update_in_place_up_and_down(pod: Pod) -> None:
    cri = pod.cri
    config = ContainerConfig(
        "main",
        0,
        IMAGE,
        command=("sleep", "600"),
        log_path="main.log",
        security=LinuxContainerSecurity(),
        resources=resources(50000, 512, 64 * MI),
    )
    cid: ContainerID = await cri.create_container(pod.sandbox, config, pod.config)
    await cri.start_container(cid)
    pid = await cri.container_pid(cid)
    assert cgroup_v1_value(pid, "cpu", "cpu.cfs_quota_us") == 50000
    assert cgroup_v1_value(pid, "memory", "memory.limit_in_bytes") == 64 * MI

    await cri.update_container_resources(cid, resources(100000, 1024, 128 * MI))
    assert cgroup_v1_value(pid, "cpu", "cpu.cfs_quota_us") == 100000
    assert cgroup_v1_value(pid, "cpu", "cpu.shares") == 1024
    assert cgroup_v1_value(pid, "memory", "memory.limit_in_bytes") == 128 * MI

    await cri.update_container_resources(cid, resources(20000, 256, 32 * MI))
    assert cgroup_v1_value(pid, "cpu", "cpu.cfs_quota_us") == 20000
    assert cgroup_v1_value(pid, "cpu", "cpu.shares") == 256
    assert cgroup_v1_value(pid, "memory", "memory.limit_in_bytes") == 32 * MI

    status = await cri.container_status(cid)
    assert status.state == ContainerState.RUNNING
    assert await cri.container_pid(cid) == pid
