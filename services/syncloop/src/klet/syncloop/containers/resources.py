"""Container and pod cgroup resources and oom_score_adj, computed as upstream does.

Pure functions over the pod spec: CPU shares from requests, CFS quota from limits, the
memory limit, the container's oom_score_adj by QoS class (clamped to the host's floor,
for hosts that refuse negative values), and the pod cgroup's values as sums over its
containers (upstream's ResourceConfigForPod) plus the node-wide podPidsLimit, which caps
every pod whatever its QoS class (a fork bomb in one pod cannot take the node's PIDs).
Missing requests default to the limits, as the API server's defaulting does; the pod's
`overhead` counts in the pod cgroup (not in any container's).

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

from klet.config.units import parse_quantity
from klet.cri.types import LinuxResources
from klet.model.types import JSON
from klet.syncloop.pods import podspec

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


def oom_score_adj(pod: JSON, container: JSON, memory_capacity_bytes: int) -> int:
    """Upstream's GetContainerOOMScoreAdjust (without the critical-pod rule)."""
    qos = podspec.qos_class(pod)
    if qos == "Guaranteed":
        return GUARANTEED_OOM_SCORE_ADJ
    if qos == "BestEffort":
        return BESTEFFORT_OOM_SCORE_ADJ
    request = value(_request(container, "memory"))
    adj = 1000
    if memory_capacity_bytes > 0:
        adj = 1000 - (1000 * request) // memory_capacity_bytes
    # Keep burstable containers strictly between guaranteed and best-effort ones.
    if adj < 1000 + GUARANTEED_OOM_SCORE_ADJ:
        return 1000 + GUARANTEED_OOM_SCORE_ADJ
    if adj >= BESTEFFORT_OOM_SCORE_ADJ:
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


def container_resources(pod: JSON, container: JSON, node: NodeLimits) -> LinuxResources:
    """The CRI LinuxResources for one container (0 means unset / unlimited)."""
    cpu_request = milli_value(_request(container, "cpu"))
    cpu_limit = milli_value(_limit(container, "cpu"))
    quota = period = 0
    if node.cpu_cfs_quota:
        period = node.period_us
        quota = milli_cpu_to_quota(cpu_limit, period)
    memory = value(_limit(container, "memory"))
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
        hugepage_limits=hugepage_limits(node.hugepage_sizes, container_hugepages(container)),
        unified={"memory.swap.max": "0"} if node.swap_control == "swap.max" else {},
    )


def _pod_total(pod: JSON, pick: Any) -> tuple[int, bool]:
    """Sum over app containers, max with each init container; and whether all declare it."""
    spec = pod.get("spec") or {}
    inits = list(spec.get("initContainers") or [])
    apps = podspec.containers(pod)
    values = [pick(c) for c in apps]
    total = sum(v for v in values if v is not None)
    for c in inits:
        v = pick(c)
        if v is not None:
            total = max(total, v)
    declared = all(pick(c) is not None for c in apps + inits)
    return total, declared


def _cpu_request(c: JSON) -> int | None:
    q = _request(c, "cpu")
    return None if q is None else milli_value(q)


def pod_cpu_request_millis(pod: JSON) -> int:
    """The pod's CPU request in millicores as upstream's PodRequests counts it: app
    containers summed, the largest init container if more, plus the pod's overhead."""
    requests, _ = _pod_total(pod, _cpu_request)
    overhead = {"resources": {"overhead": (pod.get("spec") or {}).get("overhead")}}
    return requests + milli_value(_get(overhead, "overhead", "cpu"))


def burstable_cpu_shares(pods: Iterable[JSON]) -> int:
    """The burstable QoS cgroup's CPU shares, as upstream's QoS container manager sets
    them: the CPU requests of the active Burstable pods, summed, as shares."""
    millis = sum(pod_cpu_request_millis(p) for p in pods if podspec.qos_class(p) == "Burstable")
    return milli_cpu_to_shares(millis)


def pod_resources(pod: JSON, node: NodeLimits) -> PodResources:
    """Upstream's ResourceConfigForPod: the pod cgroup's shares, quota and memory limit."""

    def cpu_lim(c: JSON) -> int | None:
        q = _limit(c, "cpu")
        return None if q is None or q == 0 else milli_value(q)

    def mem_lim(c: JSON) -> int | None:
        q = _limit(c, "memory")
        return None if q is None or q == 0 else value(q)

    qos = podspec.qos_class(pod)
    pages = _pod_hugepages(pod, node)
    if qos == "BestEffort":
        return PodResources(MIN_SHARES, None, None, None, pids_limit(node), pages)
    requests = pod_cpu_request_millis(pod)
    cpu_limits, cpu_declared = _pod_total(pod, cpu_lim)
    memory, memory_declared = _pod_total(pod, mem_lim)
    # The pod's overhead (its RuntimeClass's, copied in by the apiserver) is in the
    # requests (pod_cpu_request_millis), and added to each limit the containers declare,
    # as upstream's PodRequests and PodLimits count it.
    overhead = {"resources": {"overhead": (pod.get("spec") or {}).get("overhead")}}
    if cpu_declared:
        cpu_limits += milli_value(_get(overhead, "overhead", "cpu"))
    if memory_declared:
        memory += value(_get(overhead, "overhead", "memory"))
    shares = milli_cpu_to_shares(requests)
    period = node.period_us
    quota = milli_cpu_to_quota(cpu_limits, period) if node.cpu_cfs_quota else -1
    if qos == "Guaranteed":
        return PodResources(shares, quota, period, memory, pids_limit(node), pages)
    return PodResources(
        shares,
        quota if cpu_declared else None,
        period if cpu_declared else None,
        memory if memory_declared else None,
        pids_limit(node),
        pages,
    )


def _pod_hugepages(pod: JSON, node: NodeLimits) -> tuple[tuple[str, int], ...]:
    """The pod cgroup's hugetlb limits: per size, the app containers' limits summed, the
    largest init container's if more."""
    wanted: dict[int, int] = {}
    for size in node.hugepage_sizes:
        wanted[size], _ = _pod_total(pod, lambda c, s=size: container_hugepages(c).get(s))
    return hugepage_limits(node.hugepage_sizes, wanted)
