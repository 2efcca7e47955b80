"""CSI drivers registered through the plugin watcher, kept in the bus `csidrivers` table.

For each registration socket the watcher finds, as upstream's CSI plugin handler does:
ask it what it is (`GetInfo`); refuse anything but a `CSIPlugin` naming a driver and a
CSI version 1.x; refuse a driver name already registered by this process unless the
newcomer's highest supported version is higher (upstream's ValidatePlugin: a second
registrar cannot take over a driver's name, and with it the volumes and secrets meant
for that driver, by registering after it); ask the driver's own endpoint what it calls
this node (`NodeGetInfo`: node ID, volume limit, topology); record the driver in the
bus table, keyed by its name; then tell the plugin (`NotifyRegistrationStatus`). A
refusal is told to the plugin with the reason and logged; node-driver-registrar exits
on it and its restart makes a new socket, which is a new registration. A socket that
vanishes takes its driver out of the table, unless the driver registered again
through another socket since.

Stricter than upstream, which takes both as given: the driver name must be one the
apiserver accepts in a CSIDriver or a PV (at most 63 characters, a DNS-1123 subdomain
once lowercased), since it becomes a directory of the staging path
(`<root-dir>/plugins/kubernetes.io/csi/<driver>/...`) and a name like `../..` would
move that; the endpoint must be a unix socket's absolute, normalised path (optionally
`unix://`), short enough for a socket address. Its directory is not restricted:
drivers' manifests name host paths such as `/var/lib/kubelet/plugins/<driver>/csi.sock`
whatever the node's root dir.

The registrar is the watcher's only one, so it also hands the plugin types it has a
handler for (`DevicePlugin`: syncloop/devices/watched.py; `DRAPlugin`:
syncloop/dra/registration.py) to that handler after GetInfo,
tells the plugin the handler's verdict, and passes each vanished socket on; any other
type is refused naming it and the types taken.

The table is what the rest of the node reads: syncloop's volume code finds a driver's
endpoint there, status-reporter publishes the node IDs and topology in the CSINode
object and on the Node. The table outlives a syncloop restart; the first scan after
one re-registers what is there and drops the drivers whose socket went away meanwhile.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Protocol

from klet.bus import BusError
from klet.csi import CSIError, DriverUnavailable, NodeInfo, PluginInfo
from klet.model.records import CSIDriverRecord
from klet.syncloop.plugins.endpoints import endpoint_problem

log = logging.getLogger(__name__)

CSI_PLUGIN = "CSIPlugin"
_VERSION = re.compile(r"v?(\d+)(?:\.(\d+))?(?:\.(\d+))?$")
DRIVER_NAME_MAX = 63
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")

Version = tuple[int, int, int]


class DriverTable(Protocol):
    async def put(self, key: str, record: CSIDriverRecord) -> None: ...

    async def delete(self, key: str) -> None: ...

    async def all(self) -> dict[str, CSIDriverRecord]: ...


class Registration(Protocol):
    async def get_info(self) -> PluginInfo: ...

    async def notify(self, *, registered: bool, error: str = "") -> None: ...

    async def close(self) -> None: ...


class PluginHandler(Protocol):
    """Registrations of a plugin type other than CSI, handed over after GetInfo
    (`DevicePlugin`: syncloop/devices/watched.py; `DRAPlugin`: syncloop/dra/registration.py;
    both added by the app)."""

    async def register(self, info: PluginInfo, socket: Path) -> str | None:
        """Take the plugin; why not (told to the plugin), or None when taken."""
        ...

    async def deregister(self, socket: Path) -> None: ...


class Driver(Protocol):
    async def node_info(self) -> NodeInfo: ...

    async def close(self) -> None: ...


def driver_name_problem(name: str) -> str | None:
    """Why `name` is not a CSI driver name as the apiserver validates one in a CSIDriver
    or a PV (`ValidateCSIDriverName`), or None."""
    if not name:
        return "the driver name is empty"
    if len(name) > DRIVER_NAME_MAX:
        return f"driver name {name[:80]!r}... is longer than {DRIVER_NAME_MAX} characters"
    if not _DNS1123_SUBDOMAIN.fullmatch(name.lower()):
        return (
            f"driver name {name!r} is not a DNS-1123 subdomain (lower case alphanumeric "
            "characters, '-' or '.', starting and ending with an alphanumeric character)"
        )
    return None


def highest_version(versions: tuple[str, ...] | list[str]) -> Version | None:
    """The highest 1.x CSI version among `versions`, or None."""
    found: list[Version] = []
    for version in versions:
        m = _VERSION.match(version.strip())
        if m and int(m.group(1)) == 1:
            found.append((1, int(m.group(2) or 0), int(m.group(3) or 0)))
    return max(found, default=None)


def _show(version: Version) -> str:
    return ".".join(str(n) for n in version)


def refusal(info: PluginInfo, *, socket: str = "", others: Iterable[str] = ()) -> str | None:
    """Why klet does not take this plugin as a CSI driver, or None. `socket` is the
    registration socket's path, the endpoint of a plugin that names none; `others` the
    other plugin types taken (by handlers), named in the refusal of an unknown type."""
    if info.type != CSI_PLUGIN:
        known = ", ".join(sorted({CSI_PLUGIN, *others}))
        return f"plugin type {info.type!r} is not supported by klet (only {known})"
    if not info.name:
        return "the plugin gave no driver name"
    why = driver_name_problem(info.name)
    if why is not None:
        return why
    if highest_version(info.supported_versions) is None:
        versions = ", ".join(info.supported_versions) or "none"
        return f"none of the CSI versions the plugin supports ({versions}) is 1.x"
    return endpoint_problem(info.endpoint or socket)


class CSIRegistrar:
    """The watcher's `Registrar`: CSI drivers itself, the other types its `handlers`
    take (after GetInfo, each told the outcome here)."""

    def __init__(
        self,
        table: DriverTable,
        *,
        registration: Callable[[Path], Registration],
        driver: Callable[[str], Driver],
        clock: Callable[[], float] = time.time,
        handlers: Mapping[str, PluginHandler] | None = None,
    ) -> None:
        self.table = table
        self.handlers: dict[str, PluginHandler] = dict(handlers or {})
        """Plugin type → its handler, for the types other than CSIPlugin."""
        self.registration = registration
        self.driver = driver
        self.clock = clock
        self.by_socket: dict[Path, str] = {}
        """Registration socket → driver name, for the drivers registered by this process."""
        self.versions: dict[str, Version] = {}
        """Driver name → the highest CSI version of its registration in force."""
        self._reconciled = False

    async def register(self, socket: Path) -> bool:
        client = self.registration(socket)
        try:
            return await self._register(socket, client)
        finally:
            await client.close()

    async def _register(self, socket: Path, client: Registration) -> bool:
        try:
            info = await client.get_info()
        except CSIError as err:
            log.warning(
                "plugin did not answer GetInfo", extra={"socket": str(socket), "error": str(err)}
            )
            return not isinstance(err, DriverUnavailable)
        handler = self.handlers.get(info.type) if info.type != CSI_PLUGIN else None
        if handler is not None:
            why = await handler.register(info, socket)
            await self._notify(client, socket, registered=why is None, error=why or "")
            return True
        why = refusal(info, socket=str(socket), others=self.handlers)
        version = highest_version(info.supported_versions)
        held = self.versions.get(info.name)
        if why is None and version is not None and held is not None and version <= held:
            why = (
                f"another driver named {info.name!r} is already registered with a higher "
                f"or equal supported version ({_show(held)}; this one supports {_show(version)})"
            )
        if why is not None:
            log.warning(
                "plugin refused", extra={"socket": str(socket), "plugin": info.name, "why": why}
            )
            await self._notify(client, socket, registered=False, error=why)
            return True
        endpoint = info.endpoint or str(socket)
        driver = self.driver(endpoint)
        try:
            node = await driver.node_info()
        except CSIError as err:
            why = f"NodeGetInfo on {endpoint}: {err}"
            log.warning("CSI driver refused", extra={"driver": info.name, "why": why})
            await self._notify(client, socket, registered=False, error=why)
            return not isinstance(err, DriverUnavailable)
        finally:
            await driver.close()
        if not node.node_id:
            why = f"NodeGetInfo on {endpoint} gave no node ID"
            await self._notify(client, socket, registered=False, error=why)
            return True
        record = CSIDriverRecord(
            name=info.name,
            endpoint=endpoint,
            registration=str(socket),
            node_id=node.node_id,
            max_volumes=node.max_volumes_per_node,
            topology=dict(node.topology),
            versions=",".join(info.supported_versions),
            registered_at=self.clock(),
        )
        try:
            await self.table.put(info.name, record)
        except BusError as err:  # the bus is away: try again, the plugin waits
            log.warning(
                "cannot record the CSI driver, will retry",
                extra={"driver": info.name, "error": str(err)},
            )
            return False
        for other in [p for p, name in self.by_socket.items() if name == info.name]:
            del self.by_socket[other]  # superseded: its vanishing must not take this one
        self.by_socket[socket] = info.name
        assert version is not None  # refusal() checked there is one
        self.versions[info.name] = version
        log.info(
            "CSI driver registered",
            extra={"driver": info.name, "endpoint": endpoint, "node_id": node.node_id},
        )
        await self._notify(client, socket, registered=True)
        return True

    async def _notify(
        self, client: Registration, socket: Path, *, registered: bool, error: str = ""
    ) -> None:
        try:
            await client.notify(registered=registered, error=error)
        except CSIError as err:  # the plugin went away meanwhile: nothing to tell
            log.info(
                "plugin not told its registration status",
                extra={"socket": str(socket), "error": str(err)},
            )

    async def deregister(self, socket: Path) -> None:
        for handler in self.handlers.values():
            await handler.deregister(socket)
        name = self.by_socket.pop(socket, None)
        if name is None:
            return
        self.versions.pop(name, None)
        log.info("CSI driver deregistered", extra={"driver": name, "socket": str(socket)})
        self._reconciled = False  # the table's record goes at the reconcile that follows

    async def reconcile(self, present: frozenset[Path]) -> None:
        if self._reconciled:
            return
        try:
            records = await self.table.all()
            # A record names the socket of its driver's last registration; this process
            # took that one (and it is still there: a vanished socket is deregistered) or
            # the driver is not registered.
            for name, record in records.items():
                if self.by_socket.get(Path(record.registration)) != name:
                    await self.table.delete(name)
                    log.info("CSI driver removed from the node", extra={"driver": name})
        except BusError as err:
            log.warning(
                "cannot update the CSI drivers table, will retry", extra={"error": str(err)}
            )
            return
        self._reconciled = True
