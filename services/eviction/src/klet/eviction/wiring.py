"""Builds the eviction service's dependencies from settings; production and tests use
the same path (`build_deps(settings, overrides=Overrides(...))`).

The manager acts through adapters of the libs: the host signal source (cgroups, statfs,
/proc, CRI stats), the bus tables (desired and status pods in, pressure conditions and
node Events out), syncloop's PodControl socket and image-gc's GarbageCollector socket,
both under the run directory; the leader serves the Eviction API (dry-runs) on its own
socket there. The eviction configuration is parsed here, so invalid
thresholds refuse the start naming their field. The bus, lease, registry and private
port are every service's (`klet.wiring.service_base`). `Deps.close()` closes the service's
clients at exit (the two gRPC channels, CRI, the bus).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from klet.bus.eventqueue import EventQueue, node_reference, pod_reference
from klet.config import Settings
from klet.cri import RuntimeClient
from klet.eviction.dryrun import DryRunBackend
from klet.eviction.hostsignals import FsLayout, HostSignalSource, pod_volumes_exist
from klet.eviction.manager import NOTE_REASON, BusPods, EvictionManager, ManagerSettings
from klet.eviction.manager import Deps as ManagerDeps
from klet.eviction.metrics import Metrics, create_metrics
from klet.eviction.thresholds import parse_eviction_config
from klet.model.layout import EVICTION, IMAGE_GC, SYNCLOOP, grpc_socket
from klet.model.podhistory import HISTORY_ONLY
from klet.rpc.gc import GarbageCollectorClient
from klet.rpc.podcontrol import PodControlClient
from klet.wiring import BaseOverrides, OnServiceBase, runtime_client, service_base


@dataclass(frozen=True)
class Overrides(BaseOverrides):
    """Replacements for production clients (tests), beside the shared ones (bus,
    registry, lease holder); None keeps the default."""

    cri: RuntimeClient | None = None  # the host signal source's container stats
    pod_control: PodControlClient | None = None  # syncloop's, to kill pods
    gc: GarbageCollectorClient | None = None  # image-gc's, to free disk space


@dataclass(frozen=True)
class Deps(OnServiceBase):
    """The shared parts (bus, node bus, registry, lease, service port) come from `base`."""

    settings: Settings
    cri: RuntimeClient
    manager: EvictionManager
    metrics: Metrics
    events: EventQueue
    pod_control: PodControlClient
    gc: GarbageCollectorClient
    dry_run: DryRunBackend
    socket_path: Path
    """Where the leader serves the Eviction API (`<run-dir>/grpc/eviction/eviction.sock`)."""

    async def close(self) -> None:
        """Close the clients the service holds (gRPC channels, CRI, bus), given ones too."""
        await self.pod_control.close()
        await self.gc.close()
        await self.cri.close()
        await self.bus.close()


def build_deps(settings: Settings, overrides: Overrides | None = None) -> Deps:
    o = overrides or Overrides()
    k = settings.kubelet
    config = parse_eviction_config(k)
    base = service_base(EVICTION, settings.klet, o)
    node_bus, registry = base.node_bus, base.registry
    cri = o.cri if o.cri is not None else runtime_client(k, registry)
    run_dir = Path(settings.klet.run_dir)
    pod_control = (
        o.pod_control
        if o.pod_control is not None
        else PodControlClient(grpc_socket(run_dir, SYNCLOOP))
    )
    gc = o.gc if o.gc is not None else GarbageCollectorClient(grpc_socket(run_dir, IMAGE_GC))
    source = HostSignalSource.from_settings(settings, cri)

    async def free_space(wanted: int) -> int:
        return (await gc.free_space(wanted)).bytes_freed

    async def layout() -> FsLayout:
        return await source.fs_layout()

    metrics = create_metrics(registry)
    events = EventQueue(node_bus.events, cap=100)
    manager = EvictionManager(
        ManagerDeps(
            source=source,
            pods=BusPods(desired=node_bus.desired, status=node_bus.status),
            killer=pod_control,
            free_space=free_space,
            conditions=node_bus.conditions,
            layout=layout,
            node_event=functools.partial(events.emit, node_reference(settings.klet.node_name)),
            pod_note=lambda pod, message, detail: events.emit(
                pod_reference(pod),
                "Warning",
                NOTE_REASON,
                message,
                extra={HISTORY_ONLY: True, "detail": detail},
            ),
            metrics=metrics,
            volumes_exist=pod_volumes_exist(Path(settings.klet.root_dir)),
        ),
        config=config,
        settings=ManagerSettings(
            local_storage_capacity_isolation=k.local_storage_capacity_isolation
        ),
    )
    return Deps(
        base=base,
        settings=settings,
        cri=cri,
        manager=manager,
        metrics=metrics,
        events=events,
        pod_control=pod_control,
        gc=gc,
        dry_run=DryRunBackend(manager, k),
        socket_path=base.grpc_socket,
    )
