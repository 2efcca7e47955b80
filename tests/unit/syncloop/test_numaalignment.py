"""The memory and topology managers as syncloop builds them (klet.syncloop.numaalignment)
over a fake one-node sysfs, and what they add to the CRI config (containers/
startcontainer.py): with memoryManagerPolicy None and topologyManagerPolicy none
nothing is placed and no sysfs is read, yet admissions are counted; Static with
single-numa-node admits a Guaranteed pod on node 0, records it in memory_manager_state
and puts cpuset_mems "0" on the wire (LinuxContainerResources.cpuset_mems), a
best-effort pod gets none; a Guaranteed pod larger than the node is refused with
upstream's reason; the options and the NUMA node limit are checked at start;
upstream's memory and topology manager series count pinnings, admissions and
refusals, and under single-numa-node the aligned and unaligned placements by scope
(container, pod; kubelet_container_aligned_compute_resources_{count,failure_count}, made
at 0 under every policy); the CPU manager's hints join the merge (a pod goes to the node with CPUs
enough, memory with it; one whose CPUs fit no node is refused) and it allocates."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from klet.config import KubeletConfiguration
from klet.cri.client import _container_pb
from klet.cri.types import ContainerConfig
from klet.model.types import JSON
from klet.syncloop.containers.startcontainer import _with_mems
from klet.syncloop.cpumanager.manager import CPUManager
from klet.syncloop.cpumanager.policy import NonePolicy, Options, StaticPolicy
from klet.syncloop.cpumanager.topology import CPUInfo, CPUTopology
from klet.syncloop.memorymanager.policy import MemoryManagerError
from klet.syncloop.metrics import NUMAMetrics
from klet.syncloop.numaalignment import build
from prometheus_client import CollectorRegistry

CFG = ContainerConfig(name="app", attempt=0, image="sha256:img")


def sysfs(root: Path, nodes: int = 1) -> Path:
    for n in range(nodes):
        d = root / "sys" / f"node{n}"
        d.mkdir(parents=True)
        (d / "meminfo").write_text(f"Node {n} MemTotal: {4 << 20} kB\n")  # 4Gi
        (d / "distance").write_text("10\n")
    return root / "sys"


def cfg(**fields: object) -> KubeletConfiguration:
    base = {
        "memory_manager_policy": "Static",
        "topology_manager_policy": "single-numa-node",
        "reserved_memory": ({"numaNode": 0, "limits": {"memory": "100Mi"}},),
    }
    return dataclasses.replace(KubeletConfiguration(), **{**base, **fields})  # type: ignore[arg-type]


def pod(uid: str, memory: str | None) -> JSON:
    res = {"cpu": "1", "memory": memory} if memory else {}
    return {
        "metadata": {"uid": uid, "name": uid, "namespace": "default"},
        "spec": {"containers": [{"name": "app", "resources": {"requests": res, "limits": res}}]},
    }


def test_by_default_nothing_is_placed_and_admissions_are_counted(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    memory, topology = build(
        KubeletConfiguration(),
        tmp_path,
        cpus=CPUManager(NonePolicy(), tmp_path),
        devices=None,
        sys_node=tmp_path / "absent",
        observer=NUMAMetrics.create(registry),
    )
    assert topology.policy == "none" and memory.policy is None
    assert topology.admit("a", pod("a", "8Gi"), []) is None
    assert registry.get_sample_value("kubelet_topology_manager_admission_requests_total") == 1
    assert registry.get_sample_value("kubelet_memory_manager_pinning_requests_total") == 0


def test_upstreams_series_count_pinnings_and_refusals(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    _, topology = build(
        cfg(),
        tmp_path,
        cpus=CPUManager(NonePolicy(), tmp_path),
        devices=None,
        sys_node=sysfs(tmp_path),
        observer=NUMAMetrics.create(registry),
    )
    assert topology.admit("a", pod("a", "256Mi"), []) is None
    assert topology.admit("b", pod("b", None), []) is None  # best-effort: no pinning
    assert topology.admit("c", pod("c", "8Gi"), []) is not None
    value = registry.get_sample_value
    assert value("kubelet_memory_manager_pinning_requests_total") == 1
    assert value("kubelet_memory_manager_pinning_errors_total") == 0
    assert value("kubelet_topology_manager_admission_requests_total") == 3
    assert value("kubelet_topology_manager_admission_errors_total") == 1
    assert value("kubelet_topology_manager_admission_duration_ms_count") == 3
    aligned = "kubelet_container_aligned_compute_resources_count"
    failed = "kubelet_container_aligned_compute_resources_failure_count"

    def numa(name: str, scope: str, reg: CollectorRegistry = registry) -> float | None:
        return reg.get_sample_value(name, {"scope": scope, "boundary": "numa_node"})

    # single-numa-node guarantees alignment: each admitted container counts (the
    # best-effort one too, as upstream), the pod refused by the merge is a failure
    assert (numa(aligned, "container"), numa(failed, "container")) == (2, 1)
    assert (numa(aligned, "pod"), numa(failed, "pod")) == (0, 0)  # made at start
    _, plain = build(
        cfg(topology_manager_policy="none"),
        tmp_path / "p",
        cpus=CPUManager(NonePolicy(), tmp_path),
        devices=None,
        sys_node=sysfs(tmp_path / "q"),
        observer=NUMAMetrics.create(registry := CollectorRegistry()),
    )
    assert plain.admit("c", pod("c", "8Gi"), []) is not None
    assert registry.get_sample_value("kubelet_memory_manager_pinning_errors_total") == 1
    # under policy none an allocation failure is not a topology admission error
    assert registry.get_sample_value("kubelet_topology_manager_admission_errors_total") == 0
    # nor is anything aligned, yet the four series are there from the start
    for scope in ("container", "pod"):
        assert (numa(aligned, scope, registry), numa(failed, scope, registry)) == (0, 0)
    _, by_pod = build(
        cfg(topology_manager_scope="pod"),
        tmp_path / "s",
        cpus=CPUManager(NonePolicy(), tmp_path),
        devices=None,
        sys_node=sysfs(tmp_path / "t"),
        observer=NUMAMetrics.create(registry := CollectorRegistry()),
    )
    assert by_pod.admit("a", pod("a", "256Mi"), []) is None
    assert by_pod.admit("c", pod("c", "8Gi"), []) is not None
    assert (numa(aligned, "pod", registry), numa(failed, "pod", registry)) == (1, 1)
    assert (numa(aligned, "container", registry), numa(failed, "container", registry)) == (0, 0)


def test_a_guaranteed_pod_is_placed_on_node_0(tmp_path: Path) -> None:
    memory, topology = build(
        cfg(),
        tmp_path,
        cpus=CPUManager(NonePolicy(), tmp_path),
        devices=None,
        sys_node=sysfs(tmp_path),
    )
    p = pod("a", "256Mi")
    assert topology.admit("a", p, []) is None
    doc = json.loads((tmp_path / "memory_manager_state").read_bytes())
    assert doc["entries"]["a"]["app"] == [
        {"numaAffinity": [0], "type": "memory", "size": 256 << 20}
    ]
    wire = _container_pb(_with_mems(CFG, p, p["spec"]["containers"][0], memory))
    assert wire.linux.resources.cpuset_mems == "0"
    best = pod("b", None)
    assert topology.admit("b", best, []) is None
    assert _with_mems(CFG, best, best["spec"]["containers"][0], memory) == CFG


def test_a_pod_larger_than_the_node_is_refused(tmp_path: Path) -> None:
    _, topology = build(
        cfg(),
        tmp_path,
        cpus=CPUManager(NonePolicy(), tmp_path),
        devices=None,
        sys_node=sysfs(tmp_path),
    )
    assert topology.admit("a", pod("a", "8Gi"), []) == (
        "TopologyAffinityError",
        "Resources cannot be allocated with Topology locality",
    )
    _, plain = build(
        cfg(topology_manager_policy="none"),
        tmp_path,
        cpus=CPUManager(NonePolicy(), tmp_path),
        devices=None,
        sys_node=sysfs(tmp_path / "x"),
    )
    reason, message = plain.admit("a", pod("a", "8Gi"), []) or ("", "")
    assert reason == "UnexpectedAdmissionError"
    assert message.startswith("Allocate failed due to [memorymanager] failed to get the default")


def test_start_checks(tmp_path: Path) -> None:
    with pytest.raises(MemoryManagerError, match="more than 8 NUMA Nodes"):
        build(
            cfg(memory_manager_policy="None"),
            tmp_path,
            cpus=CPUManager(NonePolicy(), tmp_path),
            devices=None,
            sys_node=sysfs(tmp_path, 9),
        )
    with pytest.raises(MemoryManagerError, match="requires feature gate"):
        build(
            cfg(
                topology_manager_policy_options={"prefer-closest-numa-nodes": "true"},
                feature_gates={"TopologyManagerPolicyOptions": False},
            ),
            tmp_path,
            cpus=CPUManager(NonePolicy(), tmp_path),
            devices=None,
            sys_node=sysfs(tmp_path / "y"),
        )


def test_the_cpu_manager_gives_hints_and_allocates_first(tmp_path: Path) -> None:
    # two NUMA nodes of six CPUs each (CPUs 0-5 on node 0); CPU 0 reserved
    topo = CPUTopology({c: CPUInfo(core=c, socket=c // 6, numa=c // 6) for c in range(12)})
    policy = StaticPolicy.create(topo, count=1, explicit=frozenset(), options=Options())
    cpus = CPUManager(policy, tmp_path)
    memory, topology = build(cfg(), tmp_path, cpus=cpus, devices=None, sys_node=sysfs(tmp_path, 2))
    # node 0 has five CPUs to give: six go to node 1 with their memory
    p = {
        "metadata": {"uid": "a", "name": "a", "namespace": "default"},
        "spec": {
            "containers": [
                {
                    "name": "app",
                    "resources": {
                        "requests": {"cpu": "6", "memory": "256Mi"},
                        "limits": {"cpu": "6", "memory": "256Mi"},
                    },
                }
            ]
        },
    }
    assert topology.admit("a", p, []) is None
    assert cpus.exclusive("a", "app") == set(range(6, 12))
    assert memory.cpuset_mems("a", "app") == "1"
    # seven CPUs fit on no node: refused, though the memory would fit
    p["metadata"]["uid"] = "b"
    p["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "7"
    p["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "7"
    assert topology.admit("b", p, []) == (
        "TopologyAffinityError",
        "Resources cannot be allocated with Topology locality",
    )
    assert cpus.exclusive("b", "app") == frozenset()
