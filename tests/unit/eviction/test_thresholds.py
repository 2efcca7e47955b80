"""Eviction thresholds as upstream parses and applies them: quantities vs percentages of
capacity, hard vs soft (grace periods counted from the first observation), minimum
reclaim while a threshold stays met, the allocatableMemory and containerfs thresholds
derived from the others, node conditions raised at once and held for the transition
period, and every configuration problem refused with the field that holds it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import pytest
from klet.config.errors import ConfigError
from klet.config.kubelet import KubeletConfiguration
from klet.eviction.signals import Observation, Observations, Signal
from klet.eviction.thresholds import (
    Amount,
    Threshold,
    ThresholdState,
    evaluate,
    node_conditions,
    parse_eviction_config,
    parse_thresholds,
    threshold_value,
    thresholds_met,
    with_containerfs_thresholds,
)

Mi = 2**20
Gi = 2**30
MEM = Signal.MEMORY_AVAILABLE
NODEFS = Signal.NODEFS_AVAILABLE


def cfg(**changes: Any) -> KubeletConfiguration:
    return dataclasses.replace(KubeletConfiguration(), **changes)


def by_signal(thresholds: list[Threshold]) -> dict[tuple[str, bool], Threshold]:
    return {(t.signal.value, t.hard): t for t in thresholds}


def obs(**available: tuple[int, int]) -> Observations:
    """obs(memory=(available, capacity)) with signal names spelled as keyword-safe keys."""
    names = {
        "memory": MEM,
        "allocatable": Signal.ALLOCATABLE_MEMORY_AVAILABLE,
        "nodefs": NODEFS,
        "nodefs_inodes": Signal.NODEFS_INODES_FREE,
        "imagefs": Signal.IMAGEFS_AVAILABLE,
        "pid": Signal.PID_AVAILABLE,
    }
    return {names[k]: Observation(a, c, 0.0) for k, (a, c) in available.items()}


# -- parsing ---------------------------------------------------------------------------


def test_defaults_are_upstream_linux_hard_thresholds() -> None:
    got = by_signal(parse_thresholds(KubeletConfiguration()))
    assert got[("memory.available", True)].quantity == 100 * Mi
    assert got[("nodefs.available", True)].percentage == 10
    assert got[("nodefs.inodesFree", True)].percentage == 5
    assert got[("imagefs.available", True)].percentage == 15
    # enforceNodeAllocatable defaults to ["pods"]: the allocatable twin of memory.available
    twin = got[("allocatableMemory.available", True)]
    assert twin.quantity == 100 * Mi and twin.hard
    # one shared filesystem: containerfs follows nodefs
    assert got[("containerfs.available", True)].percentage == 10
    assert got[("containerfs.inodesFree", True)].percentage == 5
    assert all(t.hard for t in got.values())


@pytest.mark.parametrize(
    ("text", "quantity", "percentage"),
    [
        ("100Mi", 100 * Mi, None),
        ("1Gi", Gi, None),
        ("1.5Gi", 3 * Gi // 2, None),
        ("500M", 500_000_000, None),
        ("1000", 1000, None),
        ("10%", None, 10.0),
        ("7.5%", None, 7.5),
    ],
)
def test_quantities_and_percentages(
    text: str, quantity: int | None, percentage: float | None
) -> None:
    (t,) = parse_thresholds(cfg(eviction_hard={"pid.available": text}))
    assert (t.signal, t.quantity, t.percentage) == (Signal.PID_AVAILABLE, quantity, percentage)


@pytest.mark.parametrize("text", ["0%", "100%"])
def test_zero_and_hundred_percent_disable_a_threshold(text: str) -> None:
    assert parse_thresholds(cfg(eviction_hard={"memory.available": text})) == []


def test_empty_eviction_hard_disables_the_defaults() -> None:
    assert parse_thresholds(cfg(eviction_hard={})) == []


@pytest.mark.parametrize(
    ("capacity", "threshold", "value"),
    [
        (1000 * Mi, Threshold(MEM, 100 * Mi, None), 100 * Mi),  # a quantity ignores capacity
        (1000, Threshold(NODEFS, None, 10.0), 100),
        (1005, Threshold(NODEFS, None, 10.0), 100),  # truncated, as upstream
        (1000, Threshold(NODEFS, None, 7.5), 75),
        (0, Threshold(NODEFS, None, 10.0), 0),
    ],
)
def test_threshold_value(capacity: int, threshold: Threshold, value: int) -> None:
    assert threshold_value(threshold, capacity) == value


def test_soft_thresholds_take_their_grace_periods_and_min_reclaim_applies_to_both() -> None:
    got = by_signal(
        parse_thresholds(
            cfg(
                eviction_hard={"memory.available": "100Mi"},
                eviction_soft={"memory.available": "1Gi", "nodefs.available": "20%"},
                eviction_soft_grace_period={"memory.available": 90.0, "nodefs.available": 0.0},
                eviction_minimum_reclaim={"memory.available": "50Mi", "nodefs.available": "5%"},
            )
        )
    )
    soft = got[("memory.available", False)]
    assert (soft.quantity, soft.grace_period_s, soft.min_reclaim) == (Gi, 90.0, Amount(50 * Mi))
    assert got[("memory.available", True)].min_reclaim == Amount(50 * Mi)
    # a soft threshold with a zero grace period is hard, as upstream decides it
    zero = got[("nodefs.available", True)]
    assert (zero.percentage, zero.min_reclaim) == (20.0, Amount(percentage=5.0))
    # only hard memory.available thresholds get an allocatable twin
    twins = [t for t in got.values() if t.signal == Signal.ALLOCATABLE_MEMORY_AVAILABLE]
    assert [t.quantity for t in twins] == [100 * Mi]


def test_no_allocatable_twin_without_pods_enforcement() -> None:
    thresholds = parse_thresholds(
        cfg(eviction_hard={"memory.available": "100Mi"}, enforce_node_allocatable=("none",))
    )
    assert [t.signal for t in thresholds] == [MEM]


@pytest.mark.parametrize(
    ("changes", "problems"),
    [
        (
            {"eviction_hard": {"memory.avail": "1Gi"}},
            ["evictionHard.memory.avail: unsupported eviction signal memory.avail"],
        ),
        (
            {"eviction_hard": {"memory.available": "10Zz"}},
            ['evictionHard.memory.available: invalid quantity "10Zz"'],
        ),
        (
            {"eviction_hard": {"memory.available": "0"}},
            [
                "evictionHard.memory.available: eviction threshold memory.available "
                "must be positive: 0"
            ],
        ),
        (
            {"eviction_hard": {"memory.available": "-1Mi"}},
            [
                "evictionHard.memory.available: eviction threshold memory.available "
                "must be positive: -1Mi"
            ],
        ),
        (
            {"eviction_hard": {"nodefs.available": "120%"}},
            ["evictionHard.nodefs.available: eviction percentage threshold must be <= 100%: 120%"],
        ),
        (
            {"eviction_hard": {"nodefs.available": "-5%"}},
            ["evictionHard.nodefs.available: eviction percentage threshold must be >= 0%: -5%"],
        ),
        (
            {"eviction_hard": {"nodefs.available": "x%"}},
            ['evictionHard.nodefs.available: invalid percentage "x%"'],
        ),
        (
            {"eviction_soft": {"memory.available": "1Gi"}},
            ["evictionSoft.memory.available: needs a grace period in evictionSoftGracePeriod"],
        ),
        (
            {
                "eviction_soft": {"memory.available": "1Gi"},
                "eviction_soft_grace_period": {"memory.available": -1.0},
            },
            [
                "evictionSoftGracePeriod.memory.available: must be a non-negative duration, "
                "got -1.0",
                "evictionSoft.memory.available: needs a grace period in evictionSoftGracePeriod",
            ],
        ),
        (
            {"eviction_soft_grace_period": {"disk.available": 10.0}},
            ["evictionSoftGracePeriod.disk.available: unsupported eviction signal disk.available"],
        ),
        (
            {"eviction_minimum_reclaim": {"memory.available": "-1Mi"}},
            ["evictionMinimumReclaim.memory.available: negative eviction minimum reclaim: -1Mi"],
        ),
        (
            {"eviction_minimum_reclaim": {"nodefs.available": "0%"}},
            [
                "evictionMinimumReclaim.nodefs.available: eviction percentage minimum reclaim "
                "must be in (0%, 100%]: 0%"
            ],
        ),
        (
            {"eviction_hard": {"memory.available": "1x", "pid.available": "0"}},
            [
                'evictionHard.memory.available: invalid quantity "1x"',
                "evictionHard.pid.available: eviction threshold pid.available must be positive: 0",
            ],
        ),
    ],
)
def test_invalid_settings_are_refused_naming_the_field(
    changes: Mapping[str, Any], problems: list[str]
) -> None:
    with pytest.raises(ConfigError) as err:
        parse_thresholds(cfg(**changes))
    assert err.value.problems == problems


def test_eviction_config_carries_the_transition_period_and_grace_cap() -> None:
    parsed = parse_eviction_config(
        cfg(eviction_pressure_transition_period=30.0, eviction_max_pod_grace_period=20)
    )
    assert (parsed.pressure_transition_period_s, parsed.max_pod_grace_period_s) == (30.0, 20)
    assert parsed.thresholds == tuple(parse_thresholds(KubeletConfiguration()))
    assert parse_eviction_config(KubeletConfiguration()).pressure_transition_period_s == 300.0


def test_eviction_config_lists_every_problem() -> None:
    with pytest.raises(ConfigError) as err:
        parse_eviction_config(
            cfg(
                eviction_hard={"memory.available": "bad"},
                eviction_pressure_transition_period=-1.0,
                eviction_max_pod_grace_period=-5,
            )
        )
    assert err.value.problems == [
        'evictionHard.memory.available: invalid quantity "bad"',
        "evictionPressureTransitionPeriod: must not be negative, got -1s",
        "evictionMaxPodGracePeriod: must not be negative, got -5",
    ]


@pytest.mark.parametrize(
    ("dedicated", "split", "source"),
    [
        (False, False, "nodefs"),  # one filesystem
        (True, True, "nodefs"),  # writable layers with the root dir, images apart
        (True, False, "imagefs"),  # writable layers with the images
    ],
)
def test_containerfs_thresholds_follow_where_writable_layers_live(
    dedicated: bool, split: bool, source: str
) -> None:
    config = cfg(
        eviction_hard={
            "nodefs.available": "10%",
            "imagefs.available": "15%",
            "nodefs.inodesFree": "5%",
        },
        eviction_soft={"containerfs.available": "50%", "imagefs.available": "30%"},
        eviction_soft_grace_period={"containerfs.available": 60.0, "imagefs.available": 30.0},
    )
    got = parse_thresholds(config, dedicated_image_fs=dedicated, split_container_fs=split)
    container = {
        (t.percentage, t.grace_period_s)
        for t in got
        if t.signal in (Signal.CONTAINERFS_AVAILABLE, Signal.CONTAINERFS_INODES_FREE)
    }
    expected = {
        "nodefs": {(10.0, 0.0), (5.0, 0.0)},
        "imagefs": {(15.0, 0.0), (30.0, 30.0)},
    }[source]
    assert container == expected
    # re-deriving once the runtime answered gives the same set (idempotent)
    again = with_containerfs_thresholds(got, dedicated_image_fs=dedicated, split_container_fs=split)
    assert sorted(map(repr, again)) == sorted(map(repr, got))


# -- thresholds met --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("threshold", "observed", "enforce", "met"),
    [
        (Threshold(MEM, 100 * Mi, None), obs(memory=(99 * Mi, Gi)), False, True),
        (Threshold(MEM, 100 * Mi, None), obs(memory=(100 * Mi, Gi)), False, False),  # not <
        (Threshold(MEM, 100 * Mi, None), obs(nodefs=(0, Gi)), False, False),  # not observed
        (Threshold(NODEFS, None, 10.0), obs(nodefs=(99, 1000)), False, True),
        (Threshold(NODEFS, None, 10.0), obs(nodefs=(100, 1000)), False, False),
        (
            Threshold(MEM, 100 * Mi, None, 0, Amount(50 * Mi)),
            obs(memory=(120 * Mi, Gi)),
            False,
            False,
        ),
        (
            Threshold(MEM, 100 * Mi, None, 0, Amount(50 * Mi)),
            obs(memory=(120 * Mi, Gi)),
            True,
            True,
        ),
        (
            Threshold(MEM, 100 * Mi, None, 0, Amount(50 * Mi)),
            obs(memory=(150 * Mi, Gi)),
            True,
            False,
        ),
        (
            Threshold(NODEFS, None, 10.0, 0, Amount(percentage=5.0)),
            obs(nodefs=(140, 1000)),
            True,
            True,
        ),
        (
            Threshold(NODEFS, None, 10.0, 0, Amount(percentage=5.0)),
            obs(nodefs=(150, 1000)),
            True,
            False,
        ),
    ],
)
def test_thresholds_met(
    threshold: Threshold, observed: Observations, enforce: bool, met: bool
) -> None:
    assert thresholds_met(observed, [threshold], enforce_min_reclaim=enforce) == (
        [threshold] if met else []
    )


def test_node_conditions_per_signal() -> None:
    assert node_conditions([Threshold(s, 1, None) for s in Signal]) == {
        "MemoryPressure",
        "DiskPressure",
        "PIDPressure",
    }
    assert node_conditions([Threshold(Signal.ALLOCATABLE_MEMORY_AVAILABLE, 1, None)]) == {
        "MemoryPressure"
    }
    assert node_conditions([Threshold(Signal.IMAGEFS_INODES_FREE, 1, None)]) == {"DiskPressure"}
    assert node_conditions([]) == frozenset()


# -- evaluation over time ---------------------------------------------------------------

HARD = Threshold(MEM, 100 * Mi, None)
SOFT = Threshold(MEM, 500 * Mi, None, grace_period_s=60.0)
LOW = obs(memory=(50 * Mi, Gi))  # below both
MIDDLE = obs(memory=(300 * Mi, Gi))  # below the soft one only
HIGH = obs(memory=(900 * Mi, Gi))


def run(
    steps: list[tuple[float, Observations]],
    thresholds: list[Threshold],
    *,
    transition: float = 300.0,
) -> list[tuple[list[Threshold], frozenset[str]]]:
    state = ThresholdState()
    out = []
    for now, observed in steps:
        ev = evaluate(observed, thresholds, state, now=now, transition_period_s=transition)
        out.append((ev.met, ev.conditions))
    return out


def test_hard_threshold_is_met_at_once_and_condition_held_for_transition_period() -> None:
    got = run([(0, LOW), (10, HIGH), (299, HIGH), (300, HIGH)], [HARD])
    assert got == [
        ([HARD], {"MemoryPressure"}),
        ([], {"MemoryPressure"}),  # recovered, but the condition is held
        ([], {"MemoryPressure"}),
        ([], frozenset()),  # 300 s after it was last observed
    ]


def test_transition_period_counts_from_the_last_observation() -> None:
    got = run([(0, LOW), (200, LOW), (400, HIGH), (499, HIGH), (500, HIGH)], [HARD])
    assert [c for _, c in got] == [
        {"MemoryPressure"},
        {"MemoryPressure"},
        {"MemoryPressure"},
        {"MemoryPressure"},
        frozenset(),
    ]


def test_soft_threshold_waits_for_its_grace_period_but_raises_the_condition_at_once() -> None:
    got = run([(0, MIDDLE), (30, MIDDLE), (59, MIDDLE), (60, MIDDLE), (70, MIDDLE)], [SOFT])
    assert [m for m, _ in got] == [[], [], [], [SOFT], [SOFT]]
    assert all(c == {"MemoryPressure"} for _, c in got)


def test_grace_period_restarts_when_the_threshold_clears() -> None:
    got = run([(0, MIDDLE), (50, HIGH), (60, MIDDLE), (110, MIDDLE), (120, MIDDLE)], [SOFT])
    assert [m for m, _ in got] == [[], [], [], [], [SOFT]]


def test_hard_and_soft_together() -> None:
    got = run([(0, LOW), (60, LOW)], [HARD, SOFT])
    assert got[0][0] == [HARD]
    assert got[1][0] == [HARD, SOFT]


def test_min_reclaim_keeps_a_met_threshold_until_recovered_by_it() -> None:
    t = Threshold(MEM, 100 * Mi, None, min_reclaim=Amount(200 * Mi))
    got = run(
        [
            (0, obs(memory=(120 * Mi, Gi))),  # above the threshold, never met
            (10, obs(memory=(90 * Mi, Gi))),  # met
            (20, obs(memory=(250 * Mi, Gi))),  # above 100Mi but below 100Mi + 200Mi
            (30, obs(memory=(299 * Mi, Gi))),
            (40, obs(memory=(300 * Mi, Gi))),  # reclaimed enough
            (50, obs(memory=(250 * Mi, Gi))),  # no longer met: min reclaim is not a threshold
        ],
        [t],
    )
    assert [m for m, _ in got] == [[], [t], [t], [t], [], []]


def test_min_reclaim_keeps_the_first_observation_time() -> None:
    t = Threshold(MEM, 500 * Mi, None, grace_period_s=30.0, min_reclaim=Amount(100 * Mi))
    state = ThresholdState()
    for now, available in ((0, 400), (30, 400), (40, 550)):
        ev = evaluate(obs(memory=(available * Mi, Gi)), [t], state, now=now, transition_period_s=60)
    assert ev.met == [t] and state.first_observed == {t: 0}


def test_state_is_carried_in_place() -> None:
    state = ThresholdState()
    ev = evaluate(MIDDLE, [SOFT], state, now=100.0, transition_period_s=300)
    assert ev.crossed == [SOFT] and ev.met == []
    assert state.first_observed == {SOFT: 100.0}
    assert state.conditions_last_observed == {"MemoryPressure": 100.0}
    assert state.met == []


def test_unobserved_signal_neither_meets_nor_raises() -> None:
    assert run([(0, obs(nodefs=(0, 100)))], [HARD]) == [([], frozenset())]


def test_zero_transition_period_reports_only_what_is_crossed_now() -> None:
    got = run([(0, LOW), (1, HIGH)], [HARD], transition=0)
    assert [c for _, c in got] == [{"MemoryPressure"}, frozenset()]


def test_conditions_of_several_resources() -> None:
    thresholds = [HARD, Threshold(NODEFS, None, 10.0), Threshold(Signal.PID_AVAILABLE, 100, None)]
    got = run(
        [
            (0, obs(memory=(900 * Mi, Gi), nodefs=(5, 100), pid=(1000, 4096))),
            (10, obs(memory=(900 * Mi, Gi), nodefs=(50, 100), pid=(50, 4096))),
        ],
        thresholds,
        transition=5,
    )
    assert got[0][1] == {"DiskPressure"}
    assert got[1][1] == {"PIDPressure"}
