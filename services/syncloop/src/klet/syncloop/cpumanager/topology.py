"""The node's CPU topology: which core, socket and NUMA node each online CPU is on.

Upstream's topology.Discover builds this from cAdvisor's machine info; klet reads the
same sysfs files cAdvisor reads (`/sys/devices/system/cpu`): the online CPUs, each
CPU's `topology/physical_package_id` (socket) and `topology/thread_siblings_list`
(its core, named as upstream does by the lowest CPU of the core's threads), and the
`nodeN` link under the CPU directory (its NUMA node; 0 when the kernel has no NUMA).

`CPUTopology` is pure data with the queries the allocator needs; `discover` is the
one function that reads files.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from klet.model.cpuset import CPUSet, parse_cpus

SYS_CPU = Path("/sys/devices/system/cpu")


class TopologyError(RuntimeError):
    """The CPU topology could not be read; the message names the file."""


@dataclass(frozen=True)
class CPUInfo:
    core: int
    socket: int
    numa: int


@dataclass(frozen=True)
class CPUTopology:
    details: Mapping[int, CPUInfo]
    """Every online CPU by ID."""

    def cpus(self) -> CPUSet:
        return frozenset(self.details)

    @property
    def num_cpus(self) -> int:
        return len(self.details)

    @property
    def num_cores(self) -> int:
        return len({(i.socket, i.core) for i in self.details.values()})

    @property
    def num_sockets(self) -> int:
        return len({i.socket for i in self.details.values()})

    @property
    def num_numa_nodes(self) -> int:
        return len({i.numa for i in self.details.values()})

    def cpus_per_core(self) -> int:
        return self.num_cpus // self.num_cores if self.num_cores else 0

    def cpus_per_socket(self) -> int:
        return self.num_cpus // self.num_sockets if self.num_sockets else 0

    def core_of(self, cpu: int) -> int:
        return self.details[cpu].core

    def in_cores(self, cores: Iterable[int]) -> CPUSet:
        wanted = set(cores)
        return frozenset(c for c, i in self.details.items() if i.core in wanted)

    def in_sockets(self, sockets: Iterable[int]) -> CPUSet:
        wanted = set(sockets)
        return frozenset(c for c, i in self.details.items() if i.socket in wanted)

    def in_numa(self, nodes: Iterable[int]) -> CPUSet:
        wanted = set(nodes)
        return frozenset(c for c, i in self.details.items() if i.numa in wanted)

    def keep_only(self, cpus: Iterable[int]) -> CPUTopology:
        keep = set(cpus)
        return CPUTopology({c: i for c, i in self.details.items() if c in keep})


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError as err:
        raise TopologyError(f"reading the CPU topology: {path}: {err.strerror}") from err


def discover(root: Path = SYS_CPU) -> CPUTopology:
    """The topology of the online CPUs under `root` (a sysfs cpu directory)."""
    details: dict[int, CPUInfo] = {}
    for cpu in sorted(parse_cpus(_read(root / "online"))):
        d = root / f"cpu{cpu}"
        socket = int(_read(d / "topology" / "physical_package_id"))
        siblings = parse_cpus(_read(d / "topology" / "thread_siblings_list"))
        nodes = sorted(int(p.name[4:]) for p in d.glob("node*") if p.name[4:].isdigit())
        details[cpu] = CPUInfo(
            core=min(siblings) if siblings else cpu,
            socket=socket,
            numa=nodes[0] if nodes else 0,
        )
    if not details:
        raise TopologyError(f"reading the CPU topology: {root / 'online'} lists no CPU")
    return CPUTopology(details)
