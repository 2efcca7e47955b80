"""CPU sets in the Linux list format (`0-3,8,10-11`), as cgroup cpuset.cpus and the
upstream kubelet's `cpuset` package write them.

Shared by the configuration (`reservedSystemCPUs`), syncloop's CPU manager (its state
file, the CRI cpuset) and status-reporter (PodResources' cpu_ids read from the bus),
so it lives one floor below all three. Pure.

`format_cpus` writes what upstream's CPUSet.String() writes: ascending, runs of two or
more consecutive CPUs as `a-b`, single CPUs alone, comma-separated, "" for none; the
state file's checksum is over that text, so it must be the same byte for byte.
"""

from __future__ import annotations

from collections.abc import Iterable

CPUSet = frozenset[int]


class CPUSetError(ValueError):
    """A CPU list that does not parse; the message names the bad part."""


# The largest CPU number Linux has (NR_CPUS is at most 8192, x86_64's MAXSMP): a larger
# one names no CPU, and a range up to it (a hostile reservedSystemCPUs) would be
# expanded without bound.
MAX_CPU = 8191


def _cpu(text: str, whole: str) -> int:
    if not (text.isascii() and text.isdigit()):
        raise CPUSetError(f"invalid CPU list {whole!r}: {text!r} is not a CPU number")
    if len(text) > len(str(MAX_CPU)) or int(text) > MAX_CPU:
        raise CPUSetError(
            f"invalid CPU list {whole!r}: {text!r} is above the largest CPU number Linux "
            f"has ({MAX_CPU})"
        )
    return int(text)


def parse_cpus(text: str) -> CPUSet:
    """The CPUs of `0-3,8`; "" (or blanks) is the empty set. Raises CPUSetError."""
    cpus: set[int] = set()
    stripped = text.strip()
    if not stripped:
        return frozenset()
    for part in stripped.split(","):
        part = part.strip()
        if "-" in part:
            lo_text, _, hi_text = part.partition("-")
            lo, hi = _cpu(lo_text.strip(), text), _cpu(hi_text.strip(), text)
            if lo > hi:
                raise CPUSetError(f"invalid CPU list {text!r}: range {part!r} is descending")
            cpus.update(range(lo, hi + 1))
        else:
            cpus.add(_cpu(part, text))
    return frozenset(cpus)


def format_cpus(cpus: Iterable[int]) -> str:
    """The list format of `cpus`, as upstream's CPUSet.String()."""
    ordered = sorted(set(cpus))
    runs: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        runs.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(runs)
