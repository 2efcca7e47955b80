"""A reader's copy of bus tables, read again only when a table changed (issue 42).

Three services kept their view of the `desired` and `status` tables by reading both in
full every few seconds (HGETALL) and decoding every record: at 110 pods that is
hundreds of KB of JSON decoded every 5 s for nothing while the node is idle. Two
things make the periodic read cheap instead:

- **The generation first.** Every fenced write of a table moves the table's generation
  counter in the same atomic call (klet.bus.functions: `gen:<table>`). A `TableWatch`
  reads the counters of all its tables in one round trip (MGET) and reads a table
  again only when its counter moved since its copy was read. The counter is read
  before the table, never after, so a write landing in between only costs one more
  read. A counter Redis lost (a restart, a flush) reads as None or as a new value
  started from the server's clock, never as the value a copy holds, so the copy is
  read again in full.
- **Only the changed rows decoded.** A table read again is one HGETALL, but a row whose
  text is the same as in the copy (a digest of it is kept, not the text) keeps its
  decoded record: a change of one pod decodes one pod, not 110. An undecodable row is
  logged once per change of its text, not at every read.

A write that does not go through the fenced write (a direct HSET, which the grants
also allow, or a klet of an older release sharing the Redis) does not move a counter.
So a watch with `full_every_s` also reads every table in full at that interval (the
readers use upstream's syncFrequency, a minute), comparing digests, so such a write is
seen within it and still decodes only what changed.

A reader of another service's table may keep what it had while Redis has lost it
(`TableWatch(keep_lost_s=...)`): a counter that vanished (the copy was read at a
generation, and now there is none) means Redis restarted empty or was flushed, and the
table's writer has not written it since. Its rows are not gone from the node, only from
Redis, and the writer republishes them as soon as it has its lease back
(klet.bus.leader), so the copy is kept as it was until the counter is back, for at most
`keep_lost_s`: status-reporter's `/pods` does not empty for the moment between a Redis
restart and the republish (and then fill again pod by pod), nor does syncloop see an
empty desired set. A writer's own reconcile (syncloop's statuses, pod-source's desired
set) never keeps: it must see the loss to repair it.

Readers that follow a stream of changes (syncloop's `pods`, status-reporter's
`podstatus`) keep reading each change's rows by key as before; the watch is their
safety net for what a stream cannot tell (an entry missed while Redis was away, a pod
removed from `desired`, another replica's writes).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, Protocol, TypeVar

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)

KEEP_LOST_S = 15.0
"""How long a reader keeps a table Redis lost (`TableWatch(keep_lost_s=)`): a lease
TTL. A writer that is alive has republished long before (it takes its lease back at
Redis's first answer); past it, the reader shows the table as Redis has it."""

DIGEST_BYTES = 16
"""The size of a row's digest: collisions between two texts of one row are out of reach
(blake2b), and 110 pods cost under 2 KB of them, where the texts are hundreds of KB."""


class Generations(Protocol):
    """Where the generation counters are read (`klet.bus.Bus` is one)."""

    async def generations(self, keys: Sequence[str]) -> list[str | None]: ...


class CopiedTable(Protocol[R_co]):
    """What a copy reads of its table (`klet.bus.Table` is one)."""

    @property
    def bus(self) -> Generations: ...

    @property
    def name(self) -> str: ...

    @property
    def generation_key(self) -> str: ...

    async def raw_all(self) -> dict[str, str]: ...

    def decode_row(self, key: str, raw: str) -> R_co | None: ...


def digest(text: str) -> bytes:
    """A row's digest: what the copy keeps of its text to tell whether it changed."""
    return hashlib.blake2b(text.encode(), digest_size=DIGEST_BYTES).digest()


class TableCopy(Generic[R]):
    """One table's decoded records as last read, and what it takes to read it again."""

    def __init__(self, table: CopiedTable[R]) -> None:
        self.table = table
        self.records: Mapping[str, R] = {}
        """The decodable records as last read, by key: replaced, never mutated, when a
        read finds a change, so a reader may keep it across an await."""
        self.generation: str | None = None
        """The table's generation read before the last read of its rows."""
        self.loaded = False
        self.changes = 0
        """Reads that found the records changed (the first read counts as one)."""
        self.reads = 0
        """Full reads (HGETALL) of the table."""
        self.decoded = 0
        """Rows decoded, over all reads."""
        self._rows: dict[str, tuple[bytes, R | None]] = {}

    async def load(self, generation: str | None) -> bool:
        """Read every row (the table's generation was `generation` before the read),
        decode the ones whose text changed; returns whether the records changed."""
        raw = await self.table.raw_all()
        self.reads += 1
        rows: dict[str, tuple[bytes, R | None]] = {}
        changed = not self.loaded or raw.keys() != self._rows.keys()
        for key, text in raw.items():
            sum_ = digest(text)
            kept = self._rows.get(key)
            if kept is not None and kept[0] == sum_:
                rows[key] = kept
                continue
            self.decoded += 1
            rows[key] = (sum_, self.table.decode_row(key, text))
            changed = True
        self._rows = rows
        self.generation = generation
        self.loaded = True
        if changed:
            self.records = {k: r for k, (_, r) in rows.items() if r is not None}
            self.changes += 1
        return changed


class TableWatch:
    """Copies of some tables of one bus, refreshed together: their generations in one
    round trip, then a read of each table whose generation moved (of each, when
    `full_every_s` has passed since the last read of them all)."""

    def __init__(
        self,
        *copies: TableCopy[Any],
        full_every_s: float | None = None,
        keep_lost_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not copies:
            raise ValueError("a table watch needs at least one table")
        if full_every_s is not None and full_every_s <= 0:
            raise ValueError(f"full_every_s: must be > 0 or None, got {full_every_s!r}")
        if keep_lost_s is not None and keep_lost_s < 0:
            raise ValueError(f"keep_lost_s: must be >= 0 or None, got {keep_lost_s!r}")
        self.copies = copies
        self.full_every_s = full_every_s
        self.keep_lost_s = keep_lost_s
        self.clock = clock
        self._full_at: float | None = None  # clock time of the last read of every table
        self._seen: tuple[int, ...] | None = None  # the copies' changes at the last answer
        self._lost_at: dict[int, float] = {}  # copy index -> when its counter was found gone

    async def refresh(self) -> bool:
        """Bring every copy up to date; returns whether any copy's records changed since
        the last refresh that returned (a refresh that raised part-way, after some
        copies were read, leaves their changes to be reported by the next one).
        Raises what the bus raises (`BusError`)."""
        now = self.clock()
        bus = self.copies[0].table.bus
        generations = await bus.generations([c.table.generation_key for c in self.copies])
        full = self._full_at is None or (
            self.full_every_s is not None and now - self._full_at >= self.full_every_s
        )
        for index, (copy, generation) in enumerate(zip(self.copies, generations, strict=True)):
            if self._keeps(index, copy, generation, now):
                continue
            if full or not copy.loaded or copy.generation != generation:
                await copy.load(generation)
        if full:
            self._full_at = now
        seen = tuple(c.changes for c in self.copies)
        changed = seen != self._seen
        self._seen = seen
        return changed

    def _keeps(self, index: int, copy: TableCopy[Any], generation: str | None, now: float) -> bool:
        """Whether to keep `copy` as it is although its table's counter is gone (see the
        module docstring): only with `keep_lost_s`, only a copy read at a generation,
        and for at most `keep_lost_s` from when the loss was first seen."""
        lost = (
            self.keep_lost_s is not None
            and generation is None
            and copy.loaded
            and copy.generation is not None
        )
        if not lost:
            self._lost_at.pop(index, None)
            return False
        since = self._lost_at.setdefault(index, now)
        return now - since < (self.keep_lost_s or 0.0)
