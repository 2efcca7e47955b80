"""Node allocatable on the reserved cgroups: `enforceNodeAllocatable` with
`system-reserved` (`kube-reserved`) writes `systemReserved` (`kubeReserved`) onto the
cgroup `systemReservedCgroup` (`kubeReservedCgroup`), as upstream's node container
manager does at start: CPU shares from the reserved CPU, the memory limit, pids.max from
the reserved `pid`, each only when reserved; the `-compressible` forms write the CPU
shares alone.

klet never creates these cgroups: they hold the processes of the system or of the
Kubernetes daemons, and belong to whoever started those. A missing one refuses
syncloop's start (`missing_reserved_cgroups`, checked by every replica at start, before
it touches the bus, so that refusal has no Event). The leader then writes the limits
(`enforce_reserved`, root task `node-allocatable`) and records upstream's Events on the
Node: `NodeAllocatableEnforced` per cgroup, or `FailedNodeAllocatableEnforcement`
naming the cgroup and the cause (a limit the kernel refuses, a cgroup removed since the
start check), after which syncloop exits, as upstream's kubelet fails its start.

Trade-offs: the cgroup must exist in the v1 hierarchies klet writes to (cpu, memory,
pids; cpu alone for the compressible forms), where upstream's cgroupfs manager also
wants cpuacct, cpuset and the rest it knows; a cgroup directory is created by whoever
owns it, so asking for hierarchies nothing is written to would refuse working set-ups
for no effect. Reserved huge pages on an enforced cgroup are refused by configuration
validation.

With `cgroupDriver: systemd` the cgroup names a unit systemd has loaded, as upstream's
systemd cgroup manager reads it: the last part of the path (`/system.slice` is
`system.slice`). It must be active (the start refuses otherwise), and its limits go
through systemd's `SetUnitProperties` at run time (`SliceWriter`: `CPUShares`/
`CPUWeight`, `MemoryLimit`/`MemoryMax`, `TasksMax`, only those reserved), so systemd
keeps them and applies them to the cgroups it owns, where a write under its feet would
be undone at its next reload.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from klet.bus.eventqueue import EventQueue
from klet.cgroups import SystemdError, SystemdUnavailable
from klet.cgroups.fs import detect
from klet.cgroups.slices import Property
from klet.config.kubelet import KubeletConfiguration
from klet.model.node import reservation
from klet.syncloop.containers.podcgroups import shares_to_weight
from klet.syncloop.model.resources import milli_cpu_to_shares

log = logging.getLogger(__name__)

CGROUP_FS = Path("/sys/fs/cgroup")
ENFORCED = "NodeAllocatableEnforced"  # upstream's SuccessfulNodeAllocatableEnforcement
FAILED = "FailedNodeAllocatableEnforcement"

NodeEvent = Callable[[str, str, str], None]
"""Record an Event on the Node: (type, reason, message)."""


class ReservedCgroupFailed(RuntimeError):
    """A reserved cgroup's limits could not be enforced; syncloop stops, as upstream's
    kubelet fails its container manager's start."""


@dataclass(frozen=True)
class _Key:
    key: str  # the enforceNodeAllocatable entry
    field: str  # the cgroup's configuration field
    whose: str  # "system" or "kube"
    compressible: bool


# In upstream's order: system, kube, then the compressible forms.
_KEYS = (
    _Key("system-reserved", "systemReservedCgroup", "system", False),
    _Key("kube-reserved", "kubeReservedCgroup", "kube", False),
    _Key("system-reserved-compressible", "systemReservedCgroup", "system", True),
    _Key("kube-reserved-compressible", "kubeReservedCgroup", "kube", True),
)


@dataclass(frozen=True)
class ReservedCgroup:
    """One enforcement: the cgroup (a cgroupfs path) and the amounts written on it
    (`cpu` millicores, `memory` bytes, `pid` a count; only those reserved)."""

    key: str
    field: str
    name: str
    amounts: Mapping[str, int]
    whose: str = "system"
    compressible: bool = False

    def hierarchies(self) -> tuple[str, ...]:
        """The cgroup v1 hierarchies this enforcement writes to, so the cgroup must be in."""
        return ("cpu",) if self.compressible else ("cpu", "memory", "pids")

    def files(self) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
        """The v1 files by controller and the v2 files."""
        v1: dict[str, dict[str, str]] = {}
        v2: dict[str, str] = {}
        if "cpu" in self.amounts:
            shares = milli_cpu_to_shares(self.amounts["cpu"])
            v1["cpu"] = {"cpu.shares": str(shares)}
            v2["cpu.weight"] = str(shares_to_weight(shares))
        if "memory" in self.amounts:
            v1["memory"] = {"memory.limit_in_bytes": str(self.amounts["memory"])}
            v2["memory.max"] = str(self.amounts["memory"])
        if "pid" in self.amounts:
            v1["pids"] = {"pids.max": str(self.amounts["pid"])}
            v2["pids.max"] = str(self.amounts["pid"])
        return v1, v2

    def enforced(self) -> str:
        """The Normal Event's message (upstream's, compressible or not)."""
        return f"Updated limits on {self.whose} reserved cgroup {self.name}"

    def failed(self, cause: str) -> str:
        """The Warning Event's message (upstream's)."""
        what = f"{self.whose.capitalize()} Reserved{' Compressible' if self.compressible else ''}"
        return f'Failed to enforce {what} Cgroup Limits on "{self.name}": {cause}'


def reserved_cgroups(cfg: KubeletConfiguration) -> tuple[ReservedCgroup, ...]:
    """The reserved cgroups `enforceNodeAllocatable` asks for, in upstream's order."""
    out: list[ReservedCgroup] = []
    for k in _KEYS:
        if k.key not in cfg.enforce_node_allocatable:
            continue
        system = k.whose == "system"
        reserved = cfg.system_reserved if system else cfg.kube_reserved
        amounts = reservation({}, kube_reserved=reserved, system_reserved={}, eviction_hard={})
        wanted = ("cpu",) if k.compressible else ("cpu", "memory", "pid")
        out.append(
            ReservedCgroup(
                key=k.key,
                field=k.field,
                name=cfg.system_reserved_cgroup if system else cfg.kube_reserved_cgroup,
                amounts={r: a for r, a in amounts.items() if r in wanted},
                whose=k.whose,
                compressible=k.compressible,
            )
        )
    return tuple(out)


def absent(rc: ReservedCgroup, root: Path = CGROUP_FS) -> str:
    """Why `rc`'s cgroup cannot be written ("" when it exists where it must)."""
    rel = rc.name.strip("/")
    if detect(root) == 2:
        return "" if (root / rel).is_dir() else f"{rc.name} does not exist"
    mounted = [h for h in rc.hierarchies() if (root / h).is_dir()]
    missing = [h for h in mounted if not (root / h / rel).is_dir()]
    if not missing:
        return ""
    if len(missing) == len(mounted):
        return f"{rc.name} does not exist"
    return f"{rc.name} does not exist in the cgroup v1 {', '.join(missing)} hierarchy"


def missing_reserved_cgroups(
    cgroups: Sequence[ReservedCgroup], root: Path = CGROUP_FS
) -> list[str]:
    """Start-up refusals, one per missing reserved cgroup, naming the field and the key."""
    out: list[str] = []
    for rc in cgroups:
        why = absent(rc, root)
        line = f"{rc.field}: {why} (enforceNodeAllocatable has {rc.key})"
        if why and line not in out:  # a cgroup both enforced and compressible: once
            out.append(line)
    return out


def _write(path: Path, text: str) -> str:
    """Write `text` unless the file holds it already; the problem met, or ""."""
    try:
        if path.read_text().strip() == text:
            return ""
        path.write_text(text)
    except OSError as err:
        return f"{path}: {err.strerror or err}"
    return ""


def write_existing(rc: ReservedCgroup, root: Path = CGROUP_FS) -> list[str]:
    """Write `rc`'s limits on its cgroup, which must exist (nothing is created);
    returns the problems met."""
    why = absent(rc, root)
    if why:
        return [why]
    rel = rc.name.strip("/")
    v1, v2 = rc.files()
    if detect(root) == 2:
        written = [_write(root / rel / name, text) for name, text in v2.items()]
    else:
        written = [
            _write(root / ctrl / rel / name, text)
            for ctrl, files in v1.items()
            for name, text in files.items()
        ]
    return [p for p in written if p]


Writer = Callable[[ReservedCgroup], Awaitable[list[str]]]
"""Write a reserved cgroup's limits; returns the problems met (the cgroupfs driver's
`write_existing`, or a `SliceWriter`)."""


class UnitProperties(Protocol):
    """What `SliceWriter` needs of systemd (klet.cgroups.systemd.Systemd)."""

    async def unit_active_state(self, unit: str) -> str: ...

    async def set_properties(self, unit: str, properties: list[Property]) -> None: ...


class SliceWriter:
    """`cgroupDriver: systemd`: the reserved cgroup is a unit systemd has loaded; its
    limits are set with SetUnitProperties (see the module docstring)."""

    def __init__(self, systemd: UnitProperties, *, cgroup_version: int) -> None:
        self.systemd = systemd
        self.cgroup_version = cgroup_version

    @staticmethod
    def unit(rc: ReservedCgroup) -> str:
        return rc.name.rstrip("/").rsplit("/", 1)[-1]

    def properties(self, rc: ReservedCgroup) -> list[Property]:
        """Only the reserved resources: what is not reserved keeps its value."""
        v2 = self.cgroup_version == 2
        props: list[Property] = []
        if "cpu" in rc.amounts:
            shares = milli_cpu_to_shares(rc.amounts["cpu"])
            props.append(
                ("CPUWeight", "t", shares_to_weight(shares)) if v2 else ("CPUShares", "t", shares)
            )
        if "memory" in rc.amounts:
            props.append(("MemoryMax" if v2 else "MemoryLimit", "t", rc.amounts["memory"]))
        if "pid" in rc.amounts:
            props.append(("TasksMax", "t", rc.amounts["pid"]))
        return props

    async def absent(self, rc: ReservedCgroup) -> str:
        """Why `rc`'s unit cannot be written ("" when it is active)."""
        unit = self.unit(rc)
        try:
            state = await self.systemd.unit_active_state(unit)
        except (SystemdError, SystemdUnavailable) as err:
            return f"{rc.name}: cannot ask systemd about {unit}: {err}"
        if state == "active":
            return ""
        return f"{rc.name} does not exist (systemd unit {unit}: {state or 'not loaded'})"

    async def __call__(self, rc: ReservedCgroup) -> list[str]:
        why = await self.absent(rc)
        if why:
            return [why]
        try:
            await self.systemd.set_properties(self.unit(rc), self.properties(rc))
        except (SystemdError, SystemdUnavailable) as err:
            return [f"{self.unit(rc)}: {err}"]
        return []


async def missing_reserved_slices(
    cgroups: Sequence[ReservedCgroup], writer: SliceWriter
) -> list[str]:
    """`missing_reserved_cgroups` for the systemd driver: each unit must be active."""
    out: list[str] = []
    for rc in cgroups:
        why = await writer.absent(rc)
        line = f"{rc.field}: {why} (enforceNodeAllocatable has {rc.key})"
        if why and line not in out:
            out.append(line)
    return out


def cgroupfs_writer(root: Path = CGROUP_FS) -> Writer:
    async def write(rc: ReservedCgroup) -> list[str]:
        return write_existing(rc, root)

    return write


async def enforce_reserved(
    cgroups: Sequence[ReservedCgroup], *, emit: NodeEvent, write: Writer
) -> str:
    """Write each reserved cgroup's limits in turn, recording an Event for each; stops at
    the first failure and returns its message ("" when all were enforced)."""
    for rc in cgroups:
        log.info(
            "enforcing node allocatable on a reserved cgroup",
            extra={"cgroup": rc.name, "key": rc.key, "limits": dict(rc.amounts)},
        )
        problems = await write(rc)
        if problems:
            message = rc.failed("; ".join(problems))
            emit("Warning", FAILED, message)
            return message
        emit("Normal", ENFORCED, rc.enforced())
    return ""


async def run_enforcement(
    cgroups: Sequence[ReservedCgroup],
    *,
    emit: NodeEvent,
    events: EventQueue,
    root: Path = CGROUP_FS,
    write: Writer | None = None,
    publish_timeout_s: float = 5.0,
) -> None:
    """The leader's root task: enforce once (with `write`, by default the cgroupfs
    driver's under `root`), then idle. On a failure it waits (at most
    `publish_timeout_s`) for the Warning to leave `events` for the bus, then raises
    ReservedCgroupFailed, which ends syncloop."""
    failure = await enforce_reserved(
        cgroups, emit=emit, write=write if write is not None else cgroupfs_writer(root)
    )
    if not failure:
        await asyncio.Event().wait()
        return
    log.error(failure)
    try:
        async with asyncio.timeout(publish_timeout_s):
            await events.published()
    except TimeoutError:
        log.warning("the failure's Event is not on the bus yet; stopping all the same")
    raise ReservedCgroupFailed(failure)
