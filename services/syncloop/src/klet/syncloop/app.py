"""syncloop's root tasks: bus intake, PLEG, pod workers, status/event publishing, PodControl.

All run in one event loop under `run_supervised`: if one dies the process exits non-zero
and its supervisor restarts it, which is safe because a restarted syncloop re-adopts
every pod from CRI without restarting any container.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from klet.bus import BusError
from klet.bus.eventqueue import node_reference
from klet.bus.leader import hold, release_quietly
from klet.model.dra import DRA_PLUGIN
from klet.model.podresources import SOCKET_DIR, SOCKET_NAME
from klet.model.records import NodeConditionRecord
from klet.model.types import JSON, ContainerID
from klet.obs import create_health_app, leader_metric, run_supervised, serve_service_port
from klet.rpc.deviceplugin import GrpcPlugin, serve_registration
from klet.rpc.podcontrol import serve_pod_control
from klet.rpc.podresources import serve_pod_resources
from klet.syncloop.containers.logmanager import ContainerLogManager, LogManagerSettings
from klet.syncloop.containers.reservedcgroups import run_enforcement
from klet.syncloop.cpumanager import manager as cpumanager
from klet.syncloop.criprotocols import NodeRuntime
from klet.syncloop.devices import plugins as devices
from klet.syncloop.devices.watched import DEVICE_PLUGIN, WatchedDevicePlugins
from klet.syncloop.dra.registration import DRADrivers
from klet.syncloop.memorymanager import manager as memorymanager
from klet.syncloop.metrics import PodResourcesMetrics
from klet.syncloop.plugins.csidrivers import CSIRegistrar
from klet.syncloop.podresources import PodResourcesView
from klet.syncloop.pods.controller import PodController
from klet.syncloop.pods.intake import BusIntake
from klet.syncloop.wiring import Deps

log = logging.getLogger(__name__)


async def main(deps: Deps) -> int:
    controller = deps.controller
    m = deps.metrics
    intake = BusIntake(
        deps.node_bus,
        controller,
        consumer=deps.consumer,
        # upstream's syncFrequency: the tables are read in full at least this often
        # even when their generations did not move (klet.bus.tablecopy).
        full_resync_s=deps.settings.kubelet.sync_frequency,
        on_bad=lambda _e: m.bad_bus_entries.inc(),
        on_error=m.bus_errors.inc,
    )
    # Redis restarted empty and the lease is back: publish the statuses it lost (the
    # resync's reconcile) and any that changed meanwhile now, not at the next passes.
    deps.lease.on_restored(intake.restored)
    deps.lease.on_restored(controller.publisher.resume)
    relister = deps.relister
    device_registrations = _device_registrations(deps)
    _dra_drivers(deps)
    log_manager = ContainerLogManager(
        deps.cri,
        relister.running_containers,
        LogManagerSettings.from_config(deps.settings.kubelet),
    )

    def on_uids(uids: set[str]) -> None:
        controller.runtime_uids = uids
        m.pleg_relists.relisted(relister.last_duration_s, now=time.monotonic())
        m.pleg_last_seen.set(time.time())
        m.pod_workers.set(len(controller.workers.uids()))
        m.set_working_pods(controller.working_pods())
        m.running_pods.set(relister.ready_sandboxes())

    async def pleg() -> None:
        await relister.run(on_uids)

    async def pleg_events() -> None:
        if deps.watcher is None:  # featureGates.EventedPLEG=false
            await asyncio.Event().wait()
            return
        await deps.watcher.run()

    async def report_health() -> None:
        # syncloop's contribution to the Node's Ready condition (status-reporter folds
        # it in): False with upstream's message while PLEG is not healthy.
        while True:
            healthy = relister.healthy()
            message = (
                ""
                if healthy
                else (
                    f"PLEG is not healthy: pleg was last seen active {relister.age():.0f}s ago; "
                    f"threshold is {relister.threshold_s():.0f}s"
                )
            )
            record = NodeConditionRecord(
                type="Ready",
                status="True" if healthy else "False",
                at=time.time(),
                reason="" if healthy else "KubeletNotReady",
                message=message,
            )
            try:
                await deps.node_bus.conditions.put("Ready", record)
            except BusError as err:
                log.debug("cannot publish the PLEG health", extra={"error": str(err)})
            await asyncio.sleep(5.0)

    async def periodic_resync() -> None:
        # upstream syncFrequency: every pod is synced again even without any event.
        while True:
            await asyncio.sleep(deps.settings.kubelet.sync_frequency)
            controller.workers.wake_all()

    elected = asyncio.Event()
    leader_metric(deps.registry, service="syncloop", leading=elected.is_set)

    async def gated(name: str, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
        await elected.wait()
        log.debug("starting root task", extra={"task": name})
        await work()

    version = await _runtime_version(deps)
    mismatch = await cgroup_driver_mismatch(deps.cri, deps.settings.kubelet.cgroup_driver)
    if mismatch:
        log.error(mismatch)
        await deps.close()
        return 1
    log.info("syncloop starting", extra={"node": deps.settings.klet.node_name, "runtime": version})
    health = create_health_app(
        registry=deps.registry,
        checks={"pleg": lambda: not elected.is_set() or relister.healthy()},
        ready=lambda: elected.is_set() and intake.synced.is_set(),
    )
    try:
        await run_supervised(
            {
                "lease": hold(deps.lease, elected),
                "pods-consumer": gated("pods-consumer", intake.run_consumer),
                "desired-resync": gated("desired-resync", intake.run_resync),
                "pleg": gated("pleg", pleg),
                "pleg-events": gated("pleg-events", pleg_events),
                "periodic-resync": gated("periodic-resync", periodic_resync),
                "node-health": gated("node-health", report_health),
                "node-allocatable": gated("node-allocatable", lambda: _node_allocatable(deps)),
                "node-taints": _node_taints(deps),
                "status-publisher": gated("status-publisher", controller.publisher.run),
                "event-publisher": gated("event-publisher", deps.events.run),
                "prober": gated("prober", deps.prober.run),
                "volume-cleanup": gated("volume-cleanup", lambda: _volume_cleanup(deps)),
                "plugin-watcher": gated("plugin-watcher", lambda: _watch_plugins(deps)),
                "dra-slices": gated("dra-slices", lambda: _dra_slices(deps)),
                "volume-stats": gated("volume-stats", lambda: _volume_stats(deps)),
                "device-plugins": gated(
                    "device-plugins", lambda: _device_plugins(deps, device_registrations)
                ),
                "cpu-manager": gated("cpu-manager", lambda: _cpu_manager(deps)),
                "memory-manager": gated("memory-manager", lambda: _memory_manager(deps)),
                "pod-resources": gated("pod-resources", lambda: _pod_resources(deps)),
                "log-rotation": gated("log-rotation", log_manager.run),
                "pod-control": gated(
                    "pod-control", lambda: serve_pod_control(controller, deps.socket_path)
                ),
                "health": serve_service_port(health, deps.service_port),
            }
        )
    finally:
        await controller.workers.stop()
        # A start a worker was cancelled in finishes before the lease goes: a standby
        # that takes over must find it done, not half made.
        await deps.cri.settle()
        await release_quietly(deps.lease)
        await deps.close()
    return 0


async def _node_allocatable(deps: Deps) -> None:
    """The reserved cgroups' limits, written by the leader (reservedcgroups.py)."""
    node = node_reference(deps.settings.klet.node_name)
    await run_enforcement(
        deps.reserved,
        emit=lambda type_, reason, message: deps.events.queue.emit(node, type_, reason, message),
        events=deps.events.queue,
        write=deps.reserved_writer,
    )


async def _node_taints(deps: Deps) -> None:
    """Follow the Node's taints for admission (cluster mode; every replica, so one that
    takes over admits with them at once); standalone, nothing to follow."""
    if deps.node_taints is None:
        await asyncio.Event().wait()
        return
    await deps.node_taints.run()


def pods_syncloop_holds(controller: PodController) -> set[str]:
    """The pods whose directories are not the orphan sweep's: the desired ones and every
    pod a worker still holds. A removed pod's worker removes its sandbox first and its
    directory (volumes, files) after, so between the two the sweep, which also keeps
    the pods the runtime has a sandbox for, found the pod an orphan and tore its
    directory down beside the worker (seen in 110-pod teardowns: "removed orphaned pod
    directory" for pods being removed, or "orphaned pod directory kept ... No such file
    or directory" when the two walks met). Upstream's sweep keeps a pod while the
    runtime has anything of it and while its volumes are mounted; klet's worker removes
    both in the one sync that ends it."""
    return {*controller.desired, *controller.workers.uids()}


async def _volume_cleanup(deps: Deps) -> None:
    """Pod directories left by a crash go once the sources are ready (none to clean: idle)."""
    if deps.volumes is None:
        await asyncio.Event().wait()
        return
    controller = deps.controller
    await deps.volumes.run_orphan_cleanup(
        cri=deps.cri,
        ready=lambda: controller.sources_ready,
        desired=lambda: pods_syncloop_holds(controller),
    )


async def _watch_plugins(deps: Deps) -> None:
    """The plugin registry, on the leader only (it writes the bus); idle without one."""
    if deps.plugins is None:
        await asyncio.Event().wait()
        return
    await deps.plugins.run()


async def _volume_stats(deps: Deps) -> None:
    """The bus `volumes` table, on the leader only (it writes the bus); idle without it."""
    if deps.volume_stats is None:
        await asyncio.Event().wait()
        return
    await deps.volume_stats.run()


def _device_registrations(deps: Deps) -> devices.Registrations | None:
    """The device plugins' registrations, shared by the kubelet.sock server (root task
    `device-plugins`) and the plugin watcher, whose registrar hands `DevicePlugin`
    sockets to them (devices/watched.py); None without a device manager."""
    if deps.devices is None:
        return None
    registrations = devices.Registrations(deps.devices, connect=GrpcPlugin)
    if deps.plugins is not None and isinstance(deps.plugins.registrar, CSIRegistrar):
        deps.plugins.registrar.handlers[DEVICE_PLUGIN] = WatchedDevicePlugins(
            registrations, root_dir=Path(deps.settings.klet.root_dir)
        )
    return registrations


def _dra_drivers(deps: Deps) -> DRADrivers[Any] | None:
    """The DRA drivers (dra/registration.py, wiring's: the claim manager calls them) as
    the plugin watcher's registrar's handler of `DRAPlugin` sockets; None without a
    plugin watcher."""
    drivers = deps.dra_drivers
    if drivers is None or deps.plugins is None:
        return None
    if not isinstance(deps.plugins.registrar, CSIRegistrar):
        return None
    deps.plugins.registrar.handlers[DRA_PLUGIN] = drivers
    return drivers


async def _dra_slices(deps: Deps) -> None:
    """The node's ResourceSlices of DRA drivers that are not registered (dra/slices.py),
    on the leader only (it holds the registrations); idle standalone."""
    if deps.dra_slices is None:
        await asyncio.Event().wait()
        return
    await deps.dra_slices.run()


async def _device_plugins(deps: Deps, registrations: devices.Registrations | None) -> None:
    """The device plugin registration socket and the bus `devices` table, on the leader
    only (it writes the bus and the checkpoint); idle without a device manager."""
    if deps.devices is None:
        await asyncio.Event().wait()
        return
    controller = deps.controller

    def active() -> set[str] | None:
        return set(controller.desired) if controller.sources_ready else None

    await devices.run(
        deps.devices,
        serve=serve_registration,
        connect=GrpcPlugin,
        active=active,
        registrations=registrations,
    )


async def _pod_resources(deps: Deps) -> None:
    """The PodResources API on <root-dir>/pod-resources/kubelet.sock, on the leader only
    (podresources.py says why syncloop's)."""
    k = deps.settings.kubelet
    view = PodResourcesView(
        pods=deps.controller,
        devices=deps.devices,
        cpus=deps.cpus,
        memory=deps.memory,
        use_active_pods=k.feature_gates.get("KubeletPodResourcesListUseActivePods", True),
        get_gate=k.feature_gates.get("KubeletPodResourcesGet", True),
        claims=deps.dra_claims,
        dynamic_gate=k.feature_gates.get("KubeletPodResourcesDynamicResources", True),
    )
    socket = Path(deps.settings.klet.root_dir) / SOCKET_DIR / SOCKET_NAME
    metrics = PodResourcesMetrics.create(deps.registry)
    await serve_pod_resources(view, socket, on_request=metrics.request, on_error=metrics.error)


async def _memory_manager(deps: Deps) -> None:
    """The memory manager's state file and the release of inactive pods' memory blocks
    and topology hints, on the leader only (it writes the file)."""
    if deps.memory is None:
        await asyncio.Event().wait()
        return
    controller = deps.controller

    def active() -> dict[str, JSON] | None:
        if not controller.sources_ready:
            return None
        return {
            uid: s.desired.pod
            for uid, s in controller.pods.items()
            if s.desired is not None and s.terminal is None
        }

    forget = deps.topology.release if deps.topology is not None else None
    await memorymanager.run(deps.memory, active=active, forget=forget)


async def _cpu_manager(deps: Deps) -> None:
    """The CPU manager's reconcile every cpuManagerReconcilePeriod, on the leader only (it
    writes the state file); idle without one."""
    if deps.cpus is None:
        await asyncio.Event().wait()
        return
    controller = deps.controller

    def active() -> dict[str, JSON] | None:
        # upstream's active pods: not finished (a terminal phase, or idle since a
        # restart), as admission counts them; a finished pod's CPUs go back to the pool.
        # None until the pods running before a restart are re-admitted: until then the
        # ledger counts none of them, and their CPUs must stay theirs.
        ledger = controller.admission
        if not controller.sources_ready or (ledger is not None and not ledger.restarted):
            return None
        return {
            uid: s.desired.pod
            for uid, s in controller.pods.items()
            if s.desired is not None
            and s.terminal is None
            and (
                ledger is None
                or ledger.counts(uid, status=controller.publisher.get(uid), terminal=False)
            )
        }

    async def running(uid: str) -> list[tuple[str, ContainerID]]:
        # the pod workers' kept read when it is fresh (upstream's reconcile reads the
        # pod cache too): an idle node's reconcile asks CRI nothing (runtimecache.py)
        current = await controller.runtime.get(uid, reuse=True)
        return [(c.name, c.id) for c in current.running()]

    await cpumanager.run(
        deps.cpus,
        active=active,
        running=running,
        cri=deps.cri,
        period_s=deps.settings.kubelet.cpu_manager_reconcile_period,
    )


async def _runtime_version(deps: Deps) -> str:
    try:
        v = await deps.cri.version()
        return f"{v.runtime_name} {v.runtime_version}"
    except Exception as err:  # noqa: BLE001 - the runtime may come up later; PLEG reports it
        log.warning("runtime not reachable at start", extra={"error": str(err)})
        return "unknown"


async def cgroup_driver_mismatch(cri: NodeRuntime, driver: str) -> str:
    """Why syncloop must not start with `cgroupDriver: <driver>` on this runtime ("" when
    it may): the runtime's own driver differs, so pod cgroups and the runtime's
    container cgroups would be in two different trees. A runtime that is not up yet or
    does not say is not refused (PLEG reports a runtime that stays down)."""
    try:
        runtime_driver = await cri.cgroup_driver()
    except Exception as err:  # noqa: BLE001 - the runtime may come up later
        log.warning("runtime cgroup driver unknown at start", extra={"error": str(err)})
        return ""
    if runtime_driver and runtime_driver != driver:
        return (
            f"cgroupDriver: klet's is {driver!r} but the container runtime's is "
            f"{runtime_driver!r} (containerd: SystemdCgroup = "
            f"{'true' if runtime_driver == 'systemd' else 'false'} in its runc options); "
            "set both to the same driver"
        )
    return ""
