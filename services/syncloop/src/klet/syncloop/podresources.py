"""The PodResources API's source: syncloop's pods and the device manager's allocations.

Why syncloop: the API answers which container holds which device (and, upstream,
which exclusive CPUs and memory), and only syncloop has those. The device manager's
allocations live in syncloop's memory and its checkpoint, never on the bus (the
`devices` table carries counts only); the pods the API lists are upstream's active
pods, which are syncloop's admission decision (`PodController.active_pods`); the CPU
manager's assignments are syncloop's too (`cpumanager/`, in memory and its state file;
the bus `cpus` table is a copy). So the leader serves it
(root task `pod-resources`, like the device plugin registration socket beside it) and a
restarted or newly elected leader serves it again as soon as it leads, answering from
the checkpoint it reads back and the pods it re-admits.

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
klet has no memory manager, which answers as upstream's `None` policy: nothing. DRA:
refused at start, so no dynamic resources.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Protocol

from klet.model.devices import Device
from klet.model.podresources import (
    AllocatableResources,
    NumaDevices,
    PodResources,
    allocatable_devices,
    find_pod,
    pod_resources,
)
from klet.model.types import JSON


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
        return pod_resources(pod, devices_of=self._devices_of, cpus_of=self._cpus_of)

    def list_pods(self) -> list[PodResources]:
        pods = self.pods.active_pods() if self.use_active_pods else self.pods.all_pods()
        return [self._answer(p) for p in pods]

    def get_pod(self, namespace: str, name: str) -> PodResources | None:
        pod = find_pod(self.pods.all_pods(), namespace, name)
        return None if pod is None else self._answer(pod)

    def allocatable(self) -> AllocatableResources:
        listed = {} if self.devices is None else self.devices.listed_devices()
        cpus = () if self.cpus is None else tuple(sorted(self.cpus.allocatable()))
        return AllocatableResources(devices=allocatable_devices(listed), cpu_ids=cpus)

    def get_enabled(self) -> bool:
        return self.get_gate
