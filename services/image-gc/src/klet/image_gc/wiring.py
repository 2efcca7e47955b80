"""Builds image-gc's dependencies from settings; production and tests use the same path.

`build_deps(settings, overrides=Overrides(...))`: one CRI client serves image GC, image
detection, container GC and the image filesystem's usage; the bus carries the pod
tables, image use times and node Events; the bus, lease, registry and private port are
every service's (`klet.wiring.service_base`). Tests replace the clients and the loop
periods through `Overrides`; `Deps.close()` closes its clients at exit.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from klet.bus.eventqueue import EventQueue, node_reference
from klet.config import Settings
from klet.cri import RuntimeClient
from klet.image_gc.collector import Collector, CollectorSettings
from klet.image_gc.containergc import ContainerGC
from klet.image_gc.containerselect import ContainerGCSettings
from klet.image_gc.imagefs import ImageFs
from klet.image_gc.imagegc import ImageGCManager
from klet.image_gc.imageselect import ImageGCPolicy
from klet.image_gc.imagestore import BusImageUseStore
from klet.image_gc.metrics import Metrics, create_metrics
from klet.image_gc.podsources import BusPods
from klet.model.layout import IMAGE_GC
from klet.wiring import BaseOverrides, OnServiceBase, runtime_client, service_base


@dataclass(frozen=True)
class Periods:
    """How often the loops run (seconds); upstream's constants, shorter in tests."""

    image_detect_s: float = 300.0
    """Image detection (upstream: every 5 minutes)."""
    image_gc_s: float = 300.0
    """Image GC pass (upstream ImageGCPeriod)."""
    container_gc_s: float = 60.0
    """Container GC pass (upstream ContainerGCPeriod)."""


def image_gc_policy(settings: Settings) -> ImageGCPolicy:
    """The image GC policy of the KubeletConfiguration; raises PolicyError naming the field."""
    k = settings.kubelet
    return ImageGCPolicy(
        high_threshold_percent=k.image_gc_high_threshold_percent,
        low_threshold_percent=k.image_gc_low_threshold_percent,
        min_age_s=k.image_minimum_gc_age,
        max_age_s=k.image_maximum_gc_age,
    )


@dataclass(frozen=True)
class Overrides(BaseOverrides):
    """Replacements for production choices (tests), beside the shared ones (bus,
    registry, lease holder); None keeps the default."""

    cri: RuntimeClient | None = None
    periods: Periods | None = None


@dataclass(frozen=True)
class Deps(OnServiceBase):
    """The shared parts (bus, node bus, registry, lease, service port) come from `base`."""

    settings: Settings
    cri: RuntimeClient
    images: ImageGCManager
    containers: ContainerGC
    collector: Collector
    events: EventQueue
    metrics: Metrics
    socket_path: Path
    periods: Periods = Periods()

    async def close(self) -> None:
        """Close the clients the service holds (CRI and the bus), given ones too."""
        await self.cri.close()
        await self.bus.close()


def build_deps(settings: Settings, overrides: Overrides | None = None) -> Deps:
    o = overrides or Overrides()
    k = settings.kubelet
    policy = image_gc_policy(settings)  # refuses an invalid policy before any I/O
    base = service_base(IMAGE_GC, settings.klet, o)
    node_bus, registry = base.node_bus, base.registry
    cri = o.cri if o.cri is not None else runtime_client(k, registry)
    metrics = create_metrics(registry)
    events = EventQueue(node_bus.events, cap=100)
    node_event = functools.partial(events.emit, node_reference(settings.klet.node_name))
    pods = BusPods(node_bus)
    images = ImageGCManager(
        cri,
        policy=policy,
        fs_stats=ImageFs(cri.image_fs_info).usage,
        sandbox_image=cri.sandbox_image,
        store=BusImageUseStore(node_bus),
        events=node_event,
        sources_ready=pods.sources_ready,
        on_removed=lambda reason: metrics.images_collected.labels(reason).inc(),
    )
    containers = ContainerGC(
        runtime=cri,
        settings=ContainerGCSettings.of(settings.klet),
        sources_ready=pods.sources_ready,
        desired_uids=pods.desired_uids,
        terminated_uids=pods.terminated_uids,
        held_uids=pods.held_uids,
        pod_logs_dir=Path(k.pod_logs_dir),
        stats=cri,
    )
    collector = Collector(
        containers=containers,
        images=images,
        metrics=metrics,
        events=node_event,
        settings=CollectorSettings(),
    )
    return Deps(
        base=base,
        settings=settings,
        cri=cri,
        images=images,
        containers=containers,
        collector=collector,
        events=events,
        metrics=metrics,
        socket_path=base.grpc_socket,
        periods=o.periods or Periods(),
    )
