"""The device manager's topology hints: which NUMA node sets a container's devices fit.

As upstream's devicemanager/topology_hints.go: a resource none of whose devices reports
a topology in ListAndWatch has no preference (None); devices already held by the
container give their own nodes back (a restart re-admits the pod on them); otherwise
every node set holding enough available (healthy, not held) devices is a hint,
preferred when it is as narrow as the narrowest set that holds enough of the
resource's devices at all. A request larger than what is available gives an empty
list: the resource fits nowhere.

`device_hints` is pure; `DeviceHints` adapts the device manager (devices/manager.py)
to the topology manager's HintProvider without the device manager knowing of it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from klet.model.devices import Device
from klet.model.types import JSON
from klet.syncloop.devices.allocation import container_devices, pod_devices
from klet.syncloop.topologymanager.hints import (
    ProviderHints,
    TopologyHint,
    iterate_masks,
    mask_of,
)

__all__ = ["DeviceHints", "DeviceView", "device_hints", "resource_hints"]


def device_hints(
    nodes: Sequence[int], devices: Iterable[Device], candidates: set[str], request: int
) -> list[TopologyHint]:
    """Hints for `request` devices out of `candidates` (IDs) of one resource."""
    listed = list(devices)
    min_size = len(nodes)
    found: list[int] = []
    for mask in iterate_masks(nodes):
        in_mask = sum(1 for d in listed if mask & mask_of(d.numa_nodes))
        if in_mask >= request:
            min_size = min(min_size, mask.bit_count())
        matching = sum(1 for d in listed if d.id in candidates and mask & mask_of(d.numa_nodes))
        if matching >= request:
            found.append(mask)
    return [TopologyHint(m, m.bit_count() == min_size) for m in found]


def resource_hints(
    nodes: Sequence[int],
    *,
    listed: Mapping[str, Sequence[Device]],
    wanted: Mapping[str, int],
    held_by_container: Mapping[str, set[str]],
    in_use: Mapping[str, set[str]],
) -> dict[str, list[TopologyHint] | None]:
    """One container's (or pod's) hints by device resource."""
    out: dict[str, list[TopologyHint] | None] = {}
    for resource, request in sorted(wanted.items()):
        devices = listed.get(resource, ())
        if not any(d.numa_nodes for d in devices):
            out[resource] = None
            continue
        held = held_by_container.get(resource, set())
        if held:
            out[resource] = (
                [] if len(held) != request else device_hints(nodes, devices, held, request)
            )
            continue
        available = {
            d.id
            for d in devices
            if d.health == "Healthy" and d.id not in in_use.get(resource, set())
        }
        if len(available) < request:
            out[resource] = []
            continue
        out[resource] = device_hints(nodes, devices, available, request)
    return out


class HeldDevices(Protocol):
    def devices(self) -> set[str]: ...


class DeviceView(Protocol):
    """The device manager as the hints need it."""

    def listed_devices(self) -> dict[str, list[Device]]: ...

    @property
    def held(self) -> Mapping[tuple[str, str, str], HeldDevices]: ...


def _uid(pod: JSON) -> str:
    return str((pod.get("metadata") or {}).get("uid") or "")


class DeviceHints:
    """The device manager as a topology HintProvider."""

    def __init__(self, devices: DeviceView, nodes: Sequence[int]) -> None:
        self.devices = devices
        self.nodes = tuple(nodes)

    def _hints(self, uid: str, names: set[str], wanted: Mapping[str, int]) -> ProviderHints:
        listed = self.devices.listed_devices()
        wanted = {r: n for r, n in wanted.items() if r in listed}
        held: dict[str, set[str]] = {}
        in_use: dict[str, set[str]] = {}
        for (pod_uid, container, resource), entry in self.devices.held.items():
            in_use.setdefault(resource, set()).update(entry.devices())
            if pod_uid == uid and container in names:
                held.setdefault(resource, set()).update(entry.devices())
        return resource_hints(
            self.nodes, listed=listed, wanted=wanted, held_by_container=held, in_use=in_use
        )

    def topology_hints(self, pod: JSON, container: JSON) -> ProviderHints | None:
        return self._hints(_uid(pod), {str(container.get("name"))}, container_devices(container))

    def pod_topology_hints(self, pod: JSON) -> ProviderHints | None:
        spec = pod.get("spec") or {}
        names = {
            str(c.get("name"))
            for c in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]
        }
        return self._hints(_uid(pod), names, pod_devices(pod))
