"""The memory manager's Static policy: Guaranteed containers' memory on NUMA nodes.

As upstream's memorymanager/policy_static.go: each NUMA node starts with its memory and
hugepages less the `reservedMemory` for it; a Guaranteed pod's container gets blocks of
memory (and each hugepages size it asks for) on the topology manager's hint, or on the
narrowest node set that fits when there is none; a node used alone is never joined into
a group and a group is only used whole (the `cells` rule), so the container's
cpuset.mems is a set no other container's spills past. The hints the policy gives the
topology manager are every node set whose allocatable memory fits the request and whose
free memory fits it now, preferred when as narrow as the narrowest that could ever fit.

`reservedMemory` must add up, per memory type, to what Node Allocatable keeps back
(kube-reserved + system-reserved + the hard eviction threshold for `memory`), as
upstream's validateReservedMemory; `reserved_per_node` says which one does not.

Left out (README, Limits): the memory a finished init container held is not lent to
the pod's later containers (upstream's initContainersReusableMemory), so a pod whose
init containers ask for more than its app containers needs that memory twice.

Pure: state in, state out; the manager keeps it and writes the file.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal

from klet.model.pod import GUARANTEED, container_requests, is_pod_level_set, qos_class
from klet.model.types import JSON
from klet.model.units import parse_quantity
from klet.syncloop.memorymanager.state import Block, MemoryState, MemoryTable, NodeState
from klet.syncloop.topologymanager.hints import (
    ProviderHints,
    TopologyHint,
    bits,
    iterate_masks,
    mask_of,
)

__all__ = [
    "MEMORY",
    "AllocationError",
    "MemoryManagerError",
    "NUMANode",
    "StaticPolicy",
    "container_numa_nodes",
    "pinned",
    "pod_requests",
    "requests",
    "reserved_per_node",
]

MEMORY = "memory"
HUGEPAGES = "hugepages-"


class MemoryManagerError(ValueError):
    """The configuration or the state file cannot be used; syncloop does not start."""


class AllocationError(Exception):
    """No NUMA placement for a container (upstream's words, `[memorymanager] ...`)."""


@dataclass(frozen=True)
class NUMANode:
    id: int
    memory: int
    """MemTotal of the node, bytes."""
    hugepages: Mapping[str, int] = field(default_factory=dict)
    """Resource name (hugepages-2Mi) → bytes of pages configured on the node."""


def _memory_type(name: str) -> bool:
    return name == MEMORY or name.startswith(HUGEPAGES)


def _int(value: Decimal) -> int:
    return int(value.to_integral_value(rounding="ROUND_CEILING"))


def reserved_per_node(
    reserved_memory: Sequence[Mapping[str, object]],
    nodes: Sequence[NUMANode],
    node_reserved: Mapping[str, int],
) -> dict[int, dict[str, int]]:
    """NUMA node → memory type → bytes reserved, from `reservedMemory`. Raises
    MemoryManagerError naming the entry: a node the machine lacks, a bad quantity, or a
    total per type unequal to Node Allocatable's (`node_reserved`: kube-reserved +
    system-reserved + hard eviction, by type)."""
    ids = {n.id for n in nodes}
    out: dict[int, dict[str, int]] = {n.id: {} for n in nodes}
    totals: dict[str, int] = {}
    for i, entry in enumerate(reserved_memory):
        where = f"reservedMemory[{i}]"
        node = entry.get("numaNode")
        if not isinstance(node, int) or isinstance(node, bool):
            raise MemoryManagerError(f"{where}.numaNode: must be an integer, not {node!r}")
        if node not in ids:
            raise MemoryManagerError(
                f"{where}: the reserved memory configuration references a NUMA node {node} "
                "that does not exist on this machine"
            )
        limits = entry.get("limits") or {}
        if not isinstance(limits, Mapping):
            raise MemoryManagerError(f"{where}.limits: must be a map of quantities")
        for name, raw in limits.items():
            if not _memory_type(str(name)):
                raise MemoryManagerError(
                    f"{where}.limits.{name}: only memory and hugepages-<size> can be reserved"
                )
            try:
                value = _int(parse_quantity(str(raw)))
            except ValueError as err:
                raise MemoryManagerError(f"{where}.limits.{name}: {err}") from None
            if value < 0:
                raise MemoryManagerError(f"{where}.limits.{name}: must not be negative")
            out[node][str(name)] = value
            totals[str(name)] = totals.get(str(name), 0) + value
    for name in sorted(set(totals) | {k for k in node_reserved if _memory_type(k)}):
        want, got = node_reserved.get(name, 0), totals.get(name, 0)
        if want != got:
            raise MemoryManagerError(
                f"reservedMemory: the total amount {got} of type {name!r} is not equal to the "
                f"value {want} determined by Node Allocatable feature (kubeReserved + "
                "systemReserved + evictionHard)"
            )
    return out


def requests(container: JSON) -> dict[str, int]:
    """The container's memory and hugepages requests in bytes."""
    return {k: _int(v) for k, v in container_requests(container).items() if _memory_type(k)}


def _restartable(container: JSON) -> bool:
    return container.get("restartPolicy") == "Always"


def pod_requests(pod: JSON) -> dict[str, int]:
    """The pod's memory requests as upstream's getPodRequestedResources: the larger of
    the long-running containers' sum and the largest init container step."""
    spec = pod.get("spec") or {}
    by_init: dict[str, int] = {}
    by_sidecars: dict[str, int] = {}
    for c in spec.get("initContainers") or ():
        for name, qty in requests(c).items():
            by_init.setdefault(name, 0)
            if _restartable(c):
                by_sidecars[name] = by_sidecars.get(name, 0) + qty
            elif by_sidecars.get(name, 0) + qty > by_init[name]:
                by_init[name] = by_sidecars.get(name, 0) + qty
    by_app: dict[str, int] = {}
    for c in spec.get("containers") or ():
        for name, qty in requests(c).items():
            by_app[name] = by_app.get(name, 0) + qty
    return {
        name: max(qty + by_sidecars.get(name, 0), by_init.get(name, 0))
        for name, qty in by_app.items()
    }


def pinned(pod: JSON) -> bool:
    """Only Guaranteed pods without pod-level resources get NUMA memory."""
    return qos_class(pod) == GUARANTEED and not is_pod_level_set(pod)


def _uid(pod: JSON) -> str:
    return str((pod.get("metadata") or {}).get("uid") or "")


def _groups_equal(a: Sequence[int] | None, b: Sequence[int] | None) -> bool:
    return sorted(a or ()) == sorted(b or ())


def _node(state: MemoryState, node_id: int) -> NodeState:
    node = (state.machine or {}).get(node_id)
    if node is None:
        raise AllocationError(f"[memorymanager] NUMA node {node_id} is not in the machine state")
    return node


def _table(node: NodeState, name: str) -> MemoryTable:
    table = (node.memory_map or {}).get(name)
    return table if table is not None else MemoryTable(0, 0, 0, 0, 0)


@dataclass(frozen=True)
class StaticPolicy:
    nodes: tuple[NUMANode, ...]
    reserved: Mapping[int, Mapping[str, int]]
    """From reserved_per_node."""

    name = "Static"

    def default_machine(self) -> dict[int, NodeState]:
        machine: dict[int, NodeState] = {}
        for n in self.nodes:
            reserved = self.reserved.get(n.id, {})
            tables: dict[str, MemoryTable] = {}
            for name, total in n.hugepages.items():
                sys = reserved.get(name, 0)
                tables[name] = MemoryTable(total, sys, total - sys, 0, total - sys)
            sys = reserved.get(MEMORY, 0)
            allocatable = n.memory - sys - sum(n.hugepages.values())
            tables[MEMORY] = MemoryTable(n.memory, sys, allocatable, 0, allocatable)
            machine[n.id] = NodeState(0, tables, [n.id])
        return machine

    def start(self, state: MemoryState) -> MemoryState:
        """The state read from the file, checked against this machine as upstream's
        validateState (a new file gets the default machine state). Raises
        MemoryManagerError with upstream's words."""
        if state.policy != self.name:
            raise MemoryManagerError(
                f"[memorymanager] configured policy {self.name!r} differs from state "
                f"checkpoint policy {state.policy!r}"
            )
        if not state.machine:
            if state.entries:
                raise MemoryManagerError(
                    "[memorymanager] machine state can not be empty when it has memory assignments"
                )
            return MemoryState(self.name, self.default_machine(), {})
        expected = MemoryState(self.name, self.default_machine(), {})
        for uid, containers in sorted((state.entries or {}).items()):
            for name, blocks in sorted(containers.items()):
                for b in blocks or ():
                    size = b.size
                    for node_id in b.numa_affinity or ():
                        node = (expected.machine or {}).get(node_id)
                        if node is None:
                            raise MemoryManagerError(
                                f"[memorymanager] (pod: {uid}, container: {name}) the memory "
                                "assignment uses the NUMA that does not exist"
                            )
                        node.number_of_assignments += 1
                        node.cells = list(b.numa_affinity or ())
                        table = (node.memory_map or {}).get(b.type)
                        if table is None:
                            raise MemoryManagerError(
                                f"[memorymanager] (pod: {uid}, container: {name}) the memory "
                                "assignment uses memory resource that does not exist"
                            )
                        size = _take(table, size)
        if not _machines_equal(state, expected):
            raise MemoryManagerError(
                "[memorymanager] the expected machine state is different from the real one"
            )
        return state

    # -- hints -----------------------------------------------------------------------

    def _calculate(
        self, state: MemoryState, want: Mapping[str, int]
    ) -> dict[str, list[TopologyHint]]:
        machine = state.machine or {}
        ids = sorted(machine)
        min_size = len(ids)
        found: list[int] = []
        for mask in iterate_masks(ids):
            members = bits(mask)
            free = {r: sum(_table(machine[n], r).free for n in members) for r in want}
            alloc = {r: sum(_table(machine[n], r).allocatable for n in members) for r in want}
            if any(alloc[r] < q for r, q in want.items()):
                continue
            min_size = min(min_size, len(members))
            single = len(members) == 1
            if single and len(machine[members[0]].cells or ()) > 1:
                continue
            if not single and any(
                machine[n].number_of_assignments > 0
                and (
                    len(machine[n].cells or ()) == 1 or not _groups_equal(machine[n].cells, members)
                )
                for n in members
            ):
                continue
            if any(free[r] < q for r, q in want.items()):
                continue
            found.append(mask)
        return {r: [TopologyHint(m, m.bit_count() == min_size) for m in found] for r in want}

    def _regenerate(self, blocks: Sequence[Block], want: Mapping[str, int]) -> ProviderHints | None:
        if len(blocks) != len(want):
            return None
        hints: dict[str, list[TopologyHint]] = {r: [] for r in want}
        for b in blocks:
            if b.type not in want or b.size != want[b.type]:
                return None
            hints[b.type].append(TopologyHint(mask_of(b.numa_affinity or ()), True))
        return hints

    def hints(self, state: MemoryState, pod: JSON, container: JSON) -> ProviderHints | None:
        """The container's hints by memory type (None: no preference)."""
        if not pinned(pod):
            return None
        want = requests(container)
        blocks = state.blocks(_uid(pod), str(container.get("name") or ""))
        if blocks is not None:
            return self._regenerate(blocks, want)
        return self._calculate(state, want)

    def pod_hints(self, state: MemoryState, pod: JSON) -> ProviderHints | None:
        """The pod's hints (pod scope): its requests as one."""
        if not pinned(pod):
            return None
        want = pod_requests(pod)
        spec = pod.get("spec") or {}
        for c in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]:
            blocks = state.blocks(_uid(pod), str(c.get("name") or ""))
            if blocks is not None:
                return self._regenerate(blocks, want)
        return self._calculate(state, want)

    # -- allocation ------------------------------------------------------------------

    def _best(self, hints: Sequence[TopologyHint]) -> TopologyHint | None:
        best: TopologyHint | None = None
        for h in hints:
            assert h.affinity is not None
            if best is None or (h.preferred and not best.preferred):
                best = h
            elif h.preferred == best.preferred and _narrower(h.affinity, best.affinity or 0):
                best = h
        return best

    def allocate(
        self, state: MemoryState, pod: JSON, container: JSON, hint: TopologyHint
    ) -> MemoryState:
        """The state with the container's blocks; unchanged for a pod that is not
        Guaranteed or a container already placed. Raises AllocationError."""
        if not pinned(pod):
            return state
        uid, name = _uid(pod), str(container.get("name") or "")
        if state.blocks(uid, name) is not None:
            return state
        want = requests(container)
        machine_state = state.clone()
        best = hint
        if hint.affinity is None:
            found = self._best(self._calculate(machine_state, want).get(MEMORY, []))
            if found is None:
                raise AllocationError(
                    "[memorymanager] failed to get the default NUMA affinity, no NUMA nodes "
                    "with enough memory is available"
                )
            if not found.preferred and hint.preferred:
                raise AllocationError("[memorymanager] failed to find the default preferred hint")
            best = found
        assert best.affinity is not None
        machine = machine_state.machine or {}
        if any(
            sum(_table(_node(machine_state, n), r).free for n in bits(best.affinity)) < q
            for r, q in want.items()
        ):
            group = bits(best.affinity)
            extended = self._best(
                [
                    h
                    for h in self._calculate(machine_state, want).get(MEMORY, [])
                    if set(group) <= set(bits(h.affinity or 0))
                ]
            )
            if extended is None:
                raise AllocationError(
                    "[memorymanager] failed to find NUMA nodes to extend the current topology hint"
                )
            if not extended.preferred and best.preferred:
                raise AllocationError("[memorymanager] failed to find the extended preferred hint")
            best = extended
        assert best.affinity is not None
        members = bits(best.affinity)
        if len(members) > 1 and any(
            machine[n].number_of_assignments > 0
            and (len(machine[n].cells or ()) == 1 or not _groups_equal(machine[n].cells, members))
            for n in members
        ):
            raise AllocationError("[memorymanager] preferred hint violates NUMA node allocation")
        blocks: list[Block] = []
        for r, q in sorted(want.items()):
            blocks.append(Block(list(members), r, q))
            size = q
            for n in members:
                node = machine[n]
                node.number_of_assignments += 1
                node.cells = list(members)
                if size:
                    size = _take(_table_ref(node, r), size)
        entries = machine_state.entries if machine_state.entries is not None else {}
        entries.setdefault(uid, {})[name] = blocks
        machine_state.entries = entries
        return machine_state

    def remove(self, state: MemoryState, uid: str, name: str) -> MemoryState:
        """The state without the container's blocks, their memory freed."""
        blocks = state.blocks(uid, name)
        if blocks is None:
            return state
        out = state.clone()
        assert out.entries is not None
        del out.entries[uid][name]
        if not out.entries[uid]:
            del out.entries[uid]
        machine = out.machine or {}
        for b in blocks:
            size = b.size
            for n in b.numa_affinity or ():
                node = machine.get(n)
                if node is None:
                    continue
                node.number_of_assignments -= 1
                if node.number_of_assignments == 0:
                    node.cells = [n]
                table = (node.memory_map or {}).get(b.type)
                if not size or table is None or table.reserved == 0:
                    continue
                give = min(size, table.reserved)
                table.free += give
                table.reserved -= give
                size -= give
        return out


def _table_ref(node: NodeState, name: str) -> MemoryTable:
    if node.memory_map is None:
        node.memory_map = {}
    return node.memory_map.setdefault(name, MemoryTable(0, 0, 0, 0, 0))


def _take(table: MemoryTable, size: int) -> int:
    """Reserve up to `size` bytes from the table; what is left to reserve elsewhere."""
    if size == 0 or table.free <= 0:
        return size
    give = min(size, table.free)
    table.reserved += give
    table.free -= give
    return size - give


def _narrower(a: int, b: int) -> bool:
    ca, cb = a.bit_count(), b.bit_count()
    return ca < cb if ca != cb else a < b


def _machines_equal(a: MemoryState, b: MemoryState) -> bool:
    ma, mb = a.machine or {}, b.machine or {}
    if set(ma) != set(mb):
        return False
    for n, na in ma.items():
        nb = mb[n]
        if na.number_of_assignments != nb.number_of_assignments:
            return False
        if not _groups_equal(na.cells, nb.cells):
            return False
        ta, tb = na.memory_map or {}, nb.memory_map or {}
        if set(ta) != set(tb):
            return False
        for r in ta:
            x, y = ta[r], tb[r]
            if (x.total, x.system_reserved, x.allocatable) != (
                y.total,
                y.system_reserved,
                y.allocatable,
            ):
                return False
            cells = na.cells or ()
            free_a = sum(_table(ma[c], r).free for c in cells if c in ma)
            free_b = sum(_table(mb[c], r).free for c in cells if c in mb)
            res_a = sum(_table(ma[c], r).reserved for c in cells if c in ma)
            res_b = sum(_table(mb[c], r).reserved for c in cells if c in mb)
            if free_a != free_b or res_a != res_b:
                return False
    return True


def container_numa_nodes(state: MemoryState, uid: str, name: str) -> list[int]:
    """The NUMA nodes of a container's blocks (its cpuset.mems), ascending; empty when it
    has none (upstream's GetMemoryNUMANodes)."""
    return sorted({n for b in state.blocks(uid, name) or () for n in b.numa_affinity or ()})
