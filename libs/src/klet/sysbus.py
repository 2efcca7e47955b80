"""The system bus (D-Bus, through dbus-fast) for klet's two clients of it: systemd's
Manager (`klet.cgroups.systemd`, the systemd cgroup driver) and logind
(`klet.logind`, graceful node shutdown). Connecting and one method call, each with a
deadline; a bus that cannot be reached, does not answer in time or goes away is the
caller's own "unavailable" exception, raised `from` the original. An error reply is
returned as it is: what a refusal means is the caller's to say.
"""

from __future__ import annotations

import asyncio

from dbus_fast import BusType, Message
from dbus_fast.aio import MessageBus
from dbus_fast.errors import DBusError

__all__ = ["call", "connect"]


async def connect(
    address: str | None,
    *,
    timeout_s: float,
    unavailable: type[Exception],
    negotiate_unix_fd: bool = False,
) -> MessageBus:
    """A connection to the system bus (or the bus at `address`)."""
    bus = MessageBus(
        bus_address=address, bus_type=BusType.SYSTEM, negotiate_unix_fd=negotiate_unix_fd
    )
    try:
        async with asyncio.timeout(timeout_s):
            await bus.connect()
    except (OSError, TimeoutError, DBusError, EOFError) as err:
        raise unavailable(f"cannot connect to the system bus: {err}") from err
    return bus


async def call(
    bus: MessageBus,
    destination: str,
    path: str,
    interface: str,
    member: str,
    signature: str,
    body: list[object],
    *,
    timeout_s: float,
    unavailable: type[Exception],
) -> Message:
    """Call `member` and return its reply, an error reply included."""
    msg = Message(
        destination=destination,
        path=path,
        interface=interface,
        member=member,
        signature=signature,
        body=body,
    )
    try:
        async with asyncio.timeout(timeout_s):
            reply = await bus.call(msg)
    except TimeoutError as err:
        raise unavailable(f"{member}: no answer in {timeout_s:g} s") from err
    except (OSError, EOFError) as err:
        raise unavailable(f"{member}: the bus went away: {err}") from err
    if reply is None:
        raise unavailable(f"{member}: the bus went away")
    return reply
