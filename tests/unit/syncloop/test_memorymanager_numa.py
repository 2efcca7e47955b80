"""NUMA discovery (klet.syncloop.memorymanager.numa) over a fake sysfs tree: each
nodeN's MemTotal, huge pages by size (named as the apiserver names the resource) and
distances; a kernel without NUMA is one node 0 with /proc/meminfo's memory; an
unreadable meminfo is named."""

from __future__ import annotations

from pathlib import Path

import pytest
from klet.syncloop.memorymanager.numa import NUMAError, discover
from klet.syncloop.memorymanager.policy import NUMANode


def _node(root: Path, n: int, kb: int, pages: dict[int, int], distance: str) -> None:
    d = root / f"node{n}"
    d.mkdir(parents=True)
    (d / "meminfo").write_text(f"Node {n} MemTotal:       {kb} kB\nNode {n} MemFree: 1 kB\n")
    (d / "distance").write_text(distance + "\n")
    for size, count in pages.items():
        h = d / "hugepages" / f"hugepages-{size}kB"
        h.mkdir(parents=True)
        (h / "nr_hugepages").write_text(f"{count}\n")


def test_two_nodes(tmp_path: Path) -> None:
    _node(tmp_path, 0, 1024, {2048: 4, 1048576: 0}, "10 21")
    _node(tmp_path, 1, 2048, {}, "21 10")
    (tmp_path / "possible").write_text("0-1\n")
    m = discover(tmp_path)
    assert m.nodes == (
        NUMANode(0, 1024 * 1024, {"hugepages-1Gi": 0, "hugepages-2Mi": 4 * 2048 * 1024}),
        NUMANode(1, 2048 * 1024, {}),
    )
    assert m.distances == {0: [10, 21], 1: [21, 10]}


def test_no_numa_is_one_node(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       4096 kB\n")
    m = discover(tmp_path / "absent", meminfo)
    assert m.nodes == (NUMANode(0, 4096 * 1024),)


def test_a_bad_meminfo_is_named(tmp_path: Path) -> None:
    (tmp_path / "node0").mkdir()
    (tmp_path / "node0" / "meminfo").write_text("nothing\n")
    with pytest.raises(NUMAError, match="node0/meminfo: no MemTotal"):
        discover(tmp_path)
