"""Retry and rate arithmetic every service shares, after upstream's `flowcontrol` and
`wait` packages. Pure state and arithmetic: the caller passes the time in.

- `Backoff` is upstream's per-key `flowcontrol.Backoff`: crash-loop and image-pull
  back-off. The first restart after an exit is immediate, each further one waits twice
  as long as the previous (10 s → 300 s by default), measured from the moment the last
  instance finished. An entry not touched for twice the maximum is forgotten, so a
  container that ran fine for ten minutes starts over at the initial delay.
- `BackoffPolicy` is the shape of a loop's retry delays (initial, doubled, capped); the
  loops retry through `klet.retry`, tenacity waiting these delays. It is a value here so
  settings and policies can hold one without importing tenacity.
- `jittered` is `wait.JitterUntil`'s period.
- `TokenBucket` is `flowcontrol.NewTokenBucketRateLimiter` (kubeAPIQPS/kubeAPIBurst,
  eventRecordQPS/eventBurst, registryPullQPS/registryBurst): it starts full and refills
  `qps` tokens a second up to `burst`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class _Entry:
    delay: float
    last_update: float


@dataclass
class Backoff:
    """Per-key exponential back-off (upstream's flowcontrol.Backoff)."""

    initial_s: float = 10.0
    max_s: float = 300.0
    _entries: dict[str, _Entry] = field(default_factory=dict)

    def _expired(self, entry: _Entry, now: float) -> bool:
        return now - entry.last_update > 2 * self.max_s

    def delay(self, key: str, now: float) -> float:
        """The current delay for `key`, 0 when it has none."""
        entry = self._entries.get(key)
        if entry is None or self._expired(entry, now):
            return 0.0
        return entry.delay

    def in_backoff_since(self, key: str, event_time: float, now: float) -> bool:
        """Whether `key` must still wait, counting from `event_time` (the last exit)."""
        entry = self._entries.get(key)
        if entry is None or self._expired(entry, now):
            return False
        return now - event_time < entry.delay

    def next(self, key: str, now: float) -> float:
        """Record an attempt now and return the delay the next attempt will have to wait."""
        entry = self._entries.get(key)
        if entry is None or self._expired(entry, now):
            entry = _Entry(self.initial_s, now)
        else:
            entry = _Entry(min(entry.delay * 2, self.max_s), now)
        self._entries[key] = entry
        return entry.delay

    def reset(self, key: str) -> None:
        self._entries.pop(key, None)

    def gc(self, now: float) -> None:
        for key in [k for k, e in self._entries.items() if self._expired(e, now)]:
            del self._entries[key]


@dataclass(frozen=True)
class BackoffPolicy:
    """Delays after consecutive failures: initial_s, doubled each time, at most max_s."""

    initial_s: float = 0.2
    max_s: float = 5.0

    def __post_init__(self) -> None:
        if self.initial_s < 0 or self.max_s < 0:
            raise ValueError(f"BackoffPolicy: delays must be >= 0, got {self!r}")


def jittered(period_s: float, factor: float, *, rand: Callable[[], float] = random.random) -> float:
    """wait.JitterUntil's delay: `period_s` plus up to `factor` of it at random."""
    return period_s + period_s * factor * rand() if factor > 0 else period_s


class TokenBucket:
    """A token bucket of `qps` tokens a second, holding at most `burst` (at least 1);
    `qps` <= 0 means unlimited."""

    def __init__(self, qps: float, burst: int, *, now: float) -> None:
        self.qps = qps
        self.capacity = float(max(1, burst))
        self.tokens = self.capacity
        self._at = now

    def _refill(self, now: float) -> None:
        self.tokens = min(self.capacity, self.tokens + max(0.0, now - self._at) * self.qps)
        self._at = now

    def take(self, now: float) -> float:
        """Reserve a token: how long to wait before using it (0 = at once)."""
        if self.qps <= 0:
            return 0.0
        self._refill(now)
        self.tokens -= 1.0
        return 0.0 if self.tokens >= 0 else -self.tokens / self.qps

    def try_take(self, now: float) -> bool:
        """Take a token if one is there now (upstream's TryAccept)."""
        if self.qps <= 0:
            return True
        self._refill(now)
        if self.tokens < 1:
            return False
        self.tokens -= 1.0
        return True
