"""The plugin watcher's registrar over fakes, for the tests of the handlers it hands
registrations to (watched device plugins, DRA drivers): the registration sockets answer
GetInfo as told and record what they are notified, and no CSI driver is ever dialled."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from klet.bus import NodeBus
from klet.csi import NodeInfo, PluginInfo
from klet.syncloop.plugins.csidrivers import CSIRegistrar, PluginHandler
from klet.testbed.fakes.bus import FakeBus


class RegistrationSocket:
    """A plugin's registration socket: its GetInfo answer, the notifications it got."""

    def __init__(self, answer: PluginInfo) -> None:
        self.answer = answer
        self.told: list[tuple[bool, str]] = []

    async def get_info(self) -> PluginInfo:
        return self.answer

    async def notify(self, *, registered: bool, error: str = "") -> None:
        self.told.append((registered, error))

    async def close(self) -> None:
        return None


class NoDriver:
    """The CSI driver client the registrar must not use for another plugin type."""

    async def node_info(self) -> NodeInfo:
        raise AssertionError("a plugin handed to another handler is not a CSI driver")

    async def close(self) -> None:
        return None


def registrar(
    sockets: Mapping[Path, RegistrationSocket], handlers: Mapping[str, PluginHandler]
) -> CSIRegistrar:
    """A registrar reading `sockets` that hands each type in `handlers` to its handler."""
    return CSIRegistrar(
        NodeBus.of(FakeBus(), service="syncloop").csidrivers,
        registration=lambda p: sockets[p],
        driver=lambda _e: NoDriver(),
        handlers=dict(handlers),
    )
