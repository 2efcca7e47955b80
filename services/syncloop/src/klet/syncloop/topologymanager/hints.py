"""Topology hints and their merge, as upstream's topologymanager policies decide them.

A hint is a set of NUMA nodes (a bitmask, here an int: bit n = node n) and whether the
provider prefers it. Each hint provider (memory manager, device manager, CPU manager)
answers, per resource, the node sets a container's request fits in; `merge` takes one
hint per resource in every combination, ANDs their masks (a resource with no
preference counts as every node), and keeps the best merged hint: preferred over not,
then the narrowest mask, then the lower-numbered nodes (upstream's HintMerger,
including its rule for the best non-preferred hint). The policy decides admission:
`none` and `best-effort` admit anything, `restricted` and `single-numa-node` only a
preferred result; `single-numa-node` first drops every hint wider than one node.

The `prefer-closest-numa-nodes` option (GA in 1.34, off unless set) picks, among masks
of equal width, the one with the smallest average NUMA distance; distances come from
the machine (`node/nodeN/distance`). `max-allowable-numa-nodes` (beta) only lifts
upstream's refusal to start on a machine with more than 8 NUMA nodes.

Pure: masks and hints in, a hint and a verdict out.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = [
    "DEFAULT_MAX_NUMA_NODES",
    "POLICIES",
    "NUMAInfo",
    "PolicyOptions",
    "ProviderHints",
    "TopologyHint",
    "bits",
    "iterate_masks",
    "mask_of",
    "merge",
    "policy_options",
]

POLICIES = ("none", "best-effort", "restricted", "single-numa-node")
DEFAULT_MAX_NUMA_NODES = 8  # upstream's defaultMaxAllowableNUMANodes


def mask_of(nodes: Sequence[int]) -> int:
    m = 0
    for n in nodes:
        m |= 1 << n
    return m


def bits(mask: int) -> list[int]:
    """The NUMA nodes of a mask, ascending."""
    return [i for i in range(mask.bit_length()) if mask >> i & 1]


def _narrower(a: int, b: int) -> bool:
    """Upstream's IsNarrowerThan: fewer nodes, or as many and lower-numbered."""
    ca, cb = a.bit_count(), b.bit_count()
    return ca < cb if ca != cb else a < b


def iterate_masks(nodes: Sequence[int]) -> Iterator[int]:
    """Every non-empty subset of the nodes, smallest first (upstream's IterateBitMasks)."""
    ordered = sorted(nodes)
    for size in range(1, len(ordered) + 1):
        for combo in itertools.combinations(ordered, size):
            yield mask_of(combo)


@dataclass(frozen=True)
class TopologyHint:
    affinity: int | None
    """The NUMA node mask; None: no preference (any node)."""
    preferred: bool


ProviderHints = Mapping[str, Sequence[TopologyHint] | None]
"""One provider's hints by resource; None for a resource: no NUMA preference; an empty
sequence: the resource fits nowhere."""


@dataclass(frozen=True)
class PolicyOptions:
    prefer_closest: bool = False
    max_numa_nodes: int = DEFAULT_MAX_NUMA_NODES


def policy_options(raw: Mapping[str, str], *, beta: bool = True) -> PolicyOptions:
    """topologyManagerPolicyOptions as upstream's NewPolicyOptions reads them. Raises
    ValueError naming the option."""
    opts = PolicyOptions()
    for name, value in sorted(raw.items()):
        if name == "prefer-closest-numa-nodes":
            low = str(value).lower()
            if low not in ("1", "t", "true", "0", "f", "false"):
                raise ValueError(f"bad value for option {name!r}: {value!r} is not a boolean")
            opts = PolicyOptions(low in ("1", "t", "true"), opts.max_numa_nodes)
        elif name == "max-allowable-numa-nodes":
            if not beta:
                raise ValueError(
                    "topology manager policy beta-level options not enabled, but option "
                    f"{name!r} provided"
                )
            try:
                n = int(value)
            except ValueError:
                raise ValueError(f"option {name!r}: {value!r} is not an integer") from None
            if n < DEFAULT_MAX_NUMA_NODES:
                raise ValueError(
                    f"the minimum value of {name!r} should not be less than "
                    f"{DEFAULT_MAX_NUMA_NODES}"
                )
            opts = PolicyOptions(opts.prefer_closest, n)
        else:
            raise ValueError(f"unknown Topology Manager Policy option: {name!r}")
    return opts


@dataclass(frozen=True)
class NUMAInfo:
    nodes: tuple[int, ...]
    distances: Mapping[int, Sequence[int]] = field(default_factory=dict)
    """Node → its distance to each node by index (only read with prefer-closest)."""

    def default_mask(self) -> int:
        return mask_of(self.nodes)

    def _average(self, mask: int) -> float:
        members = bits(mask)
        if not members:
            return 0.0
        total = 0
        count = 0
        for a in members:
            for b in members:
                row = self.distances.get(a) or ()
                total += row[b] if b < len(row) else 0
                count += 1
        return total / count

    def best(self, a: int, b: int, *, closest: bool) -> int:
        """Upstream's Narrowest, or Closest with prefer-closest-numa-nodes."""
        if closest and a.bit_count() == b.bit_count():
            da, db = self._average(a), self._average(b)
            if da == db:
                return a if a < b else b
            return a if da < db else b
        return a if _narrower(a, b) else b


def _filter(providers: Sequence[ProviderHints]) -> list[list[TopologyHint]]:
    """One list of hints per resource; no preference becomes a preferred `any` hint, a
    resource that fits nowhere a non-preferred `any` hint (upstream's filterProvidersHints)."""
    out: list[list[TopologyHint]] = []
    for hints in providers:
        if not hints:
            out.append([TopologyHint(None, True)])
            continue
        for resource in hints:
            h = hints[resource]
            if h is None:
                out.append([TopologyHint(None, True)])
            elif not h:
                out.append([TopologyHint(None, False)])
            else:
                out.append(list(h))
    return out


def _merge_permutation(default: int, perm: Sequence[TopologyHint]) -> TopologyHint:
    preferred = True
    first: int | None = None
    merged = default
    for h in perm:
        if h.affinity is not None:
            if first is None:
                first = h.affinity
            elif h.affinity != first:
                preferred = False
            merged &= h.affinity
        if not h.preferred:
            preferred = False
    return TopologyHint(merged, preferred)


def _max_of_min_counts(filtered: Sequence[Sequence[TopologyHint]]) -> int:
    best = 0
    for hints in filtered:
        narrowest: int | None = None
        for h in hints:
            if h.affinity is None:
                continue
            if narrowest is None or _narrower(h.affinity, narrowest):
                narrowest = h.affinity
        if narrowest is not None:
            best = max(best, narrowest.bit_count())
    return best


class _Merger:
    def __init__(self, numa: NUMAInfo, filtered: list[list[TopologyHint]], closest: bool) -> None:
        self.numa = numa
        self.filtered = filtered
        self.closest = closest
        self.best_non_preferred = _max_of_min_counts(filtered)

    def _masks(self, current: TopologyHint, candidate: TopologyHint) -> TopologyHint:
        assert current.affinity is not None and candidate.affinity is not None
        if candidate.affinity == current.affinity:
            return current
        best = self.numa.best(current.affinity, candidate.affinity, closest=self.closest)
        return current if best == current.affinity else candidate

    def compare(self, current: TopologyHint | None, candidate: TopologyHint) -> TopologyHint | None:
        cand = candidate.affinity or 0
        if cand.bit_count() == 0:
            return current
        if current is None:
            return candidate
        if current.preferred != candidate.preferred:
            return current if current.preferred else candidate
        if current.preferred:
            return self._masks(current, candidate)
        # both non-preferred: prefer the width closest to the best non-preferred count
        cur = (current.affinity or 0).bit_count()
        n = cand.bit_count()
        target = self.best_non_preferred
        if cur > target:
            return self._masks(current, candidate)
        if cur == target:
            return current if n != target else self._masks(current, candidate)
        if n > target:
            return current
        if n == target:
            return candidate
        if n > cur:
            return candidate
        if n < cur:
            return current
        return self._masks(current, candidate)

    def merge(self) -> TopologyHint:
        default = self.numa.default_mask()
        best: TopologyHint | None = None
        for perm in itertools.product(*self.filtered):
            best = self.compare(best, _merge_permutation(default, perm))
        return best if best is not None else TopologyHint(default, False)


def merge(
    policy: str,
    providers: Sequence[ProviderHints],
    numa: NUMAInfo,
    options: PolicyOptions | None = None,
) -> tuple[TopologyHint, bool]:
    """The best hint over every provider's hints, and whether the policy admits it."""
    if policy == "none":
        return TopologyHint(None, True), True
    filtered = _filter(providers)
    if policy == "single-numa-node":
        filtered = [
            [
                h
                for h in hints
                if h.preferred and (h.affinity is None or h.affinity.bit_count() == 1)
            ]
            for hints in filtered
        ]
    options = options or PolicyOptions()
    closest = options.prefer_closest and policy != "single-numa-node"
    best = _Merger(numa, filtered, closest).merge()
    if policy == "single-numa-node" and best.affinity == numa.default_mask():
        best = TopologyHint(None, best.preferred)
    if policy == "best-effort":
        return best, True
    if policy in ("restricted", "single-numa-node"):
        return best, best.preferred
    raise ValueError(f"unknown topology manager policy {policy!r}")
