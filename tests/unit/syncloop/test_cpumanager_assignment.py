"""CPU lists (klet.model.cpuset), the CPU topology read from sysfs
(klet.syncloop.cpumanager.topology) and the topology-aware pick of CPUs
(klet.syncloop.cpumanager.assignment), against the cases of upstream's
cpu_assignment_test.go (TestTakeByTopologyNUMAPacked and the
distribute-cpus-across-cores cases) over the same topologies."""

from __future__ import annotations

from pathlib import Path

import pytest
from klet.model.cpuset import CPUSetError, format_cpus, parse_cpus
from klet.syncloop.cpumanager.assignment import NotEnoughCPUs, take_by_topology
from klet.syncloop.cpumanager.topology import CPUInfo, CPUTopology, TopologyError, discover

# upstream's topoSingleSocketHT: 8 CPUs, 4 cores, CPU i and i+4 share a core
SINGLE_HT = CPUTopology({c: CPUInfo(core=c % 4, socket=0, numa=0) for c in range(8)})
# upstream's topoDualSocketHT: 12 CPUs, 6 cores, even CPUs on socket/NUMA 0, odd on 1
DUAL_HT = CPUTopology({c: CPUInfo(core=c % 6, socket=c % 2, numa=c % 2) for c in range(12)})
# this machine: 2 CPUs, 2 cores, one socket and NUMA node
TWO = CPUTopology({0: CPUInfo(0, 0, 0), 1: CPUInfo(1, 0, 0)})


@pytest.mark.parametrize(
    ("text", "cpus", "written"),
    [
        ("", set(), ""),
        ("0", {0}, "0"),
        ("0-3,8", {0, 1, 2, 3, 8}, "0-3,8"),
        ("5,1,2", {1, 2, 5}, "1-2,5"),
        (" 0-1 ", {0, 1}, "0-1"),
        ("0,6,2,8,4,10,1,7", {0, 1, 2, 4, 6, 7, 8, 10}, "0-2,4,6-8,10"),
    ],
)
def test_cpu_lists_parse_and_write_as_upstream(text: str, cpus: set[int], written: str) -> None:
    assert parse_cpus(text) == cpus
    assert format_cpus(cpus) == written


@pytest.mark.parametrize("text", ["1.3", "asd", "3-1", "0-", "-1", "0,,1"])
def test_a_bad_cpu_list_names_itself(text: str) -> None:
    with pytest.raises(CPUSetError, match="invalid CPU list"):
        parse_cpus(text)


UPSTREAM_CASES = [
    # (topology, available, count, spread, expected)
    (SINGLE_HT, {0, 1, 2, 3, 4, 5, 6, 7}, 0, False, set()),
    (SINGLE_HT, {0, 1, 2, 3, 4, 5, 6, 7}, 1, False, {0}),
    (SINGLE_HT, {1, 3, 5, 6, 7}, 1, False, {6}),
    (SINGLE_HT, {0, 1, 2, 3, 4, 5, 6, 7}, 2, False, {0, 4}),
    (SINGLE_HT, {0, 1, 2, 3, 4, 5, 6, 7}, 8, False, set(range(8))),
    (SINGLE_HT, {0, 1, 2, 3, 6}, 2, False, {2, 6}),
    (DUAL_HT, set(range(12)), 6, False, {0, 2, 4, 6, 8, 10}),
    (DUAL_HT, {1, 2, 3, 4, 5, 7, 8, 9, 10, 11}, 1, False, {2}),
    (DUAL_HT, set(range(12)), 8, False, {0, 6, 2, 8, 4, 10, 1, 7}),
    (SINGLE_HT, set(range(8)), 3, True, {0, 1, 2}),
    (DUAL_HT, set(range(12)), 2, True, {0, 2}),
    (DUAL_HT, set(range(12)), 3, True, {0, 2, 4}),
    (DUAL_HT, set(range(12)), 6, True, {0, 2, 4, 6, 8, 10}),
    (DUAL_HT, set(range(12)), 8, True, {0, 2, 4, 6, 8, 10, 1, 3}),
    (TWO, {0, 1}, 1, False, {0}),
    (TWO, {1}, 1, False, {1}),
]


@pytest.mark.parametrize(("topo", "available", "count", "spread", "expected"), UPSTREAM_CASES)
def test_takes_what_upstream_takes(
    topo: CPUTopology, available: set[int], count: int, spread: bool, expected: set[int]
) -> None:
    assert take_by_topology(topo, frozenset(available), count, spread=spread) == expected


def test_more_than_available_is_upstreams_error() -> None:
    with pytest.raises(NotEnoughCPUs) as err:
        take_by_topology(SINGLE_HT, frozenset({0, 2, 4, 6}), 5)
    assert str(err.value) == (
        "not enough cpus available to satisfy request: requested=5, available=4"
    )


def _cpu(root: Path, cpu: int, *, package: int, siblings: str, node: int | None) -> None:
    d = root / f"cpu{cpu}" / "topology"
    d.mkdir(parents=True)
    (d / "physical_package_id").write_text(f"{package}\n")
    (d / "thread_siblings_list").write_text(f"{siblings}\n")
    if node is not None:
        (root / f"cpu{cpu}" / f"node{node}").mkdir()


def test_discover_reads_sockets_cores_and_numa_nodes_from_sysfs(tmp_path: Path) -> None:
    (tmp_path / "online").write_text("0-3\n")
    _cpu(tmp_path, 0, package=0, siblings="0,2", node=0)
    _cpu(tmp_path, 1, package=1, siblings="1,3", node=1)
    _cpu(tmp_path, 2, package=0, siblings="0,2", node=0)
    _cpu(tmp_path, 3, package=1, siblings="1,3", node=1)
    topo = discover(tmp_path)
    assert topo.details == {
        0: CPUInfo(core=0, socket=0, numa=0),
        1: CPUInfo(core=1, socket=1, numa=1),
        2: CPUInfo(core=0, socket=0, numa=0),
        3: CPUInfo(core=1, socket=1, numa=1),
    }
    assert (topo.num_cores, topo.num_sockets, topo.num_numa_nodes) == (2, 2, 2)
    assert topo.cpus_per_core() == 2


def test_discover_without_numa_links_puts_every_cpu_on_node_0(tmp_path: Path) -> None:
    (tmp_path / "online").write_text("0-1\n")
    _cpu(tmp_path, 0, package=0, siblings="0", node=None)
    _cpu(tmp_path, 1, package=0, siblings="1", node=None)
    assert discover(tmp_path) == TWO


def test_discover_names_the_file_it_could_not_read(tmp_path: Path) -> None:
    (tmp_path / "online").write_text("0\n")
    with pytest.raises(TopologyError, match="physical_package_id"):
        discover(tmp_path)
