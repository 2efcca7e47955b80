"""The host half of the stats provider: cgroups, statfs, /proc and directory walks.

Blocking reads, called from a worker thread by `klet.stats.provider`. Each read that
fails gives None (or an empty value) rather than an error: a host without a pids
controller or a missing log directory still yields every other reading. Directory sizes
are allocated blocks with each inode counted once, as `du` measures and as upstream's
volume metrics do; statfs of a path that does not exist (yet) reads its nearest
existing parent.

A klet whose services run in containers (the Helm chart: hostPID, privileged) does not
see every host path the runtime names: CRI ImageFsInfo gives containerd's
`<root>/io.containerd.snapshotter.v1.overlayfs`, which the pod need not mount. Such a
path is read through the host's root, `/proc/1/root` (PID 1 of the host's PID
namespace, its mount namespace), before falling back to a parent: the nearest existing
parent inside the container is the container's own root filesystem, and its statfs made
image GC and eviction measure the wrong disk (`host_view`).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Protocol

from klet.cgroups import CgroupStats, slices
from klet.cgroups.detail import CgroupDetail
from klet.cgroups.fs import pid1_cgroup_prefix
from klet.cgroups.machine import mem_total_bytes, read_machine
from klet.hostfs import HOST_ROOT
from klet.model import layout
from klet.stats.cadvisor import (
    DiskStats,
    MachineFacts,
    NetDev,
    OpenFiles,
    parse_cpuinfo,
    parse_diskstats,
    parse_limits,
    parse_net_dev,
    parse_swap_total,
)
from klet.stats.model import (
    DirUsage,
    FsUsage,
    SwapSpace,
    parse_btime,
    parse_default_route,
    parse_loadavg_tasks,
    parse_swap_space,
)
from klet.stats.psi import RESOURCES, Pressure, parse_psi

__all__ = ["HOST_ROOT", "CgroupReader", "HostReader", "dir_usage", "host_view", "statfs"]

EMPTY_DIR = "kubernetes.io~empty-dir"


class CgroupReader(Protocol):
    """The cgroup reads the provider makes (`klet.cgroups.CgroupFS` provides them)."""

    def stats(self, rel: str) -> CgroupStats: ...

    def exists(self, rel: str) -> bool: ...

    def task_count(self, rel: str) -> int: ...

    def detail(self, rel: str) -> CgroupDetail: ...

    def children(self, rel: str) -> list[str]: ...

    def procs(self, rel: str) -> list[int]: ...


def dir_usage(path: Path) -> DirUsage:
    """Allocated bytes and inodes under `path`, itself included; symlinks not followed,
    hard links counted once; zero when it does not exist. An entry that vanishes during
    the walk is not counted; one that cannot be read makes the result incomplete."""
    seen: set[tuple[int, int]] = set()
    size = 0
    complete = True

    def count(p: str) -> None:
        nonlocal size, complete
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            return
        except OSError:
            complete = False
            return
        key = (st.st_dev, st.st_ino)
        if key not in seen:
            seen.add(key)
            size += st.st_blocks * 512

    def unreadable(err: OSError) -> None:
        nonlocal complete
        if not isinstance(err, FileNotFoundError):
            complete = False

    if not path.exists():
        return DirUsage(0, 0)
    count(str(path))
    for root, dirs, files in os.walk(path, onerror=unreadable):
        for name in dirs + files:
            count(os.path.join(root, name))
    return DirUsage(size, len(seen), complete)


def _existing(path: Path) -> Path:
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return probe


def host_view(path: Path, *, host_root: Path = HOST_ROOT) -> Path:
    """`path` as this process can read it: itself when it exists here, else the same
    absolute path under `host_root` when it exists there, else itself."""
    if path.exists() or not path.is_absolute():
        return path
    try:
        seen = host_root / path.relative_to("/")
        if seen.exists():
            return seen
    except OSError:  # no permission to look into PID 1's root
        pass
    return path


def statfs(path: Path, *, host_root: Path = HOST_ROOT) -> FsUsage | None:
    """statfs of the filesystem holding `path` (`host_view`); None when it cannot be
    read."""
    probe = _existing(host_view(path, host_root=host_root))
    try:
        st = os.statvfs(probe)
        device = os.stat(probe).st_dev
    except OSError:
        return None
    return FsUsage(
        blocks=st.f_blocks,
        bfree=st.f_bfree,
        bavail=st.f_bavail,
        frsize=st.f_frsize,
        files=st.f_files,
        ffree=st.f_ffree,
        device=device,
    )


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _pressure(directory: Path, name: str) -> Pressure | None:
    """The PSI files `name.format(resource)` in `directory`; None when none parses."""
    found = {r: parse_psi(_read(directory / name.format(r)) or "") for r in RESOURCES}
    pressure = Pressure(**found)
    return None if pressure.empty else pressure


POD_CGROUPS_KEPT = 4096
"""Pods whose cgroup a HostReader remembers at most (the oldest found go first)."""


class HostReader:
    """Reads this host: `cgroups` for cgroup files, `proc` for /proc, `sys` for /sys,
    `root_dir` the kubelet root (pod directories, nodefs), `pod_logs_dir` the pod log
    root, `cgroup_root` the node's cgroupRoot (pods under `<cgroupRoot>/kubepods`).

    With `psi` (the KubeletPSI gate) it reads pressure stall information: the node's
    from `<proc>/pressure/`, a cgroup's from its `*.pressure` files under `unified`, the
    cgroup v2 hierarchy's mount (None on a cgroup v1 host, whose cgroups have none)."""

    def __init__(
        self,
        *,
        cgroups: CgroupReader,
        root_dir: Path,
        pod_logs_dir: Path,
        cgroup_root: str,
        proc: Path = Path("/proc"),
        sys: Path = Path("/sys"),
        psi: bool = False,
        unified: Path | None = None,
    ) -> None:
        self.cgroups = cgroups
        self.psi = psi
        self.unified = unified
        self.sys = sys
        self.root_dir = root_dir
        self.pod_logs_dir = pod_logs_dir
        self.cgroup_root = cgroup_root
        self.proc = proc
        self._pod_cgroups: dict[str, str] = {}  # pod UID -> its cgroup, found in use

    @functools.cached_property
    def _slice_prefixes(self) -> tuple[str, ...]:
        """Where systemd's tree starts, for the systemd cgroup driver's slices: PID 1's
        own subtree first (a systemd in a container that shares the host's cgroup view
        keeps its slices there; runc then also leaves same-named directories at the root
        of the hierarchies that systemd does not manage, which hold no readings), then
        the root."""
        prefix = pid1_cgroup_prefix(self.proc).rstrip("/")
        return ("",) if not prefix else (prefix, "")

    def _existing(self, cgroupfs_names: tuple[str, ...]) -> str | None:
        """The first of the cgroupfs names that exists, as it is or (cgroupDriver:
        systemd) as its slice path; one in use (holding processes or cgroups) before an
        empty one, so an empty directory the other driver left behind (a pod's UID is
        the same on every run of its static manifest) does not hide the live one."""
        return self._find(cgroupfs_names)[0]

    def _find(self, cgroupfs_names: tuple[str, ...]) -> tuple[str | None, bool]:
        """`_existing`'s choice, and whether it is in use."""
        found = [rel for rel in cgroupfs_names if self.cgroups.exists(rel)]
        for prefix in self._slice_prefixes:
            for rel in cgroupfs_names:
                path = prefix + slices.cgroup_path(rel)
                if self.cgroups.exists(path):
                    found.append(path)
        for rel in found:
            if self._in_use(rel):
                return rel, True
        return (found[0] if found else None), False

    def _in_use(self, rel: str) -> bool:
        """Whether the cgroup holds cgroups or processes (False when it is gone)."""
        return bool(self.cgroups.children(rel) or self.cgroups.task_count(rel))

    def kubepods(self) -> CgroupStats | None:
        rel = self._existing((layout.kubepods(self.cgroup_root),))
        return None if rel is None else self.cgroups.stats(rel)

    def node_cgroups(self) -> list[str]:
        """`<cgroupRoot>/kubepods` and its QoS cgroups that exist, each in either driver's form
        (`/kubepods.slice/kubepods-burstable.slice` under the systemd driver)."""
        found = (self._existing((name,)) for name in layout.node_cgroups(self.cgroup_root))
        return [rel for rel in found if rel is not None]

    def pod_cgroup(self, uid: str) -> str | None:
        """The pod's cgroup path relative to the cgroup root, if it exists (either
        driver's form).

        One found in use is remembered, and while it still is (one directory read) it is
        the answer without probing every candidate again: the candidates are three QoS
        classes in two drivers' forms, each looked for in every hierarchy, which was over
        a third of eviction's CPU on an idle node of 110 pods (issue 42)."""
        known = self._pod_cgroups.get(uid)
        if known is not None:
            if self._in_use(known):
                return known
            self._pod_cgroups.pop(uid, None)
        rel, in_use = self._find(layout.pod_cgroup_candidates(uid, self.cgroup_root))
        if rel is not None and in_use:
            if len(self._pod_cgroups) >= POD_CGROUPS_KEPT:
                self._pod_cgroups.pop(next(iter(self._pod_cgroups), ""), None)
            self._pod_cgroups[uid] = rel
        return rel

    def processes(self, rel: str, stats: CgroupStats) -> int:
        """pids.current of the cgroup, else its tasks counted (no pids controller)."""
        return stats.pids if stats.pids is not None else self.cgroups.task_count(rel)

    def memory_total(self) -> int | None:
        return mem_total_bytes(self.proc / "meminfo") or None

    def swap(self) -> SwapSpace | None:
        """The node's swap space and how much of it is free (/proc/meminfo)."""
        return parse_swap_space(_read(self.proc / "meminfo") or "")

    def boot_ns(self) -> int | None:
        return parse_btime(_read(self.proc / "stat") or "")

    def pid_max(self) -> int | None:
        text = (_read(self.proc / "sys/kernel/pid_max") or "").strip()
        return int(text) if text.isdigit() else None

    def tasks(self) -> int | None:
        return parse_loadavg_tasks(_read(self.proc / "loadavg") or "")

    def node_pressure(self) -> Pressure | None:
        """The node's PSI (/proc/pressure); None when off or the kernel has none (built
        without PSI, or booted with psi=0: the files then fail to read)."""
        if not self.psi:
            return None
        return _pressure(self.proc / "pressure", "{}")

    def cgroup_pressure(self, rel: str) -> Pressure | None:
        """A cgroup's PSI (v2 `<resource>.pressure`); None when off, on cgroup v1, or
        when the cgroup has none of the files."""
        if not self.psi or self.unified is None:
            return None
        return _pressure(self.unified / rel.strip("/"), "{}.pressure")

    def net_dev(self, pid: int) -> dict[str, NetDev]:
        """The interfaces of `pid`'s network namespace and their counters."""
        return parse_net_dev(_read(self.proc / str(pid) / "net/dev") or "")

    # The host's network is this process's own: every service runs on it, in every
    # deployment shape (`klet up`, compose's network_mode: host, the chart's
    # hostNetwork). PID 1's would do on a plain host, but its namespace link is not
    # readable where PID 1 is not dumpable (the test machines' own init).

    def host_net_dev(self) -> dict[str, NetDev]:
        """The interfaces of the host's network namespace and their counters."""
        return parse_net_dev(_read(self.proc / "net" / "dev") or "")

    def default_interface(self) -> str | None:
        """The interface of the host's default route."""
        net = self.proc / "net"
        return parse_default_route(_read(net / "route") or "", _read(net / "ipv6_route") or "")

    def own_network(self, pid: int) -> dict[str, NetDev] | None:
        """The interfaces of `pid`'s network namespace when it is not the host's; None
        when it is the host's, or either namespace cannot be read (the process is gone,
        or lives in a PID namespace this one does not see)."""
        try:
            ns = os.readlink(self.proc / str(pid) / "ns" / "net")
            host = os.readlink(self.proc / "self" / "ns" / "net")
        except OSError:
            return None
        if ns == host:
            return None
        text = _read(self.proc / str(pid) / "net/dev")
        return None if text is None else parse_net_dev(text)

    def machine(self) -> MachineFacts:
        """The machine_* facts (read_machine, plus /proc/cpuinfo's cores and sockets);
        `error` set when /proc/cpuinfo or /proc/meminfo's MemTotal cannot be read, the
        facts cAdvisor's machine info fails without."""
        info = read_machine(self.root_dir)
        cpuinfo = _read(self.proc / "cpuinfo")
        cores, sockets = parse_cpuinfo(cpuinfo or "")
        memory = self.memory_total()
        error = None
        if cpuinfo is None:
            error = f"cannot read {self.proc / 'cpuinfo'}"
        elif memory is None:
            error = f"no MemTotal in {self.proc / 'meminfo'}"
        return MachineFacts(
            cpu_cores=info.cpus,
            physical_cores=cores,
            sockets=sockets,
            memory_bytes=memory,
            swap_bytes=parse_swap_total(_read(self.proc / "meminfo") or ""),
            boot_id=info.boot_id,
            machine_id=info.machine_id,
            system_uuid=info.system_uuid,
            kernel_version=info.kernel_version,
            os_version=info.os_image,
            error=error,
        )

    def open_files(
        self, pids: list[int], *, seen: dict[int, OpenFiles | None] | None = None
    ) -> OpenFiles | None:
        """The fd entries of the processes' /proc/<pid>/fd, and those linking to a
        socket, as cAdvisor counts them; a process whose directory cannot be read (gone,
        or not ours to read) is skipped; None when there were processes and none could
        be read. `seen` keeps each process's count for the rest of a pass (a pod's
        processes are its containers')."""
        counts = [self._process_files(pid, seen) for pid in pids]
        read = [c for c in counts if c is not None]
        if pids and not read:
            return None
        return OpenFiles(sum(c.fds for c in read), sum(c.sockets for c in read))

    def _process_files(
        self, pid: int, seen: dict[int, OpenFiles | None] | None
    ) -> OpenFiles | None:
        if seen is not None and pid in seen:
            return seen[pid]
        fd_dir = self.proc / str(pid) / "fd"
        try:
            names = os.listdir(fd_dir)
        except OSError:
            found = None
        else:
            sockets = 0
            for name in names:
                try:
                    target = os.readlink(fd_dir / name)
                except OSError:  # closed meanwhile
                    continue
                sockets += target.startswith("socket")
            found = OpenFiles(len(names), sockets)
        if seen is not None:
            seen[pid] = found
        return found

    def ulimits(self, pid: int) -> dict[str, int]:
        """The soft limits cAdvisor reads from /proc/<pid>/limits ({} when unread)."""
        return parse_limits(_read(self.proc / str(pid) / "limits") or "")

    def disk_stats(self) -> dict[str, DiskStats]:
        """/proc/diskstats by "major:minor" ({} when unread)."""
        return parse_diskstats(_read(self.proc / "diskstats") or "")

    def block_device(self, dev: str) -> str:
        """ "major:minor" → /dev/<name> as /sys/dev/block names it; itself when unknown."""
        for line in (_read(self.sys / "dev/block" / dev / "uevent") or "").splitlines():
            key, _, value = line.partition("=")
            if key == "DEVNAME" and value:
                return f"/dev/{value}"
        return dev

    def pod_log_dir(self, namespace: str, name: str, uid: str) -> Path:
        return self.pod_logs_dir / layout.pod_log_dir_name(namespace, name, uid)

    def empty_dirs(self, uid: str) -> dict[str, DirUsage]:
        """The pod's disk-backed emptyDirs; a mounted one (a tmpfs) is memory, skipped."""
        base = layout.pod_dir(self.root_dir, uid) / "volumes" / EMPTY_DIR
        try:
            entries = sorted(base.iterdir())
        except OSError:
            return {}
        return {e.name: dir_usage(e) for e in entries if e.is_dir() and not os.path.ismount(e)}
