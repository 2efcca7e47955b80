"""Node and pod usage, collected once for every consumer.

`StatsProvider` (provider.py) reads the runtime and the host (`HostReader`, host.py)
into a `Snapshot` (model.py, pure); status-reporter's `/stats/summary` and eviction's
signals are both derived from it. `klet.testbed.fakes.stats` holds a fake cgroup reader.
Pressure stall information (KubeletPSI) is parsed in psi.py.
"""

from klet.stats.host import CgroupReader, HostReader, dir_usage
from klet.stats.model import (
    ContainerStats,
    DirUsage,
    FsUsage,
    NodeStats,
    PodStats,
    RuntimeFs,
    Snapshot,
    latest_attempts,
    running_containers,
)
from klet.stats.provider import StatsProvider, StatsRuntime
from klet.stats.psi import Pressure, PSIData, PSIStats, parse_psi

__all__ = [
    "CgroupReader",
    "ContainerStats",
    "DirUsage",
    "FsUsage",
    "HostReader",
    "NodeStats",
    "PSIData",
    "PSIStats",
    "PodStats",
    "Pressure",
    "RuntimeFs",
    "Snapshot",
    "StatsProvider",
    "StatsRuntime",
    "dir_usage",
    "latest_attempts",
    "parse_psi",
    "running_containers",
]
