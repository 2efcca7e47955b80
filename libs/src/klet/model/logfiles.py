"""The names of a container's rotated log files: one convention for the writer and the
reader, which live in different services.

syncloop rotates a container's CRI log `<n>.log` by renaming it to
`<n>.log.<YYYYmmdd-HHMMSS>` (UTC) and asking the runtime to reopen the log; on a later
rotation that file is gzipped to `<n>.log.<stamp>.gz` through a `<n>.log.<stamp>.tmp`
file, as upstream's container log manager does. status-reporter reads a container's
log across the same files, oldest first. Both decide which files are in use here:

- a `.tmp` file is a compression that never finished: not in use;
- a plain rotated file whose `.gz` exists was compressed (the plain one was about to
  be removed): not in use, the `.gz` holds the same lines;
- everything else is in use, and the timestamp suffix sorts the files by age.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

COMPRESSED_SUFFIX = ".gz"
TEMPORARY_SUFFIX = ".tmp"
STAMP_FORMAT = "%Y%m%d-%H%M%S"


def rotated_name(log_name: str, now: datetime) -> str:
    """The name `log_name` is renamed to when it is rotated at `now`."""
    return f"{log_name}.{now.astimezone(UTC).strftime(STAMP_FORMAT)}"


def rotations_of(log_name: str, names: Iterable[str]) -> tuple[list[str], list[str]]:
    """(in use, oldest first; left over from an interrupted rotation) among the file
    names of one directory that are rotations of `log_name` (`log_name.*`)."""
    mine = {n for n in names if n.startswith(log_name + ".") and len(n) > len(log_name) + 1}
    in_use, unused = [], []
    for name in sorted(mine):
        if name.endswith(TEMPORARY_SUFFIX) or (
            not name.endswith(COMPRESSED_SUFFIX) and name + COMPRESSED_SUFFIX in mine
        ):
            unused.append(name)
        else:
            in_use.append(name)
    return in_use, unused


def is_compressed(name: str) -> bool:
    return name.endswith(COMPRESSED_SUFFIX)
