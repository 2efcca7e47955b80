"""NUMA-aligned device picks (klet.syncloop.devices.allocation.by_affinity and the
device manager's `affinity`): with the topology manager's hint a container's devices
come from the hinted NUMA nodes first, then devices without topology, then the rest;
without a hint the plugin's order stands."""

from __future__ import annotations

from pathlib import Path

from klet.model.devices import Device, PluginOptions
from klet.syncloop.devices.allocation import by_affinity

from tests.unit.syncloop.test_device_manager import FOO, FakePlugin, manager, pod

NUMA = {"a0": (0,), "b1": (1,), "c": (), "d1": (1,)}


def test_by_affinity_orders_aligned_then_without_topology_then_the_rest() -> None:
    healthy = ["a0", "b1", "c", "d1"]
    assert by_affinity(healthy, NUMA, None) == healthy
    assert by_affinity(healthy, NUMA, 0b10) == ["b1", "d1", "c", "a0"]
    assert by_affinity(healthy, NUMA, 0b01) == ["a0", "c", "b1", "d1"]


async def test_the_manager_picks_on_the_hinted_node(tmp_path: Path) -> None:
    m, _ = manager(tmp_path)
    plugin = FakePlugin()
    m.connected(FOO, plugin, PluginOptions())
    m.listed(FOO, plugin, [Device(d, "Healthy", n) for d, n in NUMA.items()])
    m.affinity = lambda uid, name: 0b10 if uid == "hinted" else None
    p = pod("hinted", 2)
    await m.container_options(p, p["spec"]["containers"][0])
    assert plugin.allocated == [["b1", "d1"]]
    q = pod("plain", 1)
    await m.container_options(q, q["spec"]["containers"][0])
    assert plugin.allocated[-1] == ["a0"]
