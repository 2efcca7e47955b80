"""Device plugin values shared by syncloop's device manager and its gRPC adapter.

A device as a plugin lists it, the options a plugin registers with, and what the
plugins' Allocate answers add to a container's CRI config. Pure data: the wire lives
in `klet.rpc.deviceplugin`, the decisions in `klet.syncloop.devices`.
"""

from __future__ import annotations

from dataclasses import dataclass

HEALTHY = "Healthy"


@dataclass(frozen=True)
class Device:
    """One device of a plugin's ListAndWatch list."""

    id: str
    health: str  # "Healthy" or "Unhealthy"
    numa_nodes: tuple[int, ...] = ()


@dataclass(frozen=True)
class PluginOptions:
    """What a plugin registers with (DevicePluginOptions)."""

    pre_start_required: bool = False
    get_preferred_allocation_available: bool = False


@dataclass(frozen=True)
class Registration:
    """One RegisterRequest on the kubelet socket."""

    version: str
    endpoint: str  # the plugin's socket name in the device-plugins directory
    resource_name: str
    options: PluginOptions


@dataclass(frozen=True)
class DeviceMount:
    container_path: str
    host_path: str
    read_only: bool = False


@dataclass(frozen=True)
class DeviceNode:
    container_path: str
    host_path: str
    permissions: str = "mrw"


@dataclass(frozen=True)
class DeviceRunOptions:
    """What a container's devices add to its CRI config (upstream's
    DeviceRunContainerOptions): the plugins' Allocate answers merged."""

    envs: tuple[tuple[str, str], ...] = ()
    mounts: tuple[DeviceMount, ...] = ()
    devices: tuple[DeviceNode, ...] = ()
    annotations: tuple[tuple[str, str], ...] = ()
    cdi_devices: tuple[str, ...] = ()

    def merged(self, other: DeviceRunOptions) -> DeviceRunOptions:
        """Upstream's merge: an env or annotation set twice keeps the first, a mount or
        device path twice is given once."""
        envs = dict(self.envs)
        for k, v in other.envs:
            envs.setdefault(k, v)
        annotations = dict(self.annotations)
        for k, v in other.annotations:
            annotations.setdefault(k, v)
        mount_paths = {m.container_path for m in self.mounts}
        device_paths = {d.host_path for d in self.devices}
        return DeviceRunOptions(
            envs=tuple(envs.items()),
            mounts=self.mounts
            + tuple(m for m in other.mounts if m.container_path not in mount_paths),
            devices=self.devices
            + tuple(d for d in other.devices if d.host_path not in device_paths),
            annotations=tuple(annotations.items()),
            cdi_devices=self.cdi_devices
            + tuple(c for c in other.cdi_devices if c not in self.cdi_devices),
        )
