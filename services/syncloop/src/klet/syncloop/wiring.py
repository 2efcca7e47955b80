"""Builds syncloop's dependencies from settings; production and tests use the same path."""

from __future__ import annotations

import functools
import os
import socket
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from klet.bus import Bus, Lease, NodeBus, service_lease
from klet.cgroups import CgroupFS
from klet.cgroups.machine import mem_total_bytes, read_machine
from klet.config import Settings
from klet.cri import RuntimeClient, cri_settings
from klet.kube import KubeClient, kube_settings
from klet.model.flowcontrol import Backoff, TokenBucket
from klet.model.layout import DEFAULT_SERVICE_PORTS, SYNCLOOP, grpc_socket
from klet.model.node import allocatable_amounts, node_labels, storage_aware_eviction_hard
from klet.syncloop.admission.admit import AdmissionLedger, NodeInfo
from klet.syncloop.containers.images import (
    ImagePuller,
    NodeCredentials,
    PullCredentials,
    pull_parallelism,
)
from klet.syncloop.containers.security import SecuritySettings
from klet.syncloop.environment.dns import DNSSettings
from klet.syncloop.environment.envvars import NodeFacts
from klet.syncloop.environment.kubeobjects import ApiObjects
from klet.syncloop.events import BusEventSink
from klet.syncloop.metrics import Metrics, create_metrics
from klet.syncloop.pods.controller import NodePressure, PodController, published_status
from klet.syncloop.pods.runtime import PodRuntime
from klet.syncloop.pods.statuspub import StatusPublisher
from klet.syncloop.pods.syncpod import PodSyncer, SyncSettings
from klet.syncloop.probing.prober import ProbeManager
from klet.syncloop.volumes.content import (
    ConfigMapPlugin,
    DownwardAPIPlugin,
    ProjectedPlugin,
    SecretPlugin,
)
from klet.syncloop.volumes.emptydir import EmptyDirPlugin
from klet.syncloop.volumes.hostpath import HostPathPlugin
from klet.syncloop.volumes.manager import VolumeManager
from klet.syncloop.volumes.tokens import TokenManager
from prometheus_client import CollectorRegistry


@dataclass(frozen=True)
class Deps:
    settings: Settings
    bus: Bus
    node_bus: NodeBus
    cri: RuntimeClient
    controller: PodController
    prober: ProbeManager
    events: BusEventSink
    registry: CollectorRegistry
    metrics: Metrics
    socket_path: Path
    service_port: int
    consumer: str
    lease: Lease
    kube: KubeClient | None = None  # cluster mode's apiserver client, closed at exit
    volumes: VolumeManager | None = None  # pod volumes; its orphan clean-up is a root task


def host_ip(settings: Settings) -> str:
    if settings.klet.node_ip:
        return str(settings.klet.node_ip).split(",")[0]
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def admission_node(settings: Settings) -> NodeInfo:
    """The node as pod admission sees it: the allocatable and labels status-reporter
    reports on the Node, computed by the same shared code."""
    k = settings.kubelet
    name = settings.klet.node_name
    machine = read_machine(Path(settings.klet.root_dir))
    return NodeInfo(
        name=name,
        labels=node_labels(name, machine, settings.klet.node_labels),
        allocatable=allocatable_amounts(
            machine,
            max_pods=k.max_pods,
            kube_reserved=k.kube_reserved,
            system_reserved=k.system_reserved,
            eviction_hard=storage_aware_eviction_hard(
                k.eviction_hard, local_storage_capacity_isolation=k.local_storage_capacity_isolation
            ),
        ),
    )


def build_deps(settings: Settings, **overrides: Any) -> Deps:
    k = settings.kubelet
    bus = Bus.from_url(
        settings.klet.redis_url, settings.klet.node_name, auth=settings.klet.redis_auth
    )
    node_bus = NodeBus.of(bus)
    cri = RuntimeClient(cri_settings(k))
    events = BusEventSink(node_bus)
    # Cluster mode: ConfigMaps and Secrets (env references, pull secrets) from the apiserver.
    api = kube_settings(settings)
    kube = KubeClient(api) if api is not None else None
    objects = ApiObjects(kube) if kube is not None else None
    puller = ImagePuller(
        cri,
        events,
        parallel=pull_parallelism(
            serialize=k.serialize_image_pulls, max_parallel=k.max_parallel_image_pulls
        ),
        rate=(
            TokenBucket(k.registry_pull_qps, k.registry_burst, now=time.time())
            if k.registry_pull_qps
            else None
        ),
        credentials=PullCredentials(
            node=NodeCredentials(Path(settings.klet.root_dir)), objects=objects
        ),
    )
    runtime = PodRuntime(cri)
    node_facts = NodeFacts(
        host_ips=(host_ip(settings),),
        cpu_count=os.cpu_count() or 1,
        memory_bytes=mem_total_bytes(),
    )
    # Service-account tokens for projected volumes (TokenRequest), cluster mode only.
    tokens = TokenManager(kube) if kube is not None else None
    volumes = VolumeManager(
        [
            EmptyDirPlugin(),
            HostPathPlugin(),
            ConfigMapPlugin(),
            SecretPlugin(),
            DownwardAPIPlugin(),
            ProjectedPlugin(forget_tokens=tokens.forget_pod if tokens is not None else None),
        ],
        root_dir=Path(settings.klet.root_dir),
        node=node_facts,
        objects=objects,
        tokens=tokens,
    )
    # upstream: the initial back-off is 10 s, or the maximum when that is set lower
    max_backoff = k.crash_loop_back_off.max_container_restart_period
    backoff = Backoff(initial_s=min(10.0, max_backoff), max_s=max_backoff)
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
            pod_pids_limit=k.pod_pids_limit,
            node=node_facts,
            root_dir=Path(settings.klet.root_dir),
            hook_timeout_s=k.runtime_request_timeout,
            security=SecuritySettings(
                seccomp_default=k.seccomp_default,
                seccomp_profile_root=str(Path(settings.klet.root_dir) / "seccomp"),
            ),
            dns=DNSSettings(
                cluster_dns=tuple(k.cluster_dns),
                cluster_domain=k.cluster_domain,
                resolv_conf=k.resolv_conf,
            ),
        ),
        backoff=backoff,
        objects=objects,
        volumes=volumes,
    )
    publisher = StatusPublisher(node_bus)
    registry = CollectorRegistry()
    metrics = create_metrics(registry)

    def probe_result_changed(uid: str) -> None:
        controller.on_runtime_change(uid)  # wake the pod's worker

    prober = ProbeManager(
        cri, events=events, on_change=probe_result_changed, observer=metrics.prober
    )
    controller = PodController(
        bus=node_bus,
        runtime=runtime,
        syncer=syncer,
        publisher=publisher,
        host_ip=host_ip(settings),
        prober=prober,
        admission=AdmissionLedger(admission_node(settings)),
        pressure=NodePressure(node_bus),
        last_status=functools.partial(published_status, node_bus),
        on_rejected=metrics.record_admission_rejection,
        node_name=settings.klet.node_name,
    )
    deps = Deps(
        settings=settings,
        bus=bus,
        node_bus=node_bus,
        cri=cri,
        controller=controller,
        prober=prober,
        events=events,
        registry=registry,
        metrics=metrics,
        socket_path=grpc_socket(Path(settings.klet.run_dir), SYNCLOOP),
        service_port=settings.klet.service_port or DEFAULT_SERVICE_PORTS[SYNCLOOP],
        consumer=f"{socket.gethostname()}-{os.getpid()}",
        # A holder ID of its own; a restart takes over its dead predecessor's lease
        # at once (klet.bus.holder).
        lease=service_lease(bus, "syncloop", Path(settings.klet.run_dir), ttl_ms=15_000),
        kube=kube,
        volumes=volumes,
    )
    return replace(deps, **overrides) if overrides else deps
