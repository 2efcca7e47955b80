"""Leader election on a bus lease: only the holder of a service's lease acts.

A standby replica serves its health endpoints and waits; the leader renews every third
of the TTL. Losing the lease to another replica ends the process (its supervisor
restarts it as a standby) so two replicas never act at once. A Redis outage is not a
loss: nobody else can take the lease meanwhile, and the node must keep being looked
after.
"""

from __future__ import annotations

import asyncio
import logging

from klet.bus.redisbus import BusUnavailable, Lease

log = logging.getLogger(__name__)


class LeaseLost(Exception):
    """Another replica holds the lease now."""


async def hold(lease: Lease, elected: asyncio.Event) -> None:
    """Acquire and renew `lease` forever; set `elected` once held, raise LeaseLost if lost."""
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


async def release_quietly(lease: Lease) -> None:
    """At shutdown: give the lease back so a standby takes over at once (a failure only
    costs the standby the rest of the TTL)."""
    if not lease.held:
        return
    try:
        await lease.release()
    except Exception as err:  # noqa: BLE001 - shutting down; the TTL frees it anyway
        log.warning("could not release the lease", extra={"error": str(err)})
