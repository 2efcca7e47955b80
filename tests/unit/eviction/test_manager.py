"""The eviction manager's passes (manager.py) with fakes of its interfaces and a manual clock.

Covers: a hard memory threshold evicts the pod over its request with grace 1 s, reason
`Evicted` and upstream's message, writes MemoryPressure to the node table and counts
`kubelet_evictions`; one pod per pass; nothing without a new measurement; disk pressure
asks FreeSpace first (for the deficit) and evicts nothing when that clears every
threshold, evicts after it when it does not, evicts after a FreeSpace that hangs (bounded
by the timeout) or fails, waits (bounded) for the space FreeSpace reported to show in a
measurement, and skips it for nodefs next to a dedicated image filesystem;
a restarted manager does not evict a pod already Failed; critical pods are skipped;
soft thresholds wait out their grace period and kill with min(evictionMaxPodGracePeriod,
the pod's grace); a pod over an emptyDir sizeLimit is evicted without node pressure;
pressure conditions clear after the transition period; a KillPod that fails is retried
on the next pass; `wait_for_cleanup` returns once the pod is terminal; the record of
an evicted pod is dropped once the pod is no longer active. The bus's active pods
(issue 42): an idle pass reads the two tables' generations and decodes nothing, a
status written since shows at the next pass with only its row decoded, and a Redis
restart reads both tables in full. What a pass measures (issue 42): with no threshold met
only the node and the pods a local storage limit applies to (none: no pod at all), every
pod once a threshold is met.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from klet.bus import NodeBus
from klet.eviction.manager import ActivePod, BusPods, Deps, EvictionManager, ManagerSettings
from klet.eviction.metrics import create_metrics
from klet.eviction.signals import Observation, Observations, PodUsage, Signal
from klet.eviction.thresholds import Amount, EvictionConfig, Threshold
from klet.model.records import DesiredPod, PodStatusRecord
from klet.model.types import JSON, PodUID
from klet.testbed.fakes.bus import FakeBus
from prometheus_client import CollectorRegistry

MI = 1024**2
GI = 1024**3


class Clock:
    def __init__(self) -> None:
        self.t = 1_700_000_000.0

    def __call__(self) -> float:
        return self.t


@dataclass
class Source:
    clock: Clock
    available: dict[Signal, int] = field(default_factory=dict)
    capacity: dict[Signal, int] = field(default_factory=dict)
    usage: dict[str, PodUsage] = field(default_factory=dict)
    calls: int = 0
    fresh: bool = True  # stamp observations with the current time
    asked: list[frozenset[str] | None] = field(default_factory=list)  # pods asked, per call

    async def observe(
        self, *, pods: Collection[str] | None = None
    ) -> tuple[Observations, dict[str, PodUsage]]:
        self.calls += 1
        self.asked.append(None if pods is None else frozenset(pods))
        stamp = self.clock() if self.fresh else 1.0
        obs = {
            s: Observation(available=a, capacity=self.capacity.get(s, 100 * GI), time=stamp)
            for s, a in self.available.items()
        }
        return obs, {u: v for u, v in self.usage.items() if pods is None or u in pods}


@dataclass
class Pods:
    """Desired pods and their statuses, as syncloop keeps them on the bus."""

    pods: dict[str, JSON] = field(default_factory=dict)
    phase: dict[str, str] = field(default_factory=dict)

    async def active(self) -> list[ActivePod]:
        return [
            ActivePod(p, {"phase": self.phase.get(uid, "Running")})
            for uid, p in self.pods.items()
            if self.phase.get(uid, "Running") not in ("Failed", "Succeeded")
        ]


@dataclass
class Killer:
    pods: Pods
    log: list[Any]
    calls: list[tuple[str, int | None, str, str]] = field(default_factory=list)
    fail: Exception | None = None

    async def kill_pod(
        self,
        uid: PodUID,
        *,
        grace_period_s: int | None,
        reason: str,
        message: str,
        timeout_s: float | None = None,
    ) -> bool:
        if self.fail is not None:
            raise self.fail
        self.calls.append((uid, grace_period_s, reason, message))
        self.log.append(("kill", uid))
        if uid not in self.pods.pods:
            return False
        self.pods.phase[uid] = "Failed"  # what syncloop reports once the pod is killed
        return True


@dataclass(frozen=True)
class Layout:
    dedicated_image_fs: bool = False
    split_container_fs: bool = False


class World:
    def __init__(self, *thresholds: Threshold, layout: Layout = Layout(), **config: Any) -> None:
        self.clock = Clock()
        self.log: list[Any] = []
        self.source = Source(self.clock)
        self.pods = Pods()
        self.killer = Killer(self.pods, self.log)
        self.bus = FakeBus("n1")
        self.node_bus = NodeBus.of(self.bus, service="eviction")
        self.frees: list[int] = []
        self.free_effect: dict[Signal, int] = {}
        self.free_hangs = False
        self.free_error: Exception | None = None
        self.events: list[tuple[str, str]] = []
        self.volumes: set[str] = set()  # pods whose volumes syncloop has not removed yet
        self.registry = CollectorRegistry()
        self.layout = layout
        self.config = EvictionConfig(
            thresholds=thresholds,
            pressure_transition_period_s=config.get("transition", 300.0),
            max_pod_grace_period_s=config.get("max_grace", 0),
        )
        self.settings = ManagerSettings(
            reclaim_timeout_s=0.05, reclaim_settle_s=0.2, reclaim_settle_poll_s=0.01
        )
        self.deps = Deps(
            source=self.source,
            pods=self.pods,
            killer=self.killer,
            free_space=self.free_space,
            conditions=self.node_bus.conditions,
            layout=self.get_layout,
            node_event=self.node_event,
            metrics=create_metrics(self.registry),
            volumes_exist=lambda uid: uid in self.volumes,
        )
        self.manager = self.new_manager()

    def new_manager(self) -> EvictionManager:
        return EvictionManager(
            self.deps, config=self.config, settings=self.settings, clock=self.clock
        )

    async def get_layout(self) -> Layout:
        return self.layout

    async def free_space(self, wanted: int) -> int:
        self.frees.append(wanted)
        self.log.append(("free", wanted))
        if self.free_error is not None:
            raise self.free_error
        if self.free_hangs:
            await asyncio.Event().wait()
        for signal, gained in self.free_effect.items():
            self.source.available[signal] += gained
        return sum(self.free_effect.values())

    def condition(self, type_: str) -> str:
        """The status of the pressure condition this service last wrote to the bus."""
        return self.bus.rows(self.node_bus.conditions)[type_].status

    def node_event(self, type_: str, reason: str, message: str) -> None:
        self.events.append((reason, message))

    def add(self, name: str, u: PodUsage | None, **spec: Any) -> str:
        uid = f"uid-{name}"
        annotations = spec.pop("annotations", {"kubernetes.io/config.source": "api"})
        containers = spec.pop("containers", [{"name": "c", "image": "x"}])
        self.pods.pods[uid] = {
            "metadata": {"name": name, "namespace": "ns", "uid": uid, "annotations": annotations},
            "spec": {"containers": containers, **spec},
        }
        if u is not None:
            self.source.usage[uid] = u
        return uid

    async def step(self, seconds: float = 10.0) -> list[str]:
        self.clock.t += seconds
        return [e.uid for e in await self.manager.run_once()]


def usage(name: str, **kw: Any) -> PodUsage:
    base = PodUsage(
        uid=f"uid-{name}",
        namespace="ns",
        name=name,
        memory_working_set=0,
        ephemeral_storage=0,
        processes=1,
    )
    return replace(base, **kw)


def hard(signal: Signal, quantity: int, **kw: Any) -> Threshold:
    return Threshold(signal, quantity, None, **kw)


MEMORY = hard(Signal.MEMORY_AVAILABLE, 100 * MI)
NODEFS = hard(Signal.NODEFS_AVAILABLE, GI, min_reclaim=Amount(quantity=512 * MI))


def with_request(memory: str) -> list[JSON]:
    return [{"name": "c", "image": "x", "resources": {"requests": {"memory": memory}}}]


async def test_every_pass_is_counted_with_or_without_pressure() -> None:
    w = World(MEMORY)
    w.source.available[Signal.MEMORY_AVAILABLE] = 500 * MI
    assert await w.step() == []
    assert await w.step() == []
    assert w.registry.get_sample_value("klet_eviction_passes_total") == 2.0
    assert w.manager.passes == 2


async def test_hard_memory_threshold_evicts_the_pod_over_its_request() -> None:
    w = World(MEMORY)
    w.source.available[Signal.MEMORY_AVAILABLE] = 50 * MI
    w.add("calm", usage("calm", memory_working_set=200 * MI), containers=with_request("1Gi"))
    hog = w.add(
        "hog",
        usage("hog", memory_working_set=500 * MI, containers={"c": 500 * MI}),
        containers=with_request("64Mi"),
    )
    assert await w.step() == [hog]
    assert w.killer.calls == [
        (
            hog,
            1,
            "Evicted",
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. "
            "Container c was using 500Mi, request is 64Mi, has larger consumption of memory. ",
        )
    ]
    assert w.condition("MemoryPressure") == "True"
    assert w.condition("DiskPressure") == "False"
    assert w.condition("PIDPressure") == "False"
    assert w.events == [("EvictionThresholdMet", "Attempting to reclaim memory")]
    assert (
        w.registry.get_sample_value("kubelet_evictions", {"eviction_signal": "memory.available"})
        == 1.0
    )
    assert (
        w.registry.get_sample_value(
            "klet_eviction_signal_available", {"eviction_signal": "memory.available"}
        )
        == 50 * MI
    )
    assert w.frees == []  # memory has no node-level reclaim


async def test_one_pod_per_pass_and_only_on_new_measurements() -> None:
    w = World(MEMORY)
    w.source.available[Signal.MEMORY_AVAILABLE] = 50 * MI
    a = w.add("a", usage("a", memory_working_set=300 * MI))
    b = w.add("b", usage("b", memory_working_set=200 * MI))
    assert await w.step() == [a]
    w.source.fresh = False  # the same measurement again: nothing to act on
    w.source.available[Signal.MEMORY_AVAILABLE] = 40 * MI
    assert await w.step() == [] and await w.step() == []
    w.source.fresh = True
    assert await w.step() == [b]
    assert await w.step() == []  # nobody left
    assert [c[0] for c in w.killer.calls] == [a, b]


async def test_disk_pressure_is_answered_by_freespace_first() -> None:
    w = World(NODEFS)
    w.source.available[Signal.NODEFS_AVAILABLE] = 800 * MI
    w.add("writer", usage("writer", ephemeral_storage=300 * MI, writable_layer=300 * MI))
    w.free_effect = {Signal.NODEFS_AVAILABLE: GI}  # images removed: 1.8Gi available
    assert await w.step() == []
    # The deficit up to threshold + minimum reclaim: 1Gi + 512Mi - 800Mi.
    assert w.frees == [GI + 512 * MI - 800 * MI]
    assert w.killer.calls == []
    assert w.condition("DiskPressure") == "True"
    assert w.registry.get_sample_value("klet_eviction_node_reclaims_total", {"outcome": "ok"}) == 1


async def test_disk_pressure_evicts_when_freespace_is_not_enough() -> None:
    w = World(NODEFS)
    w.source.available[Signal.NODEFS_AVAILABLE] = 800 * MI
    writer = w.add(
        "writer",
        usage(
            "writer",
            ephemeral_storage=300 * MI,
            writable_layer=300 * MI,
            container_storage={"c": 300 * MI},
        ),
    )
    w.add("small", usage("small", ephemeral_storage=MI, writable_layer=MI))
    w.free_effect = {Signal.NODEFS_AVAILABLE: 100 * MI}
    assert await w.step() == [writer]
    assert w.log == [("free", 736 * MI), ("kill", writer)]
    assert w.killer.calls[0][3].startswith(
        "The node was low on resource: ephemeral-storage. Threshold quantity: 1Gi, "
        "available: 800Mi. Container c was using 300Mi, request is 0"
    )


@pytest.mark.parametrize("shows_after_s", [0.05, None])
async def test_space_freespace_freed_may_show_a_moment_later(shows_after_s: float | None) -> None:
    """containerd gives a removed container's layer back at its next garbage collection:
    the manager measures again until the bytes FreeSpace reported show, for
    reclaim_settle_s at most, and evicts only if the pressure is still there."""
    w = World(NODEFS)
    w.source.available[Signal.NODEFS_AVAILABLE] = 800 * MI
    writer = w.add("writer", usage("writer", ephemeral_storage=300 * MI, writable_layer=300 * MI))

    async def free_space(wanted: int) -> int:
        w.frees.append(wanted)

        def release() -> None:
            w.source.available[Signal.NODEFS_AVAILABLE] += GI

        if shows_after_s is not None:
            asyncio.get_running_loop().call_later(shows_after_s, release)
        return GI

    w.deps = replace(w.deps, free_space=free_space)
    w.manager = w.new_manager()
    loop = asyncio.get_running_loop()
    started = loop.time()
    if shows_after_s is not None:
        assert await w.step() == []
        assert w.source.calls > 2  # the pass's, then until the space showed
        assert loop.time() - started < w.settings.reclaim_settle_s
    else:
        assert await w.step() == [writer]  # never showed: decided without it
        assert loop.time() - started >= w.settings.reclaim_settle_s
    assert w.frees == [GI + 512 * MI - 800 * MI]


@pytest.mark.parametrize("failure", ["hang", "error"])
async def test_eviction_goes_on_when_image_gc_does_not_answer(failure: str) -> None:
    w = World(NODEFS)
    w.source.available[Signal.NODEFS_AVAILABLE] = 800 * MI
    writer = w.add("writer", usage("writer", ephemeral_storage=300 * MI, writable_layer=300 * MI))
    if failure == "hang":
        w.free_hangs = True
    else:
        w.free_error = ConnectionError("image-gc socket refused")
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await w.step() == [writer]
    assert loop.time() - started < 5
    outcome = "timeout" if failure == "hang" else "error"
    assert (
        w.registry.get_sample_value("klet_eviction_node_reclaims_total", {"outcome": outcome}) == 1
    )


async def test_nodefs_next_to_a_dedicated_image_fs_has_no_node_level_reclaim() -> None:
    w = World(NODEFS, layout=Layout(dedicated_image_fs=True))
    w.source.available[Signal.NODEFS_AVAILABLE] = 800 * MI
    logger = w.add("logger", usage("logger", ephemeral_storage=300 * MI, logs=300 * MI))
    w.add("writer", usage("writer", ephemeral_storage=900 * MI, writable_layer=900 * MI))
    assert await w.step() == [logger]  # nodefs holds the logs, not the writable layers
    assert w.frees == []


async def test_a_restarted_manager_does_not_evict_the_same_pod_twice() -> None:
    w = World(MEMORY)
    w.source.available[Signal.MEMORY_AVAILABLE] = 50 * MI
    hog = w.add("hog", usage("hog", memory_working_set=900 * MI))
    other = w.add(
        "other", usage("other", memory_working_set=10 * MI), containers=with_request("1Gi")
    )
    assert await w.step() == [hog]
    # The service restarts during pressure; the evicted pod's sample still shows up.
    w.manager = w.new_manager()
    assert await w.step() == [other]
    assert [c[0] for c in w.killer.calls] == [hog, other]


async def test_critical_pods_are_never_evicted() -> None:
    w = World(MEMORY)
    w.source.available[Signal.MEMORY_AVAILABLE] = 50 * MI
    w.add(
        "static",
        usage("static", memory_working_set=900 * MI),
        annotations={"kubernetes.io/config.source": "file"},
    )
    w.add("system", usage("system", memory_working_set=800 * MI), priority=2_000_001_000)
    w.add(
        "mirror",
        usage("mirror", memory_working_set=700 * MI),
        annotations={"kubernetes.io/config.mirror": "x"},
    )
    assert await w.step() == []
    plain = w.add(
        "plain", usage("plain", memory_working_set=5 * MI), containers=with_request("1Gi")
    )
    assert await w.step() == [plain]
    assert [c[0] for c in w.killer.calls] == [plain]


async def test_soft_threshold_waits_for_its_grace_period() -> None:
    soft = Threshold(Signal.MEMORY_AVAILABLE, 100 * MI, None, grace_period_s=30.0)
    w = World(soft, max_grace=20)
    w.source.available[Signal.MEMORY_AVAILABLE] = 50 * MI
    long = w.add(
        "long", usage("long", memory_working_set=900 * MI), terminationGracePeriodSeconds=60
    )
    assert await w.step() == []
    assert w.condition("MemoryPressure") == "True"  # raised at once
    assert await w.step(10) == []
    assert await w.step(25) == [long]
    assert w.killer.calls[0][1] == 20  # min(evictionMaxPodGracePeriod, the pod's 60)


async def test_soft_eviction_uses_the_pods_grace_when_shorter_or_uncapped() -> None:
    soft = Threshold(Signal.MEMORY_AVAILABLE, 100 * MI, None, grace_period_s=0.5)
    w = World(soft)  # evictionMaxPodGracePeriod 0: the pod's own
    w.source.available[Signal.MEMORY_AVAILABLE] = 50 * MI
    w.add("p", usage("p", memory_working_set=900 * MI), terminationGracePeriodSeconds=7)
    await w.step()
    await w.step()
    assert [c[1] for c in w.killer.calls] == [7]


async def test_local_storage_limits_evict_without_node_pressure() -> None:
    w = World(MEMORY)
    w.source.available[Signal.MEMORY_AVAILABLE] = 10 * GI
    over = w.add(
        "over",
        usage("over", ephemeral_storage=20 * MI, volumes={"scratch": 20 * MI}),
        volumes=[{"name": "scratch", "emptyDir": {"sizeLimit": "10Mi"}}],
    )
    w.add("fine", usage("fine", ephemeral_storage=20 * MI, volumes={"scratch": 20 * MI}))
    assert await w.step() == [over]
    assert w.killer.calls == [
        (over, 1, "Evicted", 'Usage of EmptyDir volume "scratch" exceeds the limit "10Mi". ')
    ]
    assert w.condition("MemoryPressure") == "False"
    assert (
        w.registry.get_sample_value("kubelet_evictions", {"eviction_signal": "emptydirfs.limit"})
        == 1
    )


async def test_an_idle_pass_measures_the_node_and_no_pod() -> None:
    w = World(MEMORY, NODEFS)
    w.source.available[Signal.MEMORY_AVAILABLE] = 10 * GI
    w.source.available[Signal.NODEFS_AVAILABLE] = 10 * GI
    for n in range(5):
        w.add(f"p{n}", usage(f"p{n}", ephemeral_storage=GI), containers=with_request("1Gi"))
    w.source.asked.clear()  # (the layout's detection is not a pass)
    assert await w.step() == [] and await w.step() == []
    assert w.source.asked == [frozenset(), frozenset()]  # one node reading per pass


async def test_only_the_pods_with_a_local_storage_limit_are_measured_without_pressure() -> None:
    w = World(MEMORY)
    w.source.available[Signal.MEMORY_AVAILABLE] = 10 * GI
    limited = w.add(
        "limited",
        usage("limited", ephemeral_storage=MI, volumes={"scratch": MI}),
        volumes=[{"name": "scratch", "emptyDir": {"sizeLimit": "10Mi"}}],
    )
    capped = w.add(
        "capped",
        usage("capped", ephemeral_storage=MI),
        containers=[
            {"name": "c", "image": "x", "resources": {"limits": {"ephemeral-storage": "1Gi"}}}
        ],
    )
    w.add("plain", usage("plain", ephemeral_storage=GI))
    w.source.asked.clear()
    assert await w.step() == []
    assert w.source.asked == [frozenset(), frozenset({limited, capped})]


async def test_a_met_threshold_measures_every_pod_for_the_ranking() -> None:
    w = World(MEMORY)
    w.source.available[Signal.MEMORY_AVAILABLE] = 50 * MI
    w.add("a", usage("a", memory_working_set=100 * MI))
    b = w.add("b", usage("b", memory_working_set=300 * MI))
    w.source.asked.clear()
    assert await w.step() == [b]  # ranked on usage the node reading alone did not carry
    assert w.source.asked == [frozenset(), None]


async def test_pressure_condition_clears_after_the_transition_period() -> None:
    w = World(MEMORY, transition=60.0)
    w.source.available[Signal.MEMORY_AVAILABLE] = 50 * MI
    await w.step()
    assert w.condition("MemoryPressure") == "True"
    w.source.available[Signal.MEMORY_AVAILABLE] = GI
    assert w.condition("MemoryPressure") == "True"
    await w.step(30)
    assert w.condition("MemoryPressure") == "True"  # held against flapping
    await w.step(31)
    assert w.condition("MemoryPressure") == "False"


async def test_a_failed_kill_is_retried_on_the_next_pass() -> None:
    w = World(MEMORY)
    w.source.available[Signal.MEMORY_AVAILABLE] = 50 * MI
    hog = w.add("hog", usage("hog", memory_working_set=900 * MI))
    w.killer.fail = ConnectionError("syncloop socket refused")
    assert await w.step() == []
    w.killer.fail = None
    assert await w.step() == [hog]


async def test_an_evicted_pod_is_forgotten_once_it_is_no_longer_active() -> None:
    w = World(MEMORY)
    w.source.available[Signal.MEMORY_AVAILABLE] = 50 * MI
    hog = w.add("hog", usage("hog", memory_working_set=900 * MI))
    other = w.add(
        "other", usage("other", memory_working_set=10 * MI), containers=with_request("1Gi")
    )
    assert await w.step() == [hog]
    assert set(w.manager.evicted) == {hog}  # still active: its status has not caught up
    del w.pods.pods[hog]  # terminal now, or gone
    assert await w.step() == [other]
    assert set(w.manager.evicted) == {other}


async def test_wait_for_cleanup_returns_once_the_pod_is_terminal() -> None:
    w = World(MEMORY)
    w.source.available[Signal.MEMORY_AVAILABLE] = 50 * MI
    hog = w.add("hog", usage("hog", memory_working_set=900 * MI))
    assert await w.step() == [hog]
    assert await w.manager.wait_for_cleanup([hog]) is True


async def test_wait_for_cleanup_waits_for_the_evicted_pods_volumes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A terminal pod whose emptyDir is still on disk is not cleaned up yet: measuring
    again then would find the same disk pressure and evict a second pod."""
    monkeypatch.setattr("klet.eviction.manager.CLEANUP_POLL_S", 0.0)
    w = World(MEMORY)
    w.source.available[Signal.MEMORY_AVAILABLE] = 50 * MI
    hog = w.add("hog", usage("hog", memory_working_set=900 * MI))
    assert await w.step() == [hog]
    w.volumes.add(hog)
    polls = 0
    exists = w.deps.volumes_exist

    def torn_down_after_three_polls(uid: str) -> bool:
        nonlocal polls
        polls += 1
        if polls == 3:
            w.volumes.discard(hog)
        return exists(uid)

    object.__setattr__(w.deps, "volumes_exist", torn_down_after_three_polls)
    assert await w.manager.wait_for_cleanup([hog]) is True
    assert polls == 3


async def test_bus_pods_are_the_desired_pods_not_reported_terminal() -> None:
    def desired(uid: str) -> DesiredPod:
        return DesiredPod(
            uid=PodUID(uid), pod={"metadata": {"uid": uid}}, source="api", hash=uid, seen_at=0.0
        )

    def status(uid: str, phase: str, *, terminated: bool = False) -> PodStatusRecord:
        return PodStatusRecord(
            uid=PodUID(uid),
            namespace="ns",
            name=uid,
            version=1,
            epoch=0.0,
            status={"phase": phase},
            updated_at=0.0,
            terminated=terminated,
        )

    bus = FakeBus("n1")
    node = NodeBus.of(bus, service="eviction")
    for u in ("new", "running", "failed", "done", "stopping"):
        bus.seed(node.desired, u, desired(u))
    for rec in (
        status("running", "Running"),
        status("failed", "Failed"),
        status("done", "Succeeded"),
        status("stopping", "Running", terminated=True),
        status("gone", "Running"),
    ):
        bus.seed(node.status, rec.uid, rec)
    pods = BusPods(desired=node.desired, status=node.status)
    active = await pods.active()
    assert sorted(p.pod["metadata"]["uid"] for p in active) == ["new", "running"]

    # issue 42: an idle pass reads the generations only; a change decodes its row only.
    bus.calls.clear()
    for _ in range(3):
        assert len(await pods.active()) == 2
    assert bus.calls == ["generations"] * 3
    assert (pods.desired.decoded, pods.status.decoded) == (5, 5)
    bus.seed(node.status, "running", status("running", "Succeeded"))
    bus.calls.clear()
    assert [p.pod["metadata"]["uid"] for p in await pods.active()] == ["new"]
    assert bus.calls == ["generations", "all"]
    assert (pods.desired.decoded, pods.status.decoded) == (5, 6)
    bus.restart()  # the tables and their generations are gone: both read again
    bus.calls.clear()
    assert await pods.active() == []
    assert bus.calls == ["generations", "all", "all"]
