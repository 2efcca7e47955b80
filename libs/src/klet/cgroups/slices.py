"""The systemd cgroup driver's names and unit properties: pure functions, no D-Bus.

With `cgroupDriver: systemd` a cgroup is a systemd slice, named as upstream's cgroup
manager names it: the cgroupfs name's parts, each with `-` replaced by `_` (a `-` in a
slice name means "child of"), joined by `-`, plus `.slice`; systemd derives the parent
from the name, so `/kubepods/burstable/pod<uid>` becomes the unit
`kubepods-burstable-pod<uid with _>.slice` at the cgroup path
`/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice`. That full
path is the cgroup parent handed to CRI (containerd takes its last element as the slice
for its `cri-containerd-<id>.scope`), as upstream's `CgroupName.ToSystemd` does.

The properties of a transient slice follow what runc's systemd driver asks for when
upstream's cgroup manager creates a pod or QoS cgroup: a description, `Wants=` on the
parent slice, no default dependencies, accounting on for CPU, memory, tasks and I/O, and
the limits as unit properties (v1: `CPUShares`, `MemoryLimit`; v2: `CPUWeight`,
`MemoryMax`; both: `CPUQuotaPerSecUSec`, `CPUQuotaPeriodUSec`, `TasksMax`). A quota is
per second of CPU time and rounded up to whole 10 ms, because systemd keeps it as a
percentage; "unlimited" is systemd's infinity, the largest 64-bit value.
"""

from __future__ import annotations

from dataclasses import dataclass

INFINITY = 2**64 - 1
"""systemd's "no limit" for 64-bit unit properties."""

SLICE_SUFFIX = ".slice"
DEFAULT_CPU_PERIOD_US = 100_000


class SliceNameError(ValueError):
    """A cgroupfs name that has no slice form (a part that is empty or holds a `/`)."""


def parts_of(cgroupfs_name: str) -> tuple[str, ...]:
    """`/kubepods/burstable/pod1` -> `("kubepods", "burstable", "pod1")`; `/` -> `()`."""
    return tuple(p for p in cgroupfs_name.strip("/").split("/") if p)


def unit_name(parts: tuple[str, ...]) -> str:
    """The slice unit of a cgroupfs name's parts: `kubepods-burstable-pod<uid_>.slice`;
    the root (no parts) is `-.slice`."""
    if not parts:
        return "-" + SLICE_SUFFIX
    for part in parts:
        if not part or "/" in part:
            raise SliceNameError(f"cgroup name part {part!r} has no slice form")
    return "-".join(p.replace("-", "_") for p in parts) + SLICE_SUFFIX


def expand(unit: str) -> str:
    """The cgroup path of a slice unit, as systemd places it: `kubepods-burstable-x.slice`
    -> `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-x.slice`."""
    if not unit.endswith(SLICE_SUFFIX) or "/" in unit:
        raise SliceNameError(f"{unit!r} is not a slice unit name")
    stem = unit[: -len(SLICE_SUFFIX)]
    if stem == "-":
        return "/"
    if not stem or stem.startswith("-") or stem.endswith("-") or "--" in stem:
        raise SliceNameError(f"{unit!r} is not a valid slice name")
    pieces = stem.split("-")
    return "/" + "/".join("-".join(pieces[: i + 1]) + SLICE_SUFFIX for i in range(len(pieces)))


def cgroup_path(cgroupfs_name: str) -> str:
    """The systemd driver's cgroup for a cgroupfs name: `/kubepods/burstable/pod<uid>` ->
    `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice` (what
    CRI gets as the cgroup parent)."""
    return expand(unit_name(parts_of(cgroupfs_name)))


def unit_of_path(path: str) -> str:
    """The slice unit a systemd cgroup path ends in (`/a.slice/a-b.slice` -> `a-b.slice`)."""
    last = path.rstrip("/").rsplit("/", 1)[-1]
    return last if last else "-" + SLICE_SUFFIX


def parent_unit(unit: str) -> str:
    """`kubepods-burstable.slice` -> `kubepods.slice`; a top-level slice's parent is `-.slice`."""
    stem = unit[: -len(SLICE_SUFFIX)]
    head, sep, _ = stem.rpartition("-")
    return (head if sep else "-") + SLICE_SUFFIX


@dataclass(frozen=True)
class SliceLimits:
    """What a pod or QoS slice is limited to; None leaves the resource unlimited."""

    cpu_shares: int | None = None
    cpu_quota_us: int | None = None
    cpu_period_us: int | None = None
    memory_limit_bytes: int | None = None
    pids_limit: int | None = None


def shares_to_weight(shares: int) -> int:
    """cgroup v2 cpu.weight for v1 cpu.shares, as runc converts them."""
    return 1 + ((shares - 2) * 9999) // 262142


def quota_per_sec_us(quota_us: int, period_us: int) -> int:
    """CPUQuotaPerSecUSec for a CFS quota and period, rounded up to whole 10 ms (systemd
    keeps the quota as a percentage of one CPU)."""
    per_sec = quota_us * 1_000_000 // period_us
    if per_sec % 10_000:
        per_sec = (per_sec // 10_000 + 1) * 10_000
    return per_sec


Property = tuple[str, str, object]
"""A unit property as D-Bus carries it: name, D-Bus signature, value."""


def slice_properties(unit: str, limits: SliceLimits, *, cgroup_version: int) -> list[Property]:
    """The properties to start transient slice `unit` with (see the module docstring)."""
    props: list[Property] = [
        ("Description", "s", f"klet {unit}"),
        ("Wants", "as", [parent_unit(unit)]),
        ("DefaultDependencies", "b", False),
        ("MemoryAccounting", "b", True),
        ("CPUAccounting", "b", True),
        ("TasksAccounting", "b", True),
        ("IOAccounting" if cgroup_version == 2 else "BlockIOAccounting", "b", True),
    ]
    return props + limit_properties(limits, cgroup_version=cgroup_version)


def limit_properties(limits: SliceLimits, *, cgroup_version: int) -> list[Property]:
    """The resource properties alone (also what an existing slice is updated with)."""
    props: list[Property] = []
    if limits.cpu_shares is not None:
        if cgroup_version == 2:
            props.append(("CPUWeight", "t", shares_to_weight(limits.cpu_shares)))
        else:
            props.append(("CPUShares", "t", limits.cpu_shares))
    period = limits.cpu_period_us or DEFAULT_CPU_PERIOD_US
    if limits.cpu_period_us is not None:
        props.append(("CPUQuotaPeriodUSec", "t", period))
    if limits.cpu_quota_us is not None and limits.cpu_quota_us > 0:
        props.append(("CPUQuotaPerSecUSec", "t", quota_per_sec_us(limits.cpu_quota_us, period)))
    else:
        props.append(("CPUQuotaPerSecUSec", "t", INFINITY))
    memory = limits.memory_limit_bytes if limits.memory_limit_bytes else INFINITY
    props.append(("MemoryMax" if cgroup_version == 2 else "MemoryLimit", "t", memory))
    pids = limits.pids_limit if limits.pids_limit is not None and limits.pids_limit > 0 else None
    props.append(("TasksMax", "t", pids if pids is not None else INFINITY))
    return props
