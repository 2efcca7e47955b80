"""Node capacity and allocatable as the Node status spells them.

The rules (capacity from the machine; allocatable = capacity − kubeReserved −
systemReserved − the hard eviction thresholds, huge pages out of memory) live in
`klet.model.node`, shared with syncloop's pod admission so the numbers a pod is
admitted against are the ones the Node reports. This module turns those amounts into
the canonical quantity strings the apiserver stores (`resource.Quantity.String()`), so
comparing what we computed with what the apiserver returns does not see a difference
that is only spelling: binary sizes use the largest exact Ki/Mi/Gi/... suffix, CPUs are
whole numbers or millicores.
"""

from __future__ import annotations

from collections.abc import Mapping

from klet.model.node import (
    MachineInfo,
    allocatable_amounts,
    capacity_amounts,
    format_bytes,
    format_cpu,
    reservation,
)

__all__ = [
    "MachineInfo",
    "allocatable",
    "capacity",
    "format_bytes",
    "format_cpu",
    "reservation",
]


def _spell(amounts: Mapping[str, int]) -> dict[str, str]:
    out: dict[str, str] = {}
    for resource, amount in amounts.items():
        if resource == "cpu":
            out[resource] = format_cpu(amount)
        elif resource == "pods":
            out[resource] = str(amount)
        else:
            out[resource] = format_bytes(amount)
    return out


def capacity(machine: MachineInfo, *, max_pods: int) -> dict[str, str]:
    """The Node's status.capacity."""
    return _spell(capacity_amounts(machine, max_pods=max_pods))


def allocatable(
    machine: MachineInfo,
    *,
    max_pods: int,
    kube_reserved: Mapping[str, str],
    system_reserved: Mapping[str, str],
    eviction_hard: Mapping[str, str],
) -> dict[str, str]:
    """The Node's status.allocatable."""
    return _spell(
        allocatable_amounts(
            machine,
            max_pods=max_pods,
            kube_reserved=kube_reserved,
            system_reserved=system_reserved,
            eviction_hard=eviction_hard,
        )
    )
