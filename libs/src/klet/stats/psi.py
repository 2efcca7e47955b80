"""Pressure stall information (PSI, the KubeletPSI feature): the kernel's `*.pressure`
files parsed, without I/O.

The kernel writes, per resource, one line per kind of stall:

    some avg10=0.12 avg60=0.05 avg300=0.01 total=123456
    full avg10=0.00 avg60=0.00 avg300=0.00 total=0

`some`: the share of time at least one task waited for the resource; `full`: the share
when all non-idle tasks did at once. avg10/60/300 are percentages over those windows,
`total` the cumulative stall in microseconds. The node's are /proc/pressure/{cpu,memory,
io}; a cgroup v2 group's are its cpu.pressure, memory.pressure and io.pressure; a cgroup
v1 host has none per cgroup. A `full` line missing (cpu before Linux 5.13) reads as
zeros, as upstream's runc reader leaves it; no `some` line, or a malformed one, is no
reading at all.

Upstream passes `total` on unchanged into the Summary API's `psi.*.total` (its field
comment says nanoseconds; cAdvisor's value is the kernel's microseconds) and divides it by
10^6 for cAdvisor's `container_pressure_*_seconds_total`: so does klet.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PSIData", "PSIStats", "Pressure", "parse_psi"]

RESOURCES = ("cpu", "memory", "io")


@dataclass(frozen=True)
class PSIData:
    """One line: the averages (percent) and the cumulative stall (microseconds)."""

    avg10: float = 0.0
    avg60: float = 0.0
    avg300: float = 0.0
    total_us: int = 0


@dataclass(frozen=True)
class PSIStats:
    """One resource's `some` and `full` lines."""

    some: PSIData
    full: PSIData


@dataclass(frozen=True)
class Pressure:
    """A cgroup's (or the node's) PSI per resource; None where none could be read."""

    cpu: PSIStats | None = None
    memory: PSIStats | None = None
    io: PSIStats | None = None

    @property
    def empty(self) -> bool:
        return self.cpu is None and self.memory is None and self.io is None


def _line(fields: list[str]) -> PSIData | None:
    values: dict[str, str] = {}
    for f in fields:
        key, sep, value = f.partition("=")
        if not sep:
            return None
        values[key] = value
    try:
        data = PSIData(
            avg10=float(values["avg10"]),
            avg60=float(values["avg60"]),
            avg300=float(values["avg300"]),
            total_us=int(values["total"]),
        )
    except (KeyError, ValueError):
        return None
    if data.total_us < 0 or min(data.avg10, data.avg60, data.avg300) < 0:
        return None
    return data


def parse_psi(text: str) -> PSIStats | None:
    """One `*.pressure` file's content; None without a well-formed `some` line."""
    lines: dict[str, PSIData | None] = {}
    for raw in text.splitlines():
        fields = raw.split()
        if fields and fields[0] in ("some", "full"):
            lines[fields[0]] = _line(fields[1:])
    some = lines.get("some")
    if some is None:
        return None
    full = lines.get("full", PSIData())
    if full is None:  # a `full` line that does not parse: the file is not what we know
        return None
    return PSIStats(some=some, full=full)
