"""Building the memory manager and the topology manager from the configuration.

Upstream's container manager creates the topology manager first and registers the
resource managers as its hint providers; here the two packages stay apart (the memory
manager uses the topology manager's hints, never the reverse) and this module joins
them: the memory manager (memoryManagerPolicy); the CPU manager's hints, the memory
manager's and the device manager's as providers; the CPU manager and then the memory
manager as allocators (upstream's order). With topologyManagerPolicy none and
memoryManagerPolicy None the topology manager has nothing to merge and the machine's
NUMA nodes are not read: it only has the CPU manager take each container's CPUs with
no preference, and counts its admissions, as upstream's admit handler does under
every policy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from klet.config.kubelet import KubeletConfiguration
from klet.syncloop.memorymanager.manager import MemoryManager, MemoryObserver, create_manager
from klet.syncloop.memorymanager.numa import SYS_NODE, NUMAError, discover
from klet.syncloop.memorymanager.policy import MemoryManagerError
from klet.syncloop.topologymanager.devicehints import DeviceHints, DeviceView
from klet.syncloop.topologymanager.hints import NUMAInfo, policy_options
from klet.syncloop.topologymanager.manager import (
    Allocator,
    HintProvider,
    TopologyManager,
    TopologyObserver,
)


class Observer(MemoryObserver, TopologyObserver, Protocol):
    """Both managers' metrics (klet.syncloop.metrics.NUMAMetrics)."""


class CPUs(HintProvider, Allocator, Protocol):
    """The CPU manager (cpumanager/manager.py): hints and exclusive CPUs."""


def build(
    cfg: KubeletConfiguration,
    root_dir: Path,
    *,
    cpus: CPUs,
    devices: DeviceView | None,
    sys_node: Path = SYS_NODE,
    observer: Observer | None = None,
) -> tuple[MemoryManager, TopologyManager]:
    """Both managers; raises MemoryManagerError naming the field when the machine or the
    configuration does not allow them (upstream's kubelet does not start either)."""
    policy = cfg.topology_manager_policy or "none"
    if policy == "none" and cfg.memory_manager_policy in ("", "None"):
        # nothing to align or place: no machine to read; the admit handler still counts
        memory = create_manager(cfg, root_dir, observer=observer)
        memory.check()
        none = TopologyManager(
            policy="none",
            scope="container",
            numa=NUMAInfo((0,)),
            allocators=[cpus],
            observer=observer,
        )
        return memory, none
    try:
        machine = discover(sys_node)
    except NUMAError as err:
        raise MemoryManagerError(f"reading the NUMA topology: {err}") from err
    memory = create_manager(cfg, root_dir, machine=machine, observer=observer)
    memory.check()
    if cfg.topology_manager_policy_options and not cfg.feature_gates.get(
        "TopologyManagerPolicyOptions", True
    ):
        raise MemoryManagerError(
            "topologyManagerPolicyOptions: requires feature gate TopologyManagerPolicyOptions"
        )
    try:
        options = policy_options(
            cfg.topology_manager_policy_options,
            beta=cfg.feature_gates.get("TopologyManagerPolicyBetaOptions", True),
        )
    except ValueError as err:
        raise MemoryManagerError(f"topologyManagerPolicyOptions: {err}") from err
    nodes = tuple(n.id for n in machine.nodes)
    if policy != "none" and len(nodes) > options.max_numa_nodes:
        raise MemoryManagerError(
            f"topologyManagerPolicy: {policy}: unsupported on machines with more than "
            f"{options.max_numa_nodes} NUMA Nodes"
        )
    providers: list[HintProvider] = [cpus, memory]
    if devices is not None:
        providers.append(DeviceHints(devices, nodes))
    topology = TopologyManager(
        policy=policy,
        scope=cfg.topology_manager_scope or "container",
        numa=NUMAInfo(nodes, machine.distances),
        options=options,
        providers=providers,
        allocators=[cpus, memory],
        observer=observer,
    )
    return memory, topology
