"""Builds syncloop's dependencies from settings; production and tests use the same path."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from klet.bus import Bus, Lease, NodeBus
from klet.cgroups import CgroupFS
from klet.config import Settings
from klet.cri import CRISettings, RuntimeClient
from klet.syncloop import podcgroups
from klet.syncloop.backoff import Backoff
from klet.syncloop.controller import PodController
from klet.syncloop.envvars import NodeFacts
from klet.syncloop.events import BusEventSink
from klet.syncloop.images import ImagePuller
from klet.syncloop.metrics import Metrics, create_metrics
from klet.syncloop.runtime import PodRuntime
from klet.syncloop.statuspub import StatusPublisher
from klet.syncloop.syncpod import PodSyncer, SyncSettings
from prometheus_client import CollectorRegistry

DEFAULT_SERVICE_PORT = 10261


@dataclass(frozen=True)
class Deps:
    settings: Settings
    bus: Bus
    node_bus: NodeBus
    cri: RuntimeClient
    controller: PodController
    events: BusEventSink
    registry: CollectorRegistry
    metrics: Metrics
    socket_path: Path
    service_port: int
    consumer: str
    lease: Lease


def host_ip(settings: Settings) -> str:
    if settings.klet.node_ip:
        return str(settings.klet.node_ip).split(",")[0]
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def build_deps(settings: Settings, **overrides: Any) -> Deps:
    k = settings.kubelet
    bus = Bus.from_url(settings.klet.redis_url, settings.klet.node_name)
    node_bus = NodeBus.of(bus)
    cri = RuntimeClient(
        CRISettings(
            runtime_endpoint=k.container_runtime_endpoint,
            image_endpoint=k.image_service_endpoint,
            timeout_s=k.runtime_request_timeout,
        )
    )
    events = BusEventSink(node_bus)
    parallel = 1 if k.serialize_image_pulls else (k.max_parallel_image_pulls or 0) or 64
    puller = ImagePuller(cri, events, parallel=parallel)
    runtime = PodRuntime(cri)
    backoff = Backoff(initial_s=10.0, max_s=k.crash_loop_back_off.max_container_restart_period)
    syncer = PodSyncer(
        cri=cri,
        runtime=runtime,
        puller=puller,
        events=events,
        cgroups=CgroupFS() if k.cgroups_per_qos else None,
        settings=SyncSettings(
            pod_logs_dir=Path(k.pod_logs_dir),
            cgroups_per_qos=k.cgroups_per_qos,
            cpu_cfs_quota=k.cpu_cfs_quota,
            cpu_cfs_quota_period=k.cpu_cfs_quota_period,
            node=NodeFacts(
                host_ips=(host_ip(settings),),
                cpu_count=os.cpu_count() or 1,
                memory_bytes=podcgroups.memory_capacity_bytes(),
            ),
        ),
        backoff=backoff,
    )
    publisher = StatusPublisher(node_bus)
    controller = PodController(
        bus=node_bus, runtime=runtime, syncer=syncer, publisher=publisher, host_ip=host_ip(settings)
    )
    registry = CollectorRegistry()
    deps = Deps(
        settings=settings,
        bus=bus,
        node_bus=node_bus,
        cri=cri,
        controller=controller,
        events=events,
        registry=registry,
        metrics=create_metrics(registry),
        socket_path=Path(settings.klet.run_dir) / "syncloop.sock",
        service_port=settings.klet.service_port or DEFAULT_SERVICE_PORT,
        consumer=f"{socket.gethostname()}-{os.getpid()}",
        # The identity is the replica slot (host + run dir), not the process: a syncloop
        # restarted in the same slot takes its lease back at once.
        lease=bus.lease(
            "syncloop", f"{socket.gethostname()}:{settings.klet.run_dir}", ttl_ms=15_000
        ),
    )
    return replace(deps, **overrides) if overrides else deps
