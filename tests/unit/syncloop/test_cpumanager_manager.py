"""The CPU manager (klet.syncloop.cpumanager.manager) over a fake CRI: admission
writes the state file before it answers and refuses with upstream's reason; the CRI
cpuset of each container; a new manager over the same root dir (a restarted syncloop)
reads the same assignments back and keeps the pod; a file of another policy or a
corrupt one stops the start with upstream's message; the reconcile sends shared-pool
containers the pool as it shrinks and grows and each running container its cpuset
once; finished pods' CPUs are released; upstream's kubelet_cpu_manager_* series count
the pinning and follow the pool, and under full-pcpus-only the aligned allocations
(kubelet_container_aligned_compute_resources_{count,failure_count}, boundary
physical_cpu; made at 0 by the static policy, not by none)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from klet.cri.types import LinuxResources
from klet.model.types import ContainerID
from klet.syncloop.cpumanager.manager import CPUManager, CPUManagerError
from klet.syncloop.cpumanager.policy import NonePolicy, Options, StaticPolicy
from klet.syncloop.cpumanager.topology import CPUInfo, CPUTopology
from klet.syncloop.metrics import CPUManagerMetrics
from klet.syncloop.topologymanager.hints import NUMAInfo
from klet.syncloop.topologymanager.manager import TopologyManager
from prometheus_client import CollectorRegistry

TWO = CPUTopology({0: CPUInfo(0, 0, 0), 1: CPUInfo(1, 0, 0)})


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


class FakeCRI:
    def __init__(self) -> None:
        self.updates: list[tuple[str, str]] = []

    async def update_container_resources(
        self, container_id: ContainerID, resources: LinuxResources
    ) -> None:
        self.updates.append((container_id, resources.cpuset_cpus))


def _manager(root: Path) -> CPUManager:
    policy = StaticPolicy.create(TWO, count=1, explicit=frozenset(), options=Options())
    m = CPUManager(policy, root)
    m.load()
    return m


def test_admission_writes_the_state_file_and_sets_the_cpuset(tmp_path: Path) -> None:
    m = _manager(tmp_path)
    assert json.loads((tmp_path / "cpu_manager_state").read_bytes())["defaultCpuSet"] == "0-1"
    g, be = _pod("g", "1"), _pod("be", None)
    assert admit(m, "g", g) is None
    doc = json.loads((tmp_path / "cpu_manager_state").read_bytes())
    assert doc["policyName"] == "static"
    assert doc["defaultCpuSet"] == "0"
    assert doc["entries"] == {"g": {"app": "1"}}
    assert m.cpuset_of(g, g["spec"]["containers"][0]) == "1"
    assert admit(m, "be", be) is None
    assert m.cpuset_of(be, be["spec"]["containers"][0]) == "0"
    assert m.exclusive("g", "app") == {1}
    assert m.allocatable() == {1}
    refused = admit(m, "h", _pod("h", "1"))
    assert refused is not None
    assert refused[0] == "UnexpectedAdmissionError"


def test_a_restarted_manager_keeps_the_assignments(tmp_path: Path) -> None:
    m = _manager(tmp_path)
    g = _pod("g", "1")
    admit(m, "g", g)
    again = _manager(tmp_path)
    assert again.state == m.state
    assert admit(again, "g", g) is None  # re-admitted as it is
    assert again.cpuset_of(g, g["spec"]["containers"][0]) == "1"


def test_a_policy_change_or_a_corrupt_file_stops_the_start(tmp_path: Path) -> None:
    _manager(tmp_path)
    with pytest.raises(CPUManagerError) as err:
        CPUManager(NonePolicy(), tmp_path).load()
    assert 'configured policy "none" differs from state checkpoint policy "static"' in str(
        err.value
    )
    assert "please drain this node and delete the CPU manager checkpoint file" in str(err.value)
    (tmp_path / "cpu_manager_state").write_text('{"policyName":"static","checksum":7}')
    with pytest.raises(CPUManagerError, match="checkpoint is corrupted"):
        _manager(tmp_path)


async def test_reconcile_follows_the_pool_and_release_gives_cpus_back(tmp_path: Path) -> None:
    m = _manager(tmp_path)
    cri = FakeCRI()
    be, g = _pod("be", None), _pod("g", "1")
    containers: dict[str, Sequence[tuple[str, ContainerID]]] = {
        "be": [("app", ContainerID("c-be"))],
        "g": [("app", ContainerID("c-g"))],
    }

    async def running(uid: str) -> Sequence[tuple[str, ContainerID]]:
        return containers.get(uid, [])

    admit(m, "be", be)
    assert await m.reconcile({"be": be}, running, cri) == 1
    assert cri.updates == [("c-be", "0-1")]
    admit(m, "g", g)
    await m.reconcile({"be": be, "g": g}, running, cri)
    assert cri.updates[1:] == [("c-be", "0"), ("c-g", "1")]  # the pool shrank
    assert await m.reconcile({"be": be, "g": g}, running, cri) == 0  # nothing changed
    m.release({"be": be})  # g finished
    assert m.state.assignments == {}
    await m.reconcile({"be": be}, running, cri)
    assert cri.updates[-1] == ("c-be", "0-1")  # and grew


async def test_the_none_policy_sets_no_cpuset_and_updates_nothing(tmp_path: Path) -> None:
    m = CPUManager(NonePolicy(), tmp_path)
    m.load()
    g = _pod("g", "1")
    assert admit(m, "g", g) is None
    assert m.cpuset_of(g, g["spec"]["containers"][0]) == ""
    cri = FakeCRI()

    async def running(uid: str) -> Sequence[tuple[str, ContainerID]]:
        return [("app", ContainerID("c"))]

    assert await m.reconcile({"g": g}, running, cri) == 0
    assert json.loads((tmp_path / "cpu_manager_state").read_bytes())["policyName"] == "none"


def test_upstreams_cpu_manager_series(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    policy = StaticPolicy.create(TWO, count=1, explicit=frozenset(), options=Options())
    m = CPUManager(policy, tmp_path, observer=CPUManagerMetrics.create(registry))
    m.load()

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert value("kubelet_cpu_manager_shared_pool_size_millicores") == 1000  # 0-1 less 0
    assert value("kubelet_cpu_manager_exclusive_cpu_allocation_count") == 0
    admit(m, "be", _pod("be", None))
    assert value("kubelet_cpu_manager_pinning_requests_total") == 0
    admit(m, "g", _pod("g", "1"))
    assert value("kubelet_cpu_manager_pinning_requests_total") == 1
    assert value("kubelet_cpu_manager_shared_pool_size_millicores") == 0
    assert value("kubelet_cpu_manager_exclusive_cpu_allocation_count") == 1
    assert value("kubelet_cpu_manager_allocation_per_numa", numa_node="0") == 1
    admit(m, "h", _pod("h", "1"))
    assert value("kubelet_cpu_manager_pinning_requests_total") == 2
    assert value("kubelet_cpu_manager_pinning_errors_total") == 1
    m.release({})
    assert value("kubelet_cpu_manager_shared_pool_size_millicores") == 1000
    assert value("kubelet_cpu_manager_allocation_per_numa", numa_node="0") == 0


def test_full_pcpus_only_counts_aligned_allocations(tmp_path: Path) -> None:
    four = CPUTopology({c: CPUInfo(c // 2, 0, 0) for c in range(4)})  # 2 cores x 2 threads
    registry = CollectorRegistry()
    policy = StaticPolicy.create(
        four, count=2, explicit=frozenset(), options=Options(full_pcpus_only=True)
    )
    m = CPUManager(policy, tmp_path, observer=CPUManagerMetrics.create(registry))

    def value(name: str, boundary: str) -> float | None:
        labels = {"scope": "container", "boundary": boundary}
        return registry.get_sample_value(
            f"kubelet_container_aligned_compute_resources_{name}", labels
        )

    m.load()
    assert (value("count", "physical_cpu"), value("failure_count", "physical_cpu")) == (0, 0)
    assert value("count", "uncore_cache") == 0  # upstream's static policy makes it too
    assert value("failure_count", "uncore_cache") is None
    assert admit(m, "half", _pod("half", "1")) is not None  # half a core: SMTAlignmentError
    assert admit(m, "be", _pod("be", None)) is None  # shared pool: not an allocation
    assert admit(m, "whole", _pod("whole", "2")) is None
    assert (value("count", "physical_cpu"), value("failure_count", "physical_cpu")) == (1, 1)

    plain = CollectorRegistry()
    none = CPUManager(NonePolicy(), tmp_path / "none", observer=CPUManagerMetrics.create(plain))
    none.load()
    assert admit(none, "g", _pod("g", "1")) is None
    name = "kubelet_container_aligned_compute_resources_count"
    assert plain.get_sample_value(name, {"scope": "container", "boundary": "physical_cpu"}) is None
