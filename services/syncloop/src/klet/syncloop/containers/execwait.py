"""A graceful stop must reach the container's command, not the runtime's init.

CRI reports a container running as soon as the runtime's `start` returned. With runc
the container's process is then still `runc init` for a moment: it has been told to
go on and is about to execve the command. A SIGTERM that lands in that moment is caught
by runc init's Go runtime, which then tries to die of it; but the process is PID 1 of
the container's PID namespace, the kernel ignores a default-action signal sent to such
an init, and the Go runtime falls back to `exit(2)`. The container then reads "exit
code 2, Error", a code its command never returned, and the command never got the signal
it was entitled to handle in its grace period. (Measured here: `runc create`, then
`runc kill TERM` on the waiting init, exits 2.)

A pod deleted moments after its creation has its container stopped right after the
start, so before a graceful stop klet waits, boundedly, until the container's process
(its host PID from CRI's verbose status) no longer names itself `runc:[...]`, runc's
name for its init stages. The stop goes ahead when the wait runs out, when the runtime
gives no PID, or when the process is gone; none of those is an error. Containers that
started long ago are not looked at (`RECENT_S`). Other runtimes' inits are not Go
programs and do not name themselves so; for them this is one status call per stop.

The wait reads /proc of the host: syncloop runs in the host's PID namespace (compose
`pid: host`, the chart's `hostPID`); where it does not, the PID is not found and
nothing is waited for.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

from klet.cri import CRIError
from klet.model.types import ContainerID

log = logging.getLogger(__name__)

RUNC_INIT_PREFIX = "runc:["
"""How runc's init names itself (`runc:[2:INIT]`) until it execs the command."""
RECENT_S = 5.0
"""Containers started longer ago than this have long since exec'd: not looked at."""
WAIT_LIMIT_S = 1.0
POLL_S = 0.005


class PidLookup(Protocol):
    async def container_pid(self, container_id: ContainerID) -> int: ...


def read_comm(pid: int, *, proc: Path = Path("/proc")) -> str | None:
    """The process's command name, None when there is no such process (or no access)."""
    try:
        return (proc / str(pid) / "comm").read_text().strip()
    except OSError:
        return None


def in_runtime_init(comm: str | None) -> bool:
    return comm is not None and comm.startswith(RUNC_INIT_PREFIX)


async def wait_for_exec(
    cri: PidLookup,
    container_id: ContainerID,
    *,
    started_at_ns: int | None = None,
    comm_of: Callable[[int], str | None] = read_comm,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    clock: Callable[[], float] = time.time,
    limit_s: float = WAIT_LIMIT_S,
) -> bool:
    """Wait until the container's process has exec'd its command; False when it was
    still the runtime's init after `limit_s` (the caller stops it all the same).
    `started_at_ns` (CRI's StartedAt), when known, skips containers started long ago."""
    if started_at_ns and clock() - started_at_ns / 1e9 > RECENT_S:
        return True
    try:
        pid = await cri.container_pid(container_id)
    except CRIError as err:
        log.debug("container PID unknown", extra={"container": container_id, "error": str(err)})
        return True
    if pid <= 0:
        return True
    for _ in range(max(1, round(limit_s / POLL_S))):
        if not in_runtime_init(comm_of(pid)):
            return True
        await sleep(POLL_S)
    if not in_runtime_init(comm_of(pid)):
        return True
    log.warning(
        "container still in the runtime's init; stopping it anyway",
        extra={"container": container_id, "pid": pid, "waited_s": limit_s},
    )
    return False
