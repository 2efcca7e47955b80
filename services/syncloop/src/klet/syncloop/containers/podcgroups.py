"""Host adapter for pod resources: creates pod cgroups and detects the host's limits.

Before RunPodSandbox the pod cgroup is created in every cgroup v1 hierarchy (or the v2
unified one) and its CPU shares, CFS quota, memory limit and pids.max (podPidsLimit) are
written, as upstream's pod container manager does; doing it again is harmless. Above
them, `<cgroupRoot>/kubepods` gets the node's pod limits (node allocatable with
`enforceNodeAllocatable: [pods]`, else capacity: CPU shares, memory, pids.max) and the
besteffort QoS cgroup the minimum CPU shares, as upstream's node and QoS container
managers write them (`NodeCgroupLimits`, from klet.model.node.pods_cgroup_amounts);
`update_qos` gives the burstable one the active Burstable pods' CPU requests as shares.
Huge pages (hugetlb, where the host has the controller: none of the limits is sent or
written where it has not, since runc would refuse every container): each pod cgroup its pods'
`hugepages-<size>` limits, 0 for the sizes not asked for; `kubepods` the node's
(allocatable) huge pages; the QoS cgroups no limit, as upstream's QoS manager. A v1
hierarchy the host does not mount (an empty directory under a read-only /sys/fs/cgroup,
as hugetlb is on these hosts) is skipped.
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
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from klet.cgroups import CgroupFS
from klet.cgroups.fs import V1_CONTROLLERS, detect, hugetlb_available, swap_control
from klet.cgroups.machine import mem_total_bytes, parse_hugepage_dir
from klet.model.layout import node_cgroups
from klet.model.units import parse_quantity
from klet.syncloop.model.resources import (
    MIN_SHARES,
    NodeLimits,
    PodResources,
    hugepage_size_name,
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


HUGEPAGES = Path("/sys/kernel/mm/hugepages")


def hugepage_sizes(root: Path = HUGEPAGES) -> tuple[int, ...]:
    """The huge page sizes (bytes) the kernel offers, whether or not any are reserved."""
    try:
        names = [e.name for e in root.iterdir()]
    except OSError:
        return ()
    return tuple(sorted(s for s in map(parse_hugepage_dir, names) if s is not None))


@functools.cache
def _detected() -> tuple[int, int, tuple[int, ...], str, int]:
    sizes = hugepage_sizes() if hugetlb_available() else ()
    return mem_total_bytes(), oom_score_adj_floor(), sizes, swap_control(), detect()


def node_limits(settings: object) -> NodeLimits:
    """NodeLimits for this host; `cpu_cfs_quota(_period)` and `pod_pids_limit` are read
    from settings if present."""
    capacity, floor, sizes, swap, version = _detected()
    return NodeLimits(
        memory_capacity_bytes=capacity,
        cpu_cfs_quota=bool(getattr(settings, "cpu_cfs_quota", True)),
        cpu_cfs_quota_period_s=float(getattr(settings, "cpu_cfs_quota_period", 0.1)),
        oom_score_adj_floor=floor,
        pod_pids_limit=int(getattr(settings, "pod_pids_limit", -1)),
        hugepage_sizes=sizes,
        swap_control=swap,
        oom_group=version == 2 and getattr(settings, "single_process_oom_kill", None) is not True,
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
    return {
        "cpu": cpu,
        "memory": memory,
        "pids": {"pids.max": _pids_max(res)},
        "hugetlb": hugetlb_v1(res.hugepage_limits),
    }


def hugetlb_v1(limits: Iterable[tuple[str, int | None]]) -> dict[str, str]:
    """hugetlb.<size>.limit_in_bytes by size; None is no limit (-1)."""
    return {
        f"hugetlb.{size}.limit_in_bytes": str(-1 if limit is None else limit)
        for size, limit in limits
    }


def hugetlb_v2(limits: Iterable[tuple[str, int | None]]) -> dict[str, str]:
    """hugetlb.<size>.max by size; None is "max"."""
    return {f"hugetlb.{size}.max": "max" if limit is None else str(limit) for size, limit in limits}


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
        **hugetlb_v2(res.hugepage_limits),
    }


def _copy_cpuset(d: Path, problems: list[str]) -> None:
    """A new v1 cpuset cgroup is empty and would refuse tasks: inherit the parent's.

    `ensure_cgroup` calls it for each directory it makes and for the cgroup it ensures,
    not for a parent that was there already: that one got its CPUs when it was made,
    and the node's cgroups above the pods are each ensured as a cgroup of their own
    (`ensure_node_cgroups`, which repairs one left empty). In a burst of 10 the copies
    at every level of every new pod's path were 11% of syncloop's samples, the event
    loop blocked on cgroupfs reads (issue 42)."""
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


def _read_words(path: Path) -> set[str]:
    try:
        return set(path.read_text().split())
    except OSError:
        return set()


def _mounted(base: Path) -> bool:
    """Whether v1 hierarchy directory `base` is one. Under a mounted cgroup root
    (/sys/fs/cgroup, a tmpfs) every hierarchy is a mount point: an empty directory there
    is a controller the host does not mount (hugetlb here). The trees of unit tests are
    plain directories."""
    return os.path.ismount(base) or not os.path.ismount(base.parent)


def ensure_cgroup(
    parent: str,
    v1_files: dict[str, dict[str, str]],
    v2_files: dict[str, str],
    root: Path = Path("/sys/fs/cgroup"),
    controllers: tuple[str, ...] = (),
) -> list[str]:
    """Create the cgroup `parent` (and those above it) and write the files of the
    hierarchy in use, by v1 controller or the v2 names; returns the problems met. On v1,
    `controllers` limits the hierarchies touched (all by default)."""
    rel = parent.strip("/")
    problems: list[str] = []
    if detect(root) == 2:
        parts = Path(rel).parts
        for i in range(len(parts)):
            d = root.joinpath(*parts[:i])
            os.makedirs(root.joinpath(*parts[: i + 1]), exist_ok=True)
            for ctrl in ("cpu", "memory", "pids", "hugetlb"):
                try:
                    (d / "cgroup.subtree_control").write_text(f"+{ctrl}")
                except OSError:
                    pass
        hugetlb = "hugetlb" in _read_words(root / "cgroup.controllers")
        for name, text in v2_files.items():
            if hugetlb or not name.startswith("hugetlb."):
                _write(root / rel / name, text, problems)
        return problems
    files = v1_files
    for ctrl in controllers or V1_CONTROLLERS:
        base = root / ctrl
        if not base.is_dir() or not _mounted(base):
            continue
        parts = Path(rel).parts
        for i in range(len(parts)):
            d = base.joinpath(*parts[: i + 1])
            try:
                d.mkdir()
                made = True
            except FileExistsError:
                made = False
            except OSError as err:
                problems.append(f"{d}: {err.strerror or err}")
                break
            if ctrl == "cpuset" and (made or i == len(parts) - 1):
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
    hugepages: tuple[tuple[str, int], ...] = ()
    """The pods' huge pages by size ("2MB"), bytes."""

    @classmethod
    def of(cls, cgroup_root: str, amounts: dict[str, int]) -> NodeCgroupLimits:
        pages = {
            parse_quantity(name.removeprefix("hugepages-")): amount
            for name, amount in amounts.items()
            if name.startswith("hugepages-")
        }
        return cls(
            cgroup_root=cgroup_root,
            cpu_shares=milli_cpu_to_shares(amounts["cpu"]),
            memory_bytes=amounts["memory"],
            pids=amounts.get("pid"),
            hugepages=tuple((hugepage_size_name(int(size)), pages[size]) for size in sorted(pages)),
        )

    def kubepods_files(self) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
        """The v1 files by controller and the v2 files of `<cgroupRoot>/kubepods`."""
        pids = str(self.pids) if self.pids is not None else "max"
        v1 = {
            "cpu": {"cpu.shares": str(self.cpu_shares)},
            "memory": {"memory.limit_in_bytes": str(self.memory_bytes)},
            "pids": {"pids.max": pids},
            "hugetlb": hugetlb_v1(self.hugepages),
        }
        v2 = {
            "cpu.weight": str(shares_to_weight(self.cpu_shares)),
            "memory.max": str(self.memory_bytes),
            "pids.max": pids,
            **hugetlb_v2(self.hugepages),
        }
        return v1, v2

    def qos_hugetlb(self) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
        """The QoS cgroups' hugetlb files: no limit of their own (kubepods holds it)."""
        unbounded = [(size, None) for size, _ in self.hugepages]
        return {"hugetlb": hugetlb_v1(unbounded)}, hugetlb_v2(unbounded)


def besteffort_files(
    node: NodeCgroupLimits | None = None,
) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """The besteffort QoS cgroup's files: MinShares (cpu.weight 1 on v2), and no
    hugetlb limit of its own."""
    v1, v2 = node.qos_hugetlb() if node is not None else ({}, {})
    return {"cpu": {"cpu.shares": str(MIN_SHARES)}, **v1}, {
        "cpu.weight": str(shares_to_weight(MIN_SHARES)),
        **v2,
    }


def ensure_node_cgroups(limits: NodeCgroupLimits, root: Path) -> list[str]:
    """Create `<cgroupRoot>/kubepods` and the besteffort QoS cgroup with their limits
    (rewriting only what differs); returns the problems met. A memory limit below what
    the pods use already is refused by the kernel (EBUSY): a problem each time until
    eviction brings the usage down, as upstream retries."""
    kubepods, burstable, besteffort = node_cgroups(limits.cgroup_root)
    problems = ensure_cgroup(kubepods, *limits.kubepods_files(), root=root)
    problems += ensure_cgroup(besteffort, *besteffort_files(limits), root=root)
    problems += ensure_cgroup(burstable, *limits.qos_hugetlb(), root=root)
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


ENSURE_RECHECK_S = 60.0
"""A pod cgroup ensured with these limits less than this ago is not written again, and
the node's cgroups above the pods are ensured at most once in this time, whichever pod
asks: each pass reads and rewrites a dozen cgroup files (the memory limit of an
unlimited pod reads back as the kernel's maximum, cpuset files are copied level by
level), which made up a quarter of syncloop's CPU in a 250-pod burst, where every pod
is synced several times; the node's three cgroups were still checked before every new
pod's, a third of the cgroup work of a burst of 10 (issue 42). Upstream's kubelet only
creates a pod cgroup that is missing on each sync, and its QoS container manager
updates the node's every minute."""


class CgroupfsPodCgroups:
    """`cgroupDriver: cgroupfs`: the directories under /sys/fs/cgroup, written directly."""

    def __init__(
        self,
        cgroups: CgroupFS,
        node: NodeCgroupLimits | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cgroups = cgroups
        self.node = node
        self.clock = clock
        self._ensured: dict[str, tuple[PodResources, float]] = {}
        self._node_ensured: float | None = None

    def cri_parent(self, name: str) -> str:
        return name

    async def ensure(self, name: str, res: PodResources) -> tuple[bool, list[str]]:
        now = self.clock()
        seen = self._ensured.get(name)
        if (
            seen is not None
            and seen[0] == res
            and 0 <= now - seen[1] < ENSURE_RECHECK_S
            and pod_cgroup_exists(name, root=self.cgroups.root)
        ):
            return True, []
        # The node's cgroups first: the files are compared before they are written, and
        # a limit the kernel refused earlier is tried again.
        problems = self._ensure_node(now)
        existed = pod_cgroup_exists(name, root=self.cgroups.root)
        problems += ensure_pod_cgroup(name, res, root=self.cgroups.root)
        if problems:
            self._ensured.pop(name, None)
        else:
            self._ensured[name] = (res, now)
        return existed, problems

    def _ensure_node(self, now: float) -> list[str]:
        """The node's cgroups, ensured unless they were less than ENSURE_RECHECK_S ago
        without a problem."""
        last = self._node_ensured
        if self.node is None or (last is not None and 0 <= now - last < ENSURE_RECHECK_S):
            return []
        problems = ensure_node_cgroups(self.node, self.cgroups.root)
        self._node_ensured = None if problems else now
        return problems

    async def update_qos(self, burstable_shares: int) -> list[str]:
        _, burstable, _ = node_cgroups(self.node.cgroup_root if self.node is not None else "/")
        v1 = {"cpu": {"cpu.shares": str(burstable_shares)}}
        v2 = {"cpu.weight": str(shares_to_weight(burstable_shares))}
        return ensure_cgroup(burstable, v1, v2, root=self.cgroups.root)

    async def remove(self, name: str) -> list[str]:
        self._ensured.pop(name, None)
        return self.cgroups.remove(name)
