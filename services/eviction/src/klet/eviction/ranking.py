"""Which pod to evict and what to tell it: upstream's eviction helpers as pure functions.

Restated from upstream's `pkg/kubelet/eviction/helpers.go` (our own code):

- Every signal reclaims one resource (`memory`, `ephemeral-storage`, `inodes`, `pids`,
  `SIGNAL_RESOURCE`). Memory thresholds are acted on before any other
  (`by_eviction_priority`).
- Ranking (`rank`): for memory, pods whose working set exceeds their memory request
  first, then lower priority first, then by usage above the request, largest first;
  for disk, the same with the pod's disk usage and ephemeral-storage request; for PIDs,
  lower priority first, then by process count. A pod without any usage sample sorts
  first, as upstream (a pod the stats do not cover yet cannot prove it is small).
- What counts as a pod's disk usage depends on the filesystem layout, as upstream's
  `buildSignalToRankFunc` (`disk_usage`): on one shared filesystem everything (writable
  layers, logs, emptyDirs); with a dedicated image filesystem holding the writable
  layers, nodefs counts logs and emptyDirs and imagefs/containerfs the writable layers;
  with containers split from images, nodefs/containerfs count all three and imagefs
  nothing per pod. Node-level reclaim (image-gc's FreeSpace) follows the same layout
  (`reclaims_node_level`): nodefs pressure next to a dedicated image filesystem has
  nothing to free there. Inode signals rank by the inodes a pod uses in total.
- Critical pods are never evicted (`klet.model.pod.is_critical`, upstream's
  IsCriticalPod): static pods, mirror pods, and pods with priority >= 2000000000
  (system-cluster-critical and system-node-critical).
- The message (`eviction_message`) says which resource ran low, the threshold and
  what was available, and which containers used more than they requested, in
  upstream's words; local storage limits (`local_storage_violation`) have their own
  messages and evict regardless of node pressure.

Quantities in messages are formatted as upstream's resource.Quantity prints them
(binary suffixes for bytes, decimal for counts).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Protocol

from klet.eviction.signals import PodUsage, Signal
from klet.model.node import format_bytes
from klet.model.pod import container_requests, pod_priority, pod_requests
from klet.model.types import JSON, PodUID
from klet.model.units import parse_quantity

REASON = "Evicted"
"""The pod status reason and Event reason of every eviction."""

MEMORY = "memory"
EPHEMERAL_STORAGE = "ephemeral-storage"
INODES = "inodes"
PIDS = "pids"

# Metric label values of the local-storage evictions (upstream's pseudo-signals).
EMPTYDIR_LIMIT = "emptydirfs.limit"
POD_EPHEMERAL_LIMIT = "ephemeralpodfs.limit"
CONTAINER_EPHEMERAL_LIMIT = "ephemeralcontainerfs.limit"

SIGNAL_RESOURCE: Mapping[Signal, str] = {
    Signal.MEMORY_AVAILABLE: MEMORY,
    Signal.ALLOCATABLE_MEMORY_AVAILABLE: MEMORY,
    Signal.NODEFS_AVAILABLE: EPHEMERAL_STORAGE,
    Signal.NODEFS_INODES_FREE: INODES,
    Signal.IMAGEFS_AVAILABLE: EPHEMERAL_STORAGE,
    Signal.IMAGEFS_INODES_FREE: INODES,
    Signal.CONTAINERFS_AVAILABLE: EPHEMERAL_STORAGE,
    Signal.CONTAINERFS_INODES_FREE: INODES,
    Signal.PID_AVAILABLE: PIDS,
}

PRESSURE_CONDITIONS = ("MemoryPressure", "DiskPressure", "PIDPressure")
"""The node conditions the eviction manager owns, in upstream's order."""

DISK_SIGNALS = frozenset(s for s, r in SIGNAL_RESOURCE.items() if r in (EPHEMERAL_STORAGE, INODES))
NODEFS_SIGNALS = frozenset({Signal.NODEFS_AVAILABLE, Signal.NODEFS_INODES_FREE})
IMAGEFS_SIGNALS = frozenset({Signal.IMAGEFS_AVAILABLE, Signal.IMAGEFS_INODES_FREE})


class FsLayout(Protocol):
    """How the runtime's filesystems sit relative to the root dir's (nodefs)."""

    @property
    def dedicated_image_fs(self) -> bool: ...

    @property
    def split_container_fs(self) -> bool: ...


@dataclass(frozen=True)
class Candidate:
    """An active pod (spec as pod-source stored it) and its latest usage sample."""

    pod: JSON
    usage: PodUsage | None

    @property
    def uid(self) -> PodUID:
        return PodUID(str((self.pod.get("metadata") or {}).get("uid", "")))

    @property
    def full_name(self) -> str:
        meta = self.pod.get("metadata") or {}
        return f"{meta.get('namespace', 'default')}/{meta.get('name', '')}"


def _quantity(value: object) -> Decimal | None:
    if value is None or value == "":
        return None
    try:
        return parse_quantity(str(value))
    except ValueError:
        return None


def pod_grace_period(pod: JSON) -> int:
    """spec.terminationGracePeriodSeconds, 30 when unset (the API default)."""
    value = (pod.get("spec") or {}).get("terminationGracePeriodSeconds")
    return int(value) if isinstance(value, int) else 30


# -- ranking ---------------------------------------------------------------------------


def disk_usage(signal: Signal, usage: PodUsage, *, layout: FsLayout) -> int:
    """The part of a pod's disk use that `signal`'s filesystem holds (module docstring);
    inodes for the inode signals."""
    if SIGNAL_RESOURCE[signal] == INODES:
        return usage.inodes
    local = usage.logs + sum(usage.volumes.values())
    if not layout.dedicated_image_fs:
        return usage.ephemeral_storage
    if not layout.split_container_fs:
        return local if signal in NODEFS_SIGNALS else usage.writable_layer
    return 0 if signal in IMAGEFS_SIGNALS else local + usage.writable_layer


def reclaims_node_level(signal: Signal, *, layout: FsLayout) -> bool:
    """Whether image-gc's FreeSpace (dead containers, unused images) can relieve
    `signal`: every disk signal, except nodefs next to a dedicated image filesystem
    that also holds the containers (upstream's buildSignalToNodeReclaimFuncs)."""
    if signal not in DISK_SIGNALS:
        return False
    return not (
        signal in NODEFS_SIGNALS and layout.dedicated_image_fs and not layout.split_container_fs
    )


def _sort_key(signal: Signal, c: Candidate, layout: FsLayout) -> tuple[int, ...]:
    resource = SIGNAL_RESOURCE[signal]
    priority = pod_priority(c.pod)
    if resource == PIDS:
        # orderedBy(priority, process): priority first; no sample sorts first within it.
        if c.usage is None:
            return (priority, 0, 0)
        return (priority, 1, -c.usage.processes)
    if c.usage is None:
        return (0, 0, priority, 0)
    if resource == MEMORY:
        used = c.usage.memory_working_set
        request = pod_requests(c.pod).get(MEMORY, 0)
    else:
        used = disk_usage(signal, c.usage, layout=layout)
        # upstream compares inodes with a request of none (0) and subtracts the
        # ephemeral-storage request from both.
        request = pod_requests(c.pod).get(EPHEMERAL_STORAGE, 0)
        exceeds = used > (request if resource == EPHEMERAL_STORAGE else 0)
        return (1, 0 if exceeds else 1, priority, -(used - request))
    return (1, 0 if used > request else 1, priority, -(used - request))


def rank(signal: Signal, candidates: Iterable[Candidate], *, layout: FsLayout) -> list[Candidate]:
    """The candidates in eviction order for `signal` (first = evict first)."""
    return sorted(candidates, key=lambda c: _sort_key(signal, c, layout))


def rank_reason(signal: Signal, c: Candidate, *, layout: FsLayout) -> str:
    """Why `rank` puts `c` where it is, in the terms of its sort key: usage against the
    request, then priority, then usage above the request (for PIDs: priority, then
    processes; for inodes: the inodes used)."""
    resource = SIGNAL_RESOURCE[signal]
    priority = pod_priority(c.pod)
    if c.usage is None:
        return f"no usage sample yet (sorts first), priority {priority}"
    if resource == PIDS:
        return f"priority {priority}, {c.usage.processes} processes"
    if resource == INODES:
        return f"{disk_usage(signal, c.usage, layout=layout)} inodes used, priority {priority}"
    if resource == MEMORY:
        used, what = c.usage.memory_working_set, "memory working set"
    else:
        used, what = disk_usage(signal, c.usage, layout=layout), "disk usage"
    request = pod_requests(c.pod).get(resource, 0)
    if not request:
        verdict = "no request"
    elif used > request:
        verdict = f"over its request {format_bytes(request)} by {format_bytes(used - request)}"
    else:
        verdict = f"within its request {format_bytes(request)}"
    return f"{what} {format_bytes(used)}, {verdict}, priority {priority}"


def by_eviction_priority(signals: Iterable[Signal]) -> list[Signal]:
    """Memory signals first, then the rest in the order given (upstream's
    byEvictionPriority); signals without a resource to reclaim are dropped."""
    listed = [s for s in signals if s in SIGNAL_RESOURCE]
    return [s for s in listed if SIGNAL_RESOURCE[s] == MEMORY] + [
        s for s in listed if SIGNAL_RESOURCE[s] != MEMORY
    ]


# -- messages --------------------------------------------------------------------------

_DECIMAL_SUFFIXES = ("", "k", "M", "G", "T", "P", "E")


def format_count(n: int) -> str:
    """A count as a canonical decimal quantity ("500", "12k", "1500k")."""
    exp = 0
    while n and exp < len(_DECIMAL_SUFFIXES) - 1 and n % 1000 == 0:
        n //= 1000
        exp += 1
    return f"{n}{_DECIMAL_SUFFIXES[exp]}"


def format_amount(resource: str, n: int) -> str:
    return format_bytes(n) if resource in (MEMORY, EPHEMERAL_STORAGE) else format_count(n)


def format_quantity_text(text: str) -> str:
    """A quantity from a pod spec as resource.Quantity.String() prints it: canonical,
    in the suffix family it was written in ("128Mi", "100M", "0.5Gi" -> "512Mi")."""
    q = _quantity(text)
    if q is None:
        return text
    binary = text.rstrip().endswith("i")
    value = math.ceil(q)
    if binary:
        return format_bytes(value)
    if q != q.to_integral_value():
        return text  # a fraction of a unit (millis): keep what was written
    return format_count(value)


def _container_request_text(container: JSON, resource: str) -> str:
    res = container.get("resources") or {}
    for part in ("requests", "limits"):
        value = (res.get(part) or {}).get(resource)
        if value not in (None, ""):
            return format_quantity_text(str(value))
    return "0"


def eviction_message(
    resource: str,
    candidate: Candidate,
    *,
    threshold_quantity: int | None,
    available: int | None,
) -> str:
    """upstream's evictionMessage: the starved resource, the threshold met, and every
    container using more memory than it requested."""
    message = f"The node was low on resource: {resource}. "
    if threshold_quantity is not None and available is not None:
        message += (
            f"Threshold quantity: {format_amount(resource, threshold_quantity)}, "
            f"available: {format_amount(resource, available)}. "
        )
    usage = candidate.usage
    if usage is None or resource not in (MEMORY, EPHEMERAL_STORAGE):
        return message
    per_container = usage.containers if resource == MEMORY else usage.container_storage
    spec: JSON = candidate.pod.get("spec") or {}
    containers: Sequence[JSON] = [
        *(spec.get("containers") or []),
        *(spec.get("initContainers") or []),
    ]
    for c in containers:
        used = per_container.get(str(c.get("name", "")))
        if used is None:
            continue
        if used > container_requests(c).get(resource, 0):
            message += (
                f"Container {c['name']} was using {format_bytes(used)}, request is "
                f"{_container_request_text(c, resource)}, has larger consumption of {resource}. "
            )
    return message


# -- local storage limits ---------------------------------------------------------------


def pod_ephemeral_limit(pod: JSON) -> Decimal | None:
    """upstream's PodLimits for ephemeral-storage: the containers' limits summed, at least
    the largest init container's; None when no container sets one."""
    spec: JSON = pod.get("spec") or {}

    def limit(c: JSON) -> Decimal | None:
        return _quantity(((c.get("resources") or {}).get("limits") or {}).get(EPHEMERAL_STORAGE))

    regular = [q for c in spec.get("containers") or [] if (q := limit(c)) is not None]
    init = [q for c in spec.get("initContainers") or [] if (q := limit(c)) is not None]
    if not regular and not init:
        return None
    return max(sum(regular, Decimal(0)), max(init, default=Decimal(0)))


def has_local_storage_limit(pod: JSON) -> bool:
    """Whether `local_storage_violation` can find the pod over a limit at all: an
    emptyDir with a sizeLimit, or an ephemeral-storage limit on any container (init
    containers count in the pod's total). A pod without one is never measured for it."""
    spec: JSON = pod.get("spec") or {}
    for vol in spec.get("volumes") or []:
        empty = vol.get("emptyDir")
        if isinstance(empty, dict):
            size = _quantity(empty.get("sizeLimit"))
            if size is not None and size > 0:
                return True
    return pod_ephemeral_limit(pod) is not None


def pods_to_measure(pods: Iterable[JSON], *, ranking_needed: bool) -> frozenset[str] | None:
    """The UIDs of the active `pods` whose usage a monitoring pass needs: every pod's
    (None) when a threshold is met and the pods are ranked; otherwise only those a
    local storage limit applies to, for the limit checks. Often none: the pass then
    reads no pod at all (issue 42: it read every pod's cgroups, processes and log
    directories every 10 s before, for nothing)."""
    if ranking_needed:
        return None
    return frozenset(
        str((p.get("metadata") or {}).get("uid", "")) for p in pods if has_local_storage_limit(p)
    )


@dataclass(frozen=True)
class LocalStorageViolation:
    """A pod to evict for its own local storage use, with the metric label and message."""

    signal: str
    message: str


def local_storage_violation(pod: JSON, usage: PodUsage) -> LocalStorageViolation | None:
    """upstream's localStorageEviction for one pod, checks in its order: an emptyDir
    over its sizeLimit, the pod's ephemeral-storage use over the sum of its containers'
    limits, then a container's writable layer and logs over its own limit. (Upstream
    counts only the logs there when a dedicated image filesystem holds the writable
    layer; the usage sample has no per-container log size to tell them apart.)"""
    spec: JSON = pod.get("spec") or {}
    for vol in spec.get("volumes") or []:
        empty = vol.get("emptyDir")
        if not isinstance(empty, dict):
            continue
        size_text = empty.get("sizeLimit")
        size = _quantity(size_text)
        used = usage.volumes.get(str(vol.get("name", "")))
        if size is None or size <= 0 or used is None or used <= size:
            continue
        return LocalStorageViolation(
            EMPTYDIR_LIMIT,
            f'Usage of EmptyDir volume "{vol["name"]}" exceeds the limit '
            f'"{format_quantity_text(str(size_text))}". ',
        )
    limit = pod_ephemeral_limit(pod)
    if limit is not None and usage.ephemeral_storage > limit:
        return LocalStorageViolation(
            POD_EPHEMERAL_LIMIT,
            "Pod ephemeral local storage usage exceeds the total limit of containers "
            f"{_format_total(pod, limit)}. ",
        )
    for c in spec.get("containers") or []:
        text = ((c.get("resources") or {}).get("limits") or {}).get(EPHEMERAL_STORAGE)
        own = _quantity(text)
        name = str(c.get("name", ""))
        if own is None or own == 0 or name not in usage.container_storage:
            continue
        if usage.container_storage[name] > own:
            return LocalStorageViolation(
                CONTAINER_EPHEMERAL_LIMIT,
                f'Container {name} exceeded its local ephemeral storage limit "'
                f'{format_quantity_text(str(text))}". ',
            )
    return None


def _format_total(pod: JSON, total: Decimal) -> str:
    """The summed limit as Quantity.String() would print it: binary when the limits
    were written with binary suffixes."""
    spec: JSON = pod.get("spec") or {}
    texts = [
        str(((c.get("resources") or {}).get("limits") or {}).get(EPHEMERAL_STORAGE) or "")
        for c in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]
    ]
    value = math.ceil(total)
    if any(t.endswith("i") for t in texts if t):
        return format_bytes(value)
    return format_count(value)
