"""Host adapter for pod resources: creates pod cgroups and detects the host's limits.

Before RunPodSandbox the pod cgroup is created in every cgroup v1 hierarchy (or the v2
unified one) and its CPU shares, CFS quota, memory limit and pids.max (podPidsLimit) are
written, as upstream's pod container manager does; doing it again is harmless. Above
them, `<cgroupRoot>/kubepods` gets the node's pod limits (node allocatable with
`enforceNodeAllocatable: [pods]`, else capacity: CPU shares, memory, pids.max) and the
besteffort QoS cgroup the minimum CPU shares, as upstream's node and QoS container
managers write them (`NodeCgroupLimits`, from klet.model.node.pods_cgroup_amounts);
`update_qos` gives the burstable one the active Burstable pods' CPU requests as shares.
`PodCgroups` is the cgroup driver as syncloop sees it: `CgroupfsPodCgroups` here,
`SystemdPodCgroups` (systemdcgroups.py) for `cgroupDriver: systemd`.
`node_limits` detects once the node's memory capacity and the lowest oom_score_adj this
host accepts (hosts that refuse negative values get containers' values clamped, with a
single warning).
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from klet.cgroups import CgroupFS
from klet.cgroups.fs import V1_CONTROLLERS, detect
from klet.cgroups.machine import mem_total_bytes
from klet.model.layout import node_cgroups
from klet.syncloop.containers.resources import (
    MIN_SHARES,
    NodeLimits,
    PodResources,
    milli_cpu_to_shares,
)

log = logging.getLogger(__name__)

OOM_SCORE_ADJ = Path("/proc/self/oom_score_adj")


def oom_score_adj_floor(path: Path = OOM_SCORE_ADJ) -> int:
    """-1000 when this process may lower its oom_score_adj; else its current value.

    Writing -1 to our own oom_score_adj is the probe: a host that refuses negative values
    answers with an error, and then nothing below our own value is accepted either.
    """
    try:
        current = int(path.read_text().strip())
    except (OSError, ValueError):
        return 0
    if current < 0:
        return -1000
    try:
        path.write_text("-1")
    except OSError:
        log.warning(
            "this host refuses negative oom_score_adj: container values are clamped",
            extra={"floor": current},
        )
        return current
    try:
        path.write_text(str(current))
    except OSError:  # pragma: no cover - raising it back is always allowed
        pass
    return -1000


@functools.cache
def _detected() -> tuple[int, int]:
    return mem_total_bytes(), oom_score_adj_floor()


def node_limits(settings: object) -> NodeLimits:
    """NodeLimits for this host; `cpu_cfs_quota(_period)` and `pod_pids_limit` are read
    from settings if present."""
    capacity, floor = _detected()
    return NodeLimits(
        memory_capacity_bytes=capacity,
        cpu_cfs_quota=bool(getattr(settings, "cpu_cfs_quota", True)),
        cpu_cfs_quota_period_s=float(getattr(settings, "cpu_cfs_quota_period", 0.1)),
        oom_score_adj_floor=floor,
        pod_pids_limit=int(getattr(settings, "pod_pids_limit", -1)),
    )


def _write(path: Path, text: str, problems: list[str]) -> None:
    try:
        if path.exists() and path.read_text().strip() == text:
            return
        path.write_text(text)
    except OSError as err:
        problems.append(f"{path}: {err.strerror or err}")


def _v1_files(res: PodResources) -> dict[str, dict[str, str]]:
    cpu = {"cpu.shares": str(res.cpu_shares)}
    if res.cpu_period is not None:
        cpu["cpu.cfs_period_us"] = str(res.cpu_period)
    cpu["cpu.cfs_quota_us"] = str(res.cpu_quota if res.cpu_quota is not None else -1)
    memory = {"memory.limit_in_bytes": str(res.memory_limit_bytes or -1)}
    return {"cpu": cpu, "memory": memory, "pids": {"pids.max": _pids_max(res)}}


def _pids_max(res: PodResources) -> str:
    # "max" when unlimited, so lowering podPidsLimit back to -1 lifts an earlier cap.
    return str(res.pids_limit) if res.pids_limit is not None else "max"


def shares_to_weight(shares: int) -> int:
    """cgroup v2 cpu.weight for v1 cpu.shares, as runc converts them."""
    return 1 + ((shares - 2) * 9999) // 262142


def _v2_files(res: PodResources) -> dict[str, str]:
    period = res.cpu_period or 100000
    quota = res.cpu_quota if res.cpu_quota is not None and res.cpu_quota > 0 else None
    return {
        "cpu.weight": str(shares_to_weight(res.cpu_shares)),
        "cpu.max": f"{quota if quota is not None else 'max'} {period}",
        "memory.max": str(res.memory_limit_bytes or "max"),
        "pids.max": _pids_max(res),
    }


def _copy_cpuset(d: Path, problems: list[str]) -> None:
    """A new v1 cpuset cgroup is empty and would refuse tasks: inherit the parent's."""
    for name in ("cpuset.cpus", "cpuset.mems"):
        try:
            current = (d / name).read_text().strip() if (d / name).exists() else ""
            if not current:
                _write(d / name, (d.parent / name).read_text().strip(), problems)
        except OSError as err:
            problems.append(f"{d / name}: {err.strerror or err}")


def pod_cgroup_exists(parent: str, root: Path = Path("/sys/fs/cgroup")) -> bool:
    """The pod cgroup is there already (so `ensure_pod_cgroup` updates it rather than
    creating it: the operation_type of kubelet_cgroup_manager_duration_seconds)."""
    rel = parent.strip("/")
    if detect(root) == 2:
        return (root / rel).is_dir()
    return any((root / ctrl / rel).is_dir() for ctrl in V1_CONTROLLERS)


def ensure_pod_cgroup(
    parent: str, res: PodResources, root: Path = Path("/sys/fs/cgroup")
) -> list[str]:
    """Create the pod cgroup and write its limits; returns the problems met (none is fatal)."""
    return ensure_cgroup(parent, _v1_files(res), _v2_files(res), root=root)


def ensure_cgroup(
    parent: str,
    v1_files: dict[str, dict[str, str]],
    v2_files: dict[str, str],
    root: Path = Path("/sys/fs/cgroup"),
) -> list[str]:
    """Create the cgroup `parent` (and those above it) and write the files of the
    hierarchy in use, by v1 controller or the v2 names; returns the problems met."""
    rel = parent.strip("/")
    problems: list[str] = []
    if detect(root) == 2:
        parts = Path(rel).parts
        for i in range(len(parts)):
            d = root.joinpath(*parts[:i])
            os.makedirs(root.joinpath(*parts[: i + 1]), exist_ok=True)
            for ctrl in ("cpu", "memory", "pids"):
                try:
                    (d / "cgroup.subtree_control").write_text(f"+{ctrl}")
                except OSError:
                    pass
        for name, text in v2_files.items():
            _write(root / rel / name, text, problems)
        return problems
    files = v1_files
    for ctrl in V1_CONTROLLERS:
        base = root / ctrl
        if not base.is_dir():
            continue
        parts = Path(rel).parts
        for i in range(len(parts)):
            d = base.joinpath(*parts[: i + 1])
            try:
                d.mkdir(exist_ok=True)
            except OSError as err:
                problems.append(f"{d}: {err.strerror or err}")
                break
            if ctrl == "cpuset":
                _copy_cpuset(d, problems)
        for name, text in files.get(ctrl, {}).items():
            _write(base / rel / name, text, problems)
    return problems


@dataclass(frozen=True)
class NodeCgroupLimits:
    """What the cgroups above the pods hold (klet.model.node.pods_cgroup_amounts):
    `<cgroupRoot>/kubepods` the CPU shares, memory and process limit of the node's pods
    together; the besteffort QoS cgroup the minimum CPU shares, as upstream's QoS
    container manager sets it."""

    cgroup_root: str
    cpu_shares: int
    memory_bytes: int
    pids: int | None

    @classmethod
    def of(cls, cgroup_root: str, amounts: dict[str, int]) -> NodeCgroupLimits:
        return cls(
            cgroup_root=cgroup_root,
            cpu_shares=milli_cpu_to_shares(amounts["cpu"]),
            memory_bytes=amounts["memory"],
            pids=amounts.get("pid"),
        )

    def kubepods_files(self) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
        """The v1 files by controller and the v2 files of `<cgroupRoot>/kubepods`."""
        pids = str(self.pids) if self.pids is not None else "max"
        v1 = {
            "cpu": {"cpu.shares": str(self.cpu_shares)},
            "memory": {"memory.limit_in_bytes": str(self.memory_bytes)},
            "pids": {"pids.max": pids},
        }
        v2 = {
            "cpu.weight": str(shares_to_weight(self.cpu_shares)),
            "memory.max": str(self.memory_bytes),
            "pids.max": pids,
        }
        return v1, v2


def besteffort_files() -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """The besteffort QoS cgroup's files: MinShares (cpu.weight 1 on v2)."""
    return {"cpu": {"cpu.shares": str(MIN_SHARES)}}, {
        "cpu.weight": str(shares_to_weight(MIN_SHARES))
    }


def ensure_node_cgroups(limits: NodeCgroupLimits, root: Path) -> list[str]:
    """Create `<cgroupRoot>/kubepods` and the besteffort QoS cgroup with their limits
    (rewriting only what differs); returns the problems met. A memory limit below what
    the pods use already is refused by the kernel (EBUSY): a problem each time until
    eviction brings the usage down, as upstream retries."""
    kubepods, burstable, besteffort = node_cgroups(limits.cgroup_root)
    problems = ensure_cgroup(kubepods, *limits.kubepods_files(), root=root)
    problems += ensure_cgroup(besteffort, *besteffort_files(), root=root)
    problems += ensure_cgroup(burstable, {}, {}, root=root)
    return problems


class PodCgroups(Protocol):
    """The cgroup driver as syncloop uses it, by the pod's cgroupfs name
    (`/kubepods/burstable/pod<uid>`, klet.model.layout): cgroupfs or systemd."""

    def cri_parent(self, name: str) -> str:
        """The cgroup parent handed to CRI for the pod's sandbox and containers."""
        ...

    async def ensure(self, name: str, res: PodResources) -> tuple[bool, list[str]]:
        """Create the pod cgroup (or update its limits); returns whether it existed and
        the problems met (none is fatal)."""
        ...

    async def remove(self, name: str) -> list[str]:
        """Remove the pod cgroup of a pod that is gone; returns what stayed."""
        ...

    async def update_qos(self, burstable_shares: int) -> list[str]:
        """Set the burstable QoS cgroup's CPU shares; returns the problems met."""
        ...


class CgroupfsPodCgroups:
    """`cgroupDriver: cgroupfs`: the directories under /sys/fs/cgroup, written directly."""

    def __init__(self, cgroups: CgroupFS, node: NodeCgroupLimits | None = None) -> None:
        self.cgroups = cgroups
        self.node = node

    def cri_parent(self, name: str) -> str:
        return name

    async def ensure(self, name: str, res: PodResources) -> tuple[bool, list[str]]:
        # The node's cgroups first, every time: the files are compared before they are
        # written, and a limit the kernel refused earlier is tried again.
        problems = [] if self.node is None else ensure_node_cgroups(self.node, self.cgroups.root)
        existed = pod_cgroup_exists(name, root=self.cgroups.root)
        return existed, problems + ensure_pod_cgroup(name, res, root=self.cgroups.root)

    async def update_qos(self, burstable_shares: int) -> list[str]:
        _, burstable, _ = node_cgroups(self.node.cgroup_root if self.node is not None else "/")
        v1 = {"cpu": {"cpu.shares": str(burstable_shares)}}
        v2 = {"cpu.weight": str(shares_to_weight(burstable_shares))}
        return ensure_cgroup(burstable, v1, v2, root=self.cgroups.root)

    async def remove(self, name: str) -> list[str]:
        return self.cgroups.remove(name)
