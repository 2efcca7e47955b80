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
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from decimal import Decimal

from klet.config.units import parse_quantity
from klet.model.types import JSON

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


def pod_requests(pod: JSON) -> dict[str, int]:
    """upstream's PodRequests, as amounts (see the module docstring)."""
    spec: JSON = pod.get("spec") or {}
    total: dict[str, Decimal] = {}
    for c in spec.get("containers") or []:
        _add(total, container_requests(c))
    sidecars: dict[str, Decimal] = {}
    init_peak: dict[str, Decimal] = {}
    for c in spec.get("initContainers") or []:
        reqs = container_requests(c)
        if c.get("restartPolicy") == "Always":
            _add(total, reqs)
            _add(sidecars, reqs)
            running = dict(sidecars)
        else:
            running = dict(reqs)
            _add(running, sidecars)
        _max(init_peak, running)
    _max(total, init_peak)
    # Pod-level resources: an explicit pod-level request wins; a pod-level limit alone
    # becomes the request (upstream's defaulting) only when no container requests it.
    level = spec.get("resources") or {}
    if isinstance(level, Mapping):
        level_requests = _resource_map(level.get("requests"))
        for name, q in _resource_map(level.get("limits")).items():
            if _pod_level_resource(name) and name not in level_requests and name not in total:
                total[name] = q
        for name, q in level_requests.items():
            if _pod_level_resource(name):
                total[name] = q
    _add(total, _resource_map(spec.get("overhead")))
    return {k: _amount(k, v) for k, v in total.items()}
