"""The device plugins' root task: registrations, each plugin's device list, the bus.

syncloop's leader serves upstream's `v1beta1.Registration` on
`<root-dir>/device-plugins/kubelet.sock` (`klet.rpc.deviceplugin`), so upstream's
plugins register unchanged. A Register names an API version (only v1beta1), an
extended resource name and the plugin's socket in the same directory; a bad one is
answered with an error naming what is wrong and nothing is kept. A good one is
answered at once and the plugin followed in a task of its own: the options came with
the request (upstream uses those too), ListAndWatch is opened and every list it sends
replaces the resource's devices. When the stream ends (the plugin exited, its socket
went) the resource's devices turn unhealthy (`DeviceManager.disconnected`); a plugin
registering again for the same resource replaces the one before. Plugins that register
through the plugin watcher instead (`watched.py`) are followed by the same
`Registrations`, so either way replaces the other.

At start the directory is cleared of everything but the checkpoint, as upstream's
CleanupPluginDirectory: plugins watch for kubelet.sock being re-created and register
again, which is how a restarted syncloop gets its plugins back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Protocol

from klet.model.devices import Device, PluginOptions, Registration
from klet.model.layout import DEVICE_PLUGINS_SOCKET as KUBELET_SOCKET
from klet.syncloop.devices import allocation, checkpoint
from klet.syncloop.devices.manager import DeviceManager, PluginAPI

log = logging.getLogger(__name__)

VERSION = "v1beta1"


class Plugin(PluginAPI, Protocol):
    def list_and_watch(self) -> AsyncIterator[list[Device]]: ...

    async def options(self) -> PluginOptions:
        """GetDevicePluginOptions (asked of a plugin registered through the watcher)."""
        ...

    async def close(self) -> None: ...


def validate(r: Registration, directory: Path) -> str:
    """Why a registration is refused ("" when it is taken)."""
    if r.version != VERSION:
        return (
            f"Unsupported version {r.version!r}: this node supports device plugin API "
            f"version {VERSION}"
        )
    why = allocation.resource_name_problem(r.resource_name)
    if why is not None:
        return f"invalid resource name {r.resource_name!r}: {why}"
    if not r.endpoint or "/" in r.endpoint or r.endpoint in (".", "..", KUBELET_SOCKET):
        return f"invalid endpoint {r.endpoint!r}: the name of a socket in {directory}"
    return ""


class Registrations:
    """Takes registrations, from kubelet.sock and from the plugin watcher
    (`devices/watched.py`), and follows each plugin's ListAndWatch. One plugin per
    resource: a newer registration replaces the one before, whichever way each came."""

    def __init__(
        self,
        manager: DeviceManager,
        *,
        connect: Callable[[Path], Plugin],
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.manager = manager
        self.connect = connect
        self.changed = asyncio.Event()
        """Set on every change the bus `devices` table should see (`run` waits on it)."""
        self.on_change = on_change or self.changed.set
        self.followers: dict[str, asyncio.Task[None]] = {}
        self.sources: dict[str, Path] = {}
        """Resource → the socket its plugin in force registered through: the plugin's own
        (kubelet.sock) or its registration socket (the plugin watcher)."""

    async def register(self, r: Registration) -> str:
        self.manager.observer.registered(r.resource_name)  # refused ones too, as upstream
        why = validate(r, self.manager.directory)
        if why:
            log.warning(
                "device plugin registration refused",
                extra={"resource": r.resource_name, "error": why},
            )
            return why
        endpoint = self.manager.directory / r.endpoint
        self.take(r.resource_name, self.connect(endpoint), r.options, source=endpoint)
        return ""

    def take(self, resource: str, plugin: Plugin, options: PluginOptions, *, source: Path) -> None:
        """Follow `plugin` for `resource` from now on, in place of any before."""
        self.manager.load()  # the checkpoint's holders first (idempotent)
        old = self.followers.pop(resource, None)
        if old is not None:
            old.cancel()
        self.manager.connected(resource, plugin, options)
        self.sources[resource] = source
        self.followers[resource] = asyncio.create_task(
            self._follow(resource, plugin), name=f"device-plugin {resource}"
        )
        self.on_change()

    def drop(self, resource: str, *, source: Path) -> bool:
        """Stop following `resource`'s plugin if it is the one that came through `source`
        (its devices turn unhealthy as when its stream ends); False if another is in force."""
        if self.sources.get(resource) != source:
            return False
        del self.sources[resource]
        task = self.followers.pop(resource, None)
        if task is not None:
            task.cancel()
        return True

    async def _follow(self, resource: str, plugin: Plugin) -> None:
        try:
            async for devices in plugin.list_and_watch():
                self.manager.listed(resource, plugin, devices)
                self.on_change()
        except Exception as err:  # noqa: BLE001 - whatever ends the stream, the plugin is gone
            log.info("device plugin stream ended", extra={"resource": resource, "error": str(err)})
        finally:
            self.manager.disconnected(resource, plugin)
            self.on_change()
            with contextlib.suppress(Exception):
                await asyncio.shield(plugin.close())

    async def stop(self) -> None:
        tasks = list(self.followers.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def clean_directory(directory: Path) -> None:
    """Remove everything in the directory but the checkpoint (upstream's
    CleanupPluginDirectory): plugins notice their kubelet.sock re-created."""
    directory.mkdir(mode=0o750, parents=True, exist_ok=True)
    for entry in os.scandir(directory):
        if entry.name == checkpoint.CHECKPOINT_NAME or entry.is_dir(follow_symlinks=False):
            continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink(entry.path)


class ServeRegistration(Protocol):
    async def __call__(
        self,
        socket: Path,
        register: Callable[[Registration], Awaitable[str]],
        *,
        ready: asyncio.Event | None = None,
    ) -> None: ...


async def run(
    manager: DeviceManager,
    *,
    serve: ServeRegistration,
    connect: Callable[[Path], Plugin],
    active: Callable[[], set[str] | None],
    period_s: float = 1.0,
    ready: asyncio.Event | None = None,
    registrations: Registrations | None = None,
) -> None:
    """The root task: the registration socket, the bus `devices` table, the grace
    period and the release of finished pods' devices. `active` gives the UIDs of the
    active pods, or None while not every source is ready. `registrations`: the ones the
    plugin watcher also hands device plugins to (a private one without)."""
    directory = manager.directory
    clean_directory(directory)
    manager.load()
    if registrations is None:
        registrations = Registrations(manager, connect=connect)
    wake = registrations.changed
    server = asyncio.create_task(
        serve(directory / KUBELET_SOCKET, registrations.register, ready=ready),
        name="device-plugin registration",
    )
    log.info(
        "device plugin registration serving", extra={"socket": str(directory / KUBELET_SOCKET)}
    )
    try:
        while not server.done():
            manager.expire()
            uids = active()
            if uids is not None:
                manager.release(uids)
            try:
                await manager.publish()
            except Exception as err:  # noqa: BLE001 - the bus may be away; published next round
                log.debug("device counts not published", extra={"error": str(err)})
            wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(period_s):
                    await wake.wait()
        await server  # it ended: raise what ended it
    finally:
        server.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await server
        await registrations.stop()
