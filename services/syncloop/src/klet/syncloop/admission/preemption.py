"""Which running pods a critical pod preempts, as upstream's CriticalPodAdmissionHandler.

Upstream's kubelet (pkg/kubelet/preemption/preemption.go) does not reject a critical pod
(static, mirror, or priority >= system-cluster-critical's 2000000000) that fails
admission only because the node lacks resources: it evicts running pods that free
enough of them and admits the critical pod. Restated:

- Only the fit check's shortfalls (`InsufficientResource`: pods, cpu, memory,
  ephemeral-storage, huge pages, extended resources) can be preempted for. When the pod
  also fails another predicate (node affinity, node name, host ports, NoExecute taints)
  those are its rejection instead, and nothing is evicted (admit.py decides that).
- Each shortfall becomes a requirement, upstream's GetInsufficientAmount: what the pod
  requests less what is still free (`requested - (capacity - used)`); cpu in
  millicores, a pod counting 1 toward `pods`.
- The candidates are the active pods the preemptor may preempt (`preemptable`: a
  critical pod preempts any non-critical one; otherwise a higher spec.priority preempts
  a lower one when both are set), split by QoS class. Guaranteed pods are taken only
  for what the BestEffort and Burstable pods together cannot free, then Burstable pods
  for what the BestEffort pods and those Guaranteed ones cannot, then BestEffort pods
  for the rest: the least important class gives first.
- Inside a class, pods are taken one at a time, each round the pod whose requests come
  closest to covering what is still required (the distance: the sum over the remaining
  requirements of the squared uncovered fraction), a tie going to the pod with the
  smaller memory, then cpu, request; so as few pods as possible go.
- When even all candidates together cannot free enough, nothing is evicted and the pod
  is rejected `UnexpectedAdmissionError` with upstream's message.

The victims are killed with reason `Preempting`, message "Preempted in order to admit
critical pod", and the DisruptionTarget condition "Pod was preempted by Kubelet to
accommodate a critical pod."; each one killed counts in
`kubelet_preemptions{preemption_signal=<the first requirement's resource>}`
(pods/controller.py does the killing, wiring counts).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from klet.model.pod import is_critical, pod_requests
from klet.model.types import JSON
from klet.syncloop.model import podspec

PREEMPTING = "Preempting"  # upstream's events.PreemptContainer: the Event and status reason
PREEMPTED_MESSAGE = "Preempted in order to admit critical pod"
PREEMPTED_DISRUPTION = "Pod was preempted by Kubelet to accommodate a critical pod."
UNEXPECTED_ADMISSION_ERROR = "UnexpectedAdmissionError"
_RECOVERY_FAILED = "Unexpected error while attempting to recover from admission failure: "


@dataclass(frozen=True)
class InsufficientResource:
    """One resource a pod does not fit in (upstream's InsufficientResourceError)."""

    resource: str
    requested: int
    used: int
    capacity: int

    @property
    def amount(self) -> int:
        """How much more would have to be free (upstream's GetInsufficientAmount)."""
        return self.requested - (self.capacity - self.used)


@dataclass(frozen=True)
class Requirement:
    """An amount of one resource still to be freed."""

    resource: str
    quantity: int


class NoPreemptionSet(Exception):
    """No set of preemptable pods frees enough: upstream's error, worded as its."""

    def __init__(self, remaining: Sequence[Requirement]) -> None:
        super().__init__(
            "no set of running pods found to reclaim resources: " + requirement_text(remaining)
        )

    @property
    def rejection_message(self) -> str:
        """The rejected critical pod's message (upstream's predicate admit handler)."""
        return f"{_RECOVERY_FAILED}preemption: error finding a set of pods to preempt: {self}"


def requirement_text(requirements: Sequence[Requirement]) -> str:
    """upstream's admissionRequirementList.toString: `[(res: cpu, q: 500), ]`."""
    return "[" + "".join(f"(res: {r.resource}, q: {r.quantity}), " for r in requirements) + "]"


def requirements(shortfalls: Sequence[InsufficientResource]) -> tuple[Requirement, ...]:
    return tuple(Requirement(s.resource, s.amount) for s in shortfalls)


def preemption_signal(required: Sequence[Requirement]) -> str:
    """The kubelet_preemptions label: the first requirement's resource ("" when none)."""
    return required[0].resource if required else ""


def resource_request(pod: JSON, resource: str) -> int:
    """upstream's resource.GetResourceRequest: 1 for `pods`; else the pod's request
    (millicores for cpu), its overhead added only when the request without it is not 0."""
    if resource == "pods":
        return 1
    total = pod_requests(pod).get(resource, 0)
    spec: JSON = pod.get("spec") or {}
    if total and spec.get("overhead"):
        bare = pod_requests({**pod, "spec": {**spec, "overhead": None}})
        if not bare.get(resource, 0):
            return 0
    return total


def _priority(pod: JSON) -> int | None:
    value = (pod.get("spec") or {}).get("priority")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def preemptable(preemptor: JSON, preemptee: JSON) -> bool:
    """upstream's kubetypes.Preemptable."""
    if is_critical(preemptor) and not is_critical(preemptee):
        return True
    mine, theirs = _priority(preemptor), _priority(preemptee)
    return mine is not None and theirs is not None and mine > theirs


def subtract(required: Sequence[Requirement], pods: Sequence[JSON]) -> tuple[Requirement, ...]:
    """What would still be required once `pods` were preempted."""
    left: list[Requirement] = []
    for req in required:
        quantity = req.quantity
        for pod in pods:
            quantity -= resource_request(pod, req.resource)
            if quantity <= 0:
                break
        if quantity > 0:
            left.append(Requirement(req.resource, quantity))
    return tuple(left)


def distance(required: Sequence[Requirement], pod: JSON) -> float:
    """How far the pod's requests are from covering `required`: per requirement, the
    uncovered fraction squared, summed (each requirement weighs the same)."""
    total = 0.0
    for req in required:
        uncovered = float(req.quantity - resource_request(pod, req.resource))
        if uncovered > 0:
            fraction = uncovered / float(req.quantity)
            total += fraction * fraction
    return total


def _smaller_request(a: JSON, b: JSON) -> bool:
    """upstream's smallerResourceRequest: memory, then cpu; equal counts as smaller."""
    for resource in ("memory", "cpu"):
        ra, rb = resource_request(a, resource), resource_request(b, resource)
        if ra != rb:
            return ra < rb
    return True


def by_distance(pods: Sequence[JSON], required: Sequence[Requirement]) -> list[JSON]:
    """upstream's getPodsToPreemptByDistance: pods taken one per round until nothing is
    required, each the closest (then the smaller); its swap-removal kept, so that ties
    fall as upstream's do."""
    left = list(pods)
    chosen: list[JSON] = []
    remaining = tuple(required)
    while remaining:
        if not left:
            raise NoPreemptionSet(remaining)
        best_distance = float(len(remaining) + 1)
        best = 0
        for i, pod in enumerate(left):
            d = distance(remaining, pod)
            if d < best_distance or (d == best_distance and _smaller_request(pod, left[best])):
                best_distance, best = d, i
        remaining = subtract(remaining, [left[best]])
        chosen.append(left[best])
        left[best] = left[-1]
        left.pop()
    return chosen


def by_qos(preemptor: JSON, pods: Sequence[JSON]) -> tuple[list[JSON], list[JSON], list[JSON]]:
    """The pods `preemptor` may preempt: (BestEffort, Burstable, Guaranteed)."""
    classes: dict[str, list[JSON]] = {"BestEffort": [], "Burstable": [], "Guaranteed": []}
    for pod in pods:
        if preemptable(preemptor, pod):
            classes[podspec.qos_class(pod)].append(pod)
    return classes["BestEffort"], classes["Burstable"], classes["Guaranteed"]


def pods_to_preempt(
    preemptor: JSON, pods: Sequence[JSON], required: Sequence[Requirement]
) -> list[JSON]:
    """upstream's getPodsToPreempt: the pods to evict so that `required` is freed,
    BestEffort ones first, then Burstable, then Guaranteed (module docstring).

    Raises NoPreemptionSet when all preemptable pods together free too little."""
    best_effort, burstable, guaranteed = by_qos(preemptor, pods)
    unable = subtract(required, [*best_effort, *burstable, *guaranteed])
    if unable:
        raise NoPreemptionSet(unable)
    guaranteed_out = by_distance(guaranteed, subtract(required, [*best_effort, *burstable]))
    burstable_out = by_distance(burstable, subtract(required, [*best_effort, *guaranteed_out]))
    best_effort_out = by_distance(
        best_effort, subtract(required, [*burstable_out, *guaranteed_out])
    )
    return [*best_effort_out, *burstable_out, *guaranteed_out]
