"""systemd's notify protocol for the process systemd starts: the `kubelet` entry point.

As upstream's kubelet (cmd/kubelet/app/server.go, pkg/kubelet/watchdog): once the node's
services are started it sends `READY=1` to `$NOTIFY_SOCKET` (whatever the unit's Type;
nothing when the variable is unset), and with the SystemdWatchdog gate (on by default in
v1.34) and `$WATCHDOG_USEC` set (the unit's `WatchdogSec=`) it sends `WATCHDOG=1` every
half of that period while the node is healthy, so systemd restarts a node that hangs.

Healthy, in klet, is what the supervisor sees: every service process is running (none
exited and waiting for its restart). Upstream's check is its sync loop having run
recently; a klet service whose loop stalls fails its own supervised root tasks and exits
(klet.obs.run_supervised), which this check then sees. A ping that fails is retried twice
(1 s, then 2 s later) as upstream's back-off does, then logged; the next period tries
again.

`$WATCHDOG_USEC` that is not a positive integer, or a period of one second or less,
refuses the start naming the variable, as upstream's `NewHealthChecker` refuses it;
`$WATCHDOG_PID` naming another process means the watchdog is not this process's.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Mapping

__all__ = ["notify_address", "run_watchdog", "send", "watchdog_period"]

log = logging.getLogger(__name__)

# upstream's minimalNotifyInterval: a watchdog period at or below it is refused
_MIN_WATCHDOG_S = 1.0
_RETRY_DELAYS_S = (1.0, 2.0)

Send = Callable[[str, str], bool]


def notify_address(env: Mapping[str, str]) -> str | None:
    """The socket `$NOTIFY_SOCKET` names, or None (not started by systemd with notify
    access). A leading "@" is an abstract socket, as systemd writes it."""
    value = env.get("NOTIFY_SOCKET", "")
    if not value:
        return None
    return "\0" + value[1:] if value.startswith("@") else value


def watchdog_period(env: Mapping[str, str], pid: int) -> float | None:
    """Seconds between pings (half of `$WATCHDOG_USEC`), or None when systemd set no
    watchdog for this process. Raises ValueError naming the variable for a value
    upstream's kubelet refuses too."""
    usec = env.get("WATCHDOG_USEC", "")
    if not usec:
        return None
    try:
        value = int(usec)
    except ValueError:
        raise ValueError(f"WATCHDOG_USEC={usec!r}: not an integer") from None
    if value <= 0:
        raise ValueError(f"WATCHDOG_USEC={usec!r}: must be a positive number")
    owner = env.get("WATCHDOG_PID", "")
    if owner:
        try:
            if int(owner) != pid:
                return None
        except ValueError:
            raise ValueError(f"WATCHDOG_PID={owner!r}: not an integer") from None
    if value / 1e6 <= _MIN_WATCHDOG_S:
        raise ValueError(
            f"WATCHDOG_USEC={usec!r}: the watchdog timeout is too small (at most 1s); "
            "set WatchdogSec= above 1s"
        )
    return value / 1e6 / 2


def send(address: str, message: str) -> bool:
    """One datagram to the notify socket; False when it cannot be delivered."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        try:
            sock.sendto(message.encode(), address)
        except OSError as err:
            log.debug("sd_notify failed", extra={"socket": address, "error": str(err)})
            return False
    return True


async def run_watchdog(
    *,
    address: str,
    period: float,
    healthy: Callable[[], bool],
    notify: Send = send,
    retry_delays: tuple[float, ...] = _RETRY_DELAYS_S,
) -> None:
    """Ping `WATCHDOG=1` every `period` seconds while `healthy()`; runs until cancelled."""
    log.info("Starting systemd watchdog", extra={"interval": f"{period:g}s"})
    while True:
        if not healthy():
            log.error(
                "Not notifying the systemd watchdog this period: a service of the node "
                "is not running"
            )
        else:
            for delay in (*retry_delays, None):
                if notify(address, "WATCHDOG=1"):
                    break
                if delay is None:
                    log.error("Failed to notify the systemd watchdog", extra={"socket": address})
                else:
                    await asyncio.sleep(delay)
        await asyncio.sleep(period)
