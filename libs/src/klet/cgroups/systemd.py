"""systemd's D-Bus API for the systemd cgroup driver: start, update and stop slices.

The one module that talks to systemd (through dbus-fast, an asyncio D-Bus library). It
connects to the system bus lazily and again after a disconnect, so a restarted systemd
or D-Bus costs one failed call, not the process. Every D-Bus failure becomes our own
`SystemdUnavailable` (no bus, no systemd, a call that timed out) or `SystemdError` (a
call systemd answered with an error), raised `from` the original.

- `ensure_slice` starts a transient slice (`StartTransientUnit`, mode `replace`) with the
  properties of `klet.cgroups.slices` and waits for its job; a slice that exists already
  (`UnitExists`) gets its limits through `SetUnitProperties` (runtime) instead, as
  `set_properties` sets them on any loaded unit (the reserved cgroups' slices).
- `stop_slice` stops it (`StopUnit`) and waits for the job; systemd then drops the
  transient unit and removes its cgroups. A slice that is not loaded is already gone.

Jobs are awaited through the Manager's `JobRemoved` signal (after `Subscribe`), by job
path: a job that ends before the caller has read its path from the reply is kept (while
calls are in flight, at most 1024), so no end is missed and concurrent calls on the same
unit each get their own job's result. `preflight` is the start-up check of `cgroupDriver: systemd`:
PID 1 must be systemd and its bus must answer.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from pathlib import Path

from dbus_fast import Message, MessageType, Variant
from dbus_fast.aio import MessageBus
from dbus_fast.errors import DBusError
from klet import sysbus
from klet.cgroups import SystemdError, SystemdUnavailable
from klet.cgroups.fs import pid1_cgroup_prefix
from klet.cgroups.slices import Property

__all__ = [
    "Systemd",
    "SystemdError",
    "SystemdUnavailable",
    "pid1_cgroup_prefix",
    "pid1_is_systemd",
    "preflight",
]

log = logging.getLogger(__name__)

SYSTEMD = "org.freedesktop.systemd1"
MANAGER_PATH = "/org/freedesktop/systemd1"
MANAGER = "org.freedesktop.systemd1.Manager"
PROPERTIES = "org.freedesktop.DBus.Properties"
_UNIT_EXISTS = "org.freedesktop.systemd1.UnitExists"
_NO_SUCH_UNIT = "org.freedesktop.systemd1.NoSuchUnit"
_JOB_REMOVED_MATCH = (
    f"type='signal',sender='{SYSTEMD}',path='{MANAGER_PATH}',"
    f"interface='{MANAGER}',member='JobRemoved'"
)
_ENDED_CAP = 1024
CALL_TIMEOUT_S = 30.0
"""How long one D-Bus call and the job it starts may take."""


def pid1_is_systemd(proc: Path = Path("/proc")) -> bool:
    try:
        return (proc / "1/comm").read_text().strip() == "systemd"
    except OSError:
        return False


class Systemd:
    """A connection to systemd's Manager on the system bus (or ``bus_address``)."""

    def __init__(
        self, *, bus_address: str | None = None, timeout_s: float = CALL_TIMEOUT_S
    ) -> None:
        self.bus_address = bus_address
        self.timeout_s = timeout_s
        self._bus: MessageBus | None = None
        self._connecting = asyncio.Lock()
        self._waiters: dict[str, asyncio.Future[str]] = {}  # job path -> its result
        self._ended: OrderedDict[str, str] = OrderedDict()  # jobs that ended unawaited
        self._in_flight = 0

    async def _connected(self) -> MessageBus:
        async with self._connecting:
            if self._bus is not None and self._bus.connected:
                return self._bus
            bus = await sysbus.connect(
                self.bus_address, timeout_s=self.timeout_s, unavailable=SystemdUnavailable
            )
            bus.add_message_handler(self._on_message)
            self._bus = bus
            try:
                await self._call_on(
                    bus,
                    "org.freedesktop.DBus",
                    "/org/freedesktop/DBus",
                    "org.freedesktop.DBus",
                    "AddMatch",
                    "s",
                    [_JOB_REMOVED_MATCH],
                )
                await self._call_on(bus, SYSTEMD, MANAGER_PATH, MANAGER, "Subscribe", "", [])
            except BaseException:
                bus.disconnect()
                self._bus = None
                raise
            return bus

    def _on_message(self, msg: Message) -> None:
        if (
            msg.message_type == MessageType.SIGNAL
            and msg.interface == MANAGER
            and msg.member == "JobRemoved"
        ):
            _job_id, job, _unit, result = msg.body
            waiter = self._waiters.pop(job, None)
            if waiter is not None:
                if not waiter.done():
                    waiter.set_result(result)
            elif self._in_flight:
                # Ours, maybe, its reply not read yet; others' are dropped by the cap.
                self._ended[job] = result
                while len(self._ended) > _ENDED_CAP:
                    self._ended.popitem(last=False)

    async def _call_on(
        self,
        bus: MessageBus,
        destination: str,
        path: str,
        interface: str,
        member: str,
        signature: str,
        body: list[object],
    ) -> list[object]:
        reply = await sysbus.call(
            bus,
            destination,
            path,
            interface,
            member,
            signature,
            body,
            timeout_s=self.timeout_s,
            unavailable=SystemdUnavailable,
        )
        if reply.message_type == MessageType.ERROR:
            raise DBusError(reply.error_name or "", str(reply.body[0] if reply.body else ""))
        return list(reply.body)

    async def _manager(self, member: str, signature: str, body: list[object]) -> list[object]:
        bus = await self._connected()
        return await self._call_on(bus, SYSTEMD, MANAGER_PATH, MANAGER, member, signature, body)

    async def version(self) -> str:
        """systemd's version (the Manager's `Version` property): the reachability check."""
        bus = await self._connected()
        try:
            body = await self._call_on(
                bus, SYSTEMD, MANAGER_PATH, PROPERTIES, "Get", "ss", [MANAGER, "Version"]
            )
        except DBusError as err:
            raise SystemdUnavailable(f"systemd does not answer on the bus: {err}") from err
        value = body[0]
        return str(value.value if isinstance(value, Variant) else value)

    async def _run_job(self, unit: str, member: str, signature: str, body: list[object]) -> None:
        """Call `member`, which answers with a job, and wait for that job's end."""
        self._in_flight += 1
        try:
            (job,) = await self._manager(member, signature, body)
            job = str(job)
            result = self._ended.pop(job, None)
            if result is None:
                waiter: asyncio.Future[str] = asyncio.get_running_loop().create_future()
                self._waiters[job] = waiter
                try:
                    async with asyncio.timeout(self.timeout_s):
                        result = await waiter
                except TimeoutError as err:
                    raise SystemdUnavailable(
                        f"{member} {unit}: job {job} did not end in {self.timeout_s:g} s"
                    ) from err
                finally:
                    self._waiters.pop(job, None)
        finally:
            self._in_flight -= 1
        if result != "done":
            raise SystemdError(f"{member} {unit}: job {result}")

    async def ensure_slice(
        self, unit: str, properties: list[Property], limits: list[Property]
    ) -> bool:
        """Start transient slice `unit` with `properties`, or when it exists already set
        its `limits`. Returns whether it existed."""
        props = [[name, Variant(sig, value)] for name, sig, value in properties]
        try:
            await self._run_job(
                unit, "StartTransientUnit", "ssa(sv)a(sa(sv))", [unit, "replace", props, []]
            )
            return False
        except DBusError as err:
            if err.type != _UNIT_EXISTS:
                raise SystemdError(f"StartTransientUnit {unit}: {err.type}: {err.text}") from err
        await self.set_properties(unit, limits)
        return True

    async def set_properties(self, unit: str, properties: list[Property]) -> None:
        """Set `properties` on the loaded unit `unit` for this boot (SetUnitProperties,
        runtime); a unit systemd does not know is a SystemdError."""
        update = [[name, Variant(sig, value)] for name, sig, value in properties]
        try:
            await self._manager("SetUnitProperties", "sba(sv)", [unit, True, update])
        except DBusError as err:
            raise SystemdError(f"SetUnitProperties {unit}: {err.type}: {err.text}") from err

    async def stop_slice(self, unit: str) -> None:
        """Stop `unit` and wait for it; a unit systemd does not know is already gone."""
        try:
            await self._run_job(unit, "StopUnit", "ss", [unit, "replace"])
        except DBusError as err:
            if err.type == _NO_SUCH_UNIT:
                return
            raise SystemdError(f"StopUnit {unit}: {err.type}: {err.text}") from err

    async def unit_active_state(self, unit: str) -> str:
        """`active`, `inactive`, ... of a loaded unit; `""` when systemd has not loaded it."""
        try:
            (path,) = await self._manager("GetUnit", "s", [unit])
        except DBusError as err:
            if err.type == _NO_SUCH_UNIT:
                return ""
            raise SystemdError(f"GetUnit {unit}: {err.type}: {err.text}") from err
        bus = await self._connected()
        try:
            (value,) = await self._call_on(
                bus,
                SYSTEMD,
                str(path),
                PROPERTIES,
                "Get",
                "ss",
                ["org.freedesktop.systemd1.Unit", "ActiveState"],
            )
        except DBusError as err:
            raise SystemdError(f"ActiveState of {unit}: {err.type}: {err.text}") from err
        return str(value.value if isinstance(value, Variant) else value)

    def close(self) -> None:
        if self._bus is not None:
            self._bus.disconnect()
            self._bus = None


async def preflight(systemd: Systemd, *, proc: Path = Path("/proc")) -> str:
    """The reason `cgroupDriver: systemd` cannot work here, or "" when it can."""
    if not pid1_is_systemd(proc):
        try:
            comm = (proc / "1/comm").read_text().strip()
        except OSError:
            comm = "unreadable"
        return f"PID 1 is not systemd (it is {comm!r})"
    try:
        await systemd.version()
    except (SystemdUnavailable, SystemdError) as err:
        return f"systemd's D-Bus API is unreachable: {err}"
    return ""
