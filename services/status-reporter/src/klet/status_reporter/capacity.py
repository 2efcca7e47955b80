"""Node capacity and allocatable, as pure functions of machine facts and configuration.

Upstream's rules (container manager `GetNodeAllocatableReservation` and the
`MachineInfo` status setter), restated:

- capacity: `cpu` = logical CPUs, `memory` = MemTotal, `ephemeral-storage` = size of the
  filesystem holding the kubelet root directory, `pods` = maxPods, and one
  `hugepages-<size>` per huge page size the kernel offers (bytes reserved in them);
- reserved = kubeReserved + systemReserved + the hard eviction threshold that guards the
  resource: `memory.available` for memory and `nodefs.available` for ephemeral storage
  (a percentage is taken of that resource's capacity). Other resources (pid, ...) in
  the reservations only matter for cgroup enforcement, not for allocatable;
- allocatable = capacity − reserved, never below zero; memory additionally loses what is
  held in huge pages, since those pages cannot back ordinary pod memory.

Quantities are written in the canonical form the apiserver stores them in (the form
`resource.Quantity.String()` prints), so comparing what we computed with what the
apiserver returns does not see a difference that is only spelling: binary sizes use
the largest exact Ki/Mi/Gi/... suffix, CPUs are whole numbers or millicores.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from klet.config.units import parse_percentage, parse_quantity


@dataclass(frozen=True)
class MachineInfo:
    """What the Node status says about the machine; sizes in bytes."""

    cpus: int
    memory_bytes: int
    ephemeral_storage_bytes: int
    hugepages: Mapping[int, int] = field(default_factory=dict)
    """Huge page size in bytes → bytes reserved in pages of that size."""
    machine_id: str = ""
    system_uuid: str = ""
    boot_id: str = ""
    kernel_version: str = ""
    os_image: str = "Linux"
    architecture: str = "amd64"
    operating_system: str = "linux"


_BINARY = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")

# Hard eviction signal → the resource whose allocatable it reduces.
EVICTION_RESOURCE = {"memory.available": "memory", "nodefs.available": "ephemeral-storage"}


def format_bytes(n: int) -> str:
    """A byte count as a canonical binary quantity ("16Mi", "1000000", "0")."""
    if n < 1024:
        return str(n)
    exp = 0
    while exp < len(_BINARY) - 1 and n % 1024 == 0:
        n //= 1024
        exp += 1
    return f"{n}{_BINARY[exp]}"


def format_cpu(millis: int) -> str:
    """Millicores as a canonical CPU quantity ("4", "3900m")."""
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


def hugepage_resource(page_bytes: int) -> str:
    """The resource name of a huge page size ("hugepages-2Mi", "hugepages-1Gi")."""
    return "hugepages-" + format_bytes(page_bytes)


def capacity(machine: MachineInfo, *, max_pods: int) -> dict[str, str]:
    """The Node's status.capacity."""
    out = {
        "cpu": format_cpu(machine.cpus * 1000),
        "memory": format_bytes(machine.memory_bytes),
        "ephemeral-storage": format_bytes(machine.ephemeral_storage_bytes),
        "pods": str(max_pods),
    }
    for size, total in sorted(machine.hugepages.items()):
        out[hugepage_resource(size)] = format_bytes(total)
    return out


def _amount(resource: str, quantity: str) -> int:
    """A reservation in the unit allocatable is computed in: millicores or bytes/count."""
    value = parse_quantity(quantity)
    if resource == "cpu":
        return math.ceil(value * 1000)
    return math.ceil(value)


def _threshold(value: str, capacity_amount: int) -> int:
    if value.endswith("%"):
        return int(capacity_amount * parse_percentage(value) / 100)
    return math.ceil(parse_quantity(value))


def reservation(
    capacity_amounts: Mapping[str, int],
    *,
    kube_reserved: Mapping[str, str],
    system_reserved: Mapping[str, str],
    eviction_hard: Mapping[str, str],
) -> dict[str, int]:
    """What is held back from pods, per resource (millicores for cpu, else bytes/count).

    Raises ValueError for a quantity that does not parse (configuration validation
    should have refused it already).
    """
    out: dict[str, int] = {}
    for reserved in (kube_reserved, system_reserved):
        for resource, quantity in reserved.items():
            out[resource] = out.get(resource, 0) + _amount(resource, quantity)
    for signal, value in eviction_hard.items():
        if signal not in EVICTION_RESOURCE:
            continue
        resource = EVICTION_RESOURCE[signal]
        out[resource] = out.get(resource, 0) + _threshold(value, capacity_amounts.get(resource, 0))
    return out


def allocatable(
    machine: MachineInfo,
    *,
    max_pods: int,
    kube_reserved: Mapping[str, str],
    system_reserved: Mapping[str, str],
    eviction_hard: Mapping[str, str],
) -> dict[str, str]:
    """The Node's status.allocatable (see the module docstring)."""
    amounts = {
        "cpu": machine.cpus * 1000,
        "memory": machine.memory_bytes,
        "ephemeral-storage": machine.ephemeral_storage_bytes,
    }
    held = reservation(
        amounts,
        kube_reserved=kube_reserved,
        system_reserved=system_reserved,
        eviction_hard=eviction_hard,
    )
    hugepage_bytes = sum(machine.hugepages.values())
    cpu = max(0, amounts["cpu"] - held.get("cpu", 0))
    memory = max(0, amounts["memory"] - held.get("memory", 0) - hugepage_bytes)
    storage = max(0, amounts["ephemeral-storage"] - held.get("ephemeral-storage", 0))
    out = {
        "cpu": format_cpu(cpu),
        "memory": format_bytes(memory),
        "ephemeral-storage": format_bytes(storage),
        "pods": str(max_pods),
    }
    for size, total in sorted(machine.hugepages.items()):
        name = hugepage_resource(size)
        out[name] = format_bytes(max(0, total - held.get(name, 0)))
    return out
