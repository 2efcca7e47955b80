"""Leader election for syncloop: only the holder of the "syncloop" lease acts on pods.

A standby replica serves its health endpoints and waits; the leader renews every third
of the TTL. Losing the lease to another replica ends the process (its supervisor
restarts it as a standby) so two replicas never drive the same pods. A Redis outage is
not a loss: nobody else can take the lease meanwhile, and the pods must keep being
looked after.
"""

from __future__ import annotations

import asyncio
import logging

from klet.bus import BusUnavailable, Lease

log = logging.getLogger(__name__)


class LeaseLost(Exception):
    """Another replica holds the lease now."""


async def hold(lease: Lease, elected: asyncio.Event) -> None:
    interval = lease.ttl_ms / 3000
    while True:
        try:
            held = await lease.try_acquire()
        except BusUnavailable:
            held = lease.held  # keep the role we had while Redis is away
        if held and not elected.is_set():
            log.info("acting as leader", extra={"holder": lease.holder, "token": lease.token})
            elected.set()
        elif not held and elected.is_set():
            raise LeaseLost(f"lease {lease.key} taken by another replica")
        elif not held:
            log.debug("standing by for the lease", extra={"holder": lease.holder})
        await asyncio.sleep(interval)
