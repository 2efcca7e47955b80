"""syncloop's dependencies, built once from settings, by production and tests alike.

`build_deps(settings, overrides=...)` decides what talks to what: the CRI client that
the pod syncer, the runtime reader, the image puller, the prober and (in app.py) PLEG
and log rotation all share; the Redis bus the controller, the intake, the status and
event publishers read and write (with the lease, the registry and the private port: every
service's set-up, `klet.wiring.service_base`); the apiserver client of cluster mode. Tests pass
`Overrides` (a `FakeRuntimeService`, a `FakeBus`, a fixed clock, the node as admission
sees it) and get the production objects wired over them. `Deps.close()` closes the clients at exit.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from klet.cgroups import CgroupFS
from klet.cgroups.machine import read_machine
from klet.config import Settings
from klet.cri import cri_settings
from klet.cri.containerevents import RuntimeEvents
from klet.csi import CSIClient, RegistrationClient
from klet.kube import kube_settings
from klet.model.flowcontrol import Backoff, TokenBucket
from klet.model.layout import DEVICE_PLUGINS_DIR, SYNCLOOP
from klet.model.node import (
    allocatable_amounts,
    node_labels,
    pods_cgroup_amounts,
    storage_aware_eviction_hard,
)
from klet.model.types import JSON, ContainerID
from klet.obs.restclient import RestClientMetrics
from klet.rpc.deviceplugin import decode_response
from klet.rpc.dra import GrpcDRAPlugin
from klet.syncloop import numaalignment
from klet.syncloop.admission.admit import AdmissionLedger, NodeInfo, admit_pod
from klet.syncloop.admission.nodetaints import KubeNodeApi, NodeTaints
from klet.syncloop.admission.sysctls import SysctlAllowlist
from klet.syncloop.containers import podcgroups
from klet.syncloop.containers.credentialplugins import AccountSource, PluginKeyring
from klet.syncloop.containers.hooks import LifecycleHooks
from klet.syncloop.containers.images import (
    ImagePuller,
    NodeCredentials,
    PullCredentials,
    pull_parallelism,
)
from klet.syncloop.containers.podcgroups import (
    CgroupfsPodCgroups,
    NodeCgroupLimits,
    PodCgroups,
)
from klet.syncloop.containers.reservedcgroups import (
    ReservedCgroup,
    SliceWriter,
    Writer,
    reserved_cgroups,
)
from klet.syncloop.containers.security import SecuritySettings
from klet.syncloop.containers.syncsettings import SyncSettings
from klet.syncloop.containers.systemdcgroups import SystemdPodCgroups
from klet.syncloop.cpumanager.manager import CPUManager, create_manager
from klet.syncloop.criprotocols import NodeRuntime
from klet.syncloop.devices.manager import DeviceManager
from klet.syncloop.dra.apiclaims import ApiClaims
from klet.syncloop.dra.apislices import ApiSlices
from klet.syncloop.dra.manager import ClaimManager, ManagerDeps
from klet.syncloop.dra.registration import DRADrivers, DriverInstance
from klet.syncloop.dra.slices import SliceWiper
from klet.syncloop.dra.state import ClaimCheckpoint
from klet.syncloop.environment.dns import DNSSettings
from klet.syncloop.environment.envvars import NodeFacts
from klet.syncloop.environment.kubeobjects import ApiObjects
from klet.syncloop.eventrecorder import BusEventSink, EventSink
from klet.syncloop.memorymanager.manager import MemoryManager
from klet.syncloop.metrics import (
    CPUManagerMetrics,
    CredentialProviderMetrics,
    DeviceMetrics,
    DRAClaimsInUse,
    Metrics,
    NUMAMetrics,
    ResizeMetrics,
    create_metrics,
    csi_operations,
    dra_grpc_operations,
    dra_operations,
    orphan_sweeps,
    plugin_counts,
    storage_operations,
    volume_counts,
    volume_operation_totals,
    volume_stat_collection,
)
from klet.syncloop.model import podspec
from klet.syncloop.plugins.csidrivers import CSIRegistrar
from klet.syncloop.plugins.watcher import PLUGINS_REGISTRY, PluginWatcher
from klet.syncloop.pods.allocation import ACTUATED_FILE, ALLOCATED_FILE, Checkpoint
from klet.syncloop.pods.controller import NodePressure, PodController, published_status
from klet.syncloop.pods.relisting import Relister
from klet.syncloop.pods.resizing import PodResizer
from klet.syncloop.pods.runtime import ExitNotices, PodRuntime
from klet.syncloop.pods.runtimeevents import EventSource, EventWatcher
from klet.syncloop.pods.statuspub import StatusPublisher
from klet.syncloop.pods.syncpod import PodSyncer
from klet.syncloop.probing.prober import ProbeManager
from klet.syncloop.topologymanager.manager import TopologyManager
from klet.syncloop.volumes.content import (
    ConfigMapPlugin,
    DownwardAPIPlugin,
    ProjectedPlugin,
    SecretPlugin,
)
from klet.syncloop.volumes.csi import CSIVolumePlugin
from klet.syncloop.volumes.emptydir import EmptyDirPlugin
from klet.syncloop.volumes.hostpath import HostPathPlugin
from klet.syncloop.volumes.manager import VolumeManager
from klet.syncloop.volumes.nfs import NfsPlugin
from klet.syncloop.volumes.tokens import TokenManager
from klet.syncloop.volumes.volumestats import VolumeStatsCollector
from klet.wiring import BaseOverrides, OnServiceBase, runtime_client, service_base
from prometheus_client import CollectorRegistry

if TYPE_CHECKING:
    from klet.cgroups.systemd import Systemd
    from klet.kube.client import KubeClient

EVENTED_PLEG_GATE = "EventedPLEG"
CSI_VOLUME_TIMEOUT_S = 120.0
"""Deadline of a CSI stage, publish, unpublish or unstage call (upstream's: 2 minutes)."""


@dataclass(frozen=True)
class Overrides(BaseOverrides):
    """Replacements for production choices (tests), beside the shared ones (bus,
    registry, lease holder); None keeps the default."""

    cri: NodeRuntime | None = None  # e.g. klet.testbed.fakes.cri.FakeRuntimeService
    events: EventSink | None = None
    """Where the syncer, image puller and prober record Events (default: `Deps.events`,
    which queues them for the `events` stream)."""
    clock: Callable[[], float] | None = None
    """The clock of the controller, syncer, image puller, prober, status publisher and
    lifecycle hooks (in production the wall clock, and monotonic time for the hooks)."""
    sleep: Callable[[float], Awaitable[None]] | None = None  # of lifecycle hooks and probes
    node: NodeInfo | None = None  # the node as admission sees it (default: read from the host)
    sync: SyncSettings | None = None  # SyncPod's settings (default: from the settings tree)
    consumer: str | None = None  # the `pods` stream consumer name
    runtime_events: EventSource | None = None
    """The runtime event source of the evented PLEG (e.g. klet.testbed.fakes.cri.FakeRuntimeEvents);
    default: `RuntimeEvents` on the CRI endpoint unless featureGates.EventedPLEG is false
    or `cri` is overridden (then no events unless given here)."""


@dataclass(frozen=True)
class Deps(OnServiceBase):
    """The shared parts (bus, node bus, registry, lease, service port) come from `base`."""

    settings: Settings
    cri: NodeRuntime
    controller: PodController
    prober: ProbeManager
    events: BusEventSink
    metrics: Metrics
    socket_path: Path
    consumer: str
    relister: Relister
    watcher: EventWatcher | None  # None: featureGates.EventedPLEG=false, relisting only
    kube: KubeClient | None = None  # cluster mode's apiserver client, closed at exit
    node_taints: NodeTaints | None = None  # cluster mode: follows the Node for admission
    volumes: VolumeManager | None = None  # pod volumes; its orphan clean-up is a root task
    plugins: PluginWatcher | None = None  # <root-dir>/plugins_registry; None: not watched
    dra_drivers: DRADrivers[GrpcDRAPlugin] | None = None
    """The DRA drivers the plugin watcher's registrar hands `DRAPlugin` sockets to."""
    dra_slices: SliceWiper | None = None
    dra_claims: ClaimManager | None = None
    """The DRA claim manager (cluster mode, the gate on); the PodResources API lists its claims."""
    """The node's ResourceSlices of absent drivers (root task `dra-slices`); cluster mode."""
    volume_stats: VolumeStatsCollector | None = None  # the bus `volumes` table; None: off
    devices: DeviceManager | None = None  # device plugins (root task `device-plugins`)
    cpus: CPUManager | None = None  # the CPU manager (root task `cpu-manager`)
    memory: MemoryManager | None = None  # the memory manager (root task `memory-manager`)
    topology: TopologyManager | None = None  # NUMA alignment and memory placement at admission
    runtime_events: RuntimeEvents | None = None  # the production event channel, closed at exit
    reserved: tuple[ReservedCgroup, ...] = ()
    """The reserved cgroups enforceNodeAllocatable names (root task `node-allocatable`)."""
    reserved_writer: Writer | None = None
    """How their limits are written: None is the cgroupfs driver's files."""

    async def close(self) -> None:
        """Close the clients the service holds (CRI, the apiserver's, the bus), given ones too."""
        await self.cri.close()
        if self.runtime_events is not None:
            await self.runtime_events.close()
        if self.kube is not None:
            await self.kube.close()
        await self.bus.close()


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
        sysctls=SysctlAllowlist.of(k.allowed_unsafe_sysctls),
        runtime_classes=kube_settings(settings) is not None,
        taints=tuple(dict(t) for t in k.register_with_taints),  # upstream's initial node
    )


def _pid_max(proc: Path = Path("/proc")) -> int | None:
    try:
        return int((proc / "sys/kernel/pid_max").read_text().strip())
    except (OSError, ValueError):
        return None


def node_cgroup_limits(settings: Settings) -> NodeCgroupLimits:
    """The limits of `<cgroupRoot>/kubepods` for this host and configuration."""
    k = settings.kubelet
    amounts = pods_cgroup_amounts(
        read_machine(Path(settings.klet.root_dir)),
        pid_max=_pid_max(),
        kube_reserved=k.kube_reserved,
        system_reserved=k.system_reserved,
        enforce_pods="pods" in k.enforce_node_allocatable,
    )
    return NodeCgroupLimits.of(k.cgroup_root or "/", amounts)


def pod_cgroups(driver: str, node: NodeCgroupLimits, systemd: Systemd | None = None) -> PodCgroups:
    """The pod cgroup driver of `cgroupDriver` (validated: cgroupfs or systemd)."""
    cgroups = CgroupFS()
    if driver == "systemd":
        # Imported here: the D-Bus client is loaded only with cgroupDriver: systemd.
        from klet.cgroups.systemd import Systemd

        return SystemdPodCgroups(
            systemd or Systemd(),
            cgroup_version=cgroups.version,
            cgroup_root=node.cgroup_root,
            node=node,
        )
    return CgroupfsPodCgroups(cgroups, node)


def build_deps(settings: Settings, overrides: Overrides | None = None) -> Deps:
    o = overrides or Overrides()
    k = settings.kubelet
    clock = o.clock if o.clock is not None else time.time
    base = service_base(SYNCLOOP, settings.klet, o)
    node_bus, registry = base.node_bus, base.registry
    cri = o.cri if o.cri is not None else runtime_client(k, registry)
    bus_events = BusEventSink(node_bus)
    events = o.events if o.events is not None else bus_events
    # Cluster mode: ConfigMaps and Secrets (env references, pull secrets) from the apiserver.
    api = kube_settings(settings)
    kube: KubeClient | None = None
    if api is not None:
        from klet.kube.client import KubeClient  # cluster mode only: loads `kubernetes`

        kube = KubeClient(api, observer=RestClientMetrics(registry))
    objects = ApiObjects(kube) if kube is not None else None
    metrics = create_metrics(registry, started_at=clock())
    csi_calls = csi_operations(registry)
    # Service-account tokens (TokenRequest), cluster mode only: for projected volumes and
    # CSI drivers, and for credential provider plugins with tokenAttributes.
    tokens = TokenManager(kube) if kube is not None else None
    puller = ImagePuller(
        cri,
        events,
        observer=metrics.image_pulls,
        parallel=pull_parallelism(
            serialize=k.serialize_image_pulls, max_parallel=k.max_parallel_image_pulls
        ),
        clock=clock,
        rate=(
            TokenBucket(k.registry_pull_qps, k.registry_burst, now=clock())
            if k.registry_pull_qps
            else None
        ),
        credentials=PullCredentials(
            node=NodeCredentials(Path(settings.klet.root_dir)),
            objects=objects,
            plugins=(
                PluginKeyring.from_config(
                    settings.klet.credential_providers,
                    observer=CredentialProviderMetrics.create(
                        registry, config_hash=settings.klet.credential_providers.hash
                    ),
                    source=AccountSource(accounts=objects, tokens=tokens),
                )
                if settings.klet.credential_providers is not None
                else None
            ),
        ),
    )
    exits = ExitNotices()  # exits announced before CRI records them (runtimeevents.py)
    runtime = PodRuntime(cri, exits)
    # The downward API's default limits and a memory emptyDir's size are the node's
    # allocatable, as upstream's (what the Node reports, from the same shared code).
    allocatable = (o.node or admission_node(settings)).allocatable
    node_facts = NodeFacts(
        host_ips=(host_ip(settings),),
        cpu_millis=allocatable.get("cpu", 1000),
        memory_bytes=allocatable.get("memory", 0),
    )
    nfs_volumes = NfsPlugin()  # inline nfs volumes and the claim plugin's NFS PVs
    volumes = VolumeManager(
        [
            EmptyDirPlugin(),
            HostPathPlugin(),
            nfs_volumes,
            ConfigMapPlugin(),
            SecretPlugin(),
            DownwardAPIPlugin(),
            ProjectedPlugin(forget_tokens=tokens.forget_pod if tokens is not None else None),
            CSIVolumePlugin(
                root_dir=Path(settings.klet.root_dir),
                node_name=settings.klet.node_name,
                drivers=node_bus.csidrivers,
                connect=lambda endpoint, driver: CSIClient(
                    endpoint, timeout_s=CSI_VOLUME_TIMEOUT_S, driver=driver, observer=csi_calls
                ),
                objects=objects,
                tokens=tokens,
                nfs_volumes=nfs_volumes,
                events=bus_events.queue,  # the resize Events go to the pod and its claim
            ),
        ],
        root_dir=Path(settings.klet.root_dir),
        node=node_facts,
        objects=objects,
        tokens=tokens,
        counts=volume_counts(registry),
        operations=storage_operations(registry),
        totals=volume_operation_totals(registry),
        orphans=orphan_sweeps(registry),
    )
    # upstream: the initial back-off is 10 s, or the maximum when that is set lower
    max_backoff = k.crash_loop_back_off.max_container_restart_period
    backoff = Backoff(initial_s=min(10.0, max_backoff), max_s=max_backoff)
    sync = o.sync or SyncSettings(
        pod_logs_dir=Path(k.pod_logs_dir),
        cgroups_per_qos=k.cgroups_per_qos,
        cgroup_root=k.cgroup_root or "/",
        cpu_cfs_quota=k.cpu_cfs_quota,
        cpu_cfs_quota_period=k.cpu_cfs_quota_period,
        pod_pids_limit=k.pod_pids_limit,
        single_process_oom_kill=k.single_process_oom_kill,
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
    )
    sleep = o.sleep if o.sleep is not None else asyncio.sleep
    systemd = None
    if k.cgroup_driver == "systemd":
        from klet.cgroups.systemd import Systemd

        systemd = Systemd()
    hooks = LifecycleHooks(
        cri=cri,
        events=events,
        host_ip=next(iter(sync.node.host_ips), ""),
        post_start_timeout_s=sync.hook_timeout_s,
        clock=o.clock if o.clock is not None else time.monotonic,
        sleep=sleep,
        stops=exits,  # its own stops' events need no confirmation (runtime.py)
        on_sleep_cut_short=metrics.sleeps_cut_short.inc,
        on_http_fallback=metrics.http_fallbacks.inc,
    )
    syncer = PodSyncer(
        cri=cri,
        runtime=runtime,
        puller=puller,
        events=events,
        cgroups=pod_cgroups(k.cgroup_driver, node_cgroup_limits(settings), systemd)
        if k.cgroups_per_qos
        else None,
        settings=sync,
        backoff=backoff,
        hooks=hooks,
        clock=clock,
        objects=objects,
        volumes=volumes,
        runtime_classes=objects,
        observer=metrics,
    )
    publisher = StatusPublisher(node_bus, clock=clock)

    def probe_result_changed(uid: str) -> None:
        controller.on_runtime_change(uid)  # wake the pod's worker

    prober = ProbeManager(
        cri,
        events=events,
        on_change=probe_result_changed,
        clock=clock,
        sleep=sleep,
        observer=metrics.prober,
    )
    node_taints = (
        NodeTaints(KubeNodeApi(kube, settings.klet.node_name), initial=k.register_with_taints)
        if kube is not None
        else None
    )
    # Device plugins (<root-dir>/device-plugins): admission counts and container
    # creation allocates through the one manager the leader's root task feeds.
    devices = DeviceManager(
        Path(settings.klet.root_dir) / DEVICE_PLUGINS_DIR,
        table=node_bus.devices,
        decode=decode_response,
        clock=clock,
        observer=DeviceMetrics.create(registry),
    )
    syncer.starter.devices = devices
    # The CPU manager (cpuManagerPolicy): the topology manager's first hint provider and
    # allocator (admission takes exclusive CPUs on the merged hint), container creation
    # sets the cpuset; raises CPUManagerError when it cannot start.
    cpus = create_manager(
        k,
        Path(settings.klet.root_dir),
        observer=CPUManagerMetrics.create(registry),
    )
    cpus.check()
    syncer.starter.cpus = cpus
    # The memory and topology managers (memoryManagerPolicy, topologyManagerPolicy):
    # admission aligns hints and places memory, container creation sets cpuset.mems;
    # raises MemoryManagerError when they cannot start.
    memory, topology = numaalignment.build(
        k,
        Path(settings.klet.root_dir),
        cpus=cpus,
        devices=devices,
        observer=NUMAMetrics.create(registry),
    )
    syncer.starter.memory = memory if memory.policy is not None else None
    # DRA (dra/): the drivers registering through the plugin watcher, and (cluster mode:
    # the claims are the apiserver's) the claim manager SyncPod prepares through before
    # a sandbox, container creation takes CDI devices from, termination unprepares; the
    # slice wiper deletes the node's ResourceSlices of drivers that went away.
    dra_slices = (
        SliceWiper(ApiSlices(kube), node=settings.klet.node_name)
        if kube is not None and k.feature_gates.get(DRA_GATE, True)
        else None
    )
    dra_drivers = DRADrivers(
        root_dir=Path(settings.klet.root_dir),
        connect=functools.partial(_connect_dra, observer=dra_grpc_operations(registry)),
        on_change=None
        if dra_slices is None
        else lambda driver, registered: dra_slices.changed(driver, registered=registered),
    )
    claims: ClaimManager | None = None
    if kube is not None and k.feature_gates.get(DRA_GATE, True):
        claims = ClaimManager(
            ManagerDeps(
                claims=ApiClaims(kube),
                drivers=dra_drivers,
                checkpoint=ClaimCheckpoint(Path(settings.klet.root_dir)),
                observe=dra_operations(registry),
            )
        )
        DRAClaimsInUse(claims.claims_in_use, registry=registry)
        syncer.claims = claims
        syncer.starter.claims = claims
    devices.affinity = lambda uid, name: topology.affinity(uid, name).affinity
    admission = AdmissionLedger(
        o.node or admission_node(settings),
        taints=node_taints,
        topology=topology,
        devices=devices,
    )
    resizer = (
        _pod_resizer(
            settings,
            sync,
            cri,
            syncer,
            hooks,
            events,
            admission,
            registry,
            lambda u: controller.on_runtime_change(u),
        )
        if k.feature_gates.get(INPLACE_RESIZE_GATE, True) and sync.root_dir is not None
        else None
    )
    controller = PodController(
        bus=node_bus,
        runtime=runtime,
        syncer=syncer,
        publisher=publisher,
        events=events,
        host_ip=host_ip(settings),
        clock=clock,
        prober=prober,
        admission=admission,
        pressure=NodePressure(node_bus),
        last_status=functools.partial(published_status, node_bus),
        on_rejected=metrics.record_admission_rejection,
        on_preempted=metrics.preemptions.inc,
        node_name=settings.klet.node_name,
        observer=metrics,
        resizer=resizer,
        backoff_period_s=settings.klet.pod_worker_backoff_period,
    )
    relister = Relister(
        cri,
        controller.on_runtime_change,
        evented_period_s=settings.klet.evented_pleg_relist_period,
        cache=runtime.cache,  # each relist confirms or drops the workers' kept reads
    )
    runtime.observe = relister.observe  # the workers' reads keep PLEG's fingerprints
    # Evented PLEG: on unless featureGates.EventedPLEG is false (upstream's gate, whose
    # default is false there; klet defaults it on and falls back to relisting every
    # second by itself when the runtime serves no events).
    runtime_events: RuntimeEvents | None = None
    source = o.runtime_events
    if source is None and o.cri is None and k.feature_gates.get(EVENTED_PLEG_GATE, True):
        # (a CRI override is a fake runtime: real events would come from elsewhere)
        runtime_events = RuntimeEvents(cri_settings(k))
        source = runtime_events
    watcher = (
        EventWatcher(
            source,
            cri,
            relister,
            wake=controller.on_runtime_change,
            observer=metrics.pleg,
            exits=exits,
        )
        if source is not None
        else None
    )
    plugin_watcher = PluginWatcher(
        Path(settings.klet.root_dir) / PLUGINS_REGISTRY,
        CSIRegistrar(node_bus.csidrivers, registration=RegistrationClient, driver=CSIClient),
    )
    plugin_counts(registry, plugin_watcher)
    return Deps(
        base=base,
        settings=settings,
        cri=cri,
        controller=controller,
        prober=prober,
        events=bus_events,
        metrics=metrics,
        socket_path=base.grpc_socket,
        consumer=o.consumer or f"{socket.gethostname()}-{os.getpid()}",
        kube=kube,
        node_taints=node_taints,
        volumes=volumes,
        plugins=plugin_watcher,
        dra_drivers=dra_drivers,
        dra_slices=dra_slices,
        dra_claims=claims,
        volume_stats=VolumeStatsCollector(
            root_dir=Path(settings.klet.root_dir),
            table=node_bus.volumes,
            drivers=node_bus.csidrivers,
            connect=lambda endpoint, driver: CSIClient(endpoint, driver=driver, observer=csi_calls),
            stats_period_s=k.volume_stats_agg_period,
            timing=volume_stat_collection(registry),
        ),
        relister=relister,
        watcher=watcher,
        devices=devices,
        cpus=cpus,
        memory=memory,
        topology=topology,
        runtime_events=runtime_events,
        reserved=reserved_cgroups(k),
        reserved_writer=None
        if systemd is None
        else SliceWriter(systemd, cgroup_version=CgroupFS().version),
    )


INPLACE_RESIZE_GATE = "InPlacePodVerticalScaling"
DRA_GATE = "DynamicResourceAllocation"


def _connect_dra(
    instance: DriverInstance, *, observer: Callable[[str, str, str, float], None]
) -> GrpcDRAPlugin:
    return GrpcDRAPlugin(
        instance.endpoint, driver=instance.driver, service=instance.service, observer=observer
    )


log = logging.getLogger(__name__)


def _pod_resizer(
    settings: Settings,
    sync: SyncSettings,
    cri: NodeRuntime,
    syncer: PodSyncer,
    hooks: LifecycleHooks,
    events: EventSink,
    admission: AdmissionLedger,
    registry: CollectorRegistry,
    wake: Callable[[str], None],
) -> PodResizer:
    """In-place resize: the allocation checkpoints under the root directory, applied
    through CRI and the pod cgroups (pods/resizing.py)."""
    root = sync.root_dir
    assert root is not None
    allocated, problem = Checkpoint.load(root / ALLOCATED_FILE)
    actuated, problem2 = Checkpoint.load(root / ACTUATED_FILE)
    for p in (problem, problem2):
        if p is not None:
            log.error("resize checkpoint ignored", extra={"problem": str(p)})
    node_limits = podcgroups.node_limits(sync)

    def admit(pod: JSON, others: list[JSON]) -> tuple[bool, str]:
        # upstream may preempt for a critical pod's resize too; klet does not (README)
        verdict = admit_pod(pod, others=others, node=admission.node, preempt=False)
        return verdict.admit, verdict.message

    async def kill(pod: JSON, container: JSON, cid: ContainerID) -> None:
        await hooks.kill_container(
            pod, container, cid, grace_s=podspec.grace_period_s(pod, None), pod_ip=""
        )

    return PodResizer(
        allocated=allocated,
        actuated=actuated,
        cri=cri,
        cgroups=syncer.cgroups,
        cgroup_root=sync.cgroup_root,
        node_limits=lambda: node_limits,
        allocatable=lambda: admission.node.allocatable,
        admit=admit,
        events=events,
        observer=ResizeMetrics(registry),
        kill=kill,
        wake=wake,
        cpu_manager_static=settings.kubelet.cpu_manager_policy == "static",
    )
