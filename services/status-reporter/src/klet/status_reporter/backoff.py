"""Retry delays of the cluster-mode loops: exponential back-off and jittered periods.

Small on purpose: the loops retry "until the apiserver answers again", which tenacity's
bounded policies (used inside single calls, see `kubeapi.py`) do not express; a loop
keeps one `Backoff`, asks it for the next delay after a failure and resets it after a
success, so it resumes within `max_s` of the apiserver's return.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class BackoffPolicy:
    """Delays after consecutive failures: initial_s, doubled each time, at most max_s."""

    initial_s: float = 0.2
    max_s: float = 5.0

    def __post_init__(self) -> None:
        if self.initial_s < 0 or self.max_s < 0:
            raise ValueError(f"BackoffPolicy: delays must be >= 0, got {self!r}")


class Backoff:
    def __init__(self, policy: BackoffPolicy) -> None:
        self._policy = policy
        self._next = policy.initial_s

    def reset(self) -> None:
        self._next = self._policy.initial_s

    def next(self) -> float:
        delay = self._next
        self._next = min(max(delay * 2, 0.001), self._policy.max_s)
        return delay


def jittered(period_s: float, factor: float, *, rand: Callable[[], float] = random.random) -> float:
    """wait.JitterUntil's delay: `period_s` plus up to `factor` of it at random."""
    return period_s + period_s * factor * rand() if factor > 0 else period_s
