"""The pod-source process: its supervised root tasks.

Root tasks, named so a crash says which one died:

- `source-file`, `source-http`, `source-api`: one loop per configured source, reading
  manifests (or listing and watching this node's pods on the apiserver) and handing
  full snapshots to the inbox;
- `lease`: the shared leader loop (`klet.bus.leader.hold`) on the "pod-source" lease;
  it elects the publisher, and stepping down (the lease taken, a write fenced, Redis
  unreachable for a whole TTL) ends the process, which comes back as a standby;
- `publisher`: merges snapshots and writes the desired set to the bus (lease holder
  only), repairing the tables at every poll;
- `service-http`: the private /healthz /readyz /metrics port (klet.obs). /readyz turns
  ready once this replica leads (holds the lease), every configured source has
  delivered a snapshot and the bus answers; a standby is healthy, not ready.

Apart from the lease, none of these ends on a Redis or apiserver outage or a bad
manifest; if one ends anyway, the others are cancelled and the process exits non-zero
so its supervisor restarts it. A service with no source configured still runs: its
publisher removes what an earlier configuration published (nothing is desired any
more).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Coroutine
from typing import Any

from klet.bus.leader import hold, release_quietly
from klet.obs import (
    RootTaskFailed,
    create_health_app,
    leader_metric,
    run_supervised,
    serve_service_port,
)
from klet.pod_source.wiring import Deps

log = logging.getLogger(__name__)

# The publisher loop wakes at least every idle period (a third of the lease TTL) and at
# the end of each outage back-off; not having run for this long means it is stuck.
PUBLISHER_STALL_S = 120.0


def root_tasks(deps: Deps) -> dict[str, Coroutine[Any, Any, None]]:
    """The named root coroutines for `deps` (not started)."""
    publisher = deps.publisher
    leader_metric(deps.registry, service="pod-source", leading=publisher.elected.is_set)

    def publisher_alive() -> bool:
        return time.monotonic() - publisher.last_run < PUBLISHER_STALL_S

    health = create_health_app(
        registry=deps.registry,
        checks={"publisher": publisher_alive},
        ready=lambda: publisher.leading and publisher.ready,
    )
    tasks: dict[str, Coroutine[Any, Any, None]] = {
        f"source-{source.name}": source.run() for source in deps.sources
    }
    # Redis restarted empty and the lease is back: republish the desired set now.
    deps.lease.on_restored(publisher.restored)
    tasks["lease"] = hold(deps.lease, publisher.elected, decided=publisher.decided)
    tasks["publisher"] = publisher.run()
    tasks["service-http"] = serve_service_port(health, deps.service)
    return tasks


async def main(deps: Deps, *, handle_signals: bool = True) -> int:
    """Run the service; return the process exit code.

    0 after SIGTERM/SIGINT, 1 when a root task ended on its own. `handle_signals=False`
    leaves signals alone (the service running as a task inside a test).
    """
    if not deps.sources:
        log.warning("no pod source configured (--pod-manifest-path, --manifest-url, --kubeconfig)")
    log.info(
        "pod-source starting",
        extra={"node": deps.node_name, "sources": sorted(deps.configured)},
    )
    try:
        await run_supervised(root_tasks(deps), handle_signals=handle_signals)
    except RootTaskFailed as err:
        log.error("a root task ended; exiting", extra={"error": str(err)})
        return 1
    finally:
        await release_quietly(deps.lease)
        await deps.close()
    return 0
