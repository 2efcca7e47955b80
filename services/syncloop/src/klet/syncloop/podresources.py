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
bytes (upstream's GetAllocatableMemory); under `None` nothing. DRA (List and Get, the
KubeletPodResourcesDynamicResources gate on as upstream's default): each prepared claim
a container names in `resources.claims` (the claim manager's cache, dra/manager.py),
with per driver (in name order) and device its pool, name and CDI devices; as
upstream's GetDynamicResources, a device's CDI list also carries those of the same
driver's devices before it (upstream appends to one list per driver), and a claim the
manager does not hold gives the container no dynamic resources at all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, replace
from typing import Protocol

from klet.model.devices import Device
from klet.model.podresources import (
    AllocatableResources,
    ClaimResource,
    ContainerMemory,
    DynamicResource,
    NumaDevices,
    PodResources,
    allocatable_devices,
    find_pod,
    pod_resources,
)
from klet.model.types import JSON
from klet.syncloop.dra.claiminfo import ClaimInfo
from klet.syncloop.dra.manager import DRAPrepareError
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


class ClaimHolder(Protocol):
    """The DRA claim manager (`dra.manager.ClaimManager`)."""

    def container_claims(self, pod: JSON, container: JSON) -> list[ClaimInfo]: ...


def dynamic_resources(claims: Sequence[ClaimInfo]) -> tuple[DynamicResource, ...]:
    """The container's DRA entries (upstream's GetDynamicResources; the module says how
    each device's CDI list is built)."""
    out = []
    for info in claims:
        resources = []
        for driver in sorted(info.driver_state):
            cdi: list[str] = []
            for device in info.driver_state[driver]:
                cdi += device.cdi_device_ids
                resources.append(
                    ClaimResource(driver, device.pool_name, device.device_name, tuple(cdi))
                )
        out.append(DynamicResource(info.claim_name, info.namespace, tuple(resources)))
    return tuple(out)


def _container_specs(pod: JSON) -> dict[str, JSON]:
    spec = pod.get("spec") or {}
    return {
        str(c.get("name")): c
        for kind in ("initContainers", "containers")
        for c in spec.get(kind) or []
    }


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
    claims: ClaimHolder | None = None
    """None: no claim manager (standalone, or DRA off): no dynamic resources."""
    dynamic_gate: bool = True
    """KubeletPodResourcesDynamicResources: false lists no dynamic resources."""

    def _devices_of(self, uid: str, container: str) -> Mapping[str, NumaDevices]:
        if self.devices is None:
            return {}
        self.devices.load()  # a restarted leader answers from its checkpoint at once
        return self.devices.container_devices(uid, container)

    def _cpus_of(self, uid: str, container: str) -> Sequence[int]:
        return () if self.cpus is None else sorted(self.cpus.exclusive(uid, container))

    def _dynamic(self, pod: JSON, name: str) -> tuple[DynamicResource, ...]:
        container = _container_specs(pod).get(name)
        if self.claims is None or not self.dynamic_gate or container is None:
            return ()
        try:
            return dynamic_resources(self.claims.container_claims(pod, container))
        except (ValueError, LookupError, DRAPrepareError):  # upstream: none for the container
            return ()

    def _answer(self, pod: JSON) -> PodResources:
        answer = pod_resources(pod, devices_of=self._devices_of, cpus_of=self._cpus_of)
        if self.claims is not None and self.dynamic_gate:
            answer = replace(
                answer,
                containers=tuple(
                    replace(c, dynamic_resources=self._dynamic(pod, c.name))
                    for c in answer.containers
                ),
            )
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
