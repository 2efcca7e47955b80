"""systemd-logind on the system bus, for graceful node shutdown (dbus-fast, asyncio).

What the shutdown manager needs from logind, as upstream's kubelet uses it:

- `take_delay_lock`: `Inhibit("shutdown", who, why, "delay")`; the reply is a file
  descriptor, and the lock lasts while it is open (closing it releases it).
- `inhibit_delay_max_s`: the Manager's `InhibitDelayMaxUSec` property, the longest
  logind waits for delay locks before it goes on anyway.
- `ensure_inhibit_delay`: raise it. A drop-in `<etc>/systemd/logind.conf.d/99-kubelet.conf`
  with `[Login]` `InhibitDelayMaxSec=<n>` (upstream's file name), then SIGHUP to
  `systemd-logind.service` through systemd's `KillUnit`, which makes logind re-read its
  configuration; the property is read again until it shows the new value (2 s at most).
- `preparing_for_shutdown`: the `PreparingForShutdown` property, true between
  `PrepareForShutdown(true)` and the end (or the cancellation) of a shutdown.
- `shutdown_signals`: each `PrepareForShutdown` signal's argument, until the bus
  connection ends or logind leaves the bus (stopped or restarted: its locks are gone
  with it, so the caller must take a new one), which raise `LogindUnavailable`.

Failures are our own `LogindUnavailable` (no bus, logind not answering) or `LogindError`
(a call logind or systemd refused), raised `from` the original.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

from dbus_fast import Message, MessageType, Variant
from dbus_fast.aio import MessageBus
from klet import sysbus

LOGIN = "org.freedesktop.login1"
LOGIN_PATH = "/org/freedesktop/login1"
LOGIN_MANAGER = "org.freedesktop.login1.Manager"
SYSTEMD = "org.freedesktop.systemd1"
SYSTEMD_PATH = "/org/freedesktop/systemd1"
SYSTEMD_MANAGER = "org.freedesktop.systemd1.Manager"
PROPERTIES = "org.freedesktop.DBus.Properties"
DROP_IN = "systemd/logind.conf.d/99-kubelet.conf"
CALL_TIMEOUT_S = 10.0
RELOAD_WAIT_S = 2.0
SIGHUP = 1
_SIGNAL_MATCH = (
    f"type='signal',sender='{LOGIN}',path='{LOGIN_PATH}',"
    f"interface='{LOGIN_MANAGER}',member='PrepareForShutdown'"
)
_OWNER_MATCH = (
    "type='signal',sender='org.freedesktop.DBus',interface='org.freedesktop.DBus',"
    f"member='NameOwnerChanged',arg0='{LOGIN}'"
)


class LogindUnavailable(Exception):
    """The system bus or logind cannot be reached, or did not answer in time."""


class LogindError(Exception):
    """logind (or systemd, for the reload) refused a call."""


class LogindClient:
    """One connection to the system bus (or `bus_address`) for the shutdown manager."""

    def __init__(
        self,
        *,
        bus_address: str | None = None,
        etc: Path = Path("/etc"),
        timeout_s: float = CALL_TIMEOUT_S,
    ) -> None:
        self.bus_address = bus_address
        self.etc = etc
        self.timeout_s = timeout_s
        self._bus: MessageBus | None = None

    async def _connected(self) -> MessageBus:
        if self._bus is not None and self._bus.connected:
            return self._bus
        bus = await sysbus.connect(
            self.bus_address,
            timeout_s=self.timeout_s,
            unavailable=LogindUnavailable,
            negotiate_unix_fd=True,  # Inhibit answers with a file descriptor
        )
        self._bus = bus
        return bus

    async def _call(
        self,
        destination: str,
        path: str,
        interface: str,
        member: str,
        signature: str,
        body: list[object],
    ) -> Message:
        reply = await sysbus.call(
            await self._connected(),
            destination,
            path,
            interface,
            member,
            signature,
            body,
            timeout_s=self.timeout_s,
            unavailable=LogindUnavailable,
        )
        if reply.message_type == MessageType.ERROR:
            text = str(reply.body[0]) if reply.body else ""
            if reply.error_name in (
                "org.freedesktop.DBus.Error.ServiceUnknown",
                "org.freedesktop.DBus.Error.NameHasNoOwner",
            ):
                raise LogindUnavailable(f"{member}: {destination} is not on the bus: {text}")
            raise LogindError(f"{member}: {reply.error_name}: {text}")
        return reply

    async def _property(self, name: str) -> object:
        reply = await self._call(LOGIN, LOGIN_PATH, PROPERTIES, "Get", "ss", [LOGIN_MANAGER, name])
        value = reply.body[0]
        return value.value if isinstance(value, Variant) else value

    async def inhibit_delay_max_s(self) -> float:
        return int(str(await self._property("InhibitDelayMaxUSec"))) / 1e6

    async def preparing_for_shutdown(self) -> bool:
        return bool(await self._property("PreparingForShutdown"))

    async def take_delay_lock(self, who: str, why: str) -> int:
        reply = await self._call(
            LOGIN,
            LOGIN_PATH,
            LOGIN_MANAGER,
            "Inhibit",
            "ssss",
            ["shutdown", who, why, "delay"],
        )
        fds = list(reply.unix_fds or [])
        value = reply.body[0] if reply.body else None
        if isinstance(value, int) and 0 <= value < len(fds):
            fd = fds.pop(value)
        elif fds:
            fd = fds.pop(0)
        else:
            raise LogindError("Inhibit: the reply carried no file descriptor")
        for extra in fds:
            os.close(extra)
        return fd

    async def ensure_inhibit_delay(self, seconds: int) -> None:
        drop_in = self.etc / DROP_IN
        try:
            drop_in.parent.mkdir(parents=True, exist_ok=True)
            drop_in.write_text(
                f"# klet: graceful node shutdown\n[Login]\nInhibitDelayMaxSec={seconds}\n"
            )
        except OSError as err:
            raise LogindError(f"cannot write {drop_in}: {err}") from err
        await self._call(
            SYSTEMD,
            SYSTEMD_PATH,
            SYSTEMD_MANAGER,
            "KillUnit",
            "ssi",
            ["systemd-logind.service", "main", SIGHUP],
        )
        deadline = asyncio.get_running_loop().time() + RELOAD_WAIT_S
        while await self.inhibit_delay_max_s() < seconds:
            if asyncio.get_running_loop().time() > deadline:
                return
            await asyncio.sleep(0.1)

    async def shutdown_signals(self) -> AsyncIterator[bool]:
        bus = await self._connected()
        queue: asyncio.Queue[bool | str] = asyncio.Queue()

        def on_message(msg: Message) -> None:
            if msg.message_type != MessageType.SIGNAL:
                return
            if msg.interface == LOGIN_MANAGER and msg.member == "PrepareForShutdown":
                queue.put_nowait(bool(msg.body[0]))
            elif msg.member == "NameOwnerChanged" and msg.body and msg.body[0] == LOGIN:
                queue.put_nowait("systemd-logind left the system bus (stopped or restarted)")

        bus.add_message_handler(on_message)
        for match in (_SIGNAL_MATCH, _OWNER_MATCH):
            await self._call(
                "org.freedesktop.DBus",
                "/org/freedesktop/DBus",
                "org.freedesktop.DBus",
                "AddMatch",
                "s",
                [match],
            )
        disconnected = asyncio.ensure_future(bus.wait_for_disconnect())  # type: ignore[no-untyped-call]
        disconnected.add_done_callback(
            lambda _: queue.put_nowait("the system bus connection ended")
        )
        try:
            while not isinstance(item := await queue.get(), str):
                yield item
            raise LogindUnavailable(item)
        finally:
            bus.remove_message_handler(on_message)
            disconnected.cancel()

    def close(self) -> None:
        if self._bus is not None:
            self._bus.disconnect()
            self._bus = None
