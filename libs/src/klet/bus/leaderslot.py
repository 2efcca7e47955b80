"""The leader slot: a lock file by which a standby sees at once that its leader died.

A standby learns from Redis alone that the leader is gone only when the lease expires
(15 s by default). Replicas of a service on one host share the run directory, so the
leader also holds an exclusive `flock` on `<run_dir>/leases/<service>/leader` while it
leads, with its holder ID written in the file; standbys probe the file a few times a
second (`probe`: a non-blocking shared lock taken and dropped at once).

Why a free lock proves the named leader is gone: only a process holding the exclusive
lock writes the file, and the lock is held from just after the process was granted the
lease until it exits, or gives the slot back at shutdown after its tasks stopped
(`klet.bus.leader.release_quietly`). The kernel drops it when the process dies however
it dies (SIGKILL, OOM kill, crash). A stopped (SIGSTOP) or hung leader still holds the
lock, so it is never mistaken for dead: it is waited out by the lease TTL as before,
and fenced if it wakes up late. A standby that finds the lock free asks Redis for the
lease with the named ID as heir (`Lease.try_acquire(heir=...)`); the acquire script
grants it only if the key still holds exactly that holder's value, or is gone. So a file
naming an older holder, a leader elected but not yet in the slot, or two standbys racing
can take nothing from a live leader: the worst case is a refused attempt.

What the slot cannot see: replicas on other hosts (their run directories differ; they
wait for the TTL), and a leader that dies in the instant between its election and taking
the slot. Both fall back to the TTL, which is what every replica did before.
"""

from __future__ import annotations

import fcntl
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

VALID_HOLDER = re.compile(r"^[A-Za-z0-9._-]+:\d+:[0-9a-f]{12}$")
"""A holder ID as `klet.bus.holder.new_holder_id` makes them. The lease script matches an
heir by prefix, so only a complete ID may ever be used as one."""


def read_holder(raw: bytes) -> str | None:
    """The holder ID on the first line of a slot file, if it is a valid one."""
    first = raw.decode("ascii", "replace").split("\n", 1)[0].strip()
    return first if VALID_HOLDER.match(first) else None


@dataclass(frozen=True)
class SlotView:
    """What one probe of a leader slot saw."""

    locked: bool
    """A live process holds the slot (a leader, or another standby probing it)."""
    holder: str | None
    """For a free slot, the valid holder ID written in it (None: empty or garbage)."""


class LeaderSlot(Protocol):
    """What the leader loop needs of a leader slot (`FileLeaderSlot`; a fake in
    `klet.testbed.fakes.bus`). Every call returns at once; OSError means the slot is unusable."""

    @property
    def held(self) -> bool: ...

    def claim(self) -> bool:
        """Take the slot for this process and name it there; False while another
        process holds it."""
        ...

    def probe(self) -> SlotView | None:
        """The slot's state, without keeping it; None when there is no slot file yet."""
        ...

    def release(self) -> None:
        """Give the slot back (this process stopped acting as the leader)."""
        ...


class FileLeaderSlot:
    """`<run_dir>/leases/<service>/leader` (klet.model.layout.leader_slot), claimed under
    `holder`'s ID."""

    def __init__(self, path: Path, holder: str) -> None:
        self.path = path
        self.holder = holder
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def claim(self) -> bool:
        if self._fd is not None:
            return True
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except OSError:
            os.close(fd)
            raise
        try:
            # Write first, then cut: a death in between leaves this ID on the first line.
            data = f"{self.holder}\n".encode()
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
        except OSError:
            os.close(fd)
            raise
        self._fd = fd
        return True

    def probe(self) -> SlotView | None:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None
        try:
            try:
                # Shared: standbys probing at the same moment do not see each other.
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return SlotView(locked=True, holder=None)
            return SlotView(locked=False, holder=read_holder(os.pread(fd, 256, 0)))
        finally:
            os.close(fd)  # drops the shared lock

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # the holder ID stays: a standby may still need it as heir
