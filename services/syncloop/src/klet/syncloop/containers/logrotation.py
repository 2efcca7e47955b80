"""Pure decisions of container log rotation: when a log is rotated and what happens to
the files around it (the I/O is `logmanager.py`'s).

Upstream's container log manager, whose behaviour this follows: a running container's
log that has reached `containerLogMaxSize` is rotated. First the leftovers of an
interrupted rotation go (`.tmp` files, plain files already compressed), then the
oldest rotated files until `containerLogMaxFiles - 2` remain, so that after this
rotation there are at most `containerLogMaxFiles` files (the rotated ones plus the
one the runtime reopens); the remaining plain rotated files are gzipped, and the
current log is renamed to `<log>.<UTC stamp>` and left plain, because the runtime may
still be writing to it until it reopens the log and a reader may still be following
it. A negative max size turns rotation off (upstream's rule; klet's configuration
validation refuses negative sizes today); 0 is never seen here (the configuration reads
it as the 10Mi default).

One difference: when the new rotated name already exists (two rotations within one
second) nothing is done this round, instead of renaming over a rotated file.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from klet.model.logfiles import is_compressed, rotated_name, rotations_of


@dataclass(frozen=True)
class RotationPolicy:
    max_size: int
    """[containerLogMaxSize] in bytes; negative: never rotate."""
    max_files: int
    """[containerLogMaxFiles] (at least 2): the current log plus rotated ones."""

    @property
    def enabled(self) -> bool:
        return self.max_size >= 0


@dataclass(frozen=True)
class RotationPlan:
    """File names (in the log's directory) to act on, in this order."""

    remove: tuple[str, ...] = ()
    """Leftovers first, then the oldest rotated files beyond the limit."""
    compress: tuple[str, ...] = ()
    """Plain rotated files to gzip (`name` → `name.gz`), oldest first."""
    rotate_to: str = ""
    """The name the current log is renamed to; "" = do not rotate."""

    @property
    def empty(self) -> bool:
        return not (self.remove or self.compress or self.rotate_to)


def needs_rotation(size: int, policy: RotationPolicy) -> bool:
    """Whether a log of `size` bytes is rotated: below the max size nothing is done to
    it or to the files around it (upstream's rotateLog returns before it lists them)."""
    return policy.enabled and size >= policy.max_size


def plan_rotation(
    log_name: str, names: Iterable[str], *, size: int, policy: RotationPolicy, now: datetime
) -> RotationPlan:
    """What to do with the log `log_name` of `size` bytes, given the file `names` in
    its directory."""
    if not needs_rotation(size, policy):
        return RotationPlan()
    names = list(names)
    target = rotated_name(log_name, now)
    if target in names or target + ".gz" in names:
        return RotationPlan()
    in_use, unused = rotations_of(log_name, names)
    keep = max(policy.max_files - 2, 0)
    excess = in_use[: len(in_use) - keep] if len(in_use) > keep else []
    kept = in_use[len(excess) :]
    return RotationPlan(
        remove=tuple(unused + excess),
        compress=tuple(n for n in kept if not is_compressed(n)),
        rotate_to=target,
    )
