"""The topology manager's admit handler: hints merged per scope, then aligned allocation.

As upstream's topologymanager scopes: with scope `container` each container's hints
(every provider's, every resource's) are merged on their own; with scope `pod` the
pod's hints are merged once and the result holds for all its containers. A policy that
refuses the merged hint (`restricted`, `single-numa-node` without a preferred one)
refuses the pod with reason `TopologyAffinityError` and upstream's message. An admitted
container's hint is kept (`affinity`, upstream's Store.GetAffinity) and each allocator
(the CPU manager, then the memory manager) places the container on it; an allocator's
failure refuses the pod with the reason it gives, else as upstream's unexpected
admission error. With policy `none` no hint is computed and allocators get "no
preference", as upstream's none scope.

HintProvider is the consumer's Protocol: the CPU manager (cpumanager/manager.py), the
memory manager (memorymanager/manager.py) and the device manager (through
devicehints.DeviceHints) provide hints.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from klet.model.types import JSON
from klet.syncloop.topologymanager.hints import (
    NUMAInfo,
    PolicyOptions,
    ProviderHints,
    TopologyHint,
    merge,
)

log = logging.getLogger(__name__)

TOPOLOGY_AFFINITY_ERROR = "TopologyAffinityError"
TOPOLOGY_AFFINITY_MESSAGE = "Resources cannot be allocated with Topology locality"
UNEXPECTED_ADMISSION_ERROR = "UnexpectedAdmissionError"
SCOPES = ("container", "pod")
SINGLE_NUMA_NODE = "single-numa-node"

NO_PREFERENCE = TopologyHint(None, False)
"""What an allocator gets for a container without a hint (upstream's zero hint)."""


class TopologyObserver(Protocol):
    """Upstream's kubelet_topology_manager_admission_* series (klet.syncloop.metrics)."""

    def admission(self, *, seconds: float, error: bool) -> None: ...

    def aligned(self, scope: str, *, failed: bool, amount: int = 1) -> None:
        """An admission (`scope` pod) or a container (`container`) placed on one NUMA
        node, or refused (`failed`); amount 0 makes the series exist."""


class _NoObserver:
    def admission(self, *, seconds: float, error: bool) -> None:
        pass

    def aligned(self, scope: str, *, failed: bool, amount: int = 1) -> None:
        pass


class HintProvider(Protocol):
    """A resource manager's NUMA hints (None: no preference for any resource)."""

    def topology_hints(self, pod: JSON, container: JSON) -> ProviderHints | None: ...

    def pod_topology_hints(self, pod: JSON) -> ProviderHints | None: ...


class Allocator(Protocol):
    """A resource manager that places a container on its hint at admission."""

    def allocate(
        self, pod: JSON, container: JSON, hint: TopologyHint
    ) -> str | tuple[str, str] | None:
        """None; or why the container cannot be placed, as the cause of an unexpected
        admission error, or as its own (reason, message) (upstream's admission.Error,
        such as the CPU manager's SMTAlignmentError)."""
        ...


def _uid(pod: JSON) -> str:
    return str((pod.get("metadata") or {}).get("uid") or "")


def _containers(pod: JSON) -> list[JSON]:
    spec = pod.get("spec") or {}
    return [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]


class TopologyManager:
    def __init__(
        self,
        *,
        policy: str,
        scope: str,
        numa: NUMAInfo,
        options: PolicyOptions | None = None,
        providers: Sequence[HintProvider] = (),
        allocators: Sequence[Allocator] = (),
        observer: TopologyObserver | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if scope not in SCOPES:
            raise ValueError(f"unknown topology manager scope {scope!r}")
        self.policy = policy
        self.scope = scope
        self.numa = numa
        self.options = options or PolicyOptions()
        self.providers = list(providers)
        self.allocators = list(allocators)
        self.hints: dict[tuple[str, str], TopologyHint] = {}
        self.observer: TopologyObserver = observer or _NoObserver()
        self.clock = clock
        for each in SCOPES:  # upstream's manager makes the four series at start, any policy
            self.observer.aligned(each, failed=False, amount=0)
            self.observer.aligned(each, failed=True, amount=0)

    def affinity(self, uid: str, name: str) -> TopologyHint:
        """The hint a container was admitted with (no preference when none)."""
        return self.hints.get((uid, name), NO_PREFERENCE)

    def _allocate(self, pod: JSON, container: JSON, hint: TopologyHint) -> tuple[str, str] | None:
        for allocator in self.allocators:
            err = allocator.allocate(pod, container, hint)
            if isinstance(err, tuple):
                return err
            if err is not None:
                return (
                    UNEXPECTED_ADMISSION_ERROR,
                    f"Allocate failed due to {err}, which is unexpected",
                )
        return None

    def _refuse(self, pod: JSON, hint: TopologyHint) -> tuple[str, str]:
        meta = pod.get("metadata") or {}
        log.info(
            "pod refused by the topology manager",
            extra={
                "pod": f"{meta.get('namespace')}/{meta.get('name')}",
                "policy": self.policy,
                "best_hint": hint.affinity,
            },
        )
        return TOPOLOGY_AFFINITY_ERROR, TOPOLOGY_AFFINITY_MESSAGE

    def admit(self, uid: str, pod: JSON, others: Sequence[JSON]) -> tuple[str, str] | None:
        """(reason, message) refusing the pod, or None (the ledger's admit handler).
        Every call is counted and timed; a refusal under a policy other than none is an
        admission error, as upstream's scopes count them."""
        start = self.clock()
        refused = self._admit(uid, pod)
        self.observer.admission(
            seconds=self.clock() - start, error=refused is not None and self.policy != "none"
        )
        return refused

    def _admit(self, uid: str, pod: JSON) -> tuple[str, str] | None:
        containers = _containers(pod)
        if self.policy == "none":
            for c in containers:
                refused = self._allocate(pod, c, NO_PREFERENCE)
                if refused is not None:
                    return refused
            return None
        # upstream counts alignment under the one policy that guarantees it
        guaranteed = self.policy == SINGLE_NUMA_NODE
        if self.scope == "pod":
            hints = [p.pod_topology_hints(pod) or {} for p in self.providers]
            best, admit = merge(self.policy, hints, self.numa, self.options)
            if not admit:
                if guaranteed:
                    self.observer.aligned("pod", failed=True)
                return self._refuse(pod, best)
            for c in containers:
                self.hints[(uid, str(c.get("name")))] = best
                refused = self._allocate(pod, c, best)
                if refused is not None:
                    return refused
            if guaranteed:
                self.observer.aligned("pod", failed=False)
            return None
        for c in containers:
            hints = [p.topology_hints(pod, c) or {} for p in self.providers]
            best, admit = merge(self.policy, hints, self.numa, self.options)
            if not admit:
                if guaranteed:
                    self.observer.aligned("container", failed=True)
                return self._refuse(pod, best)
            self.hints[(uid, str(c.get("name")))] = best
            refused = self._allocate(pod, c, best)
            if refused is not None:
                return refused
            if guaranteed:
                self.observer.aligned("container", failed=False)
        return None

    def release(self, active: Iterable[str]) -> None:
        """Forget the hints of pods that are not active."""
        keep = set(active)
        for key in [k for k in self.hints if k[0] not in keep]:
            del self.hints[key]
