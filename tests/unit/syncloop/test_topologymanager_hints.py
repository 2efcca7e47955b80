"""The topology manager's hint merge (klet.syncloop.topologymanager.hints) over fake
multi-NUMA machines, as upstream's policies: masks of different providers are ANDed in
every combination; preferred beats non-preferred, then the narrowest mask, then the
lower-numbered nodes; a resource without preference counts as any node and one that
fits nowhere makes the merge non-preferred; best-effort admits what restricted and
single-numa-node refuse; single-numa-node drops hints wider than one node and reports a
whole-machine result as no affinity; prefer-closest-numa-nodes picks the nearer of two
equally wide masks; the policy options are read and refused as upstream's."""

from __future__ import annotations

import pytest
from klet.syncloop.topologymanager.hints import (
    NUMAInfo,
    PolicyOptions,
    ProviderHints,
    TopologyHint,
    bits,
    iterate_masks,
    mask_of,
    merge,
    policy_options,
)

TWO = NUMAInfo((0, 1))
FOUR = NUMAInfo((0, 1, 2, 3))


def h(nodes: list[int] | None, preferred: bool = True) -> TopologyHint:
    return TopologyHint(None if nodes is None else mask_of(nodes), preferred)


def test_masks() -> None:
    assert mask_of([0, 2]) == 0b101 and bits(0b101) == [0, 2]
    assert list(iterate_masks([0, 1, 2])) == [1, 2, 4, 3, 5, 6, 7]


def test_two_providers_agree_on_the_node_both_prefer() -> None:
    memory = {"memory": [h([0]), h([1]), h([0, 1], False)]}
    devices = {"vendor/gpu": [h([1]), h([0, 1], False)]}
    for policy in ("best-effort", "restricted", "single-numa-node"):
        assert merge(policy, [memory, devices], TWO) == (h([1]), True)


def test_the_narrowest_preferred_hint_wins_then_the_lower_nodes() -> None:
    hints = {"memory": [h([0, 1]), h([1]), h([0])]}
    assert merge("best-effort", [hints], TWO) == (h([0]), True)


def test_hints_that_cannot_align_are_refused_by_restricted_only() -> None:
    a = {"vendor/nic": [h([0])]}
    b = {"vendor/gpu": [h([1])]}
    best, admit = merge("best-effort", [a, b], TWO)
    assert admit and best == h([0, 1], False)
    assert merge("restricted", [a, b], TWO) == (h([0, 1], False), False)
    assert merge("single-numa-node", [a, b], TWO) == (h(None, False), False)


def test_single_numa_node_drops_hints_wider_than_one_node() -> None:
    devices = {"vendor/gpu": [h([0, 1])]}  # two devices, one per node
    assert merge("restricted", [devices], TWO) == (h([0, 1]), True)
    assert merge("single-numa-node", [devices], TWO) == (h(None, False), False)


def test_no_preference_admits_everywhere() -> None:
    cases: list[list[ProviderHints]] = [[], [{}], [{"vendor/gpu": None}]]
    for providers in cases:
        assert merge("single-numa-node", providers, TWO) == (h(None), True)
        assert merge("restricted", providers, TWO) == (h([0, 1]), True)


def test_a_resource_that_fits_nowhere_makes_the_result_not_preferred() -> None:
    providers: list[ProviderHints] = [{"memory": [h([0])]}, {"vendor/gpu": []}]
    assert merge("restricted", providers, TWO) == (h([0], False), False)
    assert merge("best-effort", providers, TWO) == (h([0], False), True)


def test_policy_none_merges_nothing() -> None:
    assert merge("none", [{"vendor/gpu": []}], TWO) == (h(None), True)


def test_the_best_non_preferred_hint_is_as_wide_as_the_widest_narrowest_hint() -> None:
    # memory fits only across {0,1} or {2,3} (not preferred), devices only on node 2
    memory = {"memory": [h([0, 1], False), h([2, 3], False)]}
    devices = {"vendor/gpu": [h([2]), h([2, 3], False)]}
    best, admit = merge("best-effort", [memory, devices], FOUR)
    assert best == h([2, 3], False) and admit


def test_prefer_closest_picks_the_nearer_of_two_equally_wide_masks() -> None:
    numa = NUMAInfo(
        (0, 1, 2, 3),
        {0: [10, 20, 11, 20], 1: [20, 10, 20, 11], 2: [11, 20, 10, 20], 3: [20, 11, 20, 10]},
    )
    hints = {"vendor/gpu": [h([0, 1]), h([0, 2])]}
    assert merge("best-effort", [hints], numa) == (h([0, 1]), True)
    closest = PolicyOptions(prefer_closest=True)
    assert merge("best-effort", [hints], numa, closest) == (h([0, 2]), True)


def test_policy_options() -> None:
    assert policy_options({}) == PolicyOptions()
    assert policy_options({"prefer-closest-numa-nodes": "true"}).prefer_closest
    assert policy_options({"max-allowable-numa-nodes": "16"}).max_numa_nodes == 16
    with pytest.raises(ValueError, match="unknown Topology Manager Policy option: 'x'"):
        policy_options({"x": "1"})
    with pytest.raises(ValueError, match="not a boolean"):
        policy_options({"prefer-closest-numa-nodes": "yes"})
    with pytest.raises(ValueError, match="should not be less than 8"):
        policy_options({"max-allowable-numa-nodes": "4"})
    with pytest.raises(ValueError, match="beta-level options not enabled"):
        policy_options({"max-allowable-numa-nodes": "9"}, beta=False)
