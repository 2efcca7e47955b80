"""Container and pod cgroup resources and oom_score_adj, computed as upstream does.

Pure functions over the pod spec: CPU shares from requests, CFS quota from limits, the
memory limit, the container's oom_score_adj by QoS class (clamped to the host's floor,
for hosts that refuse negative values), and the pod cgroup's values (upstream's
ResourceConfigForPod) from the pod's totals in `klet.model.pod` (PodRequests and
PodLimits: sidecars, the restartable init containers, count with the regular
containers, an init container at its step with the sidecars started before it), plus
the node-wide podPidsLimit, which caps every pod whatever its QoS class (a fork bomb in
one pod cannot take the node's PIDs). Missing requests default to the limits, as the API
server's defaulting does; the pod's `overhead` counts in the pod cgroup (not in any
container's).

Pod-level resources (`spec.resources`, PodLevelResources): the QoS class, the pod
cgroup's shares, quota and memory limit come from the pod-level values where set; a
container without its own CPU or memory limit gets the pod's in its own cgroup (and its
huge page limits, where it names none), as upstream's getCPULimit/getMemoryLimit; the
pod-level memory request not given to any container is shared out among them for the
oom_score_adj (upstream's remainingPodMemReqPerContainer).

oom_score_adj follows upstream's GetContainerOOMScoreAdjust whole: node-critical pods
(system-node-critical) and Guaranteed ones -997, BestEffort 1000, a Burstable container
by its memory request, and a sidecar never above the regular container with the least
memory request. On cgroup v2, unless `singleProcessOOMKill` is true, a container's
`memory.oom.group` is 1 (the kernel kills the whole container on OOM), as upstream.

Huge pages: every container and pod cgroup gets a hugetlb limit for each page size the
kernel offers, 0 unless the containers' limits ask for `hugepages-<size>` (the pod's is
their sum), as upstream's GetHugepageLimitsFromResources and pod container manager set
them, so a pod uses no huge pages it was not given. Swap (`memorySwap.swapBehavior`
NoSwap, the only behaviour klet has): where the host has a swap controller, a
container's memory+swap limit equals its memory limit on cgroup v1 and its
memory.swap.max is 0 on v2, as upstream's ConfigureNoSwap.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from klet.cri.types import LinuxResources
from klet.model import pod as podmodel
from klet.model.types import JSON
from klet.model.units import parse_quantity
from klet.syncloop.model import podspec

MIN_SHARES = 2
MAX_SHARES = 262144
SHARES_PER_CPU = 1024
MIN_QUOTA_PERIOD_US = 1000
GUARANTEED_OOM_SCORE_ADJ = -997
BESTEFFORT_OOM_SCORE_ADJ = 1000


@dataclass(frozen=True)
class NodeLimits:
    """What the calculation needs from the node and the configuration."""

    memory_capacity_bytes: int
    cpu_cfs_quota: bool = True
    cpu_cfs_quota_period_s: float = 0.1
    oom_score_adj_floor: int = -1000
    pod_pids_limit: int = -1
    """podPidsLimit / --pod-max-pids: processes per pod; -1 (or 0) = no per-pod limit."""
    hugepage_sizes: tuple[int, ...] = ()
    """The huge page sizes (bytes) the kernel offers (/sys/kernel/mm/hugepages)."""
    swap_control: str = ""
    """How containers are kept out of swap: "memsw" (cgroup v1 memory+swap limit),
    "swap.max" (v2), "" when the host has no swap controller (nothing to set)."""
    oom_group: bool = False
    """Whether containers get memory.oom.group 1: cgroup v2 and singleProcessOOMKill not
    true (upstream's default there); never on v1, which has no such file."""

    @property
    def period_us(self) -> int:
        return int(round(self.cpu_cfs_quota_period_s * 1_000_000))


@dataclass(frozen=True)
class PodResources:
    """The pod cgroup's settings; None means "leave unlimited / unset"."""

    cpu_shares: int
    cpu_quota: int | None
    cpu_period: int | None
    memory_limit_bytes: int | None
    pids_limit: int | None = None
    hugepage_limits: tuple[tuple[str, int], ...] = ()
    """(page size as cgroups name it, "2MB"; limit in bytes) for every size offered."""


def pids_limit(node: NodeLimits) -> int | None:
    """The pod cgroup's pids.max: podPidsLimit when positive; None (unlimited) otherwise,
    as upstream's pod container manager applies it only when above zero."""
    return node.pod_pids_limit if node.pod_pids_limit > 0 else None


def _get(container: JSON, kind: str, name: str) -> Decimal | None:
    res = container.get("resources")
    if not isinstance(res, dict):
        return None
    values: Any = res.get(kind) or {}
    if not isinstance(values, dict):
        return None
    raw = values.get(name)
    if raw in (None, ""):
        return None
    return parse_quantity(str(raw))


def _limit(container: JSON, name: str) -> Decimal | None:
    return _get(container, "limits", name)


def _request(container: JSON, name: str) -> Decimal | None:
    """The request, defaulting to the limit when only the limit is set."""
    req = _get(container, "requests", name)
    return req if req is not None else _limit(container, name)


def milli_value(q: Decimal | None) -> int:
    return 0 if q is None else math.ceil(q * 1000)


def value(q: Decimal | None) -> int:
    return 0 if q is None else math.ceil(q)


def milli_cpu_to_shares(milli_cpu: int) -> int:
    if milli_cpu <= 0:
        return MIN_SHARES
    shares = milli_cpu * SHARES_PER_CPU // 1000
    return max(MIN_SHARES, min(shares, MAX_SHARES))


def milli_cpu_to_quota(milli_cpu: int, period_us: int) -> int:
    """0 (no quota) without a limit; otherwise at least 1 ms."""
    if milli_cpu <= 0:
        return 0
    return max(milli_cpu * period_us // 1000, MIN_QUOTA_PERIOD_US)


SYSTEM_NODE_CRITICAL = "system-node-critical"


def _memory_request(container: JSON) -> int:
    return value(_request(container, "memory"))


def _remaining_pod_memory_per_container(pod: JSON) -> int:
    """upstream's remainingPodMemReqPerContainer: the pod-level memory request no
    container asked for, shared among all (regular and init) containers."""
    level_requests = podmodel.pod_level(pod)[0]
    pod_memory = value(level_requests.get("memory"))
    if pod_memory == 0:
        return 0
    spec = pod.get("spec") or {}
    count = len(spec.get("containers") or []) + len(spec.get("initContainers") or [])
    aggregate = value(podmodel.aggregate_container_requests(pod).get("memory"))
    if not count:
        return 0
    # Go's integer division, which truncates toward zero.
    share = abs(pod_memory - aggregate) // count
    return share if pod_memory >= aggregate else -share


def _adj_for(request: int, memory_capacity_bytes: int) -> int:
    if memory_capacity_bytes <= 0:
        return 1000
    return 1000 - (1000 * request) // memory_capacity_bytes


def oom_score_adj(pod: JSON, container: JSON, memory_capacity_bytes: int) -> int:
    """Upstream's GetContainerOOMScoreAdjust (see the module docstring)."""
    spec = pod.get("spec") or {}
    if podmodel.is_critical(pod) and spec.get("priorityClassName") == SYSTEM_NODE_CRITICAL:
        return GUARANTEED_OOM_SCORE_ADJ
    qos = podspec.qos_class(pod)
    if qos == "Guaranteed":
        return GUARANTEED_OOM_SCORE_ADJ
    if qos == "BestEffort":
        return BESTEFFORT_OOM_SCORE_ADJ
    remaining = 0
    if podmodel.pod_level(pod)[0]:
        remaining = _remaining_pod_memory_per_container(pod)
    adj = _adj_for(_memory_request(container) + remaining, memory_capacity_bytes)
    sidecar = podspec.is_sidecar(container) and any(
        c.get("name") == container.get("name") for c in podspec.init_containers(pod)
    )
    regular = podspec.containers(pod)
    if sidecar and regular:
        least = min(_memory_request(c) for c in regular) + remaining
        adj = min(adj, _adj_for(least, memory_capacity_bytes))
    # Keep burstable containers strictly between guaranteed and best-effort ones.
    if adj < 1000 + GUARANTEED_OOM_SCORE_ADJ:
        return 1000 + GUARANTEED_OOM_SCORE_ADJ
    if adj == BESTEFFORT_OOM_SCORE_ADJ:
        return BESTEFFORT_OOM_SCORE_ADJ - 1
    return adj


def clamp_oom_score_adj(adj: int, floor: int) -> int:
    return max(adj, floor, -1000)


_PAGE_UNITS = ("B", "KB", "MB", "GB", "TB", "PB")


def hugepage_size_name(page_bytes: int) -> str:
    """A huge page size as cgroups and CRI name it: 2097152 -> "2MB", 1Gi -> "1GB"."""
    n, unit = page_bytes, 0
    while n >= 1024 and n % 1024 == 0 and unit < len(_PAGE_UNITS) - 1:
        n //= 1024
        unit += 1
    return f"{n}{_PAGE_UNITS[unit]}"


def container_hugepages(container: JSON) -> dict[int, int]:
    """The container's `hugepages-<size>` limits, bytes by page size."""
    res = container.get("resources")
    limits = res.get("limits") if isinstance(res, dict) else None
    out: dict[int, int] = {}
    for name in limits if isinstance(limits, dict) else ():
        if isinstance(name, str) and name.startswith("hugepages-"):
            size = value(parse_quantity(name.removeprefix("hugepages-")))
            out[size] = value(_limit(container, name))
    return out


def hugepage_limits(sizes: Iterable[int], wanted: dict[int, int]) -> tuple[tuple[str, int], ...]:
    """A limit for every page size offered: what is wanted, else 0."""
    return tuple((hugepage_size_name(size), wanted.get(size, 0)) for size in sorted(sizes))


def _pod_level_limit(pod: JSON, name: str) -> Decimal | None:
    """The pod-level limit of cpu or memory, when pod-level resources are set."""
    return podmodel.pod_level(pod)[1].get(name)


def container_resources(pod: JSON, container: JSON, node: NodeLimits) -> LinuxResources:
    """The CRI LinuxResources for one container (0 means unset / unlimited)."""
    cpu_request = milli_value(_request(container, "cpu"))
    cpu_limit_q = _limit(container, "cpu")
    memory_q = _limit(container, "memory")
    pages = container_hugepages(container)
    if podmodel.is_pod_level_set(pod):
        # Without a limit of its own, the container is held to the pod's (upstream's
        # getCPULimit, getMemoryLimit); its own huge page limits win over the pod's.
        if not cpu_limit_q:
            cpu_limit_q = _pod_level_limit(pod, "cpu")
        if not memory_q:
            memory_q = _pod_level_limit(pod, "memory")
        pages = {**pod_level_hugepages(pod), **pages}
    cpu_limit = milli_value(cpu_limit_q)
    quota = period = 0
    if node.cpu_cfs_quota:
        period = node.period_us
        quota = milli_cpu_to_quota(cpu_limit, period)
    memory = value(memory_q)
    unified: dict[str, str] = {}
    if node.swap_control == "swap.max":
        unified["memory.swap.max"] = "0"
    if node.oom_group:
        unified["memory.oom.group"] = "1"
    return LinuxResources(
        cpu_shares=milli_cpu_to_shares(cpu_request),
        cpu_quota=quota,
        cpu_period=period,
        memory_limit_bytes=memory,
        oom_score_adj=clamp_oom_score_adj(
            oom_score_adj(pod, container, node.memory_capacity_bytes), node.oom_score_adj_floor
        ),
        # Without a memory limit there is no memory+swap limit either (0 = unset).
        memory_swap_limit_bytes=memory if node.swap_control == "memsw" else 0,
        hugepage_limits=hugepage_limits(node.hugepage_sizes, pages),
        unified=unified,
    )


def _page_size(resource: str) -> int:
    return value(parse_quantity(resource.removeprefix("hugepages-")))


def pod_level_hugepages(pod: JSON) -> dict[int, int]:
    """The pod-level `hugepages-<size>` limits, bytes by page size."""
    return {
        _page_size(name): value(q)
        for name, q in podmodel.pod_level(pod)[1].items()
        if name.startswith("hugepages-")
    }


def pod_cpu_request_millis(pod: JSON) -> int:
    """The pod's CPU request in millicores as upstream's PodRequests counts it (sidecars,
    init steps, pod-level requests and overhead: `klet.model.pod.pod_requests`)."""
    return podmodel.pod_requests(pod).get("cpu", 0)


def burstable_cpu_shares(pods: Iterable[JSON]) -> int:
    """The burstable QoS cgroup's CPU shares, as upstream's QoS container manager sets
    them: the CPU requests of the active Burstable pods, summed, as shares."""
    millis = sum(pod_cpu_request_millis(p) for p in pods if podspec.qos_class(p) == "Burstable")
    return milli_cpu_to_shares(millis)


def pod_resources(pod: JSON, node: NodeLimits) -> PodResources:
    """Upstream's ResourceConfigForPod: the pod cgroup's shares, quota and memory limit."""
    qos = podspec.qos_class(pod)
    requests = podmodel.pod_requests(pod)
    pages = _pod_hugepages(requests, node)
    if qos == "BestEffort":
        return PodResources(MIN_SHARES, None, None, None, pids_limit(node), pages)
    totals = podmodel.pod_limits(pod)
    cpu_limits = milli_value(totals.limits.get("cpu"))
    memory = value(totals.limits.get("memory"))
    shares = milli_cpu_to_shares(requests.get("cpu", 0))
    period = node.period_us
    quota = milli_cpu_to_quota(cpu_limits, period) if node.cpu_cfs_quota else -1
    if qos == "Guaranteed":
        return PodResources(shares, quota, period, memory, pids_limit(node), pages)
    return PodResources(
        shares,
        quota if totals.cpu_declared else None,
        period if totals.cpu_declared else None,
        memory if totals.memory_declared else None,
        pids_limit(node),
        pages,
    )


def _pod_hugepages(requests: dict[str, int], node: NodeLimits) -> tuple[tuple[str, int], ...]:
    """The pod cgroup's hugetlb limits: per size, the pod's huge page requests (which
    equal its limits), as upstream's HugePageLimits(PodRequests)."""
    wanted: dict[int, int] = {}
    for name, amount in requests.items():
        if name.startswith("hugepages-"):
            size = _page_size(name)
            wanted[size] = wanted.get(size, 0) + amount
    return hugepage_limits(node.hugepage_sizes, wanted)
