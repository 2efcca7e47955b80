"""Registration and the node status loop against the fake apiserver: create, or adopt an
existing Node (default labels and the attach/detach annotation reconciled, taints left
alone); the first status right after registration; a PATCH only on change or after the
report frequency; 5 tries per update; an outage logged once; a deleted Node registered
again; runtime and contributed conditions reaching the Node; Node events published."""

from __future__ import annotations

import logging

import pytest
from klet.bus import BusUnavailable, NodeBus
from klet.kube import Unavailable
from klet.model.records import EventRecord, NodeConditionRecord
from klet.model.types import JSON
from klet.status_reporter.cluster.capacity import MachineInfo
from klet.status_reporter.cluster.kubeapi import NO_RETRY, KubeApi
from klet.status_reporter.cluster.nodeid import NodeIdentity
from klet.status_reporter.cluster.nodemanager import NodeStatusManager, NodeStatusPolicy
from klet.status_reporter.cluster.nodeobserver import NodeObserver
from klet.status_reporter.cluster.nodestatus import CMAD_ANNOTATION, NodeConfig
from klet.status_reporter.metrics.nodestartup import NodeStartup, boot_time
from klet.testbed.fakes.bus import FakeBus
from klet.testbed.fakes.status_reporter import FakeApiServer, FakeRuntime
from prometheus_client import CollectorRegistry

NODE = "/api/v1/nodes/node1"
GI = 1024**3


class World:
    def __init__(self, *, register: bool = True, startup: NodeStartup | None = None) -> None:
        self.kube = FakeApiServer()
        self.runtime = FakeRuntime()
        self.runtime.add_image("busybox:1", 5)
        self.bus = FakeBus()
        node = NodeBus.of(self.bus, service="status-reporter")
        self.conditions = node.node
        self.publisher = node.events
        self.identity = NodeIdentity("node1")
        self.mono = [0.0]
        self.manager = NodeStatusManager(
            api=KubeApi(self.kube, retry=NO_RETRY),
            observer=NodeObserver(
                runtime=self.runtime,
                conditions=self.conditions,
                read_machine=lambda: MachineInfo(
                    cpus=2, memory_bytes=4 * GI, ephemeral_storage_bytes=10 * GI
                ),
                node_ips=("10.0.0.5",),
            ),
            identity=self.identity,
            config=NodeConfig(
                node_name="node1",
                node_labels={"team": "a"},
                register_with_taints=({"key": "k", "effect": "NoSchedule"},),
            ),
            policy=NodeStatusPolicy(register=register),
            events=self.publisher,
            startup=startup,
            clock=lambda: 1_700_000_000.0 + self.mono[0],
            monotonic=lambda: self.mono[0],
        )

    def published(self) -> list[EventRecord]:
        return self.bus.entries(self.publisher)

    def node(self) -> JSON:
        node = self.kube.get_object(NODE)
        assert node is not None
        return node

    def ready(self) -> JSON:
        return {c["type"]: c for c in self.node()["status"]["conditions"]}["Ready"]


async def test_register_creates_the_node_then_reports_at_once() -> None:
    w = World()
    assert await w.manager.register_once()
    node = w.node()
    assert w.identity.uid == node["metadata"]["uid"]
    assert w.identity.registered.is_set()
    assert node["metadata"]["labels"]["team"] == "a"
    assert node["spec"]["taints"] == [{"key": "k", "effect": "NoSchedule"}]
    assert node["status"]["addresses"][0] == {"type": "InternalIP", "address": "10.0.0.5"}
    assert await w.manager.sync_once()
    assert w.kube.count("PATCH", "/status") == 1  # the first status follows registration
    assert w.ready()["status"] == "True"
    assert w.node()["status"]["nodeInfo"]["containerRuntimeVersion"] == "containerd://v2.0.0"


async def test_adopts_an_existing_node() -> None:
    w = World()
    w.kube.put(
        NODE,
        {
            "metadata": {
                "name": "node1",
                "labels": {"kubernetes.io/hostname": "old-name", "custom": "kept"},
                "annotations": {},
            },
            "spec": {"taints": [{"key": "admin", "effect": "NoExecute"}]},
        },
    )
    uid = w.node()["metadata"]["uid"]
    assert await w.manager.register_once()
    node = w.node()
    assert w.identity.uid == uid  # adopted, not recreated
    assert node["metadata"]["labels"]["kubernetes.io/hostname"] == "node1"
    assert node["metadata"]["labels"]["custom"] == "kept"
    assert "team" not in node["metadata"]["labels"]  # --node-labels: at creation only
    assert node["metadata"]["annotations"][CMAD_ANNOTATION] == "true"
    assert node["spec"]["taints"] == [{"key": "admin", "effect": "NoExecute"}]


async def test_patches_only_on_change_or_report_frequency() -> None:
    w = World()
    await w.manager.register_once()
    await w.manager.sync_once()
    w.mono[0] = 10.0
    await w.manager.sync_once()
    assert w.kube.count("PATCH", "/status") == 1  # nothing changed: no PATCH
    w.runtime.conditions["NetworkReady"] = (False, "NetworkPluginNotReady", "no cni")
    w.mono[0] = 20.0
    await w.manager.sync_once()
    assert w.kube.count("PATCH", "/status") == 2
    assert w.ready()["status"] == "False"
    assert "NetworkReady=false" in w.ready()["message"]
    w.mono[0] = 319.0
    await w.manager.sync_once()
    assert w.kube.count("PATCH", "/status") == 2
    w.mono[0] = 320.0
    await w.manager.sync_once()
    assert w.kube.count("PATCH", "/status") == 3  # nodeStatusReportFrequency passed


async def test_contributions_reach_the_node() -> None:
    w = World()
    await w.manager.register_once()
    w.bus.seed(
        w.conditions.tables["eviction"],
        "MemoryPressure",
        NodeConditionRecord(type="MemoryPressure", status="True", at=1.0),
    )
    w.bus.seed(
        w.conditions.tables["syncloop"],
        "Ready",
        NodeConditionRecord(
            type="Ready", status="False", at=1.0, message="PLEG is not healthy: stuck"
        ),
    )
    await w.manager.sync_once()
    conds = {c["type"]: c for c in w.node()["status"]["conditions"]}
    assert conds["MemoryPressure"]["reason"] == "KubeletHasInsufficientMemory"
    assert conds["Ready"]["message"] == "PLEG is not healthy: stuck"
    # A bus outage keeps the last contributions rather than flipping the conditions.
    w.bus.error = BusUnavailable("fake bus down")
    w.mono[0] = 10.0
    await w.manager.sync_once()
    conds = {c["type"]: c for c in w.node()["status"]["conditions"]}
    assert conds["MemoryPressure"]["status"] == "True"


async def test_runtime_down_is_not_ready() -> None:
    w = World()
    await w.manager.register_once()
    w.runtime.down = True
    await w.manager.sync_once()
    assert (w.ready()["status"], w.ready()["message"]) == ("False", "container runtime is down")
    assert w.node()["status"]["images"] == [{"names": ["busybox:1"], "sizeBytes": 5}]


async def test_five_tries_then_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    w = World()
    await w.manager.register_once()
    w.kube.down = True
    caplog.set_level(logging.WARNING)
    assert not await w.manager.sync_once()
    assert w.kube.count("GET", NODE) == 5
    assert not await w.manager.sync_once()
    assert [r.message for r in caplog.records].count("unable to update node status") == 1
    w.kube.down = False
    assert await w.manager.sync_once()


async def test_one_failed_try_is_retried_within_the_update() -> None:
    w = World()
    await w.manager.register_once()
    w.kube.fail_next("PATCH", "/status", Unavailable("blip"))
    assert await w.manager.sync_once()
    assert w.kube.count("PATCH", "/status") == 2


async def test_deleted_node_is_registered_again() -> None:
    w = World()
    await w.manager.register_once()
    old_uid = w.identity.uid
    del w.kube.objects[NODE]
    assert not await w.manager.sync_once()
    assert not w.identity.registered.is_set()
    assert await w.manager.register_once()
    assert w.identity.uid != old_uid


async def test_without_register_node_only_updates() -> None:
    w = World(register=False)
    assert not await w.manager.sync_once()
    assert w.kube.count("POST") == 0
    w.kube.put(NODE, {"metadata": {"name": "node1"}, "status": {}})
    assert await w.manager.sync_once()
    assert w.ready()["status"] == "True"


async def test_node_events() -> None:
    w = World()
    await w.manager.register_once()
    await w.manager.sync_once()
    reasons = [r.reason for r in w.published()]
    assert reasons == [
        "Starting",
        "NodeHasSufficientMemory",
        "NodeHasNoDiskPressure",
        "NodeHasSufficientPID",
        "NodeReady",
    ]
    assert w.published()[-1].involved == {"kind": "Node", "name": "node1", "uid": "node1"}
    assert w.published()[-1].message == "Node node1 status is now: NodeReady"
    w.runtime.down = True
    w.mono[0] = 10
    await w.manager.sync_once()
    assert w.published()[-1].reason == "NodeNotReady"
    w.bus.error = BusUnavailable("fake bus down")  # a bus outage loses events, nothing else
    w.runtime.down = False
    w.mono[0] = 20
    assert await w.manager.sync_once()


async def test_a_changed_contribution_brings_the_update_forward() -> None:
    """A node shutting down (eviction's Ready False) reaches the Node within the
    contribution poll, not at the next nodeStatusUpdateFrequency; a rewrite that only
    moves `at` does not."""
    import asyncio

    w = World()
    w.manager._policy = NodeStatusPolicy(update_frequency_s=3600.0, contribution_poll_s=0.01)
    eviction = NodeBus.of(w.bus, service="eviction").conditions
    # eviction owns its pressures, and Ready only as the shutdown's False (the bus
    # refuses any other Ready of eviction's).
    pressure = "MemoryPressure"
    await eviction.put(pressure, NodeConditionRecord(type=pressure, status="False", at=1.0))
    task = asyncio.create_task(w.manager.run())
    try:
        for _ in range(500):
            if w.kube.get_object(NODE) is not None and w.ready()["status"] == "True":
                break
            await asyncio.sleep(0.01)
        assert w.ready()["status"] == "True"
        patches = w.kube.count("PATCH")
        await eviction.put(pressure, NodeConditionRecord(type=pressure, status="False", at=2.0))
        await asyncio.sleep(0.1)
        assert w.kube.count("PATCH") == patches  # only `at` moved: no update
        await eviction.put(
            "Ready",
            NodeConditionRecord(
                type="Ready", status="False", at=3.0, message="node is shutting down"
            ),
        )
        for _ in range(500):
            if w.ready()["status"] == "False":
                break
            await asyncio.sleep(0.01)
        assert w.ready()["status"] == "False"
        assert w.ready()["message"] == "node is shutting down"
    finally:
        task.cancel()


async def test_the_node_startup_phases_of_a_node_this_process_created() -> None:
    registry = CollectorRegistry()
    startup = NodeStartup(registry, started_at=1_700_000_000.0 - 5, boot_at=1_700_000_000.0 - 65)
    w = World(startup=startup)

    def phases() -> dict[str, float | None]:
        names = ("pre_kubelet_", "pre_registration_", "registration_", "post_registration_", "")
        return {
            n: registry.get_sample_value(f"kubelet_node_startup_{n}duration_seconds") for n in names
        }

    assert set(phases().values()) == {0.0}  # served from the start, 0 until registered
    w.kube.fail_next("POST", "/nodes", Unavailable("apiserver starting"))
    w.mono[0] = 1.0
    assert not await w.manager.register_once()  # the first attempt, at +1
    w.mono[0] = 3.0
    assert await w.manager.register_once()  # created at +3
    w.runtime.down = True
    w.mono[0] = 4.0
    assert await w.manager.sync_once()  # reported, not Ready: no post-registration yet
    assert phases()["post_registration_"] == 0.0
    w.runtime.down = False
    w.mono[0] = 10.0
    assert await w.manager.sync_once()  # first Ready at +10
    assert phases() == {
        "pre_kubelet_": 60.0,  # boot to the start
        "pre_registration_": 6.0,  # the start (-5) to the first attempt (+1)
        "registration_": 2.0,
        "post_registration_": 7.0,
        "": 75.0,  # boot to Ready
    }
    w.mono[0] = 20.0
    w.runtime.down = True
    await w.manager.sync_once()
    w.runtime.down = False
    await w.manager.sync_once()  # Ready again later: the first one stays
    assert phases()["post_registration_"] == 7.0


async def test_an_adopted_node_sets_no_startup_phase() -> None:
    registry = CollectorRegistry()
    w = World(startup=NodeStartup(registry, started_at=1_699_999_990.0, boot_at=None))
    w.kube.put(NODE, {"metadata": {"name": "node1"}})
    assert await w.manager.register_once()
    assert await w.manager.sync_once()
    assert registry.get_sample_value("kubelet_node_startup_registration_duration_seconds") == 0
    assert registry.get_sample_value("kubelet_node_startup_post_registration_duration_seconds") == 0


def test_boot_time_is_proc_stats_btime() -> None:
    assert boot_time("cpu  1 2 3\nbtime 1699999000\nprocesses 5\n") == 1_699_999_000.0
    assert boot_time("cpu 1\n") is None
