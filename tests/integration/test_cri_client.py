"""The CRI client against real containerd: the verbose status gives the container's
host PID once it has a process (what syncloop's execwait reads), and a start whose
caller is cancelled (a service stopping) runs to its end: `settle()` waits for it and
the container runs, instead of containerd abandoning the start seconds later and
leaving a StartError behind.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from klet.cri import CRISettings, RuntimeClient
from klet.cri.types import (
    ContainerConfig,
    ContainerState,
    LinuxContainerSecurity,
    SandboxConfig,
)
from klet.devstack import DevStack
from klet.model.types import SandboxID
from klet.syncloop.containers import execwait

IMAGE = "registry.klet.test/busybox:1.36"


@dataclass
class Pod:
    cri: RuntimeClient
    sandbox: SandboxID
    config: SandboxConfig

    def container(self, name: str, *command: str) -> ContainerConfig:
        return ContainerConfig(
            name,
            0,
            IMAGE,
            command=command,
            log_path=f"{name}.log",
            security=LinuxContainerSecurity(),
        )


@pytest.fixture
async def pod(devstack: DevStack) -> AsyncIterator[Pod]:
    cri = RuntimeClient(CRISettings(runtime_endpoint=devstack.runtime_endpoint, timeout_s=30))
    config = SandboxConfig("cri", "default", "uid-cri-client", 0, "cri", "/tmp/klet-cri-logs")
    await cri.pull_image(IMAGE)
    sandbox = await cri.run_pod_sandbox(config)
    try:
        yield Pod(cri, sandbox, config)
    finally:
        await cri.stop_pod_sandbox(sandbox)
        await cri.remove_pod_sandbox(sandbox)
        await cri.close()


async def test_the_verbose_status_gives_the_pid(pod: Pod) -> None:
    cri = pod.cri
    cid = await cri.create_container(pod.sandbox, pod.container("c", "sleep", "60"), pod.config)
    assert await cri.container_pid(cid) == 0  # no process before the start
    await cri.start_container(cid)
    pid = await cri.container_pid(cid)
    assert await execwait.wait_for_exec(cri, cid)
    assert pid > 0 and execwait.read_comm(pid) == "sleep"


async def test_a_start_whose_caller_is_cancelled_runs_to_its_end(pod: Pod) -> None:
    cri = pod.cri
    cid = await cri.create_container(pod.sandbox, pod.container("s", "sleep", "60"), pod.config)
    caller = asyncio.create_task(cri.start_container(cid))
    await asyncio.sleep(0.005)  # the request is on its way
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert await cri.settle()
    status = await cri.container_status(cid)
    assert status.state == ContainerState.RUNNING, (status.reason, status.message)
    assert await cri.settle()  # nothing left: at once
