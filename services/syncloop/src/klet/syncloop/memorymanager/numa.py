"""The machine's NUMA nodes: memory, huge pages and distances, read from sysfs.

Upstream reads these through cAdvisor's machine info (`Topology[].Memory`,
`HugePages`, `Distances`), which comes from the same files read here:
`/sys/devices/system/node/nodeN/meminfo` (`Node N MemTotal: K kB`),
`nodeN/hugepages/hugepages-<size>kB/nr_hugepages` and `nodeN/distance`. A kernel without
NUMA has no `node` directory; the machine is then one node 0 with /proc/meminfo's
memory, as cAdvisor reports it.

`discover` is the only function that reads files.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from klet.model.node import hugepage_resource
from klet.syncloop.memorymanager.policy import NUMANode

SYS_NODE = Path("/sys/devices/system/node")
_NODE = re.compile(r"node(\d+)")


class NUMAError(RuntimeError):
    """The NUMA topology could not be read; the message names the file."""


@dataclass(frozen=True)
class Machine:
    nodes: tuple[NUMANode, ...]
    distances: dict[int, list[int]]


def _mem_total(path: Path) -> int:
    try:
        for line in path.read_text().splitlines():
            parts = line.split()
            if "MemTotal:" in parts:
                i = parts.index("MemTotal:")
                return int(parts[i + 1]) * 1024
    except (OSError, ValueError, IndexError) as err:
        raise NUMAError(f"reading {path}: {err}") from err
    raise NUMAError(f"{path}: no MemTotal line")


def _hugepages(node_dir: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    pages = node_dir / "hugepages"
    if not pages.is_dir():
        return out
    for d in sorted(pages.iterdir()):
        m = re.fullmatch(r"hugepages-(\d+)kB", d.name)
        if not m:
            continue
        try:
            count = int((d / "nr_hugepages").read_text().strip())
        except (OSError, ValueError) as err:
            raise NUMAError(f"reading {d / 'nr_hugepages'}: {err}") from err
        size = int(m.group(1)) * 1024
        out[hugepage_resource(size)] = count * size
    return out


def discover(sys_node: Path = SYS_NODE, proc_meminfo: Path = Path("/proc/meminfo")) -> Machine:
    ids = []
    if sys_node.is_dir():
        ids = sorted(int(m.group(1)) for d in sys_node.iterdir() if (m := _NODE.fullmatch(d.name)))
    if not ids:
        return Machine((NUMANode(0, _mem_total(proc_meminfo)),), {0: [10]})
    nodes = []
    distances: dict[int, list[int]] = {}
    for i in ids:
        d = sys_node / f"node{i}"
        nodes.append(NUMANode(i, _mem_total(d / "meminfo"), _hugepages(d)))
        try:
            distances[i] = [int(x) for x in (d / "distance").read_text().split()]
        except (OSError, ValueError):
            distances[i] = []
    return Machine(tuple(nodes), distances)
