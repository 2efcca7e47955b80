"""Which CPUs to take for a request: upstream's takeByTopologyNUMAPacked, behaviour for
behaviour (pkg/kubelet/cm/cpumanager/cpu_assignment.go).

Topology-aware best fit: whole NUMA nodes and sockets first when the request needs at
least that many CPUs (NUMA nodes first when they hold sockets, sockets first when
they hold NUMA nodes), then whole cores, then single CPUs, preferring the most used
nodes, sockets and cores (ascending free CPUs, then ascending ID) so allocations pack
and leave whole units free for later requests. With the `distribute-cpus-across-cores`
option (upstream's CPUSortingStrategySpread) whole cores are not taken and the single
CPUs are taken socket by socket in ID order.

Not here: the uncore-cache step (prefer-align-cpus-by-uncorecache) and the NUMA
distributed variant (distribute-cpus-across-numa); klet refuses both options by name.

Pure: a topology, the available CPUs and a count in; a CPU set or AllocationError out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from klet.model.cpuset import CPUSet
from klet.syncloop.cpumanager.topology import CPUTopology


class NotEnoughCPUs(ValueError):
    """The request cannot be met; the message is upstream's."""


class _Accumulator:
    def __init__(self, topo: CPUTopology, available: CPUSet, needed: int, spread: bool) -> None:
        self.topo = topo
        self.details = topo.keep_only(available)
        self.needed = needed
        self.result: set[int] = set()
        self.spread = spread
        self.numa_first = topo.num_sockets >= topo.num_numa_nodes

    # -- sorting: ascending free CPUs, then ascending ID
    def _sort(self, ids: Iterable[int], cpus_of: Callable[[list[int]], CPUSet]) -> list[int]:
        return sorted(set(ids), key=lambda i: (len(cpus_of([i])), i))

    def _numas(self, cpus: CPUSet | None = None) -> set[int]:
        d = self.details.details
        return {d[c].numa for c in (d if cpus is None else cpus) if c in d}

    def _sockets(self, cpus: CPUSet | None = None) -> set[int]:
        d = self.details.details
        return {d[c].socket for c in (d if cpus is None else cpus) if c in d}

    def _cores(self, cpus: CPUSet) -> set[int]:
        d = self.details.details
        return {d[c].core for c in cpus if c in d}

    def sorted_numas(self) -> list[int]:
        if self.numa_first:
            return self._sort(self._numas(), self.details.in_numa)
        out: list[int] = []
        for socket in self.sorted_sockets():
            out += self._sort(self._numas(self.details.in_sockets([socket])), self.details.in_numa)
        return out

    def sorted_sockets(self) -> list[int]:
        if not self.numa_first:
            return self._sort(self._sockets(), self.details.in_sockets)
        out: list[int] = []
        for numa in self.sorted_numas():
            out += self._sort(self._sockets(self.details.in_numa([numa])), self.details.in_sockets)
        return out

    def sorted_cores(self) -> list[int]:
        out: list[int] = []
        if self.numa_first:
            for socket in self.sorted_sockets():
                cores = self._cores(self.details.in_sockets([socket]))
                out += self._sort(cores, self.details.in_cores)
        else:
            for numa in self.sorted_numas():
                cores = self._cores(self.details.in_numa([numa]))
                out += self._sort(cores, self.details.in_cores)
        return out

    def sorted_cpus(self) -> list[int]:
        out: list[int] = []
        if self.spread:
            for socket in self.sorted_sockets():
                out += sorted(self.details.in_sockets([socket]))
        else:
            for core in self.sorted_cores():
                out += sorted(self.details.in_cores([core]))
        return out

    # -- taking
    def take(self, cpus: CPUSet) -> None:
        self.result |= cpus
        self.details = self.details.keep_only(self.details.cpus() - self.result)
        self.needed -= len(cpus)

    def satisfied(self) -> bool:
        return self.needed < 1

    def take_full_numas(self) -> None:
        free = [
            n
            for n in self.sorted_numas()
            if len(self.details.in_numa([n])) == len(self.topo.in_numa([n]))
        ]
        for n in free:
            cpus = self.topo.in_numa([n])
            if self.needed >= len(cpus):
                self.take(cpus)

    def take_full_sockets(self) -> None:
        free = [
            s
            for s in self.sorted_sockets()
            if len(self.details.in_sockets([s])) == self.topo.cpus_per_socket()
        ]
        for s in free:
            cpus = self.topo.in_sockets([s])
            if self.needed >= len(cpus):
                self.take(cpus)

    def take_full_cores(self) -> None:
        free = [
            c
            for c in self.sorted_cores()
            if len(self.details.in_cores([c])) == self.topo.cpus_per_core()
        ]
        for c in free:
            cpus = self.topo.in_cores([c])
            if self.needed >= len(cpus):
                self.take(cpus)

    def take_remaining(self) -> None:
        for cpu in self.sorted_cpus():
            self.take(frozenset([cpu]))
            if self.satisfied():
                return


def take_by_topology(
    topo: CPUTopology, available: CPUSet, count: int, *, spread: bool = False
) -> CPUSet:
    """`count` CPUs of `available`, packed by topology (spread across cores with
    `spread`). Raises NotEnoughCPUs with upstream's message."""
    acc = _Accumulator(topo, available, count, spread)
    if acc.satisfied():
        return frozenset(acc.result)
    if acc.needed > acc.details.num_cpus:
        raise NotEnoughCPUs(
            f"not enough cpus available to satisfy request: requested={count}, "
            f"available={len(available)}"
        )
    steps: list[Callable[[], None]] = (
        [acc.take_full_numas, acc.take_full_sockets]
        if acc.numa_first
        else [acc.take_full_sockets, acc.take_full_numas]
    )
    if not spread:
        steps.append(acc.take_full_cores)
    steps.append(acc.take_remaining)
    for step in steps:
        step()
        if acc.satisfied():
            return frozenset(acc.result)
    raise NotEnoughCPUs("failed to allocate cpus")
