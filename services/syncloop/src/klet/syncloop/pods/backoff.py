"""Per-key exponential back-off with upstream's semantics (flowcontrol.Backoff).

Crash-loop and image-pull back-off both use it: the first restart after an exit is
immediate, each further one waits twice as long as the previous (10 s → 300 s by
default), measured from the moment the last instance finished. An entry that has not
been touched for twice the maximum is forgotten, so a container that ran fine for ten
minutes starts over at the initial delay. Pure state + arithmetic; time is passed in.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class _Entry:
    delay: float
    last_update: float


@dataclass
class Backoff:
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
