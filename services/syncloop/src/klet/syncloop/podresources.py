"""The PodResources API's source: syncloop's pods and its resource managers' allocations.

Why syncloop: the API answers which container holds which devices, exclusive CPUs and
memory, and only syncloop has those. The device manager's allocations live in
syncloop's memory and its checkpoint, never on the bus (the `devices` table carries
counts only); the pods the API lists are upstream's active pods, which are syncloop's
admission decision (`PodController.active_pods`); the CPU manager's assignments and the
memory manager's blocks are syncloop's too (`cpumanager/`, `memorymanager/`, in memory
and their state files, never on the bus). So the leader serves it (root
task `pod-resources`, like the device plugin registration socket beside it) and a
restarted or newly elected leader serves it again as soon as it leads, answering from
the checkpoint and state files it reads back and the pods it re-admits.

Upstream's gates: KubeletPodResourcesListUseActivePods (on) makes List read the active
pods, off every pod the sources gave; KubeletPodResourcesGet (on) allows Get, off Get
answers upstream's "disabled" error. Get finds any pod the sources gave, active or not,
as upstream's pod manager does. Upstream's List first releases the devices of pods no
longer active (UpdateAllocatedDevices); klet's device-plugins root task does that every
second once the sources are ready, so List only reads.

CPU IDs: a container's exclusive CPUs as the CPU manager assigned them (none for a
container in the shared pool); allocatable, the CPUs the policy hands out exclusively:
under `static` every online CPU but the reserved ones, under `none` none at all
(upstream's none policy answers an empty set, and its e2e test expects that). Memory:
under the `Static` memory manager a container's blocks (type, bytes, NUMA nodes) from
its state, and allocatable one entry per NUMA node and memory type with allocatable
bytes (upstream's GetAllocatableMemory); under `None` nothing. DRA: the claims are
prepared (dra/) but not listed: the KubeletPodResourcesDynamicResources gate is
refused at start, so no dynamic resources.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, replace
from typing import Protocol

from klet.model.devices import Device
from klet.model.podresources import (
    AllocatableResources,
    ContainerMemory,
    NumaDevices,
    PodResources,
    allocatable_devices,
    find_pod,
    pod_resources,
)
from klet.model.types import JSON
from klet.syncloop.memorymanager.state import MemoryState


class DeviceHolder(Protocol):
    """The device manager (`devices.manager.DeviceManager`)."""

    def container_devices(self, uid: str, container: str) -> Mapping[str, NumaDevices]: ...

    def listed_devices(self) -> Mapping[str, Sequence[Device]]: ...

    def load(self) -> None:
        """Read the checkpoint if not yet read (idempotent)."""
        ...


class CPUHolder(Protocol):
    """The CPU manager (`cpumanager.manager.CPUManager`)."""

    def exclusive(self, uid: str, name: str) -> Set[int]: ...

    def allocatable(self) -> Set[int]: ...


class MemoryHolder(Protocol):
    """The memory manager (`memorymanager.manager.MemoryManager`): its state as the
    Static policy keeps it (a `None` policy's holds nothing)."""

    @property
    def state(self) -> MemoryState: ...


def container_memory(state: MemoryState, uid: str, name: str) -> tuple[ContainerMemory, ...]:
    """A container's memory blocks (upstream's GetMemory)."""
    blocks = ((state.entries or {}).get(uid) or {}).get(name) or []
    return tuple(
        ContainerMemory(b.type, b.size, tuple(sorted(b.numa_affinity or ()))) for b in blocks
    )


def allocatable_memory(state: MemoryState) -> tuple[ContainerMemory, ...]:
    """Per NUMA node and memory type, the allocatable bytes (upstream's static policy's
    GetAllocatableMemory; types with none left out)."""
    return tuple(
        ContainerMemory(kind, table.allocatable, (node,))
        for node, node_state in sorted((state.machine or {}).items())
        for kind, table in sorted((node_state.memory_map or {}).items())
        if table.allocatable
    )


class NodePods(Protocol):
    """The pods syncloop knows (`pods.controller.PodController`)."""

    def active_pods(self) -> list[JSON]: ...

    def all_pods(self) -> list[JSON]: ...


@dataclass(frozen=True)
class PodResourcesView:
    """Implements `klet.rpc.podresources.PodResourcesSource`."""

    pods: NodePods
    devices: DeviceHolder | None
    """None: no device manager (nothing holds devices)."""
    cpus: CPUHolder | None = None
    """None: no CPU manager (no exclusive CPUs)."""
    memory: MemoryHolder | None = None
    """None: no memory manager (no memory listed)."""
    use_active_pods: bool = True
    get_gate: bool = True

    def _devices_of(self, uid: str, container: str) -> Mapping[str, NumaDevices]:
        if self.devices is None:
            return {}
        self.devices.load()  # a restarted leader answers from its checkpoint at once
        return self.devices.container_devices(uid, container)

    def _cpus_of(self, uid: str, container: str) -> Sequence[int]:
        return () if self.cpus is None else sorted(self.cpus.exclusive(uid, container))

    def _answer(self, pod: JSON) -> PodResources:
        answer = pod_resources(pod, devices_of=self._devices_of, cpus_of=self._cpus_of)
        if self.memory is None:
            return answer
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        state = self.memory.state
        return replace(
            answer,
            containers=tuple(
                replace(c, memory=container_memory(state, uid, c.name)) for c in answer.containers
            ),
        )

    def list_pods(self) -> list[PodResources]:
        pods = self.pods.active_pods() if self.use_active_pods else self.pods.all_pods()
        return [self._answer(p) for p in pods]

    def get_pod(self, namespace: str, name: str) -> PodResources | None:
        pod = find_pod(self.pods.all_pods(), namespace, name)
        return None if pod is None else self._answer(pod)

    def allocatable(self) -> AllocatableResources:
        listed = {} if self.devices is None else self.devices.listed_devices()
        cpus = () if self.cpus is None else tuple(sorted(self.cpus.allocatable()))
        memory = () if self.memory is None else allocatable_memory(self.memory.state)
        return AllocatableResources(
            devices=allocatable_devices(listed), cpu_ids=cpus, memory=memory
        )

    def get_enabled(self) -> bool:
        return self.get_gate
