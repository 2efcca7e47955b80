"""The eviction service's root tasks: the lease, the monitoring loop, the node shutdown
manager (every replica holds its own logind lock, see shutdown.py), the Eviction gRPC
server (dry-runs, leader only), the node Event queue and the health port.

All run in one event loop under `run_supervised`; if one dies the process exits non-zero
and its supervisor restarts it. Only the holder of the "eviction" lease measures and
acts, so two replicas never evict for the same pressure; a standby serves its health
endpoints and waits. Restarting is safe: pressure state is rebuilt from the next
measurements, and a pod already evicted is Failed, never a candidate again.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from klet.bus import BusError
from klet.bus.leader import hold, release_quietly
from klet.eviction import shutdown
from klet.eviction.wiring import Deps
from klet.obs import create_health_app, leader_metric, run_supervised, serve_service_port
from klet.rpc.eviction import serve_eviction

log = logging.getLogger(__name__)


async def main(deps: Deps) -> int:
    elected = asyncio.Event()
    leader_metric(deps.registry, service="eviction", leading=elected.is_set)

    node_shutdown = shutdown.build(
        deps.settings.kubelet,
        root_dir=Path(deps.settings.klet.root_dir),
        pods=deps.manager.deps.pods,
        killer=deps.manager.deps.killer,
        conditions=deps.node_bus.conditions,
        node_event=deps.manager.deps.node_event,
        leading=elected.is_set,
        registry=deps.registry,
    )

    async def shutdown_condition() -> None:
        """eviction's Ready contribution once leading: only while the node shuts down,
        so none is left from before a reboot or from an older configuration."""
        if node_shutdown is not None:
            await node_shutdown.publish_condition()
            return
        try:
            await deps.node_bus.conditions.delete("Ready")
        except BusError as err:  # a shutdown's leftover, if any, stays until the next start
            log.error("cannot clear the shutting-down condition", extra={"error": str(err)})

    async def monitor() -> None:
        await elected.wait()
        await shutdown_condition()
        log.info(
            "eviction manager starting",
            extra={
                "node": deps.settings.klet.node_name,
                "thresholds": [t.describe() for t in deps.manager.thresholds],
                "period_s": deps.manager.settings.monitoring_period_s,
            },
        )
        await deps.manager.run()

    async def server() -> None:
        await elected.wait()
        await serve_eviction(deps.dry_run, deps.socket_path)

    health = create_health_app(
        registry=deps.registry,
        checks={},
        ready=lambda: elected.is_set() and deps.manager.passes > 0,
    )
    try:
        await run_supervised(
            {
                "lease": hold(deps.lease, elected),
                "monitor": monitor(),
                "eviction-server": server(),
                "node-events": deps.events.run(),
                "health": serve_service_port(health, deps.service_port),
                # Every replica holds its own lock (shutdown.py); none without periods.
                **({"node-shutdown": shutdown.supervise(node_shutdown)} if node_shutdown else {}),
            }
        )
    finally:
        await release_quietly(deps.lease)
        await deps.close()
    return 0
