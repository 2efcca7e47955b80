"""syncloop's side of eviction: what a KillPod with reason `Evicted` does to the pod, and
pod admission under node pressure.

Covers: an evicted pod is Failed with reason `Evicted`, the eviction message, the
DisruptionTarget condition (reason TerminationByKubelet) and one Warning `Evicted`
Event; a repeated kill keeps the first reason and records no second Event; a kill for
another reason has no DisruptionTarget. Admission under pressure, table-driven
(`pressure_verdict`, `tolerates`): MemoryPressure rejects only BestEffort pods that do
not tolerate the memory-pressure taint, DiskPressure and PIDPressure reject every pod,
critical pods (static, mirror, system priority) are always admitted; through the
controller a rejected pod is Failed with "Pod was rejected: The node had condition:
[...]. " and no DisruptionTarget, and the bus's condition tables are what decides
(`NodePressure`, which keeps its last answer while Redis is down). A kill for a node
shutdown (reason `Terminated`) is a disruption too; while the eviction service says the
node is shutting down, every pod is rejected with reason `NodeShutdown`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from klet.bus import BusUnavailable
from klet.cri.types import ContainerState
from klet.model.records import DesiredPod, NodeConditionRecord, SourceState
from klet.model.types import JSON, PodUID
from klet.syncloop.admission.admit import ADMIT, pressure_verdict, tolerates
from klet.testbed.fakes.bus import FakeBus
from klet.testbed.fakes.cri import FakeRuntimeService

from .helpers import IdleWorkers, UidEvents, pod, wire

IMAGE = "registry.klet.test/busybox:1.36"
READY = {"api": SourceState(source="api", ready=True, at=0.0)}
MESSAGE = (
    "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. "
    "Container app was using 500Mi, request is 0, has larger consumption of memory. "
)


class World:
    def __init__(self, tmp_path: Path) -> None:
        self.t = 1_700_000_000.0
        self.cri = FakeRuntimeService(clock=lambda: int(self.t * 1e9))
        self.cri.add_image(IMAGE)
        self.events = UidEvents()
        self.bus = FakeBus()
        self.deps = wire(tmp_path, self.cri, events=self.events, clock=self.clock, bus=self.bus)
        self.controller = self.deps.controller
        self.controller.workers = IdleWorkers()  # type: ignore[assignment]
        self.controller.admission.restarted = True  # type: ignore[union-attr]

    def clock(self) -> float:
        return self.t

    def add(self, uid: str, **spec: Any) -> None:
        p = pod("app", uid=uid, **spec)
        p["metadata"]["annotations"] = {"kubernetes.io/config.source": "api"}
        rec = DesiredPod(uid=PodUID(uid), pod=p, source="api", hash=uid, seen_at=0.0)
        self.controller.apply_desired({uid: rec}, READY, read_from=self.controller.generation)

    def pressure(self, *types: str) -> None:
        self.conditions(
            {f"eviction:{t}": NodeConditionRecord(type=t, status="True", at=0.0) for t in types}
        )

    def conditions(self, rows: dict[str, NodeConditionRecord]) -> None:
        """The services' condition tables as they left them (`rows` keyed
        `<service>:<type>`, as syncloop reads them)."""
        tables = self.deps.node_bus.node.tables
        for table in tables.values():
            self.bus.hashes.pop(table.key, None)
        for key, record in rows.items():
            service, _, type_ = key.partition(":")
            self.bus.seed(tables[service], type_, record)

    def running(self, uid: str) -> bool:
        return any(
            c.state == ContainerState.RUNNING and c.config.labels["io.kubernetes.pod.uid"] == uid
            for c in self.cri.containers.values()
        )


@pytest.fixture
def w(tmp_path: Path) -> World:
    return World(tmp_path)


async def kill(w: World, uid: str, grace: int | None, reason: str, message: str) -> bool:
    task = asyncio.create_task(w.controller.kill_pod(PodUID(uid), grace, reason, message))
    await asyncio.sleep(0)
    await w.controller.sync_once(uid)
    return await task


async def test_an_evicted_pod_is_failed_with_disruption_target_and_one_event(w: World) -> None:
    w.add("u1")
    await w.controller.sync_once("u1")
    assert w.running("u1")
    assert await kill(w, "u1", 1, "Evicted", MESSAGE) is True
    assert not w.running("u1")
    status = w.controller.publisher.get("u1")
    assert status is not None
    assert (status["phase"], status["reason"], status["message"]) == ("Failed", "Evicted", MESSAGE)
    [target] = [c for c in status["conditions"] if c["type"] == "DisruptionTarget"]
    assert target["status"] == "True"
    assert (target["reason"], target["message"]) == ("TerminationByKubelet", MESSAGE)
    assert status["conditions"][-1] is target
    assert [e for e in w.events.emitted if e[2] == "Evicted"] == [
        ("u1", "Warning", "Evicted", MESSAGE)
    ]

    # An eviction service restarted under pressure may ask again: nothing changes.
    w.t += 30
    assert await kill(w, "u1", 1, "Evicted", "another message") is True
    status = w.controller.publisher.get("u1")
    assert status is not None and status["message"] == MESSAGE
    [again] = [c for c in status["conditions"] if c["type"] == "DisruptionTarget"]
    assert again["lastTransitionTime"] == target["lastTransitionTime"]
    assert len([e for e in w.events.emitted if e[2] == "Evicted"]) == 1
    await w.controller.sync_once("u1")
    assert not w.running("u1")


async def test_a_kill_for_another_reason_is_no_disruption(w: World) -> None:
    w.add("u1")
    await w.controller.sync_once("u1")
    # (a preemption is one: test_preemption.py)
    await kill(w, "u1", 1, "Killed", "stopped through PodControl")
    status = w.controller.publisher.get("u1")
    assert status is not None and status["reason"] == "Killed"
    assert not [c for c in status["conditions"] if c["type"] == "DisruptionTarget"]
    assert not [e for e in w.events.emitted if e[2] == "Evicted"]


def best_effort(**spec: Any) -> JSON:
    p = pod("app", **spec)
    p["metadata"]["annotations"] = {"kubernetes.io/config.source": "api"}
    return p


def burstable() -> JSON:
    p = best_effort()
    p["spec"]["containers"][0]["resources"] = {"requests": {"memory": "64Mi"}}
    return p


def with_annotation(p: JSON, key: str, value: str) -> JSON:
    p["metadata"]["annotations"] = {key: value}
    return p


SOURCE = "kubernetes.io/config.source"
MIRROR = "kubernetes.io/config.mirror"
TOLERATE_ALL = [{"operator": "Exists"}]
TOLERATE_MEMORY = [{"key": "node.kubernetes.io/memory-pressure", "operator": "Exists"}]
TOLERATE_DISK = [{"key": "node.kubernetes.io/disk-pressure", "operator": "Exists"}]


@pytest.mark.parametrize(
    ("pressure", "p", "rejected"),
    [
        ((), best_effort(), None),
        (("MemoryPressure",), best_effort(), "[MemoryPressure]"),
        (("MemoryPressure",), burstable(), None),
        (("MemoryPressure",), best_effort(tolerations=TOLERATE_MEMORY), None),
        (("MemoryPressure",), best_effort(tolerations=TOLERATE_ALL), None),
        (("MemoryPressure",), best_effort(tolerations=TOLERATE_DISK), "[MemoryPressure]"),
        (("DiskPressure",), burstable(), "[DiskPressure]"),
        (("DiskPressure",), best_effort(tolerations=TOLERATE_ALL), "[DiskPressure]"),
        (("PIDPressure",), burstable(), "[PIDPressure]"),
        (("DiskPressure", "MemoryPressure"), burstable(), "[MemoryPressure DiskPressure]"),
        (("Ready", "MemoryPressure"), best_effort(), "[MemoryPressure]"),
        (("Ready",), best_effort(), None),
        (("DiskPressure",), with_annotation(best_effort(), SOURCE, "file"), None),
        (("DiskPressure",), with_annotation(best_effort(), MIRROR, "h"), None),
        (("DiskPressure",), best_effort(priority=2_000_001_000), None),
        (("DiskPressure",), best_effort(priority=1_999_999_999), "[DiskPressure]"),
    ],
)
def test_pressure_verdict(pressure: tuple[str, ...], p: JSON, rejected: str | None) -> None:
    verdict = pressure_verdict(p, pressure)
    if rejected is None:
        assert verdict == ADMIT
    else:
        assert (verdict.admit, verdict.reason) == (False, "Evicted")
        assert verdict.message == f"The node had condition: {rejected}. "


@pytest.mark.parametrize(
    ("toleration", "expected"),
    [
        ({"operator": "Exists"}, True),
        ({"operator": "Exists", "effect": "NoSchedule"}, True),
        ({"operator": "Exists", "effect": "NoExecute"}, False),
        ({"key": "node.kubernetes.io/memory-pressure"}, True),  # Equal, empty value
        ({"key": "node.kubernetes.io/memory-pressure", "value": "x"}, False),
        ({"key": "node.kubernetes.io/memory-pressure", "operator": "Exists"}, True),
        ({"key": "other", "operator": "Exists"}, False),
        ({"operator": "Equal"}, False),  # an empty key needs Exists
    ],
)
def test_tolerates_the_memory_pressure_taint(toleration: JSON, expected: bool) -> None:
    assert (
        tolerates([toleration], key="node.kubernetes.io/memory-pressure", effect="NoSchedule")
        is expected
    )


async def test_a_pod_rejected_under_pressure_is_failed_without_disruption(w: World) -> None:
    w.pressure("DiskPressure")
    w.add("u1")
    await w.controller.sync_once("u1")
    assert not w.running("u1") and not w.cri.sandboxes
    status = w.controller.publisher.get("u1")
    assert status is not None
    assert (status["phase"], status["reason"]) == ("Failed", "Evicted")
    assert status["message"] == "Pod was rejected: The node had condition: [DiskPressure]. "
    assert not [c for c in status["conditions"] if c["type"] == "DisruptionTarget"]
    assert w.events.emitted == [
        ("u1", "Warning", "Evicted", "The node had condition: [DiskPressure]. ")
    ]


async def test_admission_follows_the_node_table_and_keeps_it_through_an_outage(w: World) -> None:
    w.pressure("MemoryPressure")
    w.add("be1")
    await w.controller.sync_once("be1")
    assert not w.running("be1")
    w.conditions(
        {
            "eviction:MemoryPressure": NodeConditionRecord(
                type="MemoryPressure", status="False", at=1
            )
        }
    )
    w.add("be2")
    await w.controller.sync_once("be2")
    assert w.running("be2")
    # Pressure again, then Redis away: the last answer read (pressure) stands.
    w.pressure("MemoryPressure")
    w.add("be3")
    await w.controller.sync_once("be3")
    assert not w.running("be3")
    w.pressure()
    w.bus.error = BusUnavailable("connection refused")
    w.add("be4")
    await w.controller.sync_once("be4")
    assert not w.running("be4")
    w.bus.error = None
    w.add("be5")
    await w.controller.sync_once("be5")
    assert w.running("be5")


SHUTDOWN_MESSAGE = "Pod was terminated in response to imminent node shutdown."


async def test_a_pod_killed_for_a_node_shutdown_is_failed_with_disruption_target(
    w: World,
) -> None:
    w.add("u1")
    await w.controller.sync_once("u1")
    assert await kill(w, "u1", 2, "Terminated", SHUTDOWN_MESSAGE) is True
    status = w.controller.publisher.get("u1")
    assert status is not None
    assert (status["phase"], status["reason"]) == ("Failed", "Terminated")
    assert status["message"] == SHUTDOWN_MESSAGE
    [target] = [c for c in status["conditions"] if c["type"] == "DisruptionTarget"]
    assert (target["reason"], target["message"]) == ("TerminationByKubelet", SHUTDOWN_MESSAGE)
    assert not [e for e in w.events.emitted if e[2] == "Evicted"]


async def test_every_pod_is_rejected_while_the_node_shuts_down(w: World) -> None:
    w.conditions(
        {
            "eviction:Ready": NodeConditionRecord(
                type="Ready", status="False", at=0.0, message="node is shutting down"
            )
        }
    )
    w.add("u1", priority=2_000_001_000)
    await w.controller.sync_once("u1")
    assert not w.running("u1")
    status = w.controller.publisher.get("u1")
    assert status is not None
    assert (status["phase"], status["reason"]) == ("Failed", "NodeShutdown")
    assert status["message"] == "Pod was rejected: Pod was rejected as the node is shutting down."
    # Another service's unready Ready (a PLEG problem) is no shutdown.
    w.conditions(
        {"syncloop:Ready": NodeConditionRecord(type="Ready", status="False", at=0.0, message="x")}
    )
    w.add("u2")
    await w.controller.sync_once("u2")
    assert w.running("u2")
