"""syncloop's PodResources source (klet.syncloop.podresources) over a real device
manager: List names the active pods (every pod the sources gave with
KubeletPodResourcesListUseActivePods off) and each listed container's devices as the
manager holds them; a manager restarted from its checkpoint answers the same at once;
Get finds a pod that is no longer active; allocatable devices are the connected
plugins' healthy ones; no device manager, no devices; CPU IDs are the CPU manager's
exclusive assignment, allocatable CPUs its policy's (none without a CPU manager); memory
is the Static memory manager's blocks per container and its allocatable bytes per NUMA
node and type (none without a memory manager); dynamic resources are the prepared
claims each container names, per driver and device with upstream's CDI lists, none for
a container whose claim the manager does not hold or with the
KubeletPodResourcesDynamicResources gate off."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from klet.model.devices import Device, PluginOptions
from klet.model.dra import PreparedDevice
from klet.model.podresources import (
    ClaimResource,
    ContainerDevices,
    ContainerMemory,
    ContainerResources,
    DynamicResource,
    PodResources,
)
from klet.model.types import JSON
from klet.syncloop.devices import checkpoint
from klet.syncloop.devices.manager import DeviceManager
from klet.syncloop.dra.claiminfo import ClaimInfo
from klet.syncloop.memorymanager.state import Block, MemoryState, MemoryTable, NodeState
from klet.syncloop.podresources import PodResourcesView

FOO = "example.com/foo"


class Table:
    async def put(self, key: str, value: Any) -> None:
        pass


class Plugin:
    async def preferred(self, available: Any, must_include: Any, size: int) -> list[str]:
        return []

    async def allocate(self, device_ids: Any) -> bytes:
        return b""

    async def pre_start(self, device_ids: Any) -> None:
        pass


def pod(name: str, uid: str) -> JSON:
    return {
        "metadata": {"name": name, "namespace": "default", "uid": uid},
        "spec": {"containers": [{"name": "main"}]},
    }


class Pods:
    def __init__(self, active: list[JSON], finished: list[JSON]) -> None:
        self.active, self.finished = active, finished

    def active_pods(self) -> list[JSON]:
        return self.active

    def all_pods(self) -> list[JSON]:
        return self.active + self.finished


def manager(directory: Path) -> DeviceManager:
    return DeviceManager(directory, table=Table(), decode=lambda b: None)  # type: ignore[arg-type,return-value]


def holding(directory: Path) -> DeviceManager:
    m = manager(directory)
    m.load()
    plugin = Plugin()
    m.connected(FOO, plugin, PluginOptions())
    m.listed(
        FOO,
        plugin,
        [
            Device("foo-0", "Healthy", (0,)),
            Device("foo-1", "Healthy"),
            Device("foo-2", "Unhealthy"),
        ],
    )
    m.held[("u1", "main", FOO)] = checkpoint.PodDevicesEntry(
        pod_uid="u1", container_name="main", resource_name=FOO, device_ids={0: ["foo-0"]}
    )
    m.held[("u2", "main", FOO)] = checkpoint.PodDevicesEntry(
        pod_uid="u2", container_name="main", resource_name=FOO, device_ids={-1: ["foo-1"]}
    )
    m.save()
    return m


def answer(name: str, *devices: ContainerDevices) -> PodResources:
    return PodResources(name, "default", (ContainerResources("main", devices=devices),))


def test_list_names_active_pods_and_their_devices(tmp_path: Path) -> None:
    pods = Pods([pod("a", "u1")], [pod("b", "u2")])
    view = PodResourcesView(pods=pods, devices=holding(tmp_path))
    assert view.list_pods() == [answer("a", ContainerDevices(FOO, "foo-0", 0))]
    every = PodResourcesView(pods=pods, devices=holding(tmp_path), use_active_pods=False)
    assert every.list_pods() == [
        answer("a", ContainerDevices(FOO, "foo-0", 0)),
        answer("b", ContainerDevices(FOO, "foo-1")),
    ]
    # Get finds a pod that is not active any more, as upstream's pod manager does.
    assert view.get_pod("default", "b") == answer("b", ContainerDevices(FOO, "foo-1"))
    assert view.get_pod("default", "c") is None
    assert view.get_enabled()
    assert not PodResourcesView(pods=pods, devices=None, get_gate=False).get_enabled()


def test_a_restarted_manager_answers_from_its_checkpoint(tmp_path: Path) -> None:
    holding(tmp_path)
    view = PodResourcesView(pods=Pods([pod("a", "u1")], []), devices=manager(tmp_path))
    assert view.list_pods() == [answer("a", ContainerDevices(FOO, "foo-0", 0))]


def test_allocatable_is_the_healthy_devices_of_connected_plugins(tmp_path: Path) -> None:
    m = holding(tmp_path)
    view = PodResourcesView(pods=Pods([], []), devices=m)
    assert view.allocatable().devices == (
        ContainerDevices(FOO, "foo-0", 0),
        ContainerDevices(FOO, "foo-1"),
    )
    assert view.allocatable().cpu_ids == ()
    m.disconnected(FOO, m.resources[FOO].plugin)  # type: ignore[arg-type]
    assert view.allocatable().devices == ()


def test_without_a_device_manager_nothing_is_held(tmp_path: Path) -> None:
    view = PodResourcesView(pods=Pods([pod("a", "u1")], []), devices=None)
    assert view.list_pods() == [answer("a")]
    assert view.allocatable().devices == ()


class CPUs:
    """The CPU manager's static policy on 4 CPUs with CPU 0 reserved."""

    def exclusive(self, uid: str, name: str) -> frozenset[int]:
        return frozenset({3, 2}) if (uid, name) == ("u1", "main") else frozenset()

    def allocatable(self) -> frozenset[int]:
        return frozenset({3, 1, 2})


def test_exclusive_cpus_and_allocatable_cpus_come_from_the_cpu_manager(tmp_path: Path) -> None:
    view = PodResourcesView(
        pods=Pods([pod("a", "u1"), pod("b", "u2")], []), devices=None, cpus=CPUs()
    )
    assert view.list_pods() == [
        PodResources("a", "default", (ContainerResources("main", cpu_ids=(2, 3)),)),
        answer("b"),
    ]
    assert view.allocatable().cpu_ids == (1, 2, 3)


class Memory:
    """The Static memory manager's state: a container's memory on NUMA node 0 and its
    2Mi huge pages across nodes 1 and 0; node 1 has no huge pages allocatable."""

    def __init__(self) -> None:
        def table(allocatable: int) -> MemoryTable:
            return MemoryTable(
                total=allocatable, system_reserved=0, allocatable=allocatable, reserved=0, free=0
            )

        self.state = MemoryState(
            policy="Static",
            machine={
                1: NodeState(memory_map={"memory": table(4 << 30), "hugepages-2Mi": table(0)}),
                0: NodeState(
                    memory_map={"memory": table(3 << 30), "hugepages-2Mi": table(8 << 20)}
                ),
            },
            entries={
                "u1": {
                    "main": [
                        Block(numa_affinity=[0], type="memory", size=1 << 30),
                        Block(numa_affinity=[1, 0], type="hugepages-2Mi", size=4 << 20),
                    ]
                }
            },
        )


def test_memory_blocks_and_allocatable_memory_come_from_the_memory_manager() -> None:
    view = PodResourcesView(
        pods=Pods([pod("a", "u1"), pod("b", "u2")], []), devices=None, memory=Memory()
    )
    (a, b) = view.list_pods()
    assert a.containers[0].memory == (
        ContainerMemory("memory", 1 << 30, (0,)),
        ContainerMemory("hugepages-2Mi", 4 << 20, (0, 1)),
    )
    assert b == answer("b")
    assert view.allocatable().memory == (
        ContainerMemory("hugepages-2Mi", 8 << 20, (0,)),
        ContainerMemory("memory", 3 << 30, (0,)),
        ContainerMemory("memory", 4 << 30, (1,)),
    )
    assert PodResourcesView(pods=Pods([], []), devices=None).allocatable().memory == ()


class Claims:
    """The claim manager's prepared claims (dra/manager.py ClaimManager.container_claims)."""

    def __init__(self, *infos: ClaimInfo) -> None:
        self.infos = {i.claim_name: i for i in infos}

    def container_claims(self, pod: JSON, container: JSON) -> list[ClaimInfo]:
        names = [u["name"] for u in (container.get("resources") or {}).get("claims") or []]
        if any(n not in self.infos for n in names):
            raise ValueError("unable to get information for ResourceClaim")
        return [self.infos[n] for n in names]


def test_dynamic_resources_list_a_containers_prepared_claims() -> None:
    gpu = ClaimInfo(
        claim_uid="c1",
        claim_name="gpu",
        namespace="default",
        pod_uids=frozenset({"u1"}),
        driver_state={
            "nic.example.com": (PreparedDevice("pool-n", "nic-0", (), ("nic.example.com/n=0",)),),
            "gpu.example.com": (
                PreparedDevice("pool-g", "gpu-0", (), ("gpu.example.com/g=0",)),
                PreparedDevice("pool-g", "gpu-1", (), ("gpu.example.com/g=1",)),
            ),
        },
    )
    p = pod("a", "u1")
    p["spec"]["containers"] = [
        {"name": "main", "resources": {"claims": [{"name": "gpu"}]}},
        {"name": "side"},
        {"name": "lost", "resources": {"claims": [{"name": "gone"}]}},
    ]
    view = PodResourcesView(pods=Pods([p], []), devices=None, claims=Claims(gpu))
    [answer] = view.list_pods()
    main, side, lost = answer.containers
    assert main.dynamic_resources == (
        DynamicResource(
            "gpu",
            "default",
            (
                # drivers in name order; a driver's CDI list grows device by device, as
                # upstream's GetDynamicResources appends to one list per driver
                ClaimResource("gpu.example.com", "pool-g", "gpu-0", ("gpu.example.com/g=0",)),
                ClaimResource(
                    "gpu.example.com",
                    "pool-g",
                    "gpu-1",
                    ("gpu.example.com/g=0", "gpu.example.com/g=1"),
                ),
                ClaimResource("nic.example.com", "pool-n", "nic-0", ("nic.example.com/n=0",)),
            ),
        ),
    )
    assert side.dynamic_resources == () and lost.dynamic_resources == ()
    assert view.get_pod("default", "a") == answer
    off = PodResourcesView(pods=Pods([p], []), devices=None, claims=Claims(gpu), dynamic_gate=False)
    assert all(c.dynamic_resources == () for c in off.list_pods()[0].containers)
