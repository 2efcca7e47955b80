"""In-place pod resize (InPlacePodVerticalScaling, the `pods/resize` subresource): the
pure decisions, restated from upstream v1.34's allocation manager
(`pkg/kubelet/allocation`) and kuberuntime's computePodResizeAction/doPodResizeAction.

Three sets of resources per resizable container (a regular container, or a sidecar:
an init container with `restartPolicy: Always`; plain init and ephemeral containers are
never resized):

- **desired**: the spec as the apiserver has it (a `kubectl patch --subresource resize`
  changes it);
- **allocated**: what the node admitted, checkpointed (upstream's
  `<root-dir>/allocated_pods_state`) so a restarted or newly elected syncloop neither
  reverts nor re-applies; everything the node does with the pod (containers it creates,
  the pod cgroup, QoS, admission of other pods) uses the allocated pod (`with_allocation`);
- **actuated**: what was last applied to each running container through CRI.

A resize is `desired != allocated`. `decide` admits it (allocated := desired), or leaves
it pending: `Infeasible` (a static pod, or more than the node's allocatable: never
retried until the spec changes) or `Deferred` (the node's admission would refuse it next
to the other pods' allocated resources: retried, in `pending_order`, when resources
free up). While `allocated != actuated` for a running container the pod is
`PodResizeInProgress`; `plan` orders the work as upstream: memory before CPU; per
resource, a pod cgroup limit that grows is written before the containers and one that
shrinks after; container decreases before increases; a changed resource whose
`resizePolicy` says `RestartContainer` restarts that container instead. A memory limit
lowered below current usage is refused as a whole (`memory_decrease_problems`; the pod
stays `PodResizeInProgress` with reason `Error` and is retried), as 1.34 does.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Literal

from klet.model.pod import GUARANTEED, qos_class
from klet.model.types import JSON
from klet.model.units import parse_quantity

Resource = Literal["cpu", "memory"]
RESOURCES: tuple[Resource, ...] = ("memory", "cpu")  # upstream's actuation order

INFEASIBLE = "Infeasible"
DEFERRED = "Deferred"
ERROR = "Error"
RESIZE_PENDING = "PodResizePending"
RESIZE_IN_PROGRESS = "PodResizeInProgress"
STATIC_POD_MESSAGE = "In-place resize of static-pods is not supported"
CPU_MANAGER_STATIC_MESSAGE = (
    'Resize is infeasible for Guaranteed Pods alongside CPU Manager policy "static"'
)
RESTART_CONTAINER = "RestartContainer"

Allocation = Mapping[str, JSON]
"""Container name → its allocated `resources` (requests and limits, as in the spec)."""

AdmitCheck = Callable[[JSON], tuple[bool, str]]
"""The node's admission of a pod at its desired resources next to every other pod at
its allocated ones: (admitted, message)."""


# -- amounts --------------------------------------------------------------------------


@dataclass(frozen=True)
class Amounts:
    """One container's CPU and memory as the runtime is given them (upstream's
    containerResources): millicores and bytes, 0 where the spec sets none."""

    cpu_request: int = 0
    cpu_limit: int = 0
    memory_request: int = 0
    memory_limit: int = 0

    def value(self, resource: Resource, *, limit: bool) -> int:
        if resource == "cpu":
            return self.cpu_limit if limit else self.cpu_request
        return self.memory_limit if limit else self.memory_request

    def with_resource(self, resource: Resource, source: Amounts) -> Amounts:
        """These amounts with `resource`'s request and limit taken from `source`."""
        if resource == "cpu":
            return replace(self, cpu_request=source.cpu_request, cpu_limit=source.cpu_limit)
        return replace(self, memory_request=source.memory_request, memory_limit=source.memory_limit)


def _quantity(values: object, name: str) -> Decimal:
    if not isinstance(values, Mapping):
        return Decimal(0)
    raw = values.get(name)
    return Decimal(0) if raw in (None, "") else parse_quantity(str(raw))


def _milli(q: Decimal) -> int:
    return math.ceil(q * 1000)  # Quantity.MilliValue rounds up


def _bytes(q: Decimal) -> int:
    return math.ceil(q)


def amounts(resources: JSON | None) -> Amounts:
    """The amounts of a `resources` object (ResourceRequirements)."""
    res = resources if isinstance(resources, Mapping) else {}
    requests, limits = res.get("requests"), res.get("limits")
    return Amounts(
        cpu_request=_milli(_quantity(requests, "cpu")),
        cpu_limit=_milli(_quantity(limits, "cpu")),
        memory_request=_bytes(_quantity(requests, "memory")),
        memory_limit=_bytes(_quantity(limits, "memory")),
    )


# -- containers and allocations ---------------------------------------------------------


def _is_sidecar(container: JSON) -> bool:
    return container.get("restartPolicy") == "Always"


def resizable_containers(pod: JSON) -> list[JSON]:
    """upstream IsResizableContainer: sidecars (in spec order), then regular containers."""
    spec = pod.get("spec") or {}
    sidecars = [c for c in spec.get("initContainers") or [] if _is_sidecar(c)]
    return [*sidecars, *(spec.get("containers") or [])]


def allocation_of(pod: JSON) -> dict[str, JSON]:
    """What to checkpoint when the node admits `pod` (or a resize of it)."""
    return {
        str(c["name"]): copy.deepcopy(c.get("resources") or {}) for c in resizable_containers(pod)
    }


def _same(a: JSON | None, b: JSON | None) -> bool:
    """Semantic equality of two ResourceRequirements (quantities compared by value)."""
    a, b = a or {}, b or {}
    for part in ("requests", "limits"):
        pa, pb = a.get(part) or {}, b.get(part) or {}
        for name in set(pa) | set(pb):
            if _quantity(pa, name) != _quantity(pb, name):
                return False
    return True


def with_allocation(pod: JSON, allocation: Allocation | None) -> JSON:
    """upstream UpdatePodFromAllocation: `pod` with each container's resources replaced
    by its allocation where they differ (the same object when nothing differs)."""
    if not allocation:
        return pod
    spec = pod.get("spec") or {}
    out: JSON | None = None
    for kind in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(kind) or []):
            allocated = allocation.get(str(c.get("name")))
            if allocated is None or _same(c.get("resources"), allocated):
                continue
            if out is None:
                out = copy.deepcopy(pod)
            out["spec"][kind][i]["resources"] = copy.deepcopy(allocated)
    return pod if out is None else out


def resize_requested(pod: JSON, allocation: Allocation | None) -> bool:
    """Whether the spec asks for other resources than the node allocated."""
    return with_allocation(pod, allocation) is not pod


# -- requested resizes (kubelet_container_requested_resizes_total) ---------------------

Operation = Literal["add", "remove", "increase", "decrease"]


@dataclass(frozen=True)
class RequestedChange:
    """One label set of kubelet_container_requested_resizes_total."""

    resource: Resource
    requirement: Literal["requests", "limits"]
    operation: Operation


def _operation(new: Decimal, old: Decimal) -> Operation | None:
    if new == old:
        return None
    if new == 0:
        return "remove"
    if old == 0:
        return "add"
    return "increase" if new > old else "decrease"


def requested_changes(old_pod: JSON, new_pod: JSON) -> list[RequestedChange]:
    """upstream recordContainerResizeOperations: what an update of the pod asks to
    change, per container, memory then CPU, requests then limits."""
    new_by_name = {str(c.get("name")): c for c in resizable_containers(new_pod)}
    out: list[RequestedChange] = []
    for old in resizable_containers(old_pod):
        new = new_by_name.get(str(old.get("name")))
        if new is None:
            continue
        o, n = old.get("resources") or {}, new.get("resources") or {}
        for resource in RESOURCES:
            for requirement in ("requests", "limits"):
                op = _operation(
                    _quantity(n.get(requirement), resource), _quantity(o.get(requirement), resource)
                )
                if op is not None:
                    out.append(RequestedChange(resource, requirement, op))
    return out


# -- admission of a resize -------------------------------------------------------------


@dataclass(frozen=True)
class ResizeVerdict:
    """What `decide` concluded: `accept` (allocate the desired resources), or a pending
    reason (`Infeasible`, `Deferred`) with its message, or nothing to do."""

    accept: bool = False
    reason: str = ""
    message: str = ""
    metric_reason: str = ""
    """kubelet_pod_infeasible_resizes_total's reason_detail, for an infeasible one."""

    @property
    def pending(self) -> bool:
        return bool(self.reason)


NO_RESIZE = ResizeVerdict()


def _cpu_request_resized(pod: JSON, allocation: Allocation | None) -> bool:
    """upstream guaranteedPodResourceResizeRequired for cpu, in a Guaranteed pod: a
    resizable container's CPU request differs from the one allocated."""
    if qos_class(pod) != GUARANTEED:
        return False
    for c in resizable_containers(pod):
        allocated = (allocation or {}).get(str(c.get("name"))) or {}
        if _request(c.get("resources") or {}) != _request(allocated):
            return True
    return False


def _request(resources: JSON) -> Decimal:
    """The CPU request, defaulting to the limit as the apiserver does."""
    return _quantity(resources.get("requests"), "cpu") or _quantity(resources.get("limits"), "cpu")


def pod_request(pod: JSON, resource: Resource) -> int:
    """upstream resource.GetResourceRequest: the sum of the regular containers' and
    sidecars' requests, or the largest plain init container's plus the sidecars
    started before it when that is larger (millicores, bytes)."""
    spec = pod.get("spec") or {}

    def req(c: JSON) -> int:
        a = amounts(c.get("resources"))
        value = a.value(resource, limit=False)
        if value == 0:  # a request missing where a limit is set defaults to it
            value = a.value(resource, limit=True)
        return value

    total = sum(req(c) for c in spec.get("containers") or [])
    sidecars = 0
    init_max = 0
    for c in spec.get("initContainers") or []:
        if _is_sidecar(c):
            sidecars += req(c)
            total += req(c)
        else:
            init_max = max(init_max, sidecars + req(c))
    return max(total, init_max)


def decide(
    pod: JSON,
    allocation: Allocation | None,
    *,
    static: bool,
    allocatable: Mapping[str, int],
    admit: AdmitCheck,
    cpu_manager_static: bool = False,
) -> ResizeVerdict:
    """upstream handlePodResourcesResize and canResizePod for a pod whose spec may ask
    for a resize. `allocatable` is the node's (millicores, bytes); `admit(pod)` is the
    node's admission of the desired pod next to every other pod at its allocated
    resources, returning (admitted, message)."""
    if not resize_requested(pod, allocation):
        return NO_RESIZE
    if static:
        return ResizeVerdict(
            reason=INFEASIBLE, message=STATIC_POD_MESSAGE, metric_reason="static_pod"
        )
    if cpu_manager_static and _cpu_request_resized(pod, allocation):
        # upstream with InPlacePodVerticalScalingExclusiveCPUs off (its default, and the
        # only value klet accepts): the CPU manager never moves exclusive CPUs
        return ResizeVerdict(
            reason=INFEASIBLE,
            message=CPU_MANAGER_STATIC_MESSAGE,
            metric_reason="guaranteed_pod_cpu_manager_static_policy",
        )
    cpu, memory = pod_request(pod, "cpu"), pod_request(pod, "memory")
    cpu_cap, memory_cap = allocatable.get("cpu", 0), allocatable.get("memory", 0)
    if cpu > cpu_cap or memory > memory_cap:
        detail = (
            f"memory, requested: {memory}, capacity: {memory_cap}"
            if memory > memory_cap
            else f"cpu, requested: {cpu}, capacity: {cpu_cap}"
        )
        return ResizeVerdict(
            reason=INFEASIBLE,
            message="Node didn't have enough capacity: " + detail,
            metric_reason="insufficient_node_allocatable",
        )
    admitted, message = admit(pod)
    if not admitted:
        return ResizeVerdict(reason=DEFERRED, message=message)
    return ResizeVerdict(accept=True)


# -- pending resizes in priority order -------------------------------------------------


@dataclass(frozen=True)
class PendingResize:
    """A deferred resize waiting for resources: what `pending_order` sorts by."""

    uid: str
    increases_requests: bool
    priority: int
    guaranteed: bool
    pending_since: float | None
    """The PodResizePending condition's lastTransitionTime (None: not pending yet)."""


def increases_requests(allocated_pod: JSON, desired_pod: JSON) -> bool:
    """upstream isResizeIncreasingRequests: the pod's CPU or memory request grows."""
    return any(
        pod_request(desired_pod, r) > pod_request(allocated_pod, r) for r in ("cpu", "memory")
    )


def pending_order(pending: Sequence[PendingResize]) -> list[str]:
    """upstream sortPendingResizes: resizes that do not increase requests first, then
    higher priority, then Guaranteed before the rest, then the longest pending."""

    def key(p: PendingResize) -> tuple[int, int, int, int, float]:
        since = p.pending_since
        return (
            1 if p.increases_requests else 0,
            -p.priority,
            0 if p.guaranteed else 1,
            1 if since is None else 0,
            since if since is not None else 0.0,
        )

    return [p.uid for p in sorted(pending, key=key)]


# -- actuation ------------------------------------------------------------------------


@dataclass(frozen=True)
class PodCgroup:
    """The pod cgroup's CPU and memory values (from model/resources.pod_resources
    of the allocated pod, or read back): quota -1 and memory 0 mean no limit."""

    cpu_shares: int
    cpu_quota: int
    memory_limit: int

    def value(self, resource: Resource, *, limit: bool) -> int:
        if resource == "cpu":
            return self.cpu_quota if limit else self.cpu_shares
        return self.memory_limit if limit else 0


@dataclass(frozen=True)
class UpdateContainer:
    """UpdateContainerResources of one running container with these amounts."""

    name: str
    container_id: str
    resources: Amounts


@dataclass(frozen=True)
class SetPodCgroup:
    """Write the pod cgroup's limit (quota, memory limit) or request (shares) of
    `resource` to the allocated pod's value."""

    resource: Resource
    limit: bool


Step = UpdateContainer | SetPodCgroup


@dataclass(frozen=True)
class ResizePlan:
    restart: tuple[str, ...] = ()
    """Containers whose changed resource has resizePolicy RestartContainer: killed and
    started again at the allocated resources (the pod cgroup is set too)."""
    steps: tuple[Step, ...] = ()
    decreasing_memory: Mapping[str, int] = field(default_factory=dict)
    """Container → new memory limit, for the containers whose limit is lowered."""
    pod_memory_decrease: int | None = None
    """The pod cgroup's new memory limit when it is lowered."""

    @property
    def empty(self) -> bool:
        return not self.restart and not self.steps


def _policy(container: JSON, resource: Resource) -> str:
    for p in container.get("resizePolicy") or []:
        if p.get("resourceName") == resource:
            return str(p.get("restartPolicy") or "NotRequired")
    return "NotRequired"


def plan(
    allocated_pod: JSON,
    *,
    actuated: Mapping[str, Amounts],
    running: Mapping[str, str],
    pod_current: PodCgroup,
    pod_new: PodCgroup,
) -> ResizePlan:
    """upstream computePodResizeAction + doPodResizeAction's order, for the running
    containers (`running`: name → container ID; a container not running is sized when
    it starts). `actuated` is what each was last given."""
    restart: list[str] = []
    updates: dict[Resource, list[tuple[str, Amounts, bool]]] = {"memory": [], "cpu": []}
    decreasing_memory: dict[str, int] = {}
    for c in resizable_containers(allocated_pod):
        name = str(c["name"])
        if name not in running:
            continue
        desired = amounts(c.get("resources"))
        current = actuated.get(name, Amounts())
        if desired == current:
            continue
        changed = [
            r
            for r in RESOURCES
            if desired.value(r, limit=True) != current.value(r, limit=True)
            or desired.value(r, limit=False) != current.value(r, limit=False)
        ]
        if any(_policy(c, r) == RESTART_CONTAINER for r in changed):
            restart.append(name)
            continue
        for r in changed:
            limit = desired.value(r, limit=True) != current.value(r, limit=True)
            grows = desired.value(r, limit=limit) > current.value(r, limit=limit)
            updates[r].append((name, desired, grows))
        if desired.memory_limit and (
            not current.memory_limit or desired.memory_limit < current.memory_limit
        ):
            decreasing_memory[name] = desired.memory_limit
    steps: list[Step] = []
    given = {n: actuated.get(n, Amounts()) for n in running}
    for r in RESOURCES:
        if not updates[r] and not restart:
            continue
        cur_lim, new_lim = pod_current.value(r, limit=True), pod_new.value(r, limit=True)
        cur_req, new_req = pod_current.value(r, limit=False), pod_new.value(r, limit=False)
        if r == "memory" and new_lim == 0:
            new_lim = cur_lim  # upstream cannot remove a pod limit either (#128675)
        if r == "cpu" and new_lim < 0:
            new_lim = cur_lim
        if new_lim > cur_lim:
            steps.append(SetPodCgroup(r, limit=True))
        if r == "cpu" and new_req > cur_req:
            steps.append(SetPodCgroup(r, limit=False))
        ordered = [u for u in updates[r] if not u[2]] + [u for u in updates[r] if u[2]]
        for name, desired, _ in ordered:
            given[name] = given[name].with_resource(r, desired)
            steps.append(UpdateContainer(name, running[name], given[name]))
        if r == "cpu" and new_req < cur_req:
            steps.append(SetPodCgroup(r, limit=False))
        if new_lim < cur_lim:
            steps.append(SetPodCgroup(r, limit=True))
    pod_decrease = (
        pod_new.memory_limit
        if pod_new.memory_limit
        and (not pod_current.memory_limit or pod_new.memory_limit < pod_current.memory_limit)
        and (updates["memory"] or restart)
        else None
    )
    return ResizePlan(
        restart=tuple(restart),
        steps=tuple(steps),
        decreasing_memory=decreasing_memory,
        pod_memory_decrease=pod_decrease,
    )


def memory_decrease_problems(
    resize: ResizePlan, *, pod_usage: int | None, container_usage: Mapping[str, int | None]
) -> str | None:
    """upstream validateMemoryResizeAction: why lowering the memory limits now would
    put one below current usage (the whole resize waits), or None."""
    problems: list[str] = []
    if resize.pod_memory_decrease is not None:
        if pod_usage is None:
            problems.append("missing pod memory usage")
        elif pod_usage >= resize.pod_memory_decrease:
            problems.append(
                f"attempting to set pod memory limit ({resize.pod_memory_decrease}) below "
                f"current usage ({pod_usage})"
            )
    for name, limit in resize.decreasing_memory.items():
        usage = container_usage.get(name)
        if usage is None:
            problems.append(f'missing container "{name}" memory usage')
        elif usage >= limit:
            problems.append(
                f'attempting to set container "{name}" memory limit ({limit}) below '
                f"current usage ({usage})"
            )
    if not problems:
        return None
    joined = problems[0] if len(problems) == 1 else "[" + ", ".join(problems) + "]"
    return "cannot decrease memory limits: " + joined


def in_progress(
    allocated_pod: JSON, *, actuated: Mapping[str, Amounts], running: Sequence[str]
) -> bool:
    """upstream isPodResizeInProgress: a running resizable container whose allocated
    CPU or memory differs from what it was last given."""
    names = set(running)
    return any(
        amounts(c.get("resources")) != actuated.get(str(c["name"]), Amounts())
        for c in resizable_containers(allocated_pod)
        if str(c["name"]) in names
    )


def resize_condition(
    kind: str, *, reason: str, message: str, generation: int, previous: JSON | None, now: str
) -> JSON:
    """A PodResizePending/PodResizeInProgress condition (status True) as it is set,
    keeping the previous one's transition time while its reason stays (upstream's
    updatedPodResizeCondition; the caller keeps it until the next decision, so
    lastProbeTime is the time of that decision)."""
    cond: JSON = {"type": kind, "status": "True", "lastProbeTime": now}
    same = previous is not None and previous.get("reason", "") == reason
    cond["lastTransitionTime"] = previous.get("lastTransitionTime") if same and previous else now
    if reason:
        cond["reason"] = reason
    if message:
        cond["message"] = message
    if generation:
        cond["observedGeneration"] = generation
    return cond
