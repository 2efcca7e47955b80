"""Device plugin decisions: what a pod needs, whether it fits, which devices it gets.

Pure functions over the pod and the device manager's counts. Upstream allocates at
admission (its admit handler calls the plugin's Allocate for every container); klet
splits that in two, as its admission is a synchronous decision over the admitted pods:
admission counts (`admit_devices`: a pod needing more devices than are healthy and not
needed by the pods already admitted is rejected with upstream's reason and message),
and the device IDs are picked and the plugin's Allocate called when a container is
created (`pick_devices`), where the counts admission held make enough free devices
there. Device plugin resources are the container's `limits` (upstream reads limits:
for an extended resource requests and limits are equal when both are set).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass

from klet.model.devices import DeviceMount, DeviceNode, DeviceRunOptions
from klet.model.types import JSON

__all__ = [
    "DeviceMount",
    "DeviceNode",
    "DeviceRunOptions",
]

UNEXPECTED_ADMISSION_ERROR = "UnexpectedAdmissionError"
"""upstream's reason (lifecycle.UnexpectedAdmissionError) for a failed device allocation."""


class AllocationError(Exception):
    """Devices cannot be given; the message is upstream's devicesToAllocate error."""


def is_device_resource(name: str) -> bool:
    """An extended resource name a device plugin may serve: domain-qualified, outside
    the kubernetes.io domains, not a quota `requests.` name (upstream's
    IsExtendedResourceName)."""
    if "/" not in name or name.startswith("requests."):
        return False
    domain = name.split("/", 1)[0]
    return not (domain == "kubernetes.io" or domain.endswith(".kubernetes.io"))


_QUALIFIED_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def resource_name_problem(name: str) -> str | None:
    """Why `name` is not an extended resource name a device plugin may register, or None:
    upstream's IsExtendedResourceName (`requests.<name>` a qualified name: a DNS-1123
    subdomain prefix of at most 253 characters, a name part of at most 63)."""
    if not is_device_resource(name):
        return f"the ResourceName {name!r} is invalid: not an extended resource name"
    prefix, _, short = name.partition("/")
    if len("requests." + prefix) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(prefix):
        return f"the ResourceName {name!r} is invalid: its prefix is not a DNS-1123 subdomain"
    if len(short) > 63 or not _QUALIFIED_NAME.fullmatch(short):
        return (
            f"the ResourceName {name!r} is invalid: its name part is not 1-63 alphanumeric "
            "characters, '-', '_' or '.', starting and ending with an alphanumeric character"
        )
    return None


def _count(value: object) -> int:
    """A device count: a plain non-negative integer quantity ("2", 2); anything else 0
    (the apiserver refuses fractional extended resources, so none reach here)."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return max(value, 0)
    text = str(value).strip()
    return int(text) if text.isdigit() else 0


def container_devices(container: JSON) -> dict[str, int]:
    """Device plugin resource → count the container asks for in its limits."""
    limits = (container.get("resources") or {}).get("limits") or {}
    out: dict[str, int] = {}
    for name, value in limits.items():
        if is_device_resource(str(name)):
            n = _count(value)
            if n > 0:
                out[str(name)] = n
    return out


def _restartable(container: JSON) -> bool:
    return container.get("restartPolicy") == "Always"


def pod_devices(pod: JSON) -> dict[str, int]:
    """What the pod holds at its peak, per resource: an init container's devices are
    reused by the containers after it (upstream's devicesToReuse), sidecars (restartable
    init containers) keep theirs for the pod's life."""
    spec = pod.get("spec") or {}
    resources: set[str] = set()
    sidecars: dict[str, int] = {}
    peak: dict[str, int] = {}
    for c in spec.get("initContainers") or []:
        want = container_devices(c)
        resources.update(want)
        if _restartable(c):
            for r, n in want.items():
                sidecars[r] = sidecars.get(r, 0) + n
        else:
            for r, n in want.items():
                peak[r] = max(peak.get(r, 0), sidecars.get(r, 0) + n)
    regular: dict[str, int] = {}
    for c in spec.get("containers") or []:
        for r, n in container_devices(c).items():
            resources.add(r)
            regular[r] = regular.get(r, 0) + n
    return {
        r: max(peak.get(r, 0), sidecars.get(r, 0) + regular.get(r, 0))
        for r in sorted(resources)
        if max(peak.get(r, 0), sidecars.get(r, 0) + regular.get(r, 0)) > 0
    }


@dataclass(frozen=True)
class ResourceCount:
    """What the device manager knows of one resource."""

    registered: bool
    """A plugin serves it now (False: known from the checkpoint or a plugin that left)."""
    healthy: int


def devices_verdict(
    pod: JSON, *, others: Iterable[JSON], counts: Mapping[str, ResourceCount]
) -> tuple[str, str] | None:
    """(reason, message) rejecting the pod, or None when its devices fit.

    Only resources the device manager knows are checked (upstream's
    isDevicePluginResource); others are left to the extended-resource fit."""
    want = pod_devices(pod)
    if not want:
        return None
    used: dict[str, int] = {}
    for other in others:
        for r, n in pod_devices(other).items():
            used[r] = used.get(r, 0) + n
    for resource, needed in want.items():
        count = counts.get(resource)
        if count is None:
            continue
        error = _shortage(resource, needed, count, used.get(resource, 0))
        if error:
            return (
                UNEXPECTED_ADMISSION_ERROR,
                f"Allocate failed due to {error}, which is unexpected",
            )
    return None


def _shortage(resource: str, needed: int, count: ResourceCount, used: int) -> str:
    if not count.registered:
        return f"cannot allocate unregistered device {resource}"
    if count.healthy == 0:
        return f"no healthy devices present; cannot allocate unhealthy devices {resource}"
    available = max(count.healthy - used, 0)
    if available < needed:
        return (
            f"requested number of devices unavailable for {resource}. "
            f"Requested: {needed}, Available: {available}"
        )
    return ""


def by_affinity(
    healthy: Sequence[str], numa: Mapping[str, Sequence[int]], mask: int | None
) -> list[str]:
    """The healthy devices in the order a container aligned on the NUMA node `mask` (the
    topology manager's hint; None: no hint) takes them: those on the mask's nodes first,
    then those without topology, then the rest (upstream's filterByAffinity)."""
    if mask is None:
        return list(healthy)

    def rank(device: str) -> int:
        nodes = numa.get(device) or ()
        if not nodes:
            return 1
        return 0 if any(mask >> n & 1 for n in nodes) else 2

    return sorted(healthy, key=rank)


def pick_devices(
    resource: str,
    needed: int,
    *,
    healthy: Sequence[str],
    in_use: Set[str],
    reusable: Sequence[str] = (),
    preferred: Sequence[str] = (),
) -> list[str]:
    """The device IDs for one container: first those an earlier init container of the
    same pod held (`reusable`), then the plugin's preferred ones, then the free healthy
    ones in the plugin's order. Raises AllocationError (upstream's words) when there are
    not enough."""
    if needed <= 0:
        return []
    healthy_set = set(healthy)
    chosen: list[str] = []
    for device in reusable:
        if len(chosen) == needed:
            return chosen
        if device in healthy_set and device not in chosen:
            chosen.append(device)
    if len(chosen) == needed:
        return chosen
    free = [d for d in healthy if d not in in_use and d not in chosen]
    if len(free) < needed - len(chosen):
        raise AllocationError(
            f"requested number of devices unavailable for {resource}. "
            f"Requested: {needed - len(chosen)}, Available: {len(free)}"
        )
    free_set = set(free)
    for device in (*[p for p in preferred if p in free_set], *free):
        if len(chosen) == needed:
            break
        if device not in chosen:
            chosen.append(device)
    return chosen
