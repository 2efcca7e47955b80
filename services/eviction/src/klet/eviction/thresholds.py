"""Eviction thresholds: parsing the configuration, and deciding which ones are met.

Parsing restates upstream's `ParseThresholdConfig`: evictionHard and evictionSoft map a
signal to a quantity ("100Mi") or a percentage of the signal's capacity ("10%");
"0%" and "100%" disable a threshold, a zero or negative quantity is refused; every soft
threshold needs its evictionSoftGracePeriod (a hard threshold is one with grace 0, as
upstream decides hard vs soft); evictionMinimumReclaim attaches to both. When
enforceNodeAllocatable includes "pods", each hard memory.available threshold gets an
allocatableMemory.available twin. containerfs thresholds are not configured on their
own: they follow nodefs (one filesystem, or containers split from images) or imagefs (a
dedicated image filesystem holding the writable layers), as upstream's
`UpdateContainerFsThresholds`; `with_containerfs_thresholds` re-derives them once the
runtime's filesystems are known. Every problem is reported at once, as a ConfigError
naming the field (`evictionHard.memory.available: ...`).

Evaluation restates one pass of upstream's `synchronize`:

1. thresholds crossed now (available < value), plus those met at the last pass that
   have not yet recovered by their minimum reclaim (available < value + minReclaim);
2. each crossed threshold's first observation time is kept while it stays crossed,
   and it drives eviction once its grace period has elapsed (`Evaluation.met`);
3. a crossed threshold raises its node condition at once, even a soft one still in its
   grace period, and the condition is held until evictionPressureTransitionPeriod has
   passed since it was last observed (`Evaluation.conditions`).

Everything here is pure: time and observations are arguments.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal

from klet.config.errors import ConfigError, Problem
from klet.config.flags import parse_signal_thresholds
from klet.config.kubelet import KubeletConfiguration
from klet.eviction.signals import SIGNAL_CONDITION, Observations, Signal
from klet.model.node import format_bytes
from klet.model.units import parse_percentage, parse_quantity

__all__ = [
    "Amount",
    "EvictionConfig",
    "Evaluation",
    "Threshold",
    "ThresholdState",
    "evaluate",
    "node_conditions",
    "parse_eviction_config",
    "parse_expressions",
    "parse_thresholds",
    "threshold_value",
    "thresholds_met",
    "with_containerfs_thresholds",
]

_NODEFS = (Signal.NODEFS_AVAILABLE, Signal.NODEFS_INODES_FREE)
_IMAGEFS = (Signal.IMAGEFS_AVAILABLE, Signal.IMAGEFS_INODES_FREE)
_CONTAINERFS = (Signal.CONTAINERFS_AVAILABLE, Signal.CONTAINERFS_INODES_FREE)
_COUNTED = frozenset(
    {
        Signal.NODEFS_INODES_FREE,
        Signal.IMAGEFS_INODES_FREE,
        Signal.CONTAINERFS_INODES_FREE,
        Signal.PID_AVAILABLE,
    }
)


@dataclass(frozen=True)
class Amount:
    """A quantity (bytes, inodes or PIDs) or a percentage (0..100) of a capacity."""

    quantity: int | None = None
    percentage: float | None = None

    def of(self, capacity: int) -> int:
        """The amount against `capacity` (a percentage is truncated, as upstream)."""
        if self.quantity is not None:
            return self.quantity
        if self.percentage is not None:
            return int(capacity * self.percentage / 100)
        return 0

    def __str__(self) -> str:
        if self.quantity is not None:
            return str(self.quantity)
        return f"{self.percentage:g}%"


@dataclass(frozen=True)
class Threshold:
    """`signal` < value triggers; value is `quantity`, or `percentage` (0..100) of the
    signal's capacity. grace_period_s == 0 makes it a hard threshold (evict at once, pods
    killed with grace 0); otherwise soft. `min_reclaim`: once met, the threshold stays
    met until available reaches value + min_reclaim. Hashable: state is keyed by it."""

    signal: Signal
    quantity: int | None
    percentage: float | None
    grace_period_s: float = 0.0
    min_reclaim: Amount | None = None

    @property
    def hard(self) -> bool:
        return self.grace_period_s == 0

    @property
    def value(self) -> Amount:
        return Amount(self.quantity, self.percentage)

    @property
    def condition(self) -> str:
        """The node condition this threshold raises when crossed."""
        return SIGNAL_CONDITION[self.signal]

    def describe(self) -> str:
        """As evictionHard spells it, bytes in binary units: "memory.available<100Mi (hard)"."""
        kind = "hard" if self.hard else f"soft, grace {self.grace_period_s:g}s"
        value = str(self.value)
        if self.quantity is not None and self.signal not in _COUNTED:
            value = format_bytes(self.quantity)
        return f"{self.signal.value}<{value} ({kind})"


def threshold_value(t: Threshold, capacity: int) -> int:
    """The threshold's amount for a signal of `capacity` (bytes, inodes or PIDs)."""
    return t.value.of(capacity)


@dataclass(frozen=True)
class EvictionConfig:
    """The eviction settings of a KubeletConfiguration, parsed."""

    thresholds: tuple[Threshold, ...]
    pressure_transition_period_s: float  # evictionPressureTransitionPeriod, default 5m
    max_pod_grace_period_s: int  # evictionMaxPodGracePeriod; 0 = the pod's own


# -- parsing ------------------------------------------------------------------------


def _signal(path: str, name: str, problems: list[Problem]) -> Signal | None:
    try:
        return Signal(name)
    except ValueError:
        problems.append(Problem(path, f"unsupported eviction signal {name}"))
        return None


def _threshold_amount(
    path: str, signal: Signal, text: str, problems: list[Problem]
) -> Amount | None:
    """A threshold value; None when it is disabled ("0%", "100%") or invalid."""
    if not isinstance(text, str):
        problems.append(Problem(path, f"must be a quantity or a percentage, got {text!r}"))
        return None
    if text.endswith("%"):
        if text in ("0%", "100%"):
            return None
        try:
            pct = parse_percentage(text)
        except ValueError as exc:
            problems.append(Problem(path, str(exc)))
            return None
        if pct < 0:
            problems.append(Problem(path, f"eviction percentage threshold must be >= 0%: {text}"))
            return None
        if pct > 100:
            problems.append(Problem(path, f"eviction percentage threshold must be <= 100%: {text}"))
            return None
        return Amount(percentage=pct)
    try:
        value = parse_quantity(text)
    except ValueError as exc:
        problems.append(Problem(path, str(exc)))
        return None
    if value <= 0:
        problems.append(
            Problem(path, f"eviction threshold {signal.value} must be positive: {text}")
        )
        return None
    return Amount(quantity=math.ceil(value))


def _min_reclaim_amount(path: str, text: str, problems: list[Problem]) -> Amount | None:
    if not isinstance(text, str):
        problems.append(Problem(path, f"must be a quantity or a percentage, got {text!r}"))
        return None
    if text.endswith("%"):
        try:
            pct = parse_percentage(text)
        except ValueError as exc:
            problems.append(Problem(path, str(exc)))
            return None
        if not 0 < pct <= 100:
            problems.append(
                Problem(path, f"eviction percentage minimum reclaim must be in (0%, 100%]: {text}")
            )
            return None
        return Amount(percentage=pct)
    try:
        value = parse_quantity(text)
    except ValueError as exc:
        problems.append(Problem(path, str(exc)))
        return None
    if value < Decimal(0):
        problems.append(Problem(path, f"negative eviction minimum reclaim: {text}"))
        return None
    return Amount(quantity=math.ceil(value))


def _statements(
    field_name: str, statements: Mapping[str, str], problems: list[Problem]
) -> dict[Signal, Amount]:
    out: dict[Signal, Amount] = {}
    for name, text in sorted(statements.items()):
        path = f"{field_name}.{name}"
        signal = _signal(path, name, problems)
        if signal is None:
            continue
        amount = _threshold_amount(path, signal, text, problems)
        if amount is not None:
            out[signal] = amount
    return out


def _grace_periods(statements: Mapping[str, float], problems: list[Problem]) -> dict[Signal, float]:
    out: dict[Signal, float] = {}
    for name, seconds in sorted(statements.items()):
        path = f"evictionSoftGracePeriod.{name}"
        signal = _signal(path, name, problems)
        if signal is None:
            continue
        if not isinstance(seconds, int | float) or math.isnan(seconds) or seconds < 0:
            problems.append(Problem(path, f"must be a non-negative duration, got {seconds!r}"))
            continue
        out[signal] = float(seconds)
    return out


def _min_reclaims(statements: Mapping[str, str], problems: list[Problem]) -> dict[Signal, Amount]:
    out: dict[Signal, Amount] = {}
    for name, text in sorted(statements.items()):
        path = f"evictionMinimumReclaim.{name}"
        signal = _signal(path, name, problems)
        if signal is None:
            continue
        amount = _min_reclaim_amount(path, text, problems)
        if amount is not None:
            out[signal] = amount
    return out


def parse_thresholds(
    kubelet: KubeletConfiguration,
    *,
    dedicated_image_fs: bool = False,
    split_container_fs: bool = False,
) -> list[Threshold]:
    """The thresholds of the configuration: hard ones first, then soft, then the
    allocatableMemory twins and the derived containerfs thresholds.

    `dedicated_image_fs` / `split_container_fs` describe the runtime's filesystems (see
    `with_containerfs_thresholds`); the defaults describe one shared filesystem.
    Raises ConfigError listing every problem, each naming its field.
    """
    problems: list[Problem] = []
    hard = _statements("evictionHard", kubelet.eviction_hard, problems)
    soft = _statements("evictionSoft", kubelet.eviction_soft, problems)
    grace = _grace_periods(kubelet.eviction_soft_grace_period, problems)
    reclaim = _min_reclaims(kubelet.eviction_minimum_reclaim, problems)
    for signal in soft:
        if signal not in grace:
            problems.append(
                Problem(
                    f"evictionSoft.{signal.value}",
                    "needs a grace period in evictionSoftGracePeriod",
                )
            )
    if problems:
        raise ConfigError([str(p) for p in problems])
    out = [
        Threshold(signal, amount.quantity, amount.percentage, 0.0, reclaim.get(signal))
        for signal, amount in hard.items()
    ]
    out += [
        Threshold(signal, amount.quantity, amount.percentage, grace[signal], reclaim.get(signal))
        for signal, amount in soft.items()
    ]
    if "pods" in kubelet.enforce_node_allocatable:
        out += [
            replace(t, signal=Signal.ALLOCATABLE_MEMORY_AVAILABLE)
            for t in out
            if t.signal == Signal.MEMORY_AVAILABLE and t.hard
        ]
    return with_containerfs_thresholds(
        out, dedicated_image_fs=dedicated_image_fs, split_container_fs=split_container_fs
    )


def parse_expressions(
    expressions: Sequence[str], kubelet: KubeletConfiguration, *, field_name: str = "--signal"
) -> list[Threshold]:
    """Hard thresholds from expressions as `--eviction-hard` takes them
    ("memory.available<2Gi", "nodefs.available<10%"), parsed as evictionHard is (same
    splitting, same value rules), with the configuration's evictionMinimumReclaim and,
    when it enforces "pods", the allocatableMemory twin. Raises ConfigError naming
    `field_name` and the signal."""
    try:
        statements = parse_signal_thresholds(list(expressions))
    except ValueError as err:
        raise ConfigError([str(Problem(field_name, str(err)))]) from err
    problems: list[Problem] = []
    hard = _statements(field_name, statements, problems)
    reclaim = _min_reclaims(kubelet.eviction_minimum_reclaim, problems)
    if not hard and not problems:
        problems.append(Problem(field_name, f"no threshold in {list(expressions)}"))
    if problems:
        raise ConfigError([str(p) for p in problems])
    out = [
        Threshold(signal, amount.quantity, amount.percentage, 0.0, reclaim.get(signal))
        for signal, amount in hard.items()
    ]
    if "pods" in kubelet.enforce_node_allocatable:
        if Signal.ALLOCATABLE_MEMORY_AVAILABLE not in hard:
            out += [
                replace(t, signal=Signal.ALLOCATABLE_MEMORY_AVAILABLE)
                for t in out
                if t.signal == Signal.MEMORY_AVAILABLE
            ]
    return out


def with_containerfs_thresholds(
    thresholds: Iterable[Threshold], *, dedicated_image_fs: bool, split_container_fs: bool
) -> list[Threshold]:
    """Replace any containerfs thresholds by ones derived as upstream does: the writable
    layers live with nodefs on a single filesystem or when containers are split from a
    dedicated image filesystem, and with imagefs on a dedicated image filesystem that
    also holds them. Idempotent, so it can run again once the runtime has answered."""
    base = [t for t in thresholds if t.signal not in _CONTAINERFS]
    source = _IMAGEFS if dedicated_image_fs and not split_container_fs else _NODEFS
    derived = [
        replace(t, signal=_CONTAINERFS[source.index(t.signal)]) for t in base if t.signal in source
    ]
    return base + derived


def parse_eviction_config(
    kubelet: KubeletConfiguration,
    *,
    dedicated_image_fs: bool = False,
    split_container_fs: bool = False,
) -> EvictionConfig:
    """Thresholds plus the transition period and the soft-eviction grace cap."""
    problems: list[str] = []
    try:
        thresholds = parse_thresholds(
            kubelet, dedicated_image_fs=dedicated_image_fs, split_container_fs=split_container_fs
        )
    except ConfigError as err:
        problems += err.problems
        thresholds = []
    transition = kubelet.eviction_pressure_transition_period
    if transition < 0:
        problems.append(
            str(
                Problem(
                    "evictionPressureTransitionPeriod", f"must not be negative, got {transition:g}s"
                )
            )
        )
    max_grace = kubelet.eviction_max_pod_grace_period
    if max_grace < 0:
        problems.append(
            str(Problem("evictionMaxPodGracePeriod", f"must not be negative, got {max_grace}"))
        )
    if problems:
        raise ConfigError(problems)
    return EvictionConfig(tuple(thresholds), float(transition), int(max_grace))


# -- evaluation ---------------------------------------------------------------------


def thresholds_met(
    observations: Observations, thresholds: Sequence[Threshold], *, enforce_min_reclaim: bool
) -> list[Threshold]:
    """The thresholds whose signal's available amount is below their value (plus their
    minimum reclaim when `enforce_min_reclaim`); a signal not observed meets nothing."""
    out: list[Threshold] = []
    for t in thresholds:
        observed = observations.get(t.signal)
        if observed is None:
            continue
        value = threshold_value(t, observed.capacity)
        if enforce_min_reclaim and t.min_reclaim is not None:
            value += t.min_reclaim.of(observed.capacity)
        if observed.available < value:
            out.append(t)
    return out


def node_conditions(thresholds: Iterable[Threshold]) -> frozenset[str]:
    """The node conditions the thresholds raise (MemoryPressure, DiskPressure, PIDPressure)."""
    return frozenset(t.condition for t in thresholds)


@dataclass
class ThresholdState:
    """What one evaluation pass leaves for the next (upstream's manager fields).

    first_observed: threshold → when it was first seen crossed (epoch seconds), kept
      while it stays crossed; grace periods count from here.
    conditions_last_observed: node condition → when a crossed threshold last raised it.
    met: the thresholds that drove eviction at the last pass; each stays met until its
      signal recovers by the threshold's minimum reclaim.
    """

    first_observed: dict[Threshold, float] = field(default_factory=dict)
    conditions_last_observed: dict[str, float] = field(default_factory=dict)
    met: list[Threshold] = field(default_factory=list)


@dataclass(frozen=True)
class Evaluation:
    """The outcome of one pass.

    met: thresholds past their grace period: these drive reclaim and eviction.
    conditions: node conditions to report (held for the transition period).
    crossed: every threshold crossed now or still within its minimum reclaim, whether
      or not its grace period has elapsed.
    """

    met: list[Threshold]
    conditions: frozenset[str]
    crossed: list[Threshold] = field(default_factory=list)


def evaluate(
    observations: Observations,
    thresholds: Sequence[Threshold],
    state: ThresholdState,
    *,
    now: float,
    transition_period_s: float,
) -> Evaluation:
    """One monitoring pass (see the module docstring). `state` is carried between passes
    and updated in place with this pass's result; everything else is returned."""
    crossed = thresholds_met(observations, thresholds, enforce_min_reclaim=False)
    if state.met:
        for t in thresholds_met(observations, state.met, enforce_min_reclaim=True):
            if t not in crossed:
                crossed.append(t)
    first_observed = {t: state.first_observed.get(t, now) for t in crossed}
    last_seen = {
        condition: at
        for condition, at in state.conditions_last_observed.items()
        if now - at < transition_period_s
    }
    raised = node_conditions(crossed)
    for condition in raised:
        last_seen[condition] = now
    # A condition observed now is reported even with a zero transition period.
    conditions = raised | frozenset(last_seen)
    met = [t for t in crossed if now - first_observed[t] >= t.grace_period_s]
    state.first_observed = first_observed
    state.conditions_last_observed = last_seen
    state.met = list(met)
    return Evaluation(met=met, conditions=conditions, crossed=crossed)
