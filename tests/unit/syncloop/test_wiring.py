"""syncloop's build_deps: every override reaches each collaborator that uses it, the
defaults come from the settings, and Deps.close() closes what build_deps opened.

Covers: an overridden CRI client is the one the controller's runtime reader, the pod
syncer, the image puller, the lifecycle hooks and the prober call; the bus, the clock,
the sleep, the event sink, the registry, admission's node, the SyncPod settings, the
consumer name and the lease holder each reach their consumers; without overrides the
CRI client, the bus and the lease come from the settings (the lease from the run
directory's replica slot) and nothing connects while building; close() closes the CRI
client and the bus (and the apiserver client in cluster mode); the evented PLEG watches
the runtime's events by default, not with featureGates.EventedPLEG=false, and through
a given source (none when only the CRI client is a fake); the relister's long period
comes from --evented-pleg-relist-period, the pod workers' retry after a failed sync from
--pod-worker-backoff-period (upstream's 10 s by default). Its start-up
modules load the D-Bus client only for cgroupDriver: systemd.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from klet.bus import Bus
from klet.config import KletSettings, KubeletConfiguration, Settings
from klet.cri import RuntimeClient
from klet.cri.containerevents import RuntimeEvents
from klet.syncloop.admission.admit import NodeInfo
from klet.syncloop.containers.syncsettings import SyncSettings
from klet.syncloop.wiring import Overrides, build_deps
from klet.testbed.fakes.bus import FakeBus
from klet.testbed.fakes.cri import FakeRuntimeEvents, FakeRuntimeService
from prometheus_client import CollectorRegistry

from tests.harness.freshimports import loaded_after

from .helpers import RecordedEvents, wire


def test_an_overridden_cri_reaches_every_caller(tmp_path: Path) -> None:
    cri = FakeRuntimeService()
    deps = wire(tmp_path, cri)
    syncer = deps.controller.syncer
    assert deps.cri is cri
    assert deps.controller.runtime.cri is cri
    assert syncer.cri is cri and syncer.runtime.cri is cri
    assert syncer.puller.cri is cri and syncer.hooks.cri is cri
    assert deps.prober.cri is cri


def test_every_other_override_reaches_its_consumers(tmp_path: Path) -> None:
    bus, events, registry = FakeBus(), RecordedEvents(), CollectorRegistry()
    node = NodeInfo(name="node1", labels={}, allocatable={"pods": 3})
    sync = SyncSettings(pod_logs_dir=tmp_path / "logs")

    def clock() -> float:
        return 5.0

    async def sleep(_s: float) -> None:
        return None

    deps = build_deps(
        settings(tmp_path),
        Overrides(
            bus=bus,
            cri=FakeRuntimeService(),
            events=events,
            registry=registry,
            clock=clock,
            sleep=sleep,
            node=node,
            sync=sync,
            consumer="c1",
            lease_holder="h1",
        ),
    )
    controller, syncer = deps.controller, deps.controller.syncer
    assert deps.bus is bus and deps.node_bus.bus is bus and controller.bus.bus is bus
    assert controller.publisher.bus.bus is bus
    assert deps.events.queue.stream is deps.node_bus.events
    assert controller.clock is clock and syncer.clock is clock and syncer.puller.clock is clock
    assert controller.publisher.clock is clock and deps.prober.clock is clock
    assert syncer.hooks.clock is clock
    assert syncer.hooks.sleep is sleep and deps.prober.sleep is sleep
    assert syncer.events is events and syncer.puller.events is events
    assert syncer.hooks.events is events and deps.prober.events is events
    assert deps.registry is registry
    assert registry.get_sample_value("kubelet_admission_rejections_total", {"reason": "x"}) is None
    assert controller.on_rejected is not None
    controller.on_rejected("OutOfpods")
    assert (
        registry.get_sample_value("kubelet_admission_rejections_total", {"reason": "OutOfpods"})
        == 1
    )
    assert controller.admission is not None and controller.admission.node is node
    assert syncer.settings is sync
    assert deps.consumer == "c1" and deps.lease.holder == "h1" and deps.lease.bus is bus


async def test_the_defaults_come_from_the_settings(tmp_path: Path) -> None:
    deps = build_deps(settings(tmp_path))  # nothing connects yet
    assert isinstance(deps.cri, RuntimeClient) and type(deps.bus) is Bus
    assert deps.lease.bus is deps.bus and deps.lease.holder != "test"
    assert list((tmp_path / "run").iterdir())  # the lease holder's replica slot
    assert deps.socket_path.name == "syncloop.sock"
    syncer = deps.controller.syncer
    assert syncer.settings.pod_logs_dir == tmp_path / "logs"
    assert syncer.settings.root_dir == tmp_path / "node"
    assert syncer.cgroups is None  # cgroupsPerQOS off
    # evented PLEG on by default, on the CRI endpoint, with the long relist period
    assert isinstance(deps.runtime_events, RuntimeEvents) and deps.watcher is not None
    assert deps.watcher.source is deps.runtime_events and deps.watcher.relister is deps.relister
    assert deps.relister.evented_period_s == 20.0 and deps.relister.current_period() == 1.0
    assert deps.controller.workers.backoff_period_s == 10.0  # upstream's backOffPeriod
    await deps.close()


async def test_the_evented_pleg_gate_and_source(tmp_path: Path) -> None:
    base = settings(tmp_path)
    off = Settings(
        kubelet=KubeletConfiguration(
            cgroups_per_qos=False,
            pod_logs_dir=str(tmp_path / "logs"),
            feature_gates={"EventedPLEG": False},
        ),
        klet=dataclasses.replace(base.klet, evented_pleg_relist_period=120.0),
    )
    deps = build_deps(off)
    assert deps.watcher is None and deps.runtime_events is None
    assert deps.relister.evented_period_s == 120.0
    await deps.close()
    shorter = dataclasses.replace(
        base, klet=dataclasses.replace(base.klet, pod_worker_backoff_period=2.0)
    )
    deps = build_deps(shorter)
    assert deps.controller.workers.backoff_period_s == 2.0  # --pod-worker-backoff-period
    await deps.close()
    cri, events = FakeRuntimeService(), FakeRuntimeEvents()
    deps = build_deps(base, Overrides(cri=cri, bus=FakeBus(), runtime_events=events))
    assert deps.watcher is not None and deps.watcher.source is events
    assert deps.watcher.cri is cri and deps.relister.cri is cri
    assert deps.runtime_events is None  # a given source is the test's to close
    assert build_deps(base, Overrides(cri=cri, bus=FakeBus())).watcher is None


async def test_close_closes_what_build_deps_opened(tmp_path: Path) -> None:
    bus, cri = FakeBus(), FakeRuntimeService()
    deps = wire(tmp_path, cri, bus=bus)
    await deps.close()
    assert cri.closed and bus.closed


def settings(tmp_path: Path) -> Settings:
    return Settings(
        kubelet=KubeletConfiguration(cgroups_per_qos=False, pod_logs_dir=str(tmp_path / "logs")),
        klet=KletSettings(
            service="syncloop",
            node_name="node1",
            node_ip="192.168.1.10",
            root_dir=tmp_path / "node",
            run_dir=tmp_path / "run",
        ),
    )


def test_start_up_loads_no_d_bus_client() -> None:
    """What `python -m klet.syncloop` imports before building its deps (its entry
    point, app, wiring and the start-up checks' modules) leaves dbus-fast and
    klet.cgroups.systemd unloaded; wiring imports them only for cgroupDriver: systemd
    (a fresh interpreter tells)."""
    loaded = loaded_after(
        "import klet.syncloop.__main__, klet.syncloop.app, klet.syncloop.wiring, "
        "klet.syncloop.containers.reservedcgroups, klet.syncloop.containers.systemdcgroups",
        ["dbus_fast", "klet.cgroups.systemd", "klet.sysbus", "klet.syncloop.wiring"],
    )
    assert loaded == ["klet.syncloop.wiring"]
