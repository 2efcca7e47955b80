"""The kubelet plugin watcher: sockets in `<root-dir>/plugins_registry/` come and go.

A node plugin (a CSI driver's node-driver-registrar, a DRA driver) announces itself
by creating a unix socket in the registry directory; taking it away withdraws it. The
watcher hands each new socket to the `Registrar` once and each vanished one once, as
upstream's plugin manager reconciles its desired state (the sockets there) against
its actual state (the plugins registered).

Polled, not watched with inotify: the directory holds a handful of sockets, one
`scandir` a second is nothing, and a scan sees the whole state, so a missed event or a
restart cannot leave the two apart. The first scan after a start registers everything
present, which is how a restarted syncloop takes the plugins back (the plugins answer
GetInfo again, as they do after a kubelet restart). Upstream walks sub-directories
too, a layout it deprecated; klet looks at the directory itself only, and says so in
the log when it finds a directory there.

A socket whose registration failed is not retried while it stays: the plugin was told
why (NotifyRegistrationStatus) and re-creates its socket to try again, as upstream
expects; a registration that could not even reach the plugin is retried after
`retry_s`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)

PLUGINS_REGISTRY = "plugins_registry"
"""The registry directory's name under the root dir, as upstream's."""


class Registrar(Protocol):
    async def register(self, socket: Path) -> bool:
        """Take the plugin at `socket`; False when it could not be reached (retried
        later). A plugin refused for a reason it was told is True: done."""
        ...

    async def deregister(self, socket: Path) -> None:
        """The plugin at `socket` is gone."""
        ...

    async def reconcile(self, present: frozenset[Path]) -> None:
        """After each scan, with the sockets there now: drop what was registered before
        a restart, or whose removal failed, and whose socket is gone (the registrar
        decides when that needs a look at the bus)."""
        ...


@dataclass
class PluginWatcher:
    directory: Path
    registrar: Registrar
    interval_s: float = 1.0
    retry_s: float = 5.0
    known: dict[Path, tuple[int, int]] = field(default_factory=dict)
    """Socket path → (inode, change time) of the socket registered: a re-created
    socket is a new one, even where the filesystem gives it the same inode."""
    present: frozenset[Path] = frozenset()
    """The sockets the last scan found: upstream's desired state of the world (`known`
    is its actual state), as plugin_manager_total_plugins counts them."""
    _retry_at: dict[Path, float] = field(default_factory=dict)
    _warned: set[str] = field(default_factory=set)

    def sockets(self) -> dict[Path, tuple[int, int]]:
        """The sockets in the directory now, by path, with their identity."""
        found: dict[Path, tuple[int, int]] = {}
        try:
            entries = list(os.scandir(self.directory))
        except FileNotFoundError:
            return found
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISSOCK(st.st_mode):
                found[Path(entry.path)] = (st.st_ino, st.st_ctime_ns)
            elif stat.S_ISDIR(st.st_mode) and entry.name not in self._warned:
                self._warned.add(entry.name)
                log.warning(
                    "plugin registry sub-directory not watched (put the socket in the "
                    "directory itself)",
                    extra={"path": entry.path},
                )
        return found

    async def run_once(self, now: float) -> None:
        present = self.sockets()
        self.present = frozenset(present)
        for path, identity in list(self.known.items()):
            if present.get(path) != identity:
                del self.known[path]
                await self.registrar.deregister(path)
        for path, identity in present.items():
            if path in self.known or self._retry_at.get(path, 0.0) > now:
                continue
            if await self.registrar.register(path):
                self.known[path] = identity
                self._retry_at.pop(path, None)
            else:
                self._retry_at[path] = now + self.retry_s
        await self.registrar.reconcile(frozenset(present))

    async def run(self) -> None:
        self.directory.mkdir(mode=0o750, parents=True, exist_ok=True)
        loop = asyncio.get_running_loop()
        while True:
            await self.run_once(loop.time())
            await asyncio.sleep(self.interval_s)
