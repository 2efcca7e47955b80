"""The device manager: device plugins' devices, who holds them, and the checkpoint.

syncloop's leader owns it (root task `device-plugins`, `devices/plugins.py` serves the
registration socket and follows each plugin's ListAndWatch). It keeps, per resource,
the devices the plugin last listed and whether the plugin is connected, publishes the
counts in the bus `devices` table (status-reporter turns them into the Node's
capacity and allocatable), answers admission's counts, and at container creation picks
the container's devices, asks the plugin (GetPreferredAllocation, Allocate,
PreStartContainer as its options say) and returns what the CRI config gets.

Every allocation and every device update is written to the checkpoint
(`checkpoint.py`, upstream's file) before the container is created, so a restarted
syncloop reads back which container holds which device and the plugin's answer: a
container created again reuses them without a new Allocate, and a re-registered plugin
finds the same devices held. Until a resource's plugin registers again after a restart
the resource is known but not registered (capacity 0, upstream's stopped endpoint);
a plugin that goes keeps its devices in capacity, all unhealthy, for upstream's grace
period of 5 minutes, then the resource drops to 0.

Allocations of pods that are no longer active are released once every pod source is
ready (upstream's UpdateAllocatedDevices), never before: a restarted syncloop does not
yet know every pod.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from klet.model.devices import HEALTHY, Device, PluginOptions
from klet.model.podresources import NumaDevices
from klet.model.records import DeviceResourceRecord
from klet.model.types import JSON
from klet.syncloop.devices import allocation, checkpoint
from klet.syncloop.devices.allocation import AllocationError, DeviceRunOptions, ResourceCount

log = logging.getLogger(__name__)

STOP_GRACE_S = 300.0
"""upstream's endpointStopGracePeriod: how long a gone plugin's devices stay in capacity."""


class PluginAPI(Protocol):
    """A connected device plugin (`plugins.GrpcPlugin`)."""

    async def preferred(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]: ...

    async def allocate(self, device_ids: Sequence[str]) -> bytes:
        """The serialized ContainerAllocateResponse for these devices."""
        ...

    async def pre_start(self, device_ids: Sequence[str]) -> None: ...


Decode = Callable[[bytes], DeviceRunOptions]
"""Parses a serialized ContainerAllocateResponse (plugins.decode_response)."""


class DeviceObserver(Protocol):
    """Where registrations and Allocate times are counted (metrics.DeviceMetrics)."""

    def registered(self, resource: str) -> None: ...

    def allocated(self, resource: str, seconds: float) -> None: ...


class _NoObserver:
    def registered(self, resource: str) -> None:
        pass

    def allocated(self, resource: str, seconds: float) -> None:
        pass


class DeviceTable(Protocol):
    async def put(self, key: str, value: DeviceResourceRecord) -> None: ...


@dataclass
class _Resource:
    devices: dict[str, Device] = field(default_factory=dict)
    plugin: PluginAPI | None = None
    options: PluginOptions = field(default_factory=PluginOptions)
    stopped_at: float | None = None
    """When its plugin went (or, from the checkpoint, when this process started)."""

    def healthy(self) -> list[str]:
        return [d.id for d in self.devices.values() if d.health == HEALTHY]

    def unhealthy(self) -> list[str]:
        return [d.id for d in self.devices.values() if d.health != HEALTHY]


Key = tuple[str, str, str]  # pod UID, container, resource


@dataclass
class DeviceManager:
    directory: Path
    """<root-dir>/device-plugins."""
    table: DeviceTable
    decode: Decode
    clock: Callable[[], float] = time.time
    observer: DeviceObserver = field(default_factory=_NoObserver)
    resources: dict[str, _Resource] = field(default_factory=dict)
    held: dict[Key, checkpoint.PodDevicesEntry] = field(default_factory=dict)
    affinity: Callable[[str, str], int | None] | None = None
    """The NUMA node mask the topology manager admitted a container with (pod UID,
    container; set by wiring); its devices are picked there first. None: no hint."""
    _published: dict[str, DeviceResourceRecord] = field(default_factory=dict)
    _loaded: bool = False

    @property
    def checkpoint_path(self) -> Path:
        return self.directory / checkpoint.CHECKPOINT_NAME

    # -- start-up and the checkpoint ----------------------------------------------------

    def load(self) -> None:
        """Read the checkpoint once (a missing or corrupt one: start empty, as upstream).
        The first of the root task and admission's first question does it, so pods
        re-admitted after a restart find the devices they hold."""
        if self._loaded:
            return
        self._loaded = True
        try:
            blob = self.checkpoint_path.read_bytes()
        except FileNotFoundError:
            return
        try:
            cp = checkpoint.decode(blob)
        except checkpoint.CorruptCheckpoint as err:
            log.error(
                "device checkpoint not read; device allocations may not be up to date",
                extra={"path": str(self.checkpoint_path), "error": str(err)},
            )
            return
        now = self.clock()
        for e in cp.entries or ():
            self.held[(e.pod_uid, e.container_name, e.resource_name)] = e
        for resource in cp.registered or {}:
            self.resources.setdefault(resource, _Resource(stopped_at=now))
        log.info(
            "device checkpoint read",
            extra={"allocations": len(self.held), "resources": sorted(self.resources)},
        )

    def save(self) -> None:
        cp = checkpoint.DeviceCheckpoint(
            entries=list(self.held.values()),
            registered={r: state.healthy() for r, state in self.resources.items()},
        )
        tmp = self.checkpoint_path.with_name(checkpoint.CHECKPOINT_NAME + ".tmp")
        with open(tmp, "wb") as f:
            f.write(checkpoint.encode(cp))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.checkpoint_path)

    # -- plugins --------------------------------------------------------------------------

    def connected(self, resource: str, plugin: PluginAPI, options: PluginOptions) -> None:
        state = self.resources.setdefault(resource, _Resource())
        state.plugin, state.options, state.stopped_at = plugin, options, None
        log.info("device plugin connected", extra={"resource": resource})

    def disconnected(self, resource: str, plugin: PluginAPI) -> None:
        """The plugin's stream ended: its devices stay, all unhealthy, for the grace period."""
        state = self.resources.get(resource)
        if state is None or state.plugin is not plugin:
            return  # replaced by a newer registration meanwhile
        state.plugin, state.stopped_at = None, self.clock()
        state.devices = {i: Device(i, "Unhealthy", d.numa_nodes) for i, d in state.devices.items()}
        log.info("device plugin disconnected", extra={"resource": resource})

    def listed(self, resource: str, plugin: PluginAPI, devices: Iterable[Device]) -> None:
        state = self.resources.get(resource)
        if state is None or state.plugin is not plugin:
            return
        state.devices = {d.id: d for d in devices}
        log.info(
            "device plugin listed devices",
            extra={
                "resource": resource,
                "healthy": len(state.healthy()),
                "unhealthy": len(state.unhealthy()),
            },
        )
        self.save()

    def expire(self) -> list[str]:
        """Resources whose plugin has been gone for the whole grace period: their
        devices are dropped (upstream's GetCapacity deletes them); returns them."""
        now = self.clock()
        gone = [
            r
            for r, s in self.resources.items()
            if s.plugin is None
            and s.stopped_at is not None
            and now - s.stopped_at >= STOP_GRACE_S
            and s.devices
        ]
        for r in gone:
            self.resources[r].devices = {}
        if gone:
            self.save()
        return gone

    def records(self) -> dict[str, DeviceResourceRecord]:
        now = self.clock()
        out = {}
        for r, s in sorted(self.resources.items()):
            healthy, unhealthy = len(s.healthy()), len(s.unhealthy())
            if s.plugin is None:
                healthy = 0  # a plugin that is not there can give nothing
                unhealthy = len(s.devices)
            out[r] = DeviceResourceRecord(
                resource=r,
                healthy=healthy,
                unhealthy=unhealthy,
                connected=s.plugin is not None,
                at=now,
            )
        return out

    async def publish(self) -> None:
        """Write the counts that changed to the bus `devices` table."""
        for r, rec in self.records().items():
            last = self._published.get(r)
            if last is not None and (last.healthy, last.unhealthy, last.connected) == (
                rec.healthy,
                rec.unhealthy,
                rec.connected,
            ):
                continue
            await self.table.put(r, rec)
            self._published[r] = rec

    # -- the PodResources API -------------------------------------------------------------

    def container_devices(self, uid: str, container: str) -> dict[str, NumaDevices]:
        """The devices one container holds, by resource (upstream's GetDevices)."""
        return {
            k[2]: dict(e.device_ids or {})
            for k, e in self.held.items()
            if k[0] == uid and k[1] == container and e.devices()
        }

    def listed_devices(self) -> dict[str, list[Device]]:
        """Every resource's devices as last listed (a gone plugin's all unhealthy)."""
        return {r: list(s.devices.values()) for r, s in self.resources.items()}

    # -- admission ------------------------------------------------------------------------

    def counts(self) -> Mapping[str, ResourceCount]:
        return {
            r: ResourceCount(registered=s.plugin is not None, healthy=len(s.healthy()))
            for r, s in self.resources.items()
        }

    def admit(self, uid: str, pod: JSON, others: Sequence[JSON]) -> tuple[str, str] | None:
        """(reason, message) rejecting the pod for its devices, or None. A pod that
        already holds devices (admitted before a restart) fits as it is, whether or not
        its plugin is back yet (upstream: a running container needs nothing)."""
        self.load()
        if any(k[0] == uid for k in self.held):
            return None
        return allocation.devices_verdict(pod, others=others, counts=self.counts())

    # -- allocation -----------------------------------------------------------------------

    def release(self, active: Iterable[str]) -> None:
        """Free the devices of pods that are not active (call once sources are ready)."""
        keep = set(active)
        gone = [k for k in self.held if k[0] not in keep]
        for k in gone:
            del self.held[k]
        if gone:
            log.info("device allocations released", extra={"pods": sorted({k[0] for k in gone})})
            self.save()

    def _in_use(self, resource: str) -> set[str]:
        return {d for k, e in self.held.items() if k[2] == resource for d in e.devices()}

    async def container_options(self, pod: JSON, container: JSON) -> DeviceRunOptions | None:
        """The devices of one container about to be created: held ones reused (a
        restart, or a syncloop restarted), new ones picked and allocated. None when it
        asks for no device plugin resource. Raises AllocationError (upstream's words)."""
        want = allocation.container_devices(container)
        want = {r: n for r, n in want.items() if r in self.resources}
        if not want:
            return None
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        name = str(container["name"])
        options = DeviceRunOptions()
        changed = False
        for resource, needed in sorted(want.items()):
            state = self.resources[resource]
            entry = self.held.get((uid, name, resource))
            if entry is not None and len(entry.devices()) != needed:
                raise AllocationError(
                    f"pod {uid!r} container {name!r} changed request for resource "
                    f"{resource!r} from {len(entry.devices())} to {needed}"
                )
            if entry is None:
                entry = await self._allocate(uid, name, resource, needed, state, pod)
                self.held[(uid, name, resource)] = entry
                changed = True
            elif state.plugin is None:
                raise AllocationError(f"cannot allocate unregistered device {resource}")
            if state.options.pre_start_required and state.plugin is not None:
                try:
                    await state.plugin.pre_start(sorted(entry.devices()))
                except Exception as err:  # noqa: BLE001 - the plugin's failure, in its words
                    raise AllocationError(str(err)) from err
            if entry.alloc_resp is not None:
                options = options.merged(self.decode(entry.alloc_resp))
        if changed:
            self.save()
        return options

    async def _allocate(
        self, uid: str, name: str, resource: str, needed: int, state: _Resource, pod: JSON
    ) -> checkpoint.PodDevicesEntry:
        plugin = state.plugin
        if plugin is None:
            raise AllocationError(f"cannot allocate unregistered device {resource}")
        healthy = state.healthy()
        if not healthy:
            raise AllocationError(
                f"no healthy devices present; cannot allocate unhealthy devices {resource}"
            )
        mask = self.affinity(uid, name) if self.affinity is not None else None
        healthy = allocation.by_affinity(
            healthy, {d: state.devices[d].numa_nodes for d in healthy}, mask
        )
        # Devices an init container of this pod held and no longer runs with are reused.
        reusable = _reusable(pod, name, resource, self.held)
        in_use = self._in_use(resource) - set(reusable)
        preferred: list[str] = []
        if state.options.get_preferred_allocation_available:
            available = [d for d in healthy if d not in in_use]
            if needed < len(available):
                must = [d for d in reusable if d in available][:needed]
                try:
                    preferred = await plugin.preferred(available, must, needed)
                except Exception as err:  # noqa: BLE001 - the plugin's failure, in its words
                    raise AllocationError(str(err)) from err
        ids = allocation.pick_devices(
            resource, needed, healthy=healthy, in_use=in_use, reusable=reusable, preferred=preferred
        )
        started = time.monotonic()
        try:
            response = await plugin.allocate(ids)
        except Exception as err:  # noqa: BLE001 - the plugin's failure, in its words
            raise AllocationError(str(err)) from err
        finally:
            self.observer.allocated(resource, time.monotonic() - started)
        numa: dict[int, list[str]] = {}
        for d in ids:
            nodes = state.devices[d].numa_nodes or (checkpoint.NO_NUMA,)
            for n in nodes:
                numa.setdefault(n, []).append(d)
        for k in [
            k
            for k in self.held
            if k[0] == uid and k[2] == resource and set(ids) & self.held[k].devices()
        ]:
            del self.held[k]  # an init container's devices, now the next container's
        log.info(
            "devices allocated",
            extra={"pod": uid, "container": name, "resource": resource, "devices": ids},
        )
        return checkpoint.PodDevicesEntry(
            pod_uid=uid,
            container_name=name,
            resource_name=resource,
            device_ids=numa,
            alloc_resp=response,
        )


def _reusable(
    pod: JSON, name: str, resource: str, held: Mapping[Key, checkpoint.PodDevicesEntry]
) -> list[str]:
    """Devices held by this pod's init containers that ran to completion before
    `name` (not sidecars, which keep theirs)."""
    spec = pod.get("spec") or {}
    uid = str((pod.get("metadata") or {}).get("uid") or "")
    out: list[str] = []
    for c in spec.get("initContainers") or []:
        if c.get("name") == name:
            break
        if c.get("restartPolicy") == "Always":
            continue
        entry = held.get((uid, str(c.get("name")), resource))
        if entry is not None:
            out.extend(sorted(entry.devices()))
    return out
