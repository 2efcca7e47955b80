"""Pod admission: whether this node takes a pod, as upstream's predicate admit handler.

Upstream's kubelet runs every new pod through its admit handlers before the pod's first
sync (`HandlePodAdditions` → `canAdmitPod`); the predicate handler
(`pkg/kubelet/lifecycle/predicate.go`) reuses the scheduler's fit checks. Restated, in
upstream's order, the first failure being the one reported:

1. the pod's `kubernetes.io/os` *label*, when set, must name this node's OS
   (`PodOSSelectorNodeLabelDoesNotMatch`), and `spec.os.name`, when set, must too
   (`PodOSNotSupported`); then the pod must not set a field klet refuses rather than
   ignores (`containers/fields.py`: a user namespace; a RuntimeClass or resource claims
   on a standalone node),
   `PodFeatureUnsupported` naming the field, as upstream's feature admit handler;
2. resources (`noderesources.Fits`): one more pod must fit under maxPods
   (`OutOfpods`), and each resource the pod requests must fit into allocatable minus
   what the other admitted pods request (`OutOfcpu`, `OutOfmemory`,
   `OutOfephemeral-storage`, `OutOf<name>` for huge pages and extended resources).
   CPU is counted in millicores, everything else in bytes/units. Extended resources
   this node does not offer at all are dropped first (they may be cluster-level);
3. `NodeAffinity`: spec.nodeSelector and the required node affinity terms against the
   node's labels (and `metadata.name` for matchFields);
4. `NodeName`: spec.nodeName, when set, must be this node;
5. `NodePorts`: no (hostIP, protocol, hostPort) of the pod may be in use by another
   admitted pod, `0.0.0.0` (or no hostIP) conflicting with every address;
6. `TaintToleration`: a pod that is not static must tolerate every `NoExecute` taint of
   the Node (upstream's kubelet looks at no other effect: NoSchedule is the
   scheduler's), message "Predicate TaintToleration failed: node(s) had taints that the
   pod didn't tolerate". Critical pods are not exempt (upstream's critical-pod handler
   only preempts for resources). The taints are the Node's as syncloop last saw it
   (`nodetaints.py` follows the Node in cluster mode); standalone, or before the Node is
   first read, they are `registerWithTaints`, as upstream's initial node.

A pod's requests are upstream's `PodRequests` (`klet.model.pod.pod_requests`).

A critical pod (static, mirror, priority >= 2000000000) that fails only the resource
check is not rejected: the verdict admits it and names the running pods to preempt for
it (`Verdict.preempt`, chosen by `preemption.py`, upstream's CriticalPodAdmissionHandler),
which the controller kills before the pod starts. Failing another predicate as well,
it is rejected with the first of those (upstream reports only the reasons preemption
cannot help); when no set of running pods frees enough, with `UnexpectedAdmissionError`.

After the node-pressure check below and before the predicates above (upstream registers
its sysctl handler second), every sysctl of the pod must be allowed on this node
(`sysctls.py`, reason `SysctlForbidden`).

Before those, as upstream registers the eviction manager's admit handler first, node
pressure (the MemoryPressure/DiskPressure/PIDPressure conditions the eviction service
writes to the bus `node` table, see `pressure_verdict`): critical pods (static, mirror,
priority >= 2000000000) are always admitted; under MemoryPressure alone only BestEffort
pods are rejected, unless they tolerate the `node.kubernetes.io/memory-pressure`
NoSchedule taint; under any other pressure every pod is. Reason `Evicted`, message
"The node had condition: [MemoryPressure]. ". While the node shuts down gracefully
(the eviction service's shutdown manager says so on the bus) every pod is rejected,
critical ones too, with upstream's reason `NodeShutdown` and message "Pod was rejected
as the node is shutting down.". Pods re-admitted after a syncloop restart
skip this check: they already run, and a restart must not stop them.

The rejected pod's status message is "Pod was rejected: <message>"; the Event carries
the bare message (upstream's `rejectPod`).

`AdmissionLedger` holds which pods were admitted and rejected; it does no I/O, the
controller feeds it the pods that count (admitted, not terminal) and the restart order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Protocol

from klet.model.node import NODE_SHUTDOWN
from klet.model.pod import is_critical, is_static, pod_requests
from klet.model.types import JSON
from klet.syncloop.admission.preemption import (
    UNEXPECTED_ADMISSION_ERROR,
    InsufficientResource,
    NoPreemptionSet,
    pods_to_preempt,
    preemption_signal,
    requirements,
)
from klet.syncloop.admission.sysctls import FORBIDDEN_REASON, SysctlAllowlist
from klet.syncloop.containers import fields
from klet.syncloop.model import podspec

NODE_OS = "linux"
LABEL_OS = "kubernetes.io/os"
WILDCARD_IP = "0.0.0.0"

OUT_OF_PODS = "OutOfpods"
INSUFFICIENT_PREFIX = "OutOf"
REJECTED_PREFIX = "Pod was rejected: "

_FIT_ORDER = ("cpu", "memory", "ephemeral-storage")
_TERMINAL_PHASES = ("Succeeded", "Failed")


@dataclass(frozen=True)
class NodeInfo:
    """What admission needs to know about this node."""

    name: str
    labels: Mapping[str, str]
    allocatable: Mapping[str, int]
    """Resource → amount: millicores for cpu, a count for pods, else bytes/units."""
    sysctls: SysctlAllowlist = field(default_factory=SysctlAllowlist.of)
    """The pod sysctls allowed here: the safe ones plus allowedUnsafeSysctls."""
    runtime_classes: bool = False
    """RuntimeClasses and ResourceClaims can be looked up (cluster mode: the apiserver
    holds them)."""
    taints: tuple[JSON, ...] = ()
    """The Node's spec.taints (every effect; admission reads the NoExecute ones)."""


@dataclass(frozen=True)
class Verdict:
    admit: bool
    reason: str = ""
    message: str = ""
    preempt: tuple[str, ...] = ()
    """Admitted once these running pods (UIDs) are preempted for it (a critical pod)."""
    preemption_signal: str = ""
    """The resource the preemption is for (kubelet_preemptions' label)."""

    @property
    def status_message(self) -> str:
        """The rejected pod's status.message, as upstream's rejectPod words it."""
        return REJECTED_PREFIX + self.message


ADMIT = Verdict(True)


def _predicate(name: str, description: str) -> Verdict:
    return Verdict(False, name, f"Predicate {name} failed: {description}")


NODE_AFFINITY = _predicate("NodeAffinity", "node(s) didn't match Pod's node affinity/selector")
NODE_NAME = _predicate("NodeName", "node(s) didn't match the requested node name")
NODE_PORTS = _predicate("NodePorts", "node(s) didn't have free ports for the requested pod ports")
TAINT_TOLERATION = _predicate("TaintToleration", "node(s) had taints that the pod didn't tolerate")
NO_EXECUTE = "NoExecute"
OS_LABEL_MISMATCH = Verdict(
    False,
    "PodOSSelectorNodeLabelDoesNotMatch",
    "Failed to admit pod as the `kubernetes.io/os` label doesn't match node label",
)
OS_NOT_SUPPORTED = Verdict(
    False, "PodOSNotSupported", "Failed to admit pod as the OS field doesn't match node OS"
)
FEATURE_UNSUPPORTED = "PodFeatureUnsupported"


def unsupported_features(pod: JSON, *, runtime_classes: bool = True) -> Verdict:
    """PodFeatureUnsupported naming every refused field the pod sets, or ADMIT; a
    `runtimeClassName` is refused where RuntimeClasses cannot be looked up (upstream's
    standalone kubelet runs such a pod on the default handler, silently), and so are
    resource claims (the claims to prepare are the API server's)."""
    refused = fields.refused_in(pod)
    if (pod.get("spec") or {}).get("runtimeClassName") and not runtime_classes:
        refused.append(
            (
                "spec.runtimeClassName",
                "a RuntimeClass is looked up in the API server and this node has none (standalone)",
            )
        )
    if (pod.get("spec") or {}).get("resourceClaims") and not runtime_classes:
        refused.append(
            (
                "spec.resourceClaims",
                "ResourceClaims are read from the API server and this node has none (standalone)",
            )
        )
    if not refused:
        return ADMIT
    named = "; ".join(f"{path}: {why}" for path, why in refused)
    return Verdict(False, FEATURE_UNSUPPORTED, f"Pod requires features this node lacks: {named}")


def insufficient(short: InsufficientResource) -> Verdict:
    """upstream's InsufficientResourceError as a rejection."""
    return Verdict(
        False,
        INSUFFICIENT_PREFIX + short.resource,
        f"Node didn't have enough resource: {short.resource}, requested: {short.requested}, "
        f"used: {short.used}, capacity: {short.capacity}",
    )


# -- resource names ----------------------------------------------------------------


def _is_extended(resource: str) -> bool:
    """Not a native resource: a domain-qualified name outside kubernetes.io."""
    return (
        "/" in resource
        and "kubernetes.io/" not in resource
        and not resource.startswith("requests.")
    )


def _is_scalar(resource: str) -> bool:
    return resource.startswith("hugepages-") or "/" in resource


# -- the checks ----------------------------------------------------------------------


def resource_shortfalls(
    pod: JSON, *, others: Sequence[JSON], node: NodeInfo
) -> list[InsufficientResource]:
    """noderesources.Fits: every resource the pod does not fit in, in upstream's order
    (pods, cpu, memory, ephemeral-storage, then the scalar resources by name)."""
    shortfalls: list[InsufficientResource] = []
    pods_cap = node.allocatable.get("pods", 0)
    if len(others) + 1 > pods_cap:
        shortfalls.append(InsufficientResource("pods", 1, len(others), pods_cap))
    want = {
        k: v
        for k, v in pod_requests(pod).items()
        if not (_is_extended(k) and k not in node.allocatable)
    }
    used: dict[str, int] = {}
    for other in others:
        for k, v in pod_requests(other).items():
            used[k] = used.get(k, 0) + v
    scalars = sorted(k for k in want if _is_scalar(k))
    for resource in (*_FIT_ORDER, *scalars):
        requested = want.get(resource, 0)
        if requested <= 0:
            continue
        capacity = node.allocatable.get(resource, 0)
        if requested > capacity - used.get(resource, 0):
            shortfalls.append(
                InsufficientResource(resource, requested, used.get(resource, 0), capacity)
            )
    return shortfalls


def fits_resources(pod: JSON, *, others: Sequence[JSON], node: NodeInfo) -> Verdict:
    """The first resource the pod does not fit in, or ADMIT."""
    shortfalls = resource_shortfalls(pod, others=others, node=node)
    return insufficient(shortfalls[0]) if shortfalls else ADMIT


def _int64(text: str) -> int | None:
    """strconv.ParseInt(text, 10, 64)."""
    body = text[1:] if text[:1] in "+-" else text
    if not body.isascii() or not body.isdigit():
        return None
    value = int(text)
    return value if -(2**63) <= value < 2**63 else None


def _expression_matches(expr: JSON, labels: Mapping[str, str]) -> bool | None:
    """One matchExpressions requirement; None when it does not parse (upstream then
    ignores the whole term)."""
    key = str(expr.get("key", ""))
    op = expr.get("operator")
    values = [str(v) for v in expr.get("values") or []]
    present = key in labels
    if op in ("In", "NotIn"):
        if not values:
            return None
        inside = present and labels[key] in values
        return inside if op == "In" else not inside
    if op in ("Exists", "DoesNotExist"):
        if values:
            return None
        return present if op == "Exists" else not present
    if op in ("Gt", "Lt"):
        bound = _int64(values[0]) if len(values) == 1 else None
        if bound is None:
            return None
        value = _int64(labels[key]) if present else None
        if value is None:
            return False
        return value > bound if op == "Gt" else value < bound
    return None


def _field_matches(expr: JSON, node_name: str) -> bool | None:
    op = expr.get("operator")
    values = [str(v) for v in expr.get("values") or []]
    if op not in ("In", "NotIn") or len(values) != 1:
        return None
    fields = {"metadata.name": node_name} if node_name else {}
    key = str(expr.get("key", ""))
    equal = key in fields and fields[key] == values[0]
    return equal if op == "In" else not equal


def _term_matches(term: JSON, node: NodeInfo) -> bool:
    """A node selector term: its expressions and fields ANDed; an empty or unparsable
    term matches nothing."""
    exprs = list(term.get("matchExpressions") or [])
    fields = list(term.get("matchFields") or [])
    if not exprs and not fields:
        return False
    results = [_expression_matches(e, node.labels) for e in exprs]
    results += [_field_matches(f, node.name) for f in fields]
    return all(r is True for r in results)


def matches_node_affinity(pod: JSON, node: NodeInfo) -> bool:
    """GetRequiredNodeAffinity(pod).Match(node): nodeSelector, then the required terms."""
    spec: JSON = pod.get("spec") or {}
    for key, value in (spec.get("nodeSelector") or {}).items():
        if node.labels.get(key) != str(value):
            return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if required is None:
        return True
    return any(_term_matches(t or {}, node) for t in required.get("nodeSelectorTerms") or [])


HostPort = tuple[str, str, int]  # (hostIP, protocol, hostPort)


def host_ports(pod: JSON) -> list[HostPort]:
    """The host ports a pod binds: regular containers and sidecars (which run for the
    pod's whole life), with upstream's defaults (no hostIP = 0.0.0.0, TCP; a host-network
    pod's hostPort defaults to its containerPort)."""
    spec: JSON = pod.get("spec") or {}
    host_network = bool(spec.get("hostNetwork"))
    containers = [c for c in spec.get("initContainers") or [] if c.get("restartPolicy") == "Always"]
    containers += list(spec.get("containers") or [])
    out: list[HostPort] = []
    for c in containers:
        for p in c.get("ports") or []:
            port = int(p.get("hostPort") or 0)
            if port <= 0 and host_network:
                port = int(p.get("containerPort") or 0)
            if port <= 0:
                continue
            out.append((str(p.get("hostIP") or WILDCARD_IP), str(p.get("protocol") or "TCP"), port))
    return out


def port_conflict(want: HostPort, used: Iterable[HostPort]) -> bool:
    """HostPortInfo.CheckConflict: 0.0.0.0 conflicts with the same protocol/port on any
    address; another address only with itself and 0.0.0.0."""
    ip, protocol, port = want
    for u_ip, u_protocol, u_port in used:
        if (u_protocol, u_port) != (protocol, port):
            continue
        if ip == WILDCARD_IP or u_ip in (WILDCARD_IP, ip):
            return True
    return False


def fits_host_ports(pod: JSON, *, others: Sequence[JSON]) -> bool:
    used = [hp for other in others for hp in host_ports(other)]
    return not any(port_conflict(want, used) for want in host_ports(pod))


def admit_pod(
    pod: JSON, *, others: Sequence[JSON], node: NodeInfo, preempt: bool = True
) -> Verdict:
    """Whether the node takes `pod` next to `others` (the admitted pods that still run);
    a critical pod short of resources may be taken with pods of `others` to preempt,
    unless `preempt` is False (an in-place resize: it is rejected as any pod)."""
    meta: JSON = pod.get("metadata") or {}
    spec: JSON = pod.get("spec") or {}
    os_label = (meta.get("labels") or {}).get(LABEL_OS)
    if os_label is not None and os_label != NODE_OS:
        return OS_LABEL_MISMATCH
    pod_os = (spec.get("os") or {}).get("name")
    if pod_os and pod_os != NODE_OS:
        return OS_NOT_SUPPORTED
    verdict = unsupported_features(pod, runtime_classes=node.runtime_classes)
    if not verdict.admit:
        return verdict
    shortfalls = resource_shortfalls(pod, others=others, node=node)
    predicates = _failed_predicates(pod, others=others, node=node)
    if not shortfalls:
        return predicates[0] if predicates else ADMIT
    if not (preempt and is_critical(pod)):
        return insufficient(shortfalls[0])
    if predicates:
        return predicates[0]  # preemption cannot help: only these are reported
    return preemption_verdict(pod, others=others, shortfalls=shortfalls)


def _failed_predicates(pod: JSON, *, others: Sequence[JSON], node: NodeInfo) -> list[Verdict]:
    """The general predicates after the resource fit that the pod fails, in order."""
    spec: JSON = pod.get("spec") or {}
    failed: list[Verdict] = []
    if not matches_node_affinity(pod, node):
        failed.append(NODE_AFFINITY)
    node_name = spec.get("nodeName")
    if node_name and node_name != node.name:
        failed.append(NODE_NAME)
    if not fits_host_ports(pod, others=others):
        failed.append(NODE_PORTS)
    if not is_static(pod) and untolerated_no_execute(node.taints, spec.get("tolerations") or []):
        failed.append(TAINT_TOLERATION)
    return failed


def preemption_verdict(
    pod: JSON, *, others: Sequence[JSON], shortfalls: Sequence[InsufficientResource]
) -> Verdict:
    """A critical pod short only of resources: admitted with the pods to preempt, or
    rejected when no set of them frees enough (preemption.py)."""
    required = requirements(shortfalls)
    try:
        victims = pods_to_preempt(pod, others, required)
    except NoPreemptionSet as err:
        return Verdict(False, UNEXPECTED_ADMISSION_ERROR, err.rejection_message)
    return Verdict(
        True,
        preempt=tuple(str(podspec.meta(v).get("uid", "")) for v in victims),
        preemption_signal=preemption_signal(required),
    )


def tolerates_taint(toleration: JSON, taint: JSON) -> bool:
    """Toleration.ToleratesTaint: the effect and key match when the toleration sets
    them; operator Exists matches any value, Equal (or none) only the taint's value."""
    effect = toleration.get("effect") or ""
    if effect and effect != (taint.get("effect") or ""):
        return False
    key = toleration.get("key") or ""
    if key and key != (taint.get("key") or ""):
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return True
    if operator == "Equal":
        return (toleration.get("value") or "") == (taint.get("value") or "")
    return False


def untolerated_no_execute(taints: Iterable[JSON], tolerations: Iterable[JSON]) -> JSON | None:
    """FindMatchingUntoleratedTaint over the NoExecute taints: the first one no
    toleration tolerates, or None."""
    usable = [t for t in tolerations if isinstance(t, Mapping)]
    for taint in taints:
        if not isinstance(taint, Mapping) or taint.get("effect") != NO_EXECUTE:
            continue
        if not any(tolerates_taint(t, taint) for t in usable):
            return taint
    return None


# -- node pressure (upstream's eviction admit handler) -------------------------------

MEMORY_PRESSURE = "MemoryPressure"
PRESSURE_ORDER = (MEMORY_PRESSURE, "DiskPressure", "PIDPressure")
TAINT_MEMORY_PRESSURE = "node.kubernetes.io/memory-pressure"
EVICTED = "Evicted"
SHUTDOWN_MESSAGE = "Pod was rejected as the node is shutting down."


def tolerates(tolerations: Iterable[JSON], *, key: str, effect: str) -> bool:
    """TolerationsTolerateTaint for a taint with `key`, `effect` and an empty value."""
    for t in tolerations:
        if not isinstance(t, Mapping):
            continue
        if t.get("effect") and t.get("effect") != effect:
            continue
        operator = t.get("operator") or "Equal"
        if t.get("key"):
            if t.get("key") != key:
                continue
        elif operator != "Exists":
            continue
        if operator == "Exists" or (operator == "Equal" and not t.get("value")):
            return True
    return False


def pressure_verdict(pod: JSON, conditions: Iterable[str]) -> Verdict:
    """Whether node pressure, or a node shutdown, keeps `pod` out (module docstring)."""
    if NODE_SHUTDOWN in set(conditions):
        return Verdict(False, NODE_SHUTDOWN, SHUTDOWN_MESSAGE)
    present = [c for c in PRESSURE_ORDER if c in set(conditions)]
    if not present or is_critical(pod):
        return ADMIT
    if present == [MEMORY_PRESSURE]:
        if podspec.qos_class(pod) != "BestEffort":
            return ADMIT
        spec: JSON = pod.get("spec") or {}
        if tolerates(spec.get("tolerations") or [], key=TAINT_MEMORY_PRESSURE, effect="NoSchedule"):
            return ADMIT
    return Verdict(False, EVICTED, f"The node had condition: [{' '.join(present)}]. ")


# -- order and bookkeeping -----------------------------------------------------------


def _created(pod: JSON, seen_at: float) -> float:
    stamp = (pod.get("metadata") or {}).get("creationTimestamp")
    if stamp:
        try:
            return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
        except ValueError:
            pass
    return seen_at


def admission_order(pods: Iterable[tuple[str, JSON, float]]) -> list[str]:
    """UIDs of (uid, pod, first-seen time) oldest first, as upstream's
    PodsByCreationTime; a pod without creationTimestamp (static) by when it was seen."""
    return [uid for _, uid in sorted((_created(p, seen), uid) for uid, p, seen in pods)]


def is_terminal_phase(status: JSON | None) -> bool:
    return status is not None and status.get("phase") in _TERMINAL_PHASES


class DeviceAdmission(Protocol):
    """The device manager's say on a pod's device plugin resources (devices/manager.py):
    (reason, message) rejecting it, or None."""

    def admit(self, uid: str, pod: JSON, others: Sequence[JSON]) -> tuple[str, str] | None: ...


class TaintSource(Protocol):
    """The Node's taints as last seen (`nodetaints.NodeTaints`)."""

    def taints(self) -> tuple[JSON, ...]: ...


@dataclass
class AdmissionLedger:
    """The admission decisions of one syncloop process.

    After a restart, `readmit` runs once before any new pod is decided: the pods the
    runtime still runs are re-admitted first, oldest first, each counting only those
    before it, so a running pod is never rejected because of pods admitted after it.
    Pods the runtime has but that no longer run (finished, or their sandbox is gone)
    were admitted by the previous process: they stay admitted without a new check
    (re-checking could only turn a finished pod's final status into a rejection), and
    are `idle`, not counted, until a status shows them running again.
    """

    node: NodeInfo
    taints: TaintSource | None = None
    """Where the Node's current taints are read at each decision; None: `node.taints`."""
    topology: DeviceAdmission | None = None
    """NUMA alignment and the CPU and memory managers' placement
    (topologymanager/manager.py); None: none of them is checked."""
    devices: DeviceAdmission | None = None
    """Device plugin resources (the leader's device manager); None: not checked."""
    admitted: set[str] = field(default_factory=set)
    rejected: dict[str, Verdict] = field(default_factory=dict)
    idle: set[str] = field(default_factory=set)
    restarted: bool = False

    def verdict(self, uid: str) -> Verdict | None:
        if uid in self.admitted:
            return ADMIT
        return self.rejected.get(uid)

    def decide(
        self, uid: str, pod: JSON, *, others: Sequence[JSON], pressure: Iterable[str] = ()
    ) -> Verdict:
        verdict = pressure_verdict(pod, pressure)
        if verdict.admit:
            forbidden = self.node.sysctls.check(pod)
            if forbidden is not None:
                verdict = Verdict(False, FORBIDDEN_REASON, forbidden)
        if verdict.admit:
            node = self.node
            if self.taints is not None:
                node = replace(node, taints=self.taints.taints())
            verdict = admit_pod(pod, others=others, node=node)
        if verdict.preempt:
            # the handlers after it see the node as it will be once they are gone
            gone = set(verdict.preempt)
            others = [o for o in others if podspec.meta(o).get("uid") not in gone]
        if verdict.admit and self.topology is not None:
            # upstream's topology manager admit handler: merged hints (TopologyAffinityError)
            # and the CPU and memory managers' Allocate, before the device manager's
            refused = self.topology.admit(uid, pod, others)
            if refused is not None:
                verdict = Verdict(False, *refused)
        if verdict.admit and self.devices is not None:
            # upstream's device manager admit handler (reason UnexpectedAdmissionError)
            refused = self.devices.admit(uid, pod, others)
            if refused is not None:
                verdict = Verdict(False, *refused)
        if verdict.admit:
            self.admitted.add(uid)
        else:
            self.rejected[uid] = verdict
        return verdict

    def readmit(
        self, running: Mapping[str, tuple[JSON, float]], *, idle: Iterable[str] = ()
    ) -> dict[str, Verdict]:
        """Re-admit the pods running before a restart (pod, first-seen time), oldest first."""
        verdicts: dict[str, Verdict] = {}
        done: list[str] = []
        preempted: set[str] = set()
        for uid in admission_order((uid, p, seen) for uid, (p, seen) in running.items()):
            others = [running[u][0] for u in done if u in self.admitted and u not in preempted]
            verdicts[uid] = self.decide(uid, running[uid][0], others=others)
            preempted.update(verdicts[uid].preempt)
            done.append(uid)
        for uid in idle:
            if uid not in running:
                self.admitted.add(uid)
                self.idle.add(uid)
        self.restarted = True
        return verdicts

    def counts(self, uid: str, *, status: JSON | None, terminal: bool) -> bool:
        """Whether an admitted pod holds its resources: not made terminal by syncloop,
        not in a terminal phase, and not idle since the restart with no status yet."""
        if uid not in self.admitted or terminal:
            return False
        if status is None:
            return uid not in self.idle
        return not is_terminal_phase(status)

    def forget(self, uid: str) -> None:
        self.admitted.discard(uid)
        self.rejected.pop(uid, None)
        self.idle.discard(uid)
