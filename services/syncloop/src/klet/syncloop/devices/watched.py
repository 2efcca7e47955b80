"""Device plugins that register through the plugin watcher, not on kubelet.sock.

Upstream's kubelet takes device plugins two ways: a Register call on
`<root-dir>/device-plugins/kubelet.sock` (`plugins.py`), and a socket in
`<root-dir>/plugins_registry/` whose pluginregistration `GetInfo` answers type
`DevicePlugin`, the resource name as the plugin's name, `v1beta1` among its versions and
the plugin's own socket as the endpoint (none: the registration socket itself serves the
DevicePlugin API too, as upstream's sample plugin does). The plugin watcher
(`plugins/watcher.py`) finds the socket and its registrar asks GetInfo, then hands a
`DevicePlugin` to `WatchedDevicePlugins`; the plugin is told the outcome there
(NotifyRegistrationStatus), as upstream's operation executor does.

Checked before anything is connected, each refusal told to the plugin naming the cause:
the API version (upstream's message), the resource name (upstream's
IsExtendedResourceName, `allocation.resource_name_problem`) and the endpoint, which
upstream takes as given and klet requires to be a normalised absolute unix socket path
under one of the root dir's plugin directories (`plugins_registry/`, `plugins/`,
`device-plugins/`), not kubelet.sock itself: a registration names the socket whose
Allocate answers become mounts and device nodes of containers, so it must be a socket
only the node's plugins can create. Then the plugin's options are asked
(GetDevicePluginOptions, as upstream's PluginConnected; a Register on kubelet.sock
carries them) and the plugin is followed by the same `Registrations` as a kubelet.sock
one: ListAndWatch into the device manager, Allocate and PreStartContainer at container
creation, the checkpoint.

A second registration of a registered resource replaces the first when its highest
supported API version is at least the registered one's (the rule upstream's CSI
handler has, with equal versions allowed: upstream's device handler replaces on every
registration, and a plugin restarted under a new socket name must not be locked out by
its predecessor's stale socket). klet knows one version, v1beta1, so every valid
re-registration replaces. The socket vanishing withdraws the plugin (its devices turn
unhealthy for the grace period) unless another registration replaced it since.
upstream's registration counter (`kubelet_device_plugin_registration_total`) counts
kubelet.sock registrations only, as upstream's; these are logged.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from klet.model.layout import DEVICE_PLUGINS_DIR, DEVICE_PLUGINS_SOCKET
from klet.syncloop.devices import allocation
from klet.syncloop.devices.plugins import VERSION, Registrations
from klet.syncloop.plugins.endpoints import endpoint_problem, socket_path

log = logging.getLogger(__name__)

DEVICE_PLUGIN = "DevicePlugin"
"""pluginregistration v1's type for device plugins."""
PLUGIN_DIRS = ("plugins_registry", "plugins", DEVICE_PLUGINS_DIR)
"""The root dir's directories a watched device plugin's endpoint may be under."""


class Info(Protocol):
    """What the registration socket said (klet.csi's PluginInfo)."""

    @property
    def name(self) -> str: ...

    @property
    def endpoint(self) -> str: ...

    @property
    def supported_versions(self) -> Sequence[str]: ...


def endpoint_path(info: Info, socket: Path) -> str:
    """The plugin's DevicePlugin socket: its endpoint, or the registration socket."""
    return socket_path(info.endpoint or str(socket))


def device_endpoint_problem(endpoint: str, root_dir: Path) -> str | None:
    """Why `endpoint` is not a socket klet connects to as a device plugin, or None."""
    why = endpoint_problem(endpoint, [root_dir / d for d in PLUGIN_DIRS])
    if why is not None:
        return why
    path = Path(endpoint)
    if path == root_dir / DEVICE_PLUGINS_DIR / DEVICE_PLUGINS_SOCKET:
        return f"endpoint {endpoint!r} is the kubelet's own registration socket"
    return None


def refusal(info: Info, *, socket: Path, root_dir: Path) -> str | None:
    """Why a `DevicePlugin` registration is refused, or None (pure: no I/O)."""
    if VERSION not in info.supported_versions:
        return (
            f"manager version, {VERSION}, is not among plugin supported versions "
            f"{list(info.supported_versions)}"
        )
    why = allocation.resource_name_problem(info.name)
    if why is not None:
        return f"invalid name of device plugin socket: {why}"
    return device_endpoint_problem(endpoint_path(info, socket), root_dir)


class WatchedDevicePlugins:
    """The plugin watcher's handler of `DevicePlugin` registrations."""

    def __init__(self, registrations: Registrations, *, root_dir: Path) -> None:
        self.registrations = registrations
        self.root_dir = root_dir
        self.by_socket: dict[Path, str] = {}
        """Registration socket → resource, for the plugins registered through it."""

    async def register(self, info: Info, socket: Path) -> str | None:
        """Take the plugin; why not (the caller tells the plugin), or None when taken."""
        why = refusal(info, socket=socket, root_dir=self.root_dir)
        if why is not None:
            log.warning(
                "device plugin registration refused",
                extra={"resource": info.name, "socket": str(socket), "error": why},
            )
            return why
        endpoint = Path(endpoint_path(info, socket))
        plugin = self.registrations.connect(endpoint)
        try:
            options = await plugin.options()
        except Exception as err:  # noqa: BLE001 - any failure: the plugin is told why
            await plugin.close()
            why = f"failed to get device plugin options from {endpoint}: {err}"
            log.warning(
                "device plugin registration refused",
                extra={"resource": info.name, "socket": str(socket), "error": why},
            )
            return why
        for other in [s for s, name in self.by_socket.items() if name == info.name]:
            del self.by_socket[other]  # replaced: its vanishing must not take this one
        self.registrations.take(info.name, plugin, options, source=socket)
        self.by_socket[socket] = info.name
        log.info(
            "device plugin registered through the plugin watcher",
            extra={"resource": info.name, "endpoint": str(endpoint), "socket": str(socket)},
        )
        return None

    async def deregister(self, socket: Path) -> None:
        resource = self.by_socket.pop(socket, None)
        if resource is not None and self.registrations.drop(resource, source=socket):
            log.info(
                "device plugin deregistered", extra={"resource": resource, "socket": str(socket)}
            )
