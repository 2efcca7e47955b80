"""Eviction signals: what is measured, in what shape, and the arithmetic from raw readings.

The names are upstream's (`pkg/kubelet/eviction/api`), so a KubeletConfiguration written
for the upstream kubelet names the same signals. An `Observation` is one signal's
available amount against its capacity (bytes, inodes or PIDs); `PodUsage` is what the
ranking needs of one pod. The `SignalSource` protocol is the seam between the manager
and the host: `klet.eviction.hostsignals.HostSignalSource` reads the real host, unit
tests pass their own.

The arithmetic lives here as pure functions so it is tested on recorded samples rather
than on whatever host runs the tests, restating upstream's definitions:

- memory.available = node memory capacity (MemTotal) − working set of the root cgroup;
  allocatableMemory.available = node allocatable memory (capacity − kubeReserved −
  systemReserved, the kubepods cgroup's budget) − working set of the kubepods cgroup.
  The working set (usage − inactive_file, from cgroup v1 or v2 files) is read by
  `klet.cgroups.CgroupFS`. Never below zero.
- {nodefs,imagefs,containerfs}.available / .inodesFree = statfs free-to-unprivileged
  blocks and free inodes against the filesystem's size and inode count.
- pid.available = /proc/sys/kernel/pid_max − the number of tasks (the total of
  /proc/loadavg's fourth field, which upstream prefers to sysinfo's truncated count).

The readings themselves are collected by `klet.stats`, once for eviction and the
Summary API alike.

This module does no I/O and imports nothing that does: decision modules import it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

__all__ = [
    "SIGNAL_CONDITION",
    "ContainerSample",
    "Observation",
    "Observations",
    "PodUsage",
    "Signal",
    "SignalSource",
    "available_observation",
    "fs_observations",
    "pid_observation",
    "pod_usage",
]


class Signal(StrEnum):
    """An eviction signal, spelled as upstream spells it in evictionHard and friends."""

    MEMORY_AVAILABLE = "memory.available"
    ALLOCATABLE_MEMORY_AVAILABLE = "allocatableMemory.available"
    NODEFS_AVAILABLE = "nodefs.available"
    NODEFS_INODES_FREE = "nodefs.inodesFree"
    IMAGEFS_AVAILABLE = "imagefs.available"
    IMAGEFS_INODES_FREE = "imagefs.inodesFree"
    CONTAINERFS_AVAILABLE = "containerfs.available"
    CONTAINERFS_INODES_FREE = "containerfs.inodesFree"
    PID_AVAILABLE = "pid.available"


# The node condition a met threshold of the signal raises (upstream signalToNodeCondition).
SIGNAL_CONDITION: Mapping[Signal, str] = {
    Signal.MEMORY_AVAILABLE: "MemoryPressure",
    Signal.ALLOCATABLE_MEMORY_AVAILABLE: "MemoryPressure",
    Signal.NODEFS_AVAILABLE: "DiskPressure",
    Signal.NODEFS_INODES_FREE: "DiskPressure",
    Signal.IMAGEFS_AVAILABLE: "DiskPressure",
    Signal.IMAGEFS_INODES_FREE: "DiskPressure",
    Signal.CONTAINERFS_AVAILABLE: "DiskPressure",
    Signal.CONTAINERFS_INODES_FREE: "DiskPressure",
    Signal.PID_AVAILABLE: "PIDPressure",
}


@dataclass(frozen=True)
class Observation:
    """One signal's reading: `available` of `capacity` (bytes, inodes or PIDs), taken at
    `time` (seconds since the epoch). `available` may be 0 but is never negative."""

    available: int
    capacity: int
    time: float


Observations = dict[Signal, Observation]


@dataclass(frozen=True)
class PodUsage:
    """What one running pod uses, as the ranking and the local-storage checks need it.

    memory_working_set: the pod cgroup's working set, bytes.
    ephemeral_storage: writable layers + logs + disk-backed emptyDirs, bytes (the sum of
      the three fields below it).
    processes: tasks in the pod cgroup (pids.current).
    containers: container name → memory working set, bytes (CRI stats, else the
      container's own cgroup).
    writable_layer / logs: bytes over all containers; container_storage: container name →
      its writable layer + its logs (what a container's ephemeral-storage limit covers).
    volumes: emptyDir name → bytes used, for disk-backed emptyDirs only (a `medium:
      Memory` emptyDir is a tmpfs and counts as memory, as upstream).
    inodes: inodes used by the writable layers, logs and emptyDirs.
    """

    uid: str
    namespace: str
    name: str
    memory_working_set: int
    ephemeral_storage: int
    processes: int
    containers: Mapping[str, int] = field(default_factory=dict)
    writable_layer: int = 0
    logs: int = 0
    volumes: Mapping[str, int] = field(default_factory=dict)
    container_storage: Mapping[str, int] = field(default_factory=dict)
    inodes: int = 0


class SignalSource(Protocol):
    """Measures the node: every signal it can observe, and the usage of each running pod
    keyed by pod UID. A signal that cannot be measured is absent, not zero. `pods`
    limits the pods measured to those UIDs (None: every running pod; empty: none)."""

    async def observe(
        self, *, pods: Collection[str] | None = None
    ) -> tuple[Observations, dict[str, PodUsage]]: ...


# -- arithmetic ------------------------------------------------------------------------


def available_observation(capacity: int, used: int, *, now: float) -> Observation:
    """capacity − used as an Observation, clamped at zero."""
    return Observation(available=max(capacity - used, 0), capacity=capacity, time=now)


def fs_observations(
    *, blocks: int, bavail: int, frsize: int, files: int, ffree: int, now: float
) -> tuple[Observation, Observation | None]:
    """(bytes, inodes) of a statfs result; the inode observation is None for a filesystem
    that reports no inode count (it has no inode limit to run out of)."""
    size = Observation(available=bavail * frsize, capacity=blocks * frsize, time=now)
    if files <= 0:
        return size, None
    return size, Observation(available=ffree, capacity=files, time=now)


def pid_observation(pid_max: int, tasks: int, *, now: float) -> Observation:
    """pid.available: pid_max − running tasks, against pid_max."""
    return Observation(available=max(pid_max - tasks, 0), capacity=pid_max, time=now)


@dataclass(frozen=True)
class ContainerSample:
    """One container's readings (CRI stats and its log directory); bytes and inodes."""

    memory_working_set: int = 0
    writable_layer: int = 0
    writable_inodes: int = 0
    logs: int = 0
    log_inodes: int = 0


def pod_usage(
    *,
    uid: str,
    namespace: str,
    name: str,
    cgroup_working_set: int | None,
    processes: int,
    containers: Mapping[str, ContainerSample],
    volumes: Mapping[str, tuple[int, int]],
    pod_logs: tuple[int, int] | None = None,
) -> PodUsage:
    """Assemble a pod's usage from its readings.

    cgroup_working_set: the pod cgroup's working set; None (no pod cgroup, e.g. with
      cgroupsPerQOS off) falls back to the sum of the containers' working sets.
    volumes: disk-backed emptyDir name → (bytes, inodes).
    pod_logs: (bytes, inodes) of the pod's whole log directory, which also holds the
      logs of containers no longer running; None sums the containers' logs instead.
    """
    memory = cgroup_working_set
    if memory is None:
        memory = sum(c.memory_working_set for c in containers.values())
    writable = sum(c.writable_layer for c in containers.values())
    logs, log_inodes = (
        pod_logs
        if pod_logs is not None
        else (
            sum(c.logs for c in containers.values()),
            sum(c.log_inodes for c in containers.values()),
        )
    )
    volume_bytes = {v: used for v, (used, _inodes) in volumes.items()}
    inodes = (
        sum(c.writable_inodes for c in containers.values())
        + log_inodes
        + sum(i for _used, i in volumes.values())
    )
    return PodUsage(
        uid=uid,
        namespace=namespace,
        name=name,
        memory_working_set=memory,
        ephemeral_storage=writable + logs + sum(volume_bytes.values()),
        processes=processes,
        containers={n: c.memory_working_set for n, c in containers.items()},
        writable_layer=writable,
        logs=logs,
        volumes=volume_bytes,
        container_storage={n: c.writable_layer + c.logs for n, c in containers.items()},
        inodes=inodes,
    )
