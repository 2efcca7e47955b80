"""The eviction service's build_deps: every override reaches its consumer, the defaults
come from the settings, and Deps.close() closes what build_deps opened.

Covers: the bus is what the manager reads pods from and writes pressure conditions and
node Events to; the PodControl client is the manager's pod killer and the
GarbageCollector client serves its FreeSpace; the CRI client is the host signal
source's; the registry holds the manager's metrics; the lease holder names the lease;
without overrides the clients and the lease come from the settings; close() closes the
two gRPC clients, CRI and the bus.
"""

from __future__ import annotations

from pathlib import Path

from klet.bus import Bus
from klet.config import KletSettings, KubeletConfiguration, Settings
from klet.cri import RuntimeClient, cri_settings
from klet.eviction.wiring import Overrides, build_deps
from klet.model.records import DesiredPod
from klet.model.types import PodUID
from klet.rpc.gc import FreeSpaceResult, GarbageCollectorClient
from klet.rpc.podcontrol import PodControlClient
from klet.testbed.fakes.bus import FakeBus
from prometheus_client import CollectorRegistry


class RecordingGC(GarbageCollectorClient):
    """image-gc's client, answering FreeSpace itself and noting close()."""

    def __init__(self, socket_path: Path) -> None:
        super().__init__(socket_path)
        self.asked: list[int] = []
        self.closed = False

    async def free_space(
        self, bytes_to_free: int, *, timeout_s: float | None = None
    ) -> FreeSpaceResult:
        self.asked.append(bytes_to_free)
        return FreeSpaceResult(bytes_freed=bytes_to_free // 2)

    async def close(self) -> None:
        self.closed = True
        await super().close()


class ClosingPodControl(PodControlClient):
    def __init__(self, socket_path: Path) -> None:
        super().__init__(socket_path)
        self.closed = False

    async def close(self) -> None:
        self.closed = True
        await super().close()


class ClosingRuntime(RuntimeClient):
    closed = False

    async def close(self) -> None:
        self.closed = True
        await super().close()


def settings(tmp_path: Path) -> Settings:
    return Settings(
        kubelet=KubeletConfiguration(),
        klet=KletSettings(
            service="eviction", node_name="n1", root_dir=tmp_path, run_dir=tmp_path / "run"
        ),
    )


def desired(uid: str) -> DesiredPod:
    pod = {"metadata": {"name": uid, "namespace": "default", "uid": uid}, "spec": {}}
    return DesiredPod(uid=PodUID(uid), pod=pod, source="api", hash="h", seen_at=0.0)


async def test_every_override_reaches_its_consumer(tmp_path: Path) -> None:
    s = settings(tmp_path)
    bus, registry = FakeBus("n1"), CollectorRegistry()
    cri = ClosingRuntime(cri_settings(s.kubelet))
    pod_control = ClosingPodControl(tmp_path / "syncloop.sock")
    gc = RecordingGC(tmp_path / "image-gc.sock")
    deps = build_deps(
        s,
        Overrides(
            bus=bus, cri=cri, pod_control=pod_control, gc=gc, registry=registry, lease_holder="h1"
        ),
    )
    m = deps.manager.deps
    assert deps.bus is bus and deps.cri is cri and deps.registry is registry
    bus.seed(deps.node_bus.desired, "u1", desired("u1"))
    assert [p.pod["metadata"]["uid"] for p in await m.pods.active()] == ["u1"]
    assert m.conditions is deps.node_bus.conditions and deps.node_bus.bus is bus
    m.node_event("Warning", "EvictionThresholdMet", "low on memory")
    assert [e.reason for e in deps.events.queue] == ["EvictionThresholdMet"]
    assert deps.events.stream is deps.node_bus.events
    assert await deps.lease.try_acquire()
    assert m.killer is pod_control
    assert await m.free_space(100) == 50 and gc.asked == [100]
    assert m.source._stats._runtime is cri  # type: ignore[attr-defined]
    assert m.metrics is deps.metrics
    assert deps.lease.holder == "h1" and deps.lease.bus is bus
    await deps.close()
    assert cri.closed and pod_control.closed and gc.closed and bus.closed


async def test_the_defaults_come_from_the_settings(tmp_path: Path) -> None:
    deps = build_deps(settings(tmp_path))  # nothing connects yet
    assert isinstance(deps.cri, RuntimeClient) and type(deps.bus) is Bus
    assert isinstance(deps.pod_control, PodControlClient)
    assert isinstance(deps.gc, GarbageCollectorClient)
    assert deps.lease.bus is deps.bus
    assert list((tmp_path / "run").iterdir())  # the lease holder's replica slot
    await deps.close()
