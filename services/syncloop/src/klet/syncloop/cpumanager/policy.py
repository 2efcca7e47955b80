"""The CPU manager's policies, as upstream's policy_none.go and policy_static.go decide.

`none` gives no container a cpuset: every container runs on every CPU, and the state
file holds only the policy name. `static` keeps a shared pool (the state's default
set) and gives each container of a Guaranteed pod whose CPU request is a whole number
that many CPUs of its own, taken from the pool by topology (assignment.py) and
given back when the container is removed. The reserved CPUs (`reservedSystemCPUs`,
or kube-reserved + system-reserved cpu rounded up, taken lowest cores first) stay in
the pool and are never given out; with `strict-cpu-reservation` they are not in the
pool either, so shared containers are kept off them too. An init container's CPUs are
handed on to the pod's next containers (`reusable`, kept by the manager), as
upstream's cpusToReuse.

The static policy is a topology manager hint provider: `container_hints` and
`pod_hints` give the NUMA node sets a request fits in (preferred: as few nodes as the
machine can hold it in), and `allocate` takes the CPUs of the merged hint's nodes
first, as upstream's allocateCPUs.

Pod-level resources skip the allocation (upstream: not supported by the static
policy): such a pod's containers run in the shared pool.

Pure: every function takes the state and returns a new one.
"""

from __future__ import annotations

import json as _json
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from klet.model.cpuset import CPUSet, format_cpus
from klet.model.pod import GUARANTEED, container_requests, is_pod_level_set, qos_class
from klet.model.types import JSON
from klet.syncloop.cpumanager.assignment import NotEnoughCPUs, take_by_topology
from klet.syncloop.cpumanager.state import CPUState
from klet.syncloop.cpumanager.topology import CPUTopology
from klet.syncloop.topologymanager.hints import TopologyHint, iterate_masks

NONE = "none"
STATIC = "static"

FULL_PCPUS_ONLY = "full-pcpus-only"
DISTRIBUTE_ACROSS_NUMA = "distribute-cpus-across-numa"
ALIGN_BY_SOCKET = "align-by-socket"
DISTRIBUTE_ACROSS_CORES = "distribute-cpus-across-cores"
STRICT_RESERVATION = "strict-cpu-reservation"
PREFER_UNCORE_CACHE = "prefer-align-cpus-by-uncorecache"

ALPHA_OPTIONS = frozenset({ALIGN_BY_SOCKET, DISTRIBUTE_ACROSS_CORES})
BETA_OPTIONS = frozenset({STRICT_RESERVATION, DISTRIBUTE_ACROSS_NUMA, PREFER_UNCORE_CACHE})
STABLE_OPTIONS = frozenset({FULL_PCPUS_ONLY})
IMPLEMENTED_OPTIONS = frozenset({FULL_PCPUS_ONLY, STRICT_RESERVATION, DISTRIBUTE_ACROSS_CORES})
"""The options klet implements; the others are refused by name (not_implemented)."""

_NOT_IMPLEMENTED = {
    DISTRIBUTE_ACROSS_NUMA: "spreading a request evenly over NUMA nodes",
    PREFER_UNCORE_CACHE: "aligning CPUs by uncore (L3) cache",
    ALIGN_BY_SOCKET: "topology hints preferring socket-aligned NUMA node sets",
}

SMT_ALIGNMENT_ERROR = "SMTAlignmentError"
UNEXPECTED_ADMISSION_ERROR = "UnexpectedAdmissionError"


class PolicyError(ValueError):
    """A policy or its options cannot start; the message is upstream's where it has one."""


class AdmissionError(Exception):
    """A container's CPUs cannot be had: upstream's admission reason and message."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class Options:
    full_pcpus_only: bool = False
    strict_reservation: bool = False
    spread_cores: bool = False


def not_implemented(option: str) -> str | None:
    """Why klet refuses `option` by name, or None when it implements (or does not know) it."""
    return _NOT_IMPLEMENTED.get(option)


_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_FALSE = {"0", "f", "F", "FALSE", "false", "False"}


def parse_options(values: Mapping[str, str], *, alpha: bool, beta: bool) -> Options:
    """cpuManagerPolicyOptions as upstream's NewStaticPolicyOptions reads them, `alpha`
    and `beta` the CPUManagerPolicy{Alpha,Beta}Options gates. Raises PolicyError."""
    on: dict[str, bool] = {}
    for name in sorted(values):
        value = values[name]
        if name not in ALPHA_OPTIONS | BETA_OPTIONS | STABLE_OPTIONS:
            raise PolicyError(f"unknown CPU Manager Policy option: {_q(name)}")
        if name in ALPHA_OPTIONS and not alpha:
            raise PolicyError(
                f"CPU Manager Policy Alpha-level Options not enabled, but option "
                f"{_q(name)} provided"
            )
        if name in BETA_OPTIONS and not beta:
            raise PolicyError(
                f"CPU Manager Policy Beta-level Options not enabled, but option {_q(name)} provided"
            )
        if value not in _TRUE | _FALSE:
            raise PolicyError(
                f"bad value for option {_q(name)}: strconv.ParseBool: parsing {_q(value)}: "
                "invalid syntax"
            )
        on[name] = value in _TRUE
        reason = not_implemented(name)
        if on[name] and reason is not None:
            raise PolicyError(f"cpuManagerPolicyOptions: {name}: not implemented by klet: {reason}")
    for a, b in ((FULL_PCPUS_ONLY, DISTRIBUTE_ACROSS_CORES),):
        if on.get(a) and on.get(b):
            raise PolicyError(f"static policy options {a} and {b} can not be used at the same time")
    return Options(
        full_pcpus_only=on.get(FULL_PCPUS_ONLY, False),
        strict_reservation=on.get(STRICT_RESERVATION, False),
        spread_cores=on.get(DISTRIBUTE_ACROSS_CORES, False),
    )


def reserved_count(kube_reserved_cpu_milli: int, system_reserved_cpu_milli: int) -> int:
    """Reserved CPUs from kube-reserved + system-reserved cpu, rounded up (upstream's
    numReservedCPUs); raises PolicyError at zero, as upstream's static policy does."""
    total = kube_reserved_cpu_milli + system_reserved_cpu_milli
    if total <= 0:
        raise PolicyError(
            "[cpumanager] the static policy requires systemreserved.cpu + kubereserved.cpu "
            "to be greater than zero"
        )
    return math.ceil(total / 1000)


@dataclass(frozen=True)
class StaticPolicy:
    topology: CPUTopology
    reserved: CPUSet
    options: Options = Options()
    name: str = STATIC

    @classmethod
    def create(
        cls, topology: CPUTopology, *, count: int, explicit: CPUSet, options: Options
    ) -> StaticPolicy:
        """The policy with `count` reserved CPUs: `explicit` (reservedSystemCPUs) when
        given, else the lowest cores'. Raises PolicyError."""
        if explicit:
            unknown = explicit - topology.cpus()
            if unknown:
                raise PolicyError(
                    f"reservedSystemCPUs: CPUs {format_cpus(unknown)} are not online on this "
                    f"node (online: {format_cpus(topology.cpus())})"
                )
            reserved = explicit
        else:
            try:
                reserved = take_by_topology(
                    topology, topology.cpus(), count, spread=options.spread_cores
                )
            except NotEnoughCPUs:
                reserved = frozenset()
        if len(reserved) != count:
            raise PolicyError(
                "[cpumanager] unable to reserve the required amount of CPUs (size of "
                f"{format_cpus(reserved)} did not equal {count})"
            )
        return cls(topology=topology, reserved=reserved, options=options)

    @property
    def reserved_physical(self) -> CPUSet:
        return self.topology.in_cores({self.topology.core_of(c) for c in self.reserved})

    def start(self, state: CPUState) -> CPUState:
        """The state checked against this node and reservation (upstream's validateState),
        or initialised when empty. Raises PolicyError."""
        all_cpus = self.topology.cpus()
        if self.options.strict_reservation:
            all_cpus = all_cpus - self.reserved
        default = state.default
        if not default:
            if state.assignments:
                raise PolicyError("default cpuset cannot be empty")
            return replace(state, default=all_cpus)
        if self.options.strict_reservation:
            if self.reserved & default:
                raise PolicyError(
                    f'some of strictly reserved cpus: "{format_cpus(self.reserved & default)}" '
                    f'are present in defaultCpuSet: "{format_cpus(default)}"'
                )
        elif not self.reserved <= default:
            raise PolicyError(
                f'not all reserved cpus: "{format_cpus(self.reserved)}" are present in '
                f'defaultCpuSet: "{format_cpus(default)}"'
            )
        known = set(default)
        for pod, containers in state.assignments.items():
            for container, cpus in containers.items():
                if cpus & default:
                    raise PolicyError(
                        f'pod: {pod}, container: {container} cpuset: "{format_cpus(cpus)}" '
                        f'overlaps with default cpuset "{format_cpus(default)}"'
                    )
                known |= cpus
        if known != all_cpus:
            raise PolicyError(
                f'current set of available CPUs "{format_cpus(all_cpus)}" doesn\'t match '
                f'with CPUs in state "{format_cpus(known)}"'
            )
        return state

    def allocatable(self) -> CPUSet:
        return self.topology.cpus() - self.reserved

    def available(self, state: CPUState) -> CPUSet:
        return state.default - self.reserved

    def allocate(
        self,
        state: CPUState,
        pod: JSON,
        container: JSON,
        *,
        reusable: CPUSet = frozenset(),
        numa: int | None = None,
    ) -> tuple[CPUState, CPUSet]:
        """The state with `container`'s exclusive CPUs taken (none for a shared-pool
        container), and its CPUs; raises AdmissionError. `numa` is the topology
        manager's merged hint (bit n: NUMA node n; None: no preference): the CPUs of
        those nodes are taken first, the rest from anywhere (upstream's allocateCPUs)."""
        count = guaranteed_cpus(pod, container)
        if count == 0 or is_pod_level_set(pod):
            return state, frozenset()
        uid, name = _uid(pod), str(container.get("name") or "")
        group = self.topology.cpus_per_core()
        if self.options.full_pcpus_only:
            if count % group:
                raise AdmissionError(
                    SMT_ALIGNMENT_ERROR,
                    f"SMT Alignment Error: requested {count} cpus not multiple cpus per "
                    f"core = {group}",
                )
            physical = len(state.default - self.reserved_physical)
            if count > physical:
                raise AdmissionError(
                    SMT_ALIGNMENT_ERROR,
                    "SMT Alignment Error: not enough free physical CPUs: available physical "
                    f"CPUs = {physical}, requested CPUs = {count}, CPUs per core = {group}",
                )
        held = state.assignments.get(uid, {}).get(name)
        if held is not None:
            return state, held
        allocatable = self.available(state) | reusable
        try:
            cpus: CPUSet = frozenset()
            if numa is not None:
                aligned = self._in_mask(allocatable, numa)
                cpus = self._take(aligned, min(count, len(aligned)))
            cpus |= self._take(allocatable - cpus, count - len(cpus))
        except NotEnoughCPUs as err:
            raise AdmissionError(
                UNEXPECTED_ADMISSION_ERROR, f"Allocate failed due to {err}, which is unexpected"
            ) from err
        assignments = {p: dict(c) for p, c in state.assignments.items()}
        assignments.setdefault(uid, {})[name] = cpus
        return replace(state, default=state.default - cpus, assignments=assignments), cpus

    def remove(self, state: CPUState, uid: str, name: str) -> CPUState:
        """The state with the container's CPUs back in the pool (those a sibling still
        holds, handed on from an init container, stay out)."""
        containers = state.assignments.get(uid, {})
        if name not in containers:
            return state
        siblings: set[int] = set()
        for other, cpus in containers.items():
            if other != name:
                siblings |= cpus
        back = containers[name] - siblings
        assignments = {p: dict(c) for p, c in state.assignments.items()}
        del assignments[uid][name]
        if not assignments[uid]:
            del assignments[uid]
        return replace(state, default=state.default | back, assignments=assignments)

    def _take(self, available: CPUSet, count: int) -> CPUSet:
        return take_by_topology(self.topology, available, count, spread=self.options.spread_cores)

    def _in_mask(self, cpus: CPUSet, mask: int) -> CPUSet:
        details = self.topology.details
        return frozenset(c for c in cpus if mask >> details[c].numa & 1)

    def generate_hints(
        self, available: CPUSet, reusable: CPUSet, request: int
    ) -> list[TopologyHint]:
        """Every set of NUMA nodes whose CPUs (`available`, plus `reusable`, which must
        all lie in the set) can hold `request` CPUs; preferred are those as narrow as
        the fewest nodes of this machine that hold `request` CPUs at all, free or not
        (upstream's generateCPUTopologyHints)."""
        details = self.topology.details
        nodes = sorted({i.numa for i in details.values()})
        narrowest = len(nodes)
        fits: list[int] = []
        for mask in iterate_masks(nodes):
            if len(self._in_mask(self.topology.cpus(), mask)) >= request:
                narrowest = min(narrowest, mask.bit_count())
            if len(self._in_mask(reusable, mask)) != len(reusable):
                continue
            if len(reusable) + len(self._in_mask(available, mask)) >= request:
                fits.append(mask)
        return [TopologyHint(m, m.bit_count() == narrowest) for m in fits]

    def container_hints(
        self, state: CPUState, pod: JSON, container: JSON, *, reusable: CPUSet = frozenset()
    ) -> list[TopologyHint] | None:
        """The container's CPU hints (upstream's GetTopologyHints): None when it takes no
        exclusive CPUs; for one that holds its CPUs already (a restart), the hints of
        those CPUs, or none at all (unsatisfiable) when it holds another count."""
        requested = guaranteed_cpus(pod, container)
        if requested == 0 or is_pod_level_set(pod):
            return None
        held = state.assignments.get(_uid(pod), {}).get(str(container.get("name") or ""))
        if held is not None:
            if len(held) != requested:
                return []
            return self.generate_hints(held, frozenset(), requested)
        return self.generate_hints(self.available(state), reusable, requested)

    def pod_hints(
        self, state: CPUState, pod: JSON, *, reusable: CPUSet = frozenset()
    ) -> list[TopologyHint] | None:
        """The pod's CPU hints (upstream's GetPodTopologyHints): for the CPUs the whole
        pod takes (pod_guaranteed_cpus), counting those its containers already hold."""
        requested = pod_guaranteed_cpus(pod)
        if requested == 0 or is_pod_level_set(pod):
            return None
        held_by_pod: CPUSet = frozenset()
        held = state.assignments.get(_uid(pod), {})
        for c in _containers(pod):
            cpus = held.get(str(c.get("name") or ""))
            if cpus is not None:
                if len(cpus) != guaranteed_cpus(pod, c):
                    return []
                held_by_pod |= cpus
        if len(held_by_pod) == requested:
            return self.generate_hints(held_by_pod, frozenset(), requested)
        return self.generate_hints(self.available(state), reusable | held_by_pod, requested)


@dataclass(frozen=True)
class NonePolicy:
    """No exclusive CPUs: every container runs on every CPU (no cpuset)."""

    name: str = NONE

    def start(self, state: CPUState) -> CPUState:
        return state

    def allocatable(self) -> CPUSet:
        return frozenset()

    def allocate(
        self,
        state: CPUState,
        pod: JSON,
        container: JSON,
        *,
        reusable: CPUSet = frozenset(),
        numa: int | None = None,
    ) -> tuple[CPUState, CPUSet]:
        return state, frozenset()

    def container_hints(
        self, state: CPUState, pod: JSON, container: JSON, *, reusable: CPUSet = frozenset()
    ) -> list[TopologyHint] | None:
        return None

    def pod_hints(
        self, state: CPUState, pod: JSON, *, reusable: CPUSet = frozenset()
    ) -> list[TopologyHint] | None:
        return None

    def remove(self, state: CPUState, uid: str, name: str) -> CPUState:
        return state


def _uid(pod: JSON) -> str:
    return str((pod.get("metadata") or {}).get("uid") or "")


def _containers(pod: JSON) -> list[JSON]:
    spec: JSON = pod.get("spec") or {}
    return [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]


def _restartable(container: JSON) -> bool:
    return container.get("restartPolicy") == "Always"


def reuse(reusable: CPUSet, pod: JSON, container: JSON, cpus: CPUSet) -> CPUSet:
    """The pod's CPUs its next containers may take again after `container` got `cpus`
    (upstream's updateCPUsToReuse): an init container's are added, those of an app
    container or a sidecar (restartable init container, running beside the app) taken
    out."""
    name = container.get("name")
    spec: JSON = pod.get("spec") or {}
    for init in spec.get("initContainers") or ():
        if init.get("name") == name and not _restartable(init):
            return reusable | cpus
    return reusable - cpus


def pod_guaranteed_cpus(pod: JSON) -> int:
    """The exclusive CPUs the whole pod needs at once (upstream's podGuaranteedCPUs): the
    largest of each init container's with the sidecars started before it, or the app
    containers' with every sidecar, whichever is more."""
    spec: JSON = pod.get("spec") or {}
    by_inits = by_sidecars = 0
    for c in spec.get("initContainers") or ():
        n = guaranteed_cpus(pod, c)
        if _restartable(c):
            by_sidecars += n
        else:
            by_inits = max(by_inits, by_sidecars + n)
    by_apps = sum(guaranteed_cpus(pod, c) for c in spec.get("containers") or ())
    return max(by_inits, by_apps + by_sidecars)


def guaranteed_cpus(pod: JSON, container: JSON) -> int:
    """The container's exclusive CPU count: its whole-number CPU request in a Guaranteed
    pod, else 0 (upstream's guaranteedCPUs)."""
    if qos_class(pod) != GUARANTEED:
        return 0
    cpu = container_requests(container).get("cpu")
    if cpu is None:
        return 0
    value, milli = math.ceil(cpu), math.ceil(cpu * 1000)
    if value * 1000 != milli:
        return 0
    return int(value)


def container_cpuset(state: CPUState, uid: str, name: str) -> CPUSet:
    """The CPUs a container runs on: its own, else the shared pool (upstream's
    GetCPUSetOrDefault); empty under the none policy (no cpuset is set)."""
    return state.assignments.get(uid, {}).get(name, state.default)


def _q(value: object) -> str:
    """Go's %q of a string: double-quoted, escaped."""
    return _json.dumps(str(value), ensure_ascii=False)
