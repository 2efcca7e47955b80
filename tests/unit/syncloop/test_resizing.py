"""The resize manager (pods/resizing.py) over recording fakes: a new pod's allocation is
recorded and the syncer gets the pod as allocated; a resize that fits is allocated and
applied in upstream's order (pod cgroup grown first, the container's memory then CPU),
the status showing allocatedResources, resources and PodResizeInProgress until done
(then a ResizeCompleted Event); a Deferred resize waits and is accepted, in priority
order, when a pod goes; the checkpoint makes a new manager (a restarted syncloop) see
the same allocation and apply nothing again; the metrics are told."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from klet.cri.errors import CRIError
from klet.cri.types import ContainerState as CS
from klet.cri.types import ContainerStatsInfo, LinuxResources
from klet.model.types import ContainerID
from klet.syncloop.model.resources import NodeLimits, PodResources
from klet.syncloop.pods import resize
from klet.syncloop.pods.allocation import ACTUATED_FILE, ALLOCATED_FILE, Checkpoint
from klet.syncloop.pods.resizing import PodResizer

from .helpers import RecordedEvents, ctr, runtime, sandbox

MI = 1024 * 1024
NODE = NodeLimits(memory_capacity_bytes=4096 * MI)


class Cri:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    async def update_container_resources(
        self, container_id: ContainerID, resources: LinuxResources
    ) -> None:
        self.calls.append(("update", (container_id, resources)))

    async def container_stats(self, container_id: ContainerID) -> ContainerStatsInfo:
        raise CRIError("no stats in this fake")


class Cgroups:
    def __init__(self, calls: list[tuple[str, Any]]) -> None:
        self.calls = calls

    def cri_parent(self, name: str) -> str:
        return name

    async def ensure(self, name: str, res: PodResources) -> tuple[bool, list[str]]:
        self.calls.append(("cgroup", res))
        return True, []

    async def remove(self, name: str) -> list[str]:
        return []

    async def update_qos(self, burstable_shares: int) -> list[str]:
        return []


class Observer:
    def __init__(self) -> None:
        self.changes: list[resize.RequestedChange] = []
        self.infeasible_: list[str] = []
        self.accepted: list[str] = []
        self.durations: list[bool] = []
        self.last: tuple[Mapping[str, int], int] = ({}, 0)

    def requested(self, change: resize.RequestedChange) -> None:
        self.changes.append(change)

    def infeasible(self, reason_detail: str) -> None:
        self.infeasible_.append(reason_detail)

    def deferred_accepted(self, trigger: str) -> None:
        self.accepted.append(trigger)

    def duration(self, seconds: float, *, success: bool) -> None:
        self.durations.append(success)

    def counts(self, pending: Mapping[str, int], in_progress: int) -> None:
        self.last = (dict(pending), in_progress)


def pod(uid: str, cpu: str, mem: str, *, priority: int = 0, generation: int = 1) -> dict[str, Any]:
    res = {"requests": {"cpu": cpu, "memory": mem}, "limits": {"cpu": cpu, "memory": mem}}
    return {
        "metadata": {"name": uid, "namespace": "default", "uid": uid, "generation": generation},
        "spec": {
            "priority": priority,
            "containers": [{"name": "a", "image": "i", "resources": res}],
        },
    }


class World:
    def __init__(self, tmp: Path, *, cpu_free: int = 4000) -> None:
        self.tmp = tmp
        self.cri = Cri()
        self.cgroups = Cgroups(self.cri.calls)
        self.events = RecordedEvents()
        self.woken: list[str] = []
        self.pods: dict[str, dict[str, Any]] = {}
        self.cpu = cpu_free
        self.observer = Observer()
        self.resizer = self.make()

    def make(self) -> PodResizer:
        return PodResizer(
            allocated=Checkpoint.load(self.tmp / ALLOCATED_FILE)[0],
            actuated=Checkpoint.load(self.tmp / ACTUATED_FILE)[0],
            cri=self.cri,
            cgroups=self.cgroups,
            cgroup_root="/",
            node_limits=lambda: NODE,
            allocatable=lambda: {"cpu": 4000, "memory": 4096 * MI},
            admit=self.admit,
            events=self.events,
            observer=self.observer,
            kill=self.kill,
            wake=self.woken.append,
            cgroup_fs_root=None,
        )

    def admit(self, p: dict[str, Any], others: list[dict[str, Any]]) -> tuple[bool, str]:
        want = resize.pod_request(p, "cpu")
        used = sum(resize.pod_request(o, "cpu") for o in others)
        if want > self.cpu - used:
            return False, f"Node didn't have enough resource: cpu, requested: {want}"
        return True, ""

    async def kill(self, p: Any, c: Any, cid: ContainerID) -> None:
        self.cri.calls.append(("kill", cid))

    def others(self, uid: str) -> list[dict[str, Any]]:
        return [self.resizer.allocated_pod(u, p) for u, p in self.pods.items() if u != uid]

    def sync(self, p: dict[str, Any]) -> dict[str, Any]:
        self.pods[p["metadata"]["uid"]] = p
        return self.resizer.before_sync(p["metadata"]["uid"], p, self.others)


def running(p: dict[str, Any]) -> Any:
    return runtime([sandbox()], [ctr(p, "a", CS.RUNNING)])


async def test_a_fitting_resize_is_applied_in_order(tmp_path: Path) -> None:
    w = World(tmp_path)
    first = pod("u1", "500m", "64Mi")
    assert w.sync(first) is first  # a new pod: its spec is its allocation
    assert not await w.resizer.actuate("u1", first, running(first))  # started as allocated
    bigger = pod("u1", "1", "128Mi", generation=2)
    allocated = w.sync(bigger)
    assert [(c.resource, c.requirement, c.operation) for c in w.observer.changes] == [
        ("memory", "requests", "increase"),
        ("memory", "limits", "increase"),
        ("cpu", "requests", "increase"),
        ("cpu", "limits", "increase"),
    ]
    assert resize.amounts(allocated["spec"]["containers"][0]["resources"]).cpu_limit == 1000
    assert w.woken == ["u1"]
    view = w.resizer.status("u1", allocated)
    assert [c["type"] for c in view.conditions] == ["PodResizeInProgress"]
    assert view.conditions[0]["observedGeneration"] == 2
    assert await w.resizer.actuate("u1", allocated, running(first))
    kinds = [k for k, _ in w.cri.calls]
    # memory: pod cgroup limit up, then the container; CPU: quota, shares, container
    assert kinds == ["cgroup", "update", "cgroup", "cgroup", "update"]
    memory_update = w.cri.calls[1][1][1]
    cpu_update = w.cri.calls[4][1][1]
    assert memory_update.memory_limit_bytes == 128 * MI and memory_update.cpu_quota == 50000
    assert cpu_update.memory_limit_bytes == 128 * MI and cpu_update.cpu_quota == 100000
    assert w.observer.durations == [True]
    view = w.resizer.status("u1", allocated)
    assert view.conditions == ()
    assert view.actuated is not None and view.actuated["a"]["limits"] == {
        "cpu": "1",
        "memory": "128Mi",
    }
    assert w.events.reasons() == ["ResizeCompleted"]

    # A restarted syncloop: the same allocation, nothing to apply again.
    w.cri.calls.clear()
    again = w.make()
    assert again.allocated_pod("u1", bigger) == bigger
    assert not await again.actuate("u1", bigger, running(first))
    assert w.cri.calls == []


async def test_deferred_resizes_are_accepted_in_priority_order(tmp_path: Path) -> None:
    w = World(tmp_path, cpu_free=3000)
    for uid in ("low", "high", "hog"):
        w.sync(pod(uid, "1", "64Mi", priority=100 if uid == "high" else 0))
    w.woken.clear()
    # Both ask for 1 more CPU; the node has none free.
    w.sync(pod("low", "2", "64Mi", generation=2))
    w.sync(pod("high", "2", "64Mi", priority=100, generation=2))
    for uid in ("low", "high"):
        [cond] = w.resizer.status(uid, w.pods[uid]).conditions
        assert (cond["type"], cond["reason"]) == ("PodResizePending", "Deferred")
    assert w.observer.last == ({"deferred": 2}, 0)
    # The hog goes: one CPU frees up, and the higher priority resize gets it.
    del w.pods["hog"]
    w.woken.clear()
    w.resizer.forget("hog", w.others)
    assert w.woken == ["high"]  # accepted: its worker applies it
    assert [c["type"] for c in w.resizer.status("high", w.pods["high"]).conditions] == [
        "PodResizeInProgress"
    ]
    assert w.resizer.status("low", w.pods["low"]).conditions[0]["reason"] == "Deferred"
    assert w.observer.accepted == ["pods_removed"]


async def test_infeasible_resize_stays_pending_and_is_counted(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.sync(pod("u1", "1", "64Mi"))
    allocated = w.sync(pod("u1", "8", "64Mi", generation=2))
    assert resize.amounts(allocated["spec"]["containers"][0]["resources"]).cpu_limit == 1000
    [cond] = w.resizer.status("u1", allocated).conditions
    assert (cond["reason"], cond["observedGeneration"]) == ("Infeasible", 2)
    assert (
        cond["message"] == "Node didn't have enough capacity: cpu, requested: 8000, capacity: 4000"
    )
    w.sync(pod("u1", "8", "64Mi", generation=2))  # synced again: not counted again
    assert w.observer.infeasible_ == ["insufficient_node_allocatable"]
    # Back to what is allocated: the condition goes.
    w.sync(pod("u1", "1", "64Mi", generation=3))
    assert w.resizer.status("u1", allocated).conditions == ()
