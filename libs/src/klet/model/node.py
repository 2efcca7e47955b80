"""The node's resources and labels, as pure functions of machine facts and configuration.

Shared by status-reporter (which reports them on the Node) and syncloop (whose pod
admission checks requests against them), so both see exactly the same numbers.

Upstream's rules (container manager `GetNodeAllocatableReservation`, the `MachineInfo`
status setter and the node's default labels), restated:

- capacity: `cpu` = logical CPUs, `memory` = MemTotal, `ephemeral-storage` = size of the
  filesystem holding the kubelet root directory, `pods` = maxPods, and one
  `hugepages-<size>` per huge page size the kernel offers (bytes reserved in them);
- reserved = kubeReserved + systemReserved + the hard eviction threshold that guards the
  resource: `memory.available` for memory and `nodefs.available` for ephemeral storage
  (a percentage is taken of that resource's capacity). Other resources (pid, ...) in
  the reservations only matter for cgroup enforcement, not for allocatable;
- allocatable = capacity − reserved, never below zero; memory additionally loses what is
  held in huge pages, since those pages cannot back ordinary pod memory;
- labels: `kubernetes.io/hostname`, `kubernetes.io/os`, `kubernetes.io/arch` and the
  `beta.` twins of the last two, then --node-labels on top (the flag wins).

Amounts are integers in the unit the scheduler's fit check uses: millicores for `cpu`,
a count for `pods`, bytes for everything else. `format_bytes`/`format_cpu` spell them
the way the apiserver stores quantities (`resource.Quantity.String()`), so a Node we
wrote compares equal to the one the apiserver returns.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from klet.model.units import parse_percentage, parse_quantity


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

NODE_SHUTTING_DOWN = "node is shutting down"
"""The Ready message during a graceful shutdown (upstream's); the eviction service
contributes it as its `Ready`, and syncloop's admission reads it."""
NODE_SHUTDOWN = "NodeShutdown"
"""The pseudo-condition syncloop's admission sees while the node shuts down, and the
reason of the pods it then rejects."""
SHUTDOWN_POD_REASON = "Terminated"
SHUTDOWN_POD_MESSAGE = "Pod was terminated in response to imminent node shutdown."
"""The final status of a pod killed for a graceful shutdown (upstream's)."""

LABEL_HOSTNAME = "kubernetes.io/hostname"
LABEL_OS = "kubernetes.io/os"
LABEL_ARCH = "kubernetes.io/arch"
LABEL_BETA_OS = "beta.kubernetes.io/os"
LABEL_BETA_ARCH = "beta.kubernetes.io/arch"
DEFAULT_LABELS = (LABEL_HOSTNAME, LABEL_OS, LABEL_ARCH, LABEL_BETA_OS, LABEL_BETA_ARCH)


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


def capacity_amounts(machine: MachineInfo, *, max_pods: int) -> dict[str, int]:
    """The Node's status.capacity as amounts (see the module docstring for units)."""
    out = {
        "cpu": machine.cpus * 1000,
        "memory": machine.memory_bytes,
        "ephemeral-storage": machine.ephemeral_storage_bytes,
        "pods": max_pods,
    }
    for size, total in sorted(machine.hugepages.items()):
        out[hugepage_resource(size)] = total
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


def allocatable_amounts(
    machine: MachineInfo,
    *,
    max_pods: int,
    kube_reserved: Mapping[str, str],
    system_reserved: Mapping[str, str],
    eviction_hard: Mapping[str, str],
) -> dict[str, int]:
    """The Node's status.allocatable as amounts (see the module docstring)."""
    cap = capacity_amounts(machine, max_pods=max_pods)
    held = reservation(
        cap,
        kube_reserved=kube_reserved,
        system_reserved=system_reserved,
        eviction_hard=eviction_hard,
    )
    hugepage_bytes = sum(machine.hugepages.values())
    out = {
        "cpu": max(0, cap["cpu"] - held.get("cpu", 0)),
        "memory": max(0, cap["memory"] - held.get("memory", 0) - hugepage_bytes),
        "ephemeral-storage": max(0, cap["ephemeral-storage"] - held.get("ephemeral-storage", 0)),
        "pods": max_pods,
    }
    for size, total in sorted(machine.hugepages.items()):
        name = hugepage_resource(size)
        out[name] = max(0, total - held.get(name, 0))
    return out


def pods_cgroup_amounts(
    machine: MachineInfo,
    *,
    pid_max: int | None,
    kube_reserved: Mapping[str, str],
    system_reserved: Mapping[str, str],
    enforce_pods: bool,
) -> dict[str, int]:
    """What the node's pods together may use, as upstream's node container manager writes
    it on `<cgroupRoot>/kubepods`: `cpu` (millicores), `memory` (bytes), `pid` (a count,
    when `pid_max` is known) and each `hugepages-<size>` (bytes). With
    `enforceNodeAllocatable` holding `pods`, that is capacity − kubeReserved −
    systemReserved (GetNodeAllocatableAbsolute: no eviction threshold, which eviction
    guards below the limit), memory also less the allocatable huge pages; without it,
    capacity itself (upstream still writes the cgroup, since the default CPU shares would
    starve the pods)."""
    cap = {"cpu": machine.cpus * 1000, "memory": machine.memory_bytes}
    if pid_max is not None:
        cap["pid"] = pid_max
    pages = {hugepage_resource(size): total for size, total in machine.hugepages.items()}
    if not enforce_pods:
        return {**cap, **pages}
    held = reservation(
        {**cap, **pages},
        kube_reserved=kube_reserved,
        system_reserved=system_reserved,
        eviction_hard={},
    )
    out = {name: max(0, amount - held.get(name, 0)) for name, amount in cap.items()}
    for name, total in pages.items():
        out[name] = max(0, total - held.get(name, 0))
    out["memory"] = max(0, out["memory"] - sum(out[name] for name in pages))
    return out


def storage_aware_eviction_hard(
    eviction_hard: Mapping[str, str], *, local_storage_capacity_isolation: bool
) -> dict[str, str]:
    """The thresholds that reserve allocatable: without localStorageCapacityIsolation
    upstream reserves no ephemeral storage, so `nodefs.available` is left out."""
    out = dict(eviction_hard)
    if not local_storage_capacity_isolation:
        out.pop("nodefs.available", None)
    return out


def default_labels(node_name: str, machine: MachineInfo) -> dict[str, str]:
    """The labels the kubelet always puts on its Node."""
    return {
        LABEL_HOSTNAME: node_name,
        LABEL_OS: machine.operating_system,
        LABEL_ARCH: machine.architecture,
        LABEL_BETA_OS: machine.operating_system,
        LABEL_BETA_ARCH: machine.architecture,
    }


def node_labels(
    node_name: str, machine: MachineInfo, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Default labels, then --node-labels (`extra`) on top: as upstream, the flag wins."""
    return {**default_labels(node_name, machine), **(extra or {})}
