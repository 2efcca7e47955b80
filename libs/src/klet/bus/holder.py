"""Lease holder identities: unique per process, with a safe fast restart.

Every process gets its own holder ID, `<hostname>:<pid>:<12 random hex digits>`, so two
replicas never share one, whatever host, container or run directory they share. The
random part also keeps a restarted process that happens to get the same pid (pid 1 in
a container) apart from its predecessor.

A unique ID alone would make a crash-restarted leader wait out its old lease (15 s by
default). To avoid that safely, a replica slot is a lock file in the run directory,
`<run_dir>/leases/<service>/holder` (each service's slots in a directory of its own,
which a deployment mounts for that service alone, so no service can lock another's):
the process holds an exclusive `flock` on it for its whole life and writes its ID into
it. The kernel drops the lock only when the process is gone, so whoever gets the lock
knows that the ID left in the file belongs to a dead process, and may take over that
process's lease at once (`predecessor`). A stopped (SIGSTOP) or hung process still holds
the lock, so it is never mistaken for dead. A second replica sharing the run directory
finds the slot locked and runs without a predecessor: after a crash of that one, its
successor waits for the old lease to expire. So does every replica whose run directory
cannot be written.

The replica slot helps a process that its supervisor restarts; it does nothing for a hot
standby running beside the leader (the leader's slot stays locked while it lives). For
that, the lease also gets a leader slot, `<run_dir>/leases/<service>/leader`, held by
whichever replica leads: a standby on this host that finds it free takes over the named
leader's lease at once (`klet.bus.leaderslot` says why that is safe).
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import secrets
import socket
from dataclasses import dataclass
from pathlib import Path

from klet.bus.leaderslot import FileLeaderSlot, read_holder
from klet.bus.redisbus import Bus, Lease
from klet.model.layout import holder_slot, leader_slot

log = logging.getLogger(__name__)

# Open slot files, kept for the life of the process: closing one would drop its lock.
_held_slots: list[int] = []


@dataclass(frozen=True)
class HolderIdentity:
    holder: str
    """This process's lease holder ID."""
    predecessor: str | None
    """The holder ID of this slot's previous, dead process, if known."""


def new_holder_id() -> str:
    host = re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname()) or "host"
    return f"{host}:{os.getpid()}:{secrets.token_hex(6)}"


def claim_slot(run_dir: Path, service: str) -> HolderIdentity:
    """A fresh holder ID, and the predecessor's when this process got the slot's lock."""
    holder = new_holder_id()
    path = holder_slot(run_dir, service)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as err:
        log.warning(
            "no replica slot for the lease; a restart waits for the old lease to expire",
            extra={"path": str(path), "error": str(err)},
        )
        return HolderIdentity(holder, None)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        log.info(
            "another live replica uses this run directory's lease slot; "
            "a restart of this one waits for its old lease to expire",
            extra={"path": str(path)},
        )
        return HolderIdentity(holder, None)
    predecessor = read_holder(os.read(fd, 256))
    os.lseek(fd, 0, os.SEEK_SET)
    os.ftruncate(fd, 0)
    os.write(fd, f"{holder}\n".encode())
    _held_slots.append(fd)
    return HolderIdentity(holder, predecessor)


def service_lease(bus: Bus, service: str, run_dir: Path, *, ttl_ms: int) -> Lease:
    """The lease named `service`, held under a fresh identity from this slot, with this
    host's leader slot for it; the bus's writes are fenced by it from now on (see
    `Bus.lease`)."""
    me = claim_slot(run_dir, service)
    log.info(
        "lease identity",
        extra={"lease": service, "holder": me.holder, "predecessor": me.predecessor},
    )
    lease = bus.lease(service, me.holder, ttl_ms=ttl_ms, predecessor=me.predecessor)
    lease.leader_slot = FileLeaderSlot(leader_slot(run_dir, service), me.holder)
    return lease
