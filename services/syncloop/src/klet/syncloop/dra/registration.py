"""DRA drivers that register through the plugin watcher (upstream's DRA plugin manager).

A DRA driver's kubelet plugin puts a registration socket in `<root-dir>/plugins_registry/`;
the watcher's registrar (`plugins/csidrivers.py`) asks it GetInfo and hands a `DRAPlugin`
to `DRADrivers`, which says whether it is taken; the registrar tells the plugin
(NotifyRegistrationStatus) with the cause of a refusal. Checked, each refusal naming
its cause:

- the versions, which for DRA are the gRPC services the plugin serves: the first of
  klet's (`v1.DRAPlugin`, then `v1beta1.DRAPlugin`, upstream's order) that the plugin
  offers is the one called; none of them, or none at all, is upstream's refusal;
- the driver name, which ResourceSlices and claim allocation results carry and which
  klet will use to find the plugin of a claim: a lower-case DNS-1123 subdomain of at most
  63 characters, as the apiserver validates a driver name (upstream's plugin manager
  takes it as given);
- the endpoint: a normalised absolute unix socket path (optionally `unix://`) under the
  root dir's `plugins/` or `plugins_registry/`, which upstream also takes as given;
  klet will hand this socket the pods' claims and put the CDI devices it answers into
  containers, so it must be a socket only the node's plugins can create. An empty
  endpoint is refused: upstream would register it and fail at the first call;
- an endpoint already registered for the same driver (upstream's "endpoint ... already
  registered": one plugin instance cannot take over another's).

Several instances of one driver may be registered at once (a driver's rolling update
starts the new pod before the old one goes); the most recently registered is the one
called, as upstream's heuristic. The registration socket vanishing withdraws its
instance; the driver is gone when its last instance is (`on_change` hears of a driver's
first instance and of its last going: the slice wiper, slices.py). Nothing is dialled at
registration: the connection is made at each use (`client`), as upstream connects on
demand.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from klet.model.dra import SERVICES
from klet.syncloop.plugins.endpoints import endpoint_problem, socket_path

log = logging.getLogger(__name__)

PLUGIN_DIRS = ("plugins", "plugins_registry")
"""The root dir's directories a DRA driver's endpoint may be under."""
DRIVER_NAME_MAX = 63
C = TypeVar("C")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


class Info(Protocol):
    """What the registration socket said (klet.csi's PluginInfo)."""

    @property
    def name(self) -> str: ...

    @property
    def endpoint(self) -> str: ...

    @property
    def supported_versions(self) -> Sequence[str]: ...


@dataclass(frozen=True)
class DriverInstance:
    """One registered kubelet plugin of a DRA driver."""

    driver: str
    endpoint: Path
    """Its DRAPlugin socket."""
    service: str
    """The DRAPlugin service called on it (`v1.DRAPlugin` or `v1beta1.DRAPlugin`)."""
    socket: Path
    """Its registration socket, whose vanishing withdraws it."""


def chosen_service(versions: Sequence[str]) -> str | None:
    """The first of klet's DRAPlugin services that the plugin offers, or None."""
    return next((s for s in SERVICES if s in versions), None)


def driver_name_problem(name: str) -> str | None:
    """Why `name` is not a DRA driver name the apiserver accepts, or None."""
    if not name:
        return "the plugin gave no DRA driver name"
    if len(name) > DRIVER_NAME_MAX:
        return f"DRA driver name {name[:80]!r} is longer than {DRIVER_NAME_MAX} characters"
    if not _DNS1123_SUBDOMAIN.fullmatch(name):
        return (
            f"DRA driver name {name!r} is not a DNS-1123 subdomain (lower case alphanumeric "
            "characters, '-' or '.', starting and ending with an alphanumeric character)"
        )
    return None


def driver_endpoint_problem(endpoint: str, root_dir: Path) -> str | None:
    """Why `endpoint` is not a socket klet calls as a DRA driver, or None."""
    if not socket_path(endpoint):
        return "the plugin gave no endpoint for its DRAPlugin service"
    return endpoint_problem(endpoint, [root_dir / d for d in PLUGIN_DIRS])


def refusal(info: Info, *, root_dir: Path) -> str | None:
    """Why a `DRAPlugin` registration is refused, or None (pure: no I/O)."""
    why = driver_name_problem(info.name)
    if why is not None:
        return why
    if not info.supported_versions:
        return (
            f"invalid supported gRPC versions of DRA driver plugin {info.name} at endpoint "
            f"{info.endpoint}: empty list of supported gRPC services (aka supported versions)"
        )
    if chosen_service(info.supported_versions) is None:
        return (
            f"invalid supported gRPC versions of DRA driver plugin {info.name} at endpoint "
            f"{info.endpoint}: none of services supported by the plugin "
            f"({list(info.supported_versions)}) are supported by the kubelet ({list(SERVICES)})"
        )
    return driver_endpoint_problem(info.endpoint, root_dir)


class DRADrivers(Generic[C]):
    """The plugin watcher's handler of `DRAPlugin` registrations, and the registered
    drivers: `client(driver)` connects to the one to call (`connect` makes the client,
    klet.rpc.dra.GrpcDRAPlugin in production)."""

    def __init__(
        self,
        *,
        root_dir: Path,
        connect: Callable[[DriverInstance], C],
        on_change: Callable[[str, bool], None] | None = None,
    ) -> None:
        self.root_dir = root_dir
        self.connect = connect
        self.on_change = on_change
        """Told (driver, True) when a driver's first instance registers and (driver,
        False) when its last one goes."""
        self.instances: dict[str, list[DriverInstance]] = {}
        """Driver name → its registered instances, oldest first."""

    async def register(self, info: Info, socket: Path) -> str | None:
        """Take the plugin; why not (the caller tells the plugin), or None when taken."""
        why = refusal(info, root_dir=self.root_dir)
        endpoint = Path(socket_path(info.endpoint))
        held = self.instances.get(info.name, [])
        if why is None and any(i.endpoint == endpoint for i in held):
            why = f"endpoint {endpoint} already registered for DRA driver plugin {info.name}"
        if why is not None:
            log.warning(
                "DRA driver registration refused",
                extra={"driver": info.name, "socket": str(socket), "error": why},
            )
            return why
        service = chosen_service(info.supported_versions)
        assert service is not None  # refusal() checked there is one
        instance = DriverInstance(info.name, endpoint, service, socket)
        self.instances[info.name] = [*held, instance]
        if not held and self.on_change is not None:
            self.on_change(info.name, True)
        log.info(
            "DRA driver registered",
            extra={
                "driver": info.name,
                "endpoint": str(endpoint),
                "service": service,
                "instances": len(held) + 1,
            },
        )
        return None

    async def deregister(self, socket: Path) -> None:
        for driver, held in list(self.instances.items()):
            kept = [i for i in held if i.socket != socket]
            if len(kept) == len(held):
                continue
            if kept:
                self.instances[driver] = kept
            else:
                del self.instances[driver]
                if self.on_change is not None:
                    self.on_change(driver, False)
            log.info(
                "DRA driver instance deregistered",
                extra={"driver": driver, "socket": str(socket), "instances": len(kept)},
            )

    def current(self, driver: str) -> DriverInstance | None:
        """The instance to call for `driver` (the most recently registered), or None."""
        held = self.instances.get(driver)
        return held[-1] if held else None

    def client(self, driver: str) -> C:
        """A client of `driver`'s current instance; LookupError naming the driver when it
        is not registered (upstream's "DRA driver ... is not registered")."""
        instance = self.current(driver)
        if instance is None:
            raise LookupError(f"DRA driver {driver} is not registered")
        return self.connect(instance)
