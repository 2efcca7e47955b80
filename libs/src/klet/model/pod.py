"""Facts every service reads off a pod's JSON: where it came from, whether it is static,
mirror or critical, and what it requests.

pod-source writes the `kubernetes.io/config.*` annotations (upstream's
`pkg/kubelet/types/pod_update.go` names) and every other service reads them, so their
names and meaning live here once:

- `config.source`: the source that delivered the pod (`file`, `http`, `api`); a pod
  without it counts as an apiserver pod;
- `config.hash`: a static pod's content hash (also its UID), which its mirror pod
  carries in `config.mirror`;
- `config.seen`: when pod-source first saw the pod.

Static, mirror and critical follow upstream's `IsStaticPod` (source other than the
apiserver), `IsMirrorPod` (the `config.mirror` annotation) and `IsCriticalPod` (static,
mirror, or priority at least system-cluster-critical's, 2000000000). A pod's requests
follow upstream's `PodRequests`: the sum over regular containers and sidecars
(restartable init containers), at least the peak of any init container (which runs
alongside the sidecars started before it), pod-level requests replacing that for
cpu/memory/huge pages when set, plus the pod overhead; a request missing on a container
defaults to its limit, as the apiserver's defaulting does. Amounts are in the
scheduler's fit-check unit: millicores for `cpu`, bytes or counts for the rest.

A pod's limits follow upstream's `PodLimits` the same way (sidecars summed with the
regular containers, each init container's step counted with the sidecars started
before it), pod-level limits replacing the aggregate where set, the overhead added to
each non-zero limit; `limits_declared` says for cpu and memory whether every container
(every init step) declares one, or the pod does. The QoS class is upstream's
`GetPodQOS`: the API's `status.qosClass` when the pod carries one (the apiserver sets it
at creation and it never changes), else computed from the pod-level requests and limits
when `spec.resources` is set (PodLevelResources), from every container's otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal

from klet.model.types import JSON
from klet.model.units import parse_quantity

CONFIG_SOURCE = "kubernetes.io/config.source"
CONFIG_HASH = "kubernetes.io/config.hash"
CONFIG_SEEN = "kubernetes.io/config.seen"
CONFIG_MIRROR = "kubernetes.io/config.mirror"

API_SOURCE = "api"
"""upstream's ApiserverSource: the one source whose pods are not static."""

SYSTEM_CRITICAL_PRIORITY = 2_000_000_000
"""Priority of system-cluster-critical; system-node-critical is higher."""

_POD_LEVEL = ("cpu", "memory")


def pod_annotations(pod: JSON) -> Mapping[str, str]:
    return (pod.get("metadata") or {}).get("annotations") or {}


def config_source(pod: JSON) -> str:
    """The config source of a pod; `api` unless pod-source marked it otherwise."""
    return pod_annotations(pod).get(CONFIG_SOURCE) or API_SOURCE


def is_static(pod: JSON) -> bool:
    return config_source(pod) != API_SOURCE


def is_mirror(pod: JSON) -> bool:
    return CONFIG_MIRROR in pod_annotations(pod)


def pod_priority(pod: JSON) -> int:
    """spec.priority (the apiserver resolves priorityClassName into it); 0 when unset."""
    value = (pod.get("spec") or {}).get("priority")
    return value if isinstance(value, int) else 0


def is_critical(pod: JSON) -> bool:
    return is_static(pod) or is_mirror(pod) or pod_priority(pod) >= SYSTEM_CRITICAL_PRIORITY


# -- requests ------------------------------------------------------------------------


def _amount(resource: str, quantity: Decimal) -> int:
    """A quantity in the fit check's unit (Quantity.MilliValue / Value, rounded up)."""
    return math.ceil(quantity * 1000) if resource == "cpu" else math.ceil(quantity)


def _resource_map(values: object) -> dict[str, Decimal]:
    if not isinstance(values, Mapping):
        return {}
    return {str(k): parse_quantity(str(v)) for k, v in values.items() if v is not None and v != ""}


def container_requests(container: JSON) -> dict[str, Decimal]:
    """The container's requests, each missing one defaulting to its limit."""
    res = container.get("resources") or {}
    if not isinstance(res, Mapping):
        return {}
    return {**_resource_map(res.get("limits")), **_resource_map(res.get("requests"))}


def _add(total: dict[str, Decimal], more: Mapping[str, Decimal]) -> None:
    for k, v in more.items():
        total[k] = total.get(k, Decimal(0)) + v


def _max(total: dict[str, Decimal], other: Mapping[str, Decimal]) -> None:
    for k, v in other.items():
        if k not in total or v > total[k]:
            total[k] = v


def _pod_level_resource(name: str) -> bool:
    return name in _POD_LEVEL or name.startswith("hugepages-")


def _is_sidecar(container: JSON) -> bool:
    return container.get("restartPolicy") == "Always"


def _aggregate(
    pod: JSON,
    amounts: Callable[[JSON], dict[str, Decimal]],
    each: Callable[[Mapping[str, Decimal]], None] | None = None,
) -> dict[str, Decimal]:
    """upstream's sidecar-aware aggregate of the containers' `amounts`: regular containers
    and sidecars summed, at least each init container's step (it runs beside the
    sidecars started before it). `each` sees every container's and every init step's."""
    spec: JSON = pod.get("spec") or {}
    total: dict[str, Decimal] = {}
    for c in spec.get("containers") or []:
        mine = amounts(c)
        if each is not None:
            each(mine)
        _add(total, mine)
    sidecars: dict[str, Decimal] = {}
    init_peak: dict[str, Decimal] = {}
    for c in spec.get("initContainers") or []:
        mine = amounts(c)
        if _is_sidecar(c):
            _add(total, mine)
            _add(sidecars, mine)
            step = dict(sidecars)
        else:
            step = dict(mine)
            _add(step, sidecars)
        if each is not None:
            each(step)
        _max(init_peak, step)
    _max(total, init_peak)
    return total


def aggregate_container_requests(pod: JSON) -> dict[str, Decimal]:
    """upstream's AggregateContainerRequests (`_aggregate` of the requests)."""
    return _aggregate(pod, container_requests)


def pod_level(pod: JSON) -> tuple[dict[str, Decimal], dict[str, Decimal]]:
    """The pod-level (`spec.resources`) requests and limits of the resources pod-level
    resources cover (cpu, memory, hugepages-*), requests defaulted as the apiserver
    does: from the containers' aggregate for cpu and memory, else from the limit."""
    level = (pod.get("spec") or {}).get("resources")
    if not isinstance(level, Mapping):
        return {}, {}
    limits = {k: v for k, v in _resource_map(level.get("limits")).items() if _pod_level_resource(k)}
    requests = {
        k: v for k, v in _resource_map(level.get("requests")).items() if _pod_level_resource(k)
    }
    if limits:
        aggregate = aggregate_container_requests(pod)
        for name in _POD_LEVEL:
            if name not in requests and name in aggregate:
                requests[name] = aggregate[name]
        for name, q in limits.items():
            requests.setdefault(name, q)
    return requests, limits


def is_pod_level_set(pod: JSON) -> bool:
    """upstream's IsPodLevelResourcesSet: `spec.resources` names cpu, memory or huge pages."""
    requests, limits = pod_level(pod)
    return bool(requests or limits)


def pod_requests(pod: JSON) -> dict[str, int]:
    """upstream's PodRequests, as amounts (see the module docstring)."""
    spec: JSON = pod.get("spec") or {}
    total = aggregate_container_requests(pod)
    total.update(pod_level(pod)[0])
    _add(total, _resource_map(spec.get("overhead")))
    return {k: _amount(k, v) for k, v in total.items()}


@dataclass(frozen=True)
class PodLimits:
    """upstream's PodLimits (quantities) and ResourceConfigForPod's "declared" flags."""

    limits: dict[str, Decimal]
    cpu_declared: bool
    memory_declared: bool


def _container_limits(container: JSON) -> dict[str, Decimal]:
    res = container.get("resources") or {}
    return _resource_map(res.get("limits")) if isinstance(res, Mapping) else {}


def pod_limits(pod: JSON) -> PodLimits:
    """upstream's PodLimits with pod-level resources: sidecars summed with the regular
    containers, each init step with the sidecars before it, pod-level limits replacing
    the aggregate, the overhead added to each non-zero limit."""
    spec: JSON = pod.get("spec") or {}
    cpu_declared = memory_declared = True

    def seen(limits: Mapping[str, Decimal]) -> None:
        nonlocal cpu_declared, memory_declared
        if not limits.get("cpu"):
            cpu_declared = False
        if not limits.get("memory"):
            memory_declared = False

    total = _aggregate(pod, _container_limits, seen)
    level = pod_level(pod)[1]
    total.update(level)
    if level.get("cpu"):
        cpu_declared = True
    if level.get("memory"):
        memory_declared = True
    for name, q in _resource_map(spec.get("overhead")).items():
        if total.get(name):
            total[name] += q
    return PodLimits(total, cpu_declared, memory_declared)


# -- QoS class ------------------------------------------------------------------------

GUARANTEED, BURSTABLE, BEST_EFFORT = "Guaranteed", "Burstable", "BestEffort"
_QOS_CLASSES = (GUARANTEED, BURSTABLE, BEST_EFFORT)


def _positive(values: Mapping[str, Decimal]) -> dict[str, Decimal]:
    return {k: v for k, v in values.items() if k in _POD_LEVEL and v > 0}


def compute_qos_class(pod: JSON) -> str:
    """upstream's ComputePodQOS (cpu and memory only, quantities compared by value)."""
    requests: dict[str, Decimal] = {}
    limits: dict[str, Decimal] = {}
    guaranteed = True
    spec: JSON = pod.get("spec") or {}
    if is_pod_level_set(pod):
        level_requests, level_limits = pod_level(pod)
        requests = _positive(level_requests)
        limits = _positive(level_limits)
        if level_limits and set(limits) != set(_POD_LEVEL):
            guaranteed = False
    else:
        for c in list(spec.get("containers") or []) + list(spec.get("initContainers") or []):
            c_limits = _positive(_container_limits(c))
            _add(requests, _positive(container_requests(c)))
            _add(limits, c_limits)
            if set(c_limits) != set(_POD_LEVEL):
                guaranteed = False
    if not requests and not limits:
        return BEST_EFFORT
    if guaranteed and all(limits.get(k) == v for k, v in requests.items()):
        if len(requests) == len(limits):
            return GUARANTEED
    return BURSTABLE


def qos_class(pod: JSON) -> str:
    """upstream's GetPodQOS: the apiserver's `status.qosClass` when present (it is fixed
    at creation, so a resize never moves a pod), else `compute_qos_class`."""
    status = pod.get("status")
    given = status.get("qosClass") if isinstance(status, Mapping) else None
    return given if given in _QOS_CLASSES else compute_qos_class(pod)
