"""cgroup filesystem access for v1 (one hierarchy per controller) and v2 (unified).

Detection: a cgroup2 mount at the root (`/sys/fs/cgroup` with `cgroup.controllers`) is
v2; otherwise controller directories under it are v1 (these hosts mount v1 plus an
empty unified hierarchy, which counts as v1). Stats follow upstream's definitions:
working set = usage minus inactive_file. Removal only ever `rmdir`s, which the kernel
refuses for a cgroup that still has processes or children, so it cannot kill anything.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from klet.cgroups.detail import CgroupDetail, read_detail_v1, read_detail_v2

V1_CONTROLLERS = (
    "cpu",
    "cpuacct",
    "cpuset",
    "memory",
    "pids",
    "blkio",
    "devices",
    "freezer",
    "hugetlb",
    "systemd",
)


# At or above this a memory or swap limit is none (v1 writes 2^63 rounded to a page),
# as upstream's stats helper reads them.
_UNLIMITED = 1 << 62


@dataclass(frozen=True)
class CgroupStats:
    """The readings /stats/summary and eviction take of a cgroup. Swap, as cAdvisor reads
    it for upstream's Summary: usage v1 memory.stat total_swap (with swap accounting) /
    v2 memory.swap.current; limit v1 memory.memsw.limit_in_bytes (memory and swap
    together, as cAdvisor's spec takes it) / v2 memory.swap.max, None when unlimited.
    None: not readable."""

    memory_usage_bytes: int | None
    memory_working_set_bytes: int | None
    cpu_usage_ns: int | None
    pids: int | None
    swap_usage_bytes: int | None = None
    swap_limit_bytes: int | None = None


def detect(root: Path = Path("/sys/fs/cgroup")) -> int:
    """1 or 2."""
    return 2 if (root / "cgroup.controllers").exists() else 1


PROC_SELF_CGROUP = Path("/proc/self/cgroup")


def swap_control(root: Path = Path("/sys/fs/cgroup"), self_cgroup: Path = PROC_SELF_CGROUP) -> str:
    """How this host keeps containers out of swap: "memsw", "swap.max" or "" (see
    syncloop's NodeLimits.swap_control), found as
    upstream's swapControllerAvailable: v1's memory.memsw.limit_in_bytes at the memory
    root (the kernel has swap accounting), v2's memory.swap.max in our own cgroup."""
    if detect(root) == 1:
        return "memsw" if (root / "memory" / "memory.memsw.limit_in_bytes").exists() else ""
    try:
        own = next(
            (line[3:] for line in self_cgroup.read_text().splitlines() if line.startswith("0::")),
            "/",
        )
    except OSError:
        return ""
    return "swap.max" if (root / own.strip().lstrip("/") / "memory.swap.max").exists() else ""


def hugetlb_available(root: Path = Path("/sys/fs/cgroup")) -> bool:
    """Whether this host's cgroups have the hugetlb controller: a mounted v1 hierarchy
    (these hosts leave it unmounted, an empty directory), or on v2 a root that offers it.
    Huge page limits go to the runtime only where it does: runc refuses to start a
    container with a limit it cannot set."""
    if detect(root) == 2:
        try:
            return "hugetlb" in (root / "cgroup.controllers").read_text().split()
        except OSError:
            return False
    return os.path.ismount(root / "hugetlb")


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _limit(value: int | None) -> int | None:
    return None if value is None or value < 0 or value >= _UNLIMITED else value


def _read_kv(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if value.strip().isdigit():
                out[key] = int(value)
    except OSError:
        pass
    return out


def _v2_root_usage(meminfo: Path) -> int | None:
    """The v2 root cgroup has no memory.current: its usage is MemTotal - MemFree, as runc
    computes it (inactive_file still comes from the root's memory.stat)."""
    fields: dict[str, int] = {}
    try:
        for line in meminfo.read_text().splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                fields[key.strip()] = int(parts[0]) * 1024  # the kernel's "kB" are KiB
    except OSError:
        return None
    if "MemTotal" not in fields or "MemFree" not in fields:
        return None
    return max(fields["MemTotal"] - fields["MemFree"], 0)


class CgroupFS:
    def __init__(self, root: Path = Path("/sys/fs/cgroup"), *, proc: Path = Path("/proc")) -> None:
        self.root = root
        self.proc = proc
        self.version = detect(root)

    def _dirs(self, rel: str) -> list[Path]:
        rel = rel.strip("/")
        if self.version == 2:
            return [self.root / rel]
        return [self.root / c / rel for c in V1_CONTROLLERS if (self.root / c).is_dir()]

    def stats(self, rel: str) -> CgroupStats:
        rel = rel.strip("/")
        if self.version == 2:
            d = self.root / rel
            usage = _read_int(d / "memory.current")
            if usage is None and not rel:
                usage = _v2_root_usage(self.proc / "meminfo")
            inactive = _read_kv(d / "memory.stat").get("inactive_file", 0)
            cpu = _read_kv(d / "cpu.stat").get("usage_usec")
            return CgroupStats(
                usage,
                None if usage is None else max(usage - inactive, 0),
                None if cpu is None else cpu * 1000,
                _read_int(d / "pids.current"),
                swap_usage_bytes=_read_int(d / "memory.swap.current"),
                swap_limit_bytes=_limit(_read_int(d / "memory.swap.max")),
            )
        mem = self.root / "memory" / rel
        usage = _read_int(mem / "memory.usage_in_bytes")
        stat = _read_kv(mem / "memory.stat")
        inactive = stat.get("total_inactive_file", stat.get("inactive_file", 0))
        return CgroupStats(
            usage,
            None if usage is None else max(usage - inactive, 0),
            _read_int(self.root / "cpuacct" / rel / "cpuacct.usage"),
            _read_int(self.root / "pids" / rel / "pids.current"),
            swap_usage_bytes=stat.get("total_swap"),
            swap_limit_bytes=_limit(_read_int(mem / "memory.memsw.limit_in_bytes")),
        )

    def detail(self, rel: str) -> CgroupDetail:
        """Every reading `/metrics/cadvisor` serves of the cgroup (detail.py)."""
        rel = rel.strip("/")
        if self.version == 2:
            root_usage = _v2_root_usage(self.proc / "meminfo") if not rel else None
            return read_detail_v2(self.root, rel, root_usage=root_usage)
        return read_detail_v1(self.root, rel)

    def children(self, rel: str) -> list[str]:
        """The names of the cgroup's child cgroups (v1: in the memory hierarchy)."""
        base = self.root / ("" if self.version == 2 else "memory") / rel.strip("/")
        try:
            return sorted(e.name for e in os.scandir(base) if e.is_dir(follow_symlinks=False))
        except OSError:
            return []

    def procs(self, rel: str) -> list[int]:
        """The processes in the cgroup and its children (their cgroup.procs), in the
        order found: the cgroup's own first."""
        base = self.root / ("" if self.version == 2 else "memory") / rel.strip("/")
        out: list[int] = []
        for root, _dirs, files in os.walk(base):
            if "cgroup.procs" in files:
                try:
                    text = (Path(root) / "cgroup.procs").read_text()
                except OSError:
                    continue
                out.extend(int(line) for line in text.split() if line.isdigit())
        return out

    def task_count(self, rel: str) -> int:
        """Tasks in the cgroup and its children, counted from their task lists: what
        stands in for pids.current on a host without the pids controller."""
        base = self.root / ("" if self.version == 2 else "memory") / rel.strip("/")
        name = "cgroup.threads" if self.version == 2 else "tasks"
        total = 0
        for root, _dirs, files in os.walk(base):
            if name in files:
                try:
                    text = (Path(root) / name).read_text()
                except OSError:
                    continue
                total += sum(1 for line in text.splitlines() if line.strip())
        return total

    def exists(self, rel: str) -> bool:
        return any(d.is_dir() for d in self._dirs(rel))

    def remove(self, rel: str) -> list[str]:
        """rmdir the cgroup (and empty children) in every hierarchy; returns what stayed."""
        left: list[str] = []
        for d in self._dirs(rel):
            if not d.is_dir():
                continue
            for sub, dirnames, _files in os.walk(d, topdown=False):
                for name in dirnames:
                    try:
                        os.rmdir(os.path.join(sub, name))
                    except OSError:
                        pass
            try:
                os.rmdir(d)
            except OSError as err:
                left.append(f"{d}: {err.strerror}")
        return left


def pid1_cgroup_prefix(proc: Path = Path("/proc"), controller: str = "") -> str:
    """Where systemd's cgroup tree starts in this process's view of /sys/fs/cgroup: `/` on
    a host, `/docker/<id>` for a systemd in a container sharing the host's cgroup
    namespace (PID 1's own cgroup without `/init.scope`, as runc finds it). With a v1
    `controller`, where it starts in that controller's hierarchy (runc places a systemd
    unit's cgroups there for the controllers systemd does not manage, such as hugetlb)."""
    try:
        lines = (proc / "1/cgroup").read_text().splitlines()
    except OSError:
        return "/"
    by_controller: dict[str, str] = {}
    for line in lines:
        fields = line.split(":", 2)
        if len(fields) == 3:
            for name in fields[1].split(",") or [""]:
                by_controller[name] = fields[2]
    path = (
        by_controller.get(controller)
        if controller
        else by_controller.get("name=systemd") or by_controller.get("")
    ) or "/"
    if path.endswith("/init.scope"):
        path = path[: -len("/init.scope")]
    return path or "/"
