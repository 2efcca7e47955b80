"""image-gc's build_deps: every override reaches its consumer, the defaults come from
the settings, an invalid policy is refused first, and Deps.close() closes what
build_deps opened.

Covers: the CRI client is what image GC, container GC and container stats call; the bus
carries the image use times, the pod tables both collectors read and the node Events;
the registry holds the collector's metrics; the periods and the lease holder are the
ones given; without overrides the client and the lease come from the settings; an
invalid image GC policy raises PolicyError before anything is built; close() closes
CRI and the bus.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from klet.bus import Bus
from klet.config import KletSettings, KubeletConfiguration, Settings
from klet.cri import RuntimeClient, cri_settings
from klet.image_gc.imageselect import PolicyError
from klet.image_gc.wiring import Overrides, Periods, build_deps
from klet.model.records import SourceState
from klet.testbed.fakes.bus import FakeBus
from prometheus_client import CollectorRegistry


class ClosingRuntime(RuntimeClient):
    closed = False

    async def close(self) -> None:
        self.closed = True
        await super().close()


def settings(tmp_path: Path, **kubelet: int) -> Settings:
    return Settings(
        kubelet=KubeletConfiguration(**kubelet),  # type: ignore[arg-type]
        klet=KletSettings(
            service="image-gc", node_name="n1", root_dir=tmp_path, run_dir=tmp_path / "run"
        ),
    )


async def test_every_override_reaches_its_consumer(tmp_path: Path) -> None:
    s = settings(tmp_path)
    bus, registry, periods = FakeBus("n1"), CollectorRegistry(), Periods(container_gc_s=1.0)
    cri = ClosingRuntime(cri_settings(s.kubelet))
    deps = build_deps(
        s, Overrides(bus=bus, cri=cri, registry=registry, periods=periods, lease_holder="h1")
    )
    assert deps.cri is cri and deps.images.runtime is cri
    assert deps.containers.runtime is cri and deps.containers.stats is cri
    assert deps.bus is bus and deps.node_bus.bus is bus
    assert deps.events.stream is deps.node_bus.events
    bus.seed(deps.node_bus.sources, "file", SourceState(source="file", ready=True, at=0.0))
    assert await deps.images.sources_ready()  # container GC reads the same tables
    assert deps.registry is registry and deps.collector.metrics is deps.metrics
    assert deps.periods is periods
    assert deps.lease.holder == "h1" and deps.lease.bus is bus
    await deps.close()
    assert cri.closed and bus.closed


async def test_the_defaults_come_from_the_settings(tmp_path: Path) -> None:
    deps = build_deps(settings(tmp_path))  # nothing connects yet
    assert isinstance(deps.cri, RuntimeClient) and type(deps.bus) is Bus
    assert deps.periods == Periods() and deps.lease.bus is deps.bus
    assert list((tmp_path / "run").iterdir())  # the lease holder's replica slot
    await deps.close()


def test_an_invalid_policy_is_refused_before_anything_is_built(tmp_path: Path) -> None:
    with pytest.raises(PolicyError):
        build_deps(
            settings(
                tmp_path, image_gc_high_threshold_percent=50, image_gc_low_threshold_percent=60
            )
        )
    assert not (tmp_path / "run").exists()
