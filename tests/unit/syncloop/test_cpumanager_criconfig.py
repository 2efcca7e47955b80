"""What the CPU manager adds to a container's CRI config (containers/startcontainer.py,
upstream's PreCreateContainer): the cpuset (its own CPUs, else the shared pool) on the
wire as LinuxContainerResources.cpuset_cpus, none under the none policy, and with
DisableCPUQuotaWithExclusiveCPUs no CFS quota for a container (and its pod) holding
exclusive CPUs, the quota kept when the gate is off."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from klet.cri.client import _container_pb
from klet.cri.types import ContainerConfig, LinuxResources
from klet.syncloop.containers.startcontainer import _with_cpuset
from klet.syncloop.cpumanager.manager import CPUManager
from klet.syncloop.cpumanager.policy import NonePolicy, Options, StaticPolicy
from klet.syncloop.cpumanager.topology import CPUInfo, CPUTopology
from klet.syncloop.topologymanager.hints import NUMAInfo
from klet.syncloop.topologymanager.manager import TopologyManager

TWO = CPUTopology({0: CPUInfo(0, 0, 0), 1: CPUInfo(1, 0, 0)})
CFG = ContainerConfig(
    name="app", attempt=0, image="sha256:img", resources=LinuxResources(cpu_quota=100_000)
)


def _pod(uid: str, cpu: str | None) -> dict[str, Any]:
    res = {"cpu": cpu, "memory": "64Mi"} if cpu else {}
    return {
        "metadata": {"uid": uid, "name": uid, "namespace": "default"},
        "spec": {"containers": [{"name": "app", "resources": {"requests": res, "limits": res}}]},
    }


def admit(m: CPUManager, uid: str, pod: dict[str, Any]) -> tuple[str, str] | None:
    """The pod through the topology manager's admit handler as syncloop runs it under
    topologyManagerPolicy none: the CPU manager allocates each container."""
    topology = TopologyManager(
        policy="none", scope="container", numa=NUMAInfo((0,)), allocators=[m]
    )
    return topology.admit(uid, pod, [])


def _static(root: Path, *, disable_quota: bool) -> CPUManager:
    policy = StaticPolicy.create(TWO, count=1, explicit=frozenset(), options=Options())
    m = CPUManager(policy, root, disable_quota=disable_quota)
    m.load()
    return m


def test_exclusive_and_shared_cpusets_reach_the_wire(tmp_path: Path) -> None:
    m = _static(tmp_path, disable_quota=True)
    g, be = _pod("g", "1"), _pod("be", None)
    admit(m, "g", g)
    admit(m, "be", be)
    exclusive = _with_cpuset(CFG, g, g["spec"]["containers"][0], m)
    assert exclusive.resources == LinuxResources(cpu_quota=-1, cpuset_cpus="1")
    assert _container_pb(exclusive).linux.resources.cpuset_cpus == "1"
    assert _container_pb(exclusive).linux.resources.cpu_quota == -1
    shared = _with_cpuset(CFG, be, be["spec"]["containers"][0], m)
    assert shared.resources == LinuxResources(cpu_quota=100_000, cpuset_cpus="0")
    assert m.unlimited_quota("g") and not m.unlimited_quota("be")


def test_the_quota_stays_with_the_gate_off(tmp_path: Path) -> None:
    m = _static(tmp_path, disable_quota=False)
    g = _pod("g", "1")
    admit(m, "g", g)
    cfg = _with_cpuset(CFG, g, g["spec"]["containers"][0], m)
    assert cfg.resources == LinuxResources(cpu_quota=100_000, cpuset_cpus="1")
    assert not m.unlimited_quota("g")


def test_the_none_policy_leaves_the_config_alone(tmp_path: Path) -> None:
    m = CPUManager(NonePolicy(), tmp_path, disable_quota=True)
    g = _pod("g", "1")
    admit(m, "g", g)
    assert _with_cpuset(CFG, g, g["spec"]["containers"][0], m) == CFG
