"""The status-reporter process: its supervised root tasks.

Root tasks, each named so a crash says which one died:

- `lease`: the "status-reporter" bus lease (`klet.bus.leader.hold`);
- `pod-view-reload` and `podstatus-consumer`: the two refresh loops of the pod view;
- `service-http`: the private /healthz /readyz /metrics port (klet.obs);
- `healthz-http`: upstream's healthz listener (127.0.0.1:10248 by default; off at 0);
- `read-only-http`: the read-only kubelet API, only when readOnlyPort is set;
- `kubelet-api`: the kubelet API on --port (10250), unless it is off;
- `pod-history`: the leader's record of each pod's history for `klet why`
  (`history.py`), in both modes;
- `container-log-usage`: every replica measures its pods' log directories for
  `kubelet_container_log_filesystem_used_bytes` (`metrics/logusage.py`);
- cluster mode only (a kubeconfig is set, see `cluster/managers.py`): `node-status`,
  `node-lease`, `pod-status` and `events`.

**Replicas.** Several replicas may run on one node (`docker compose up --scale
status-reporter=2`, host network). Every replica serves the read APIs: the pod view is
read-only and each replica keeps its own (it tails the `podstatus` stream with plain
XREAD, no consumer group, so no replica takes entries from another). The kubelet API,
the read-only port and the healthz port are bound with SO_REUSEPORT: the kernel spreads
new connections over the replicas, and a replica that dies drops only its own
connections. A replica joins the two ports that answer from the pod view (kubelet API,
read-only port) only once its view has settled (loaded, or the bus failed first:
`podcache.PodCache.settled`): a replica restarted beside a running one would otherwise
take a share of the readers at once and answer them with an empty pod list. The private
service port is per replica.

Only the holder of the lease writes: the four cluster-mode tasks (node status, the
node Lease, pod statuses and mirror pods, Events from the `events` consumer group) start
when this replica is elected and never on a standby. Losing the lease ends the process
(`LeaseLost`), which is the only way to be sure none of its writers acts any more; its
supervisor restarts it as a standby. The bus is fenced by the lease too, so a write that
slipped through anyway (the node status events published to the bus) is refused.

Standalone (no kubeconfig) there is nothing to write, and the lease is taken anyway: one
code path and one `klet_leader` series for both modes, so an operator sees which replica
would act, and a configuration that later adds a kubeconfig changes nothing about who
leads. It costs nothing but a renewal every 5 s; a Redis outage longer than the lease
TTL restarts the leader as a standby, as in cluster mode (the pod view is stale then
anyway, and the other replica keeps serving).

**Health.** `/healthz` (private port and 10248) says the process is alive: a standby is
healthy. `/readyz` (private port) says this replica serves current reads: the pod view
has loaded and the bus answers, whether or not it leads (it does not depend on the
apiserver either: the kubelet API must stay readable while the apiserver is down).
`klet_leader{service="status-reporter"}` is 1 on the replica that holds the lease.

If any root task ends, the others are cancelled and the process exits non-zero so its
supervisor restarts it; the loops themselves survive Redis outages, so that only happens
on a real bug, a lost lease or a port that cannot be bound. SIGTERM/SIGINT stop
everything cleanly (`run_supervised`), the lease is given back so a standby takes over
at once, and the Redis pool is closed on the way out.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from klet.bus.leader import hold, release_quietly
from klet.obs import create_health_app, run_supervised, serve_http, serve_service_port
from klet.status_reporter.cluster.managers import cluster_tasks
from klet.status_reporter.kubeletapi.readonly import (
    counted_app,
    create_app,
    create_healthz_app,
)
from klet.status_reporter.wiring import Deps


async def when_set(event: asyncio.Event, run: Callable[[], Awaitable[None]]) -> None:
    """Start `run()` once `event` is set."""
    await event.wait()
    await run()


async def when_elected(
    elected: asyncio.Event,
    run: Callable[[], Awaitable[None]],
    *,
    also: asyncio.Event | None = None,
) -> None:
    """Start `run()` once this replica holds the lease (and `also` is set, when given);
    a standby never starts it."""
    await elected.wait()
    if also is not None:
        await also.wait()
    await run()


def root_tasks(deps: Deps) -> dict[str, Coroutine[Any, Any, None]]:
    """The named root coroutines for `deps` (not started)."""
    # No health checks beyond the built-in ping: a Redis outage must not fail a
    # liveness probe (the last view is still served). Readiness says whether the view
    # is current: loaded once and the bus reachable; leading has nothing to do with it.
    service_app = create_health_app(
        registry=deps.registry,
        checks={},
        ready=lambda: deps.pods.loaded.is_set() and deps.pods.bus_available,
    )
    tasks: dict[str, Coroutine[Any, Any, None]] = {
        "lease": hold(deps.lease, deps.elected),
        "pod-view-reload": deps.pods.run_reloader(),
        "podstatus-consumer": deps.pods.run_consumer(),
        "service-http": serve_service_port(service_app, deps.service),
    }
    if deps.volumes is not None:
        tasks["volume-view"] = deps.volumes.run()
    if deps.devices is not None:
        tasks["device-view"] = deps.devices.run()
    if deps.history is not None:
        tasks["pod-history"] = when_elected(deps.elected, deps.history.run)
    if deps.log_usage is not None:
        tasks["container-log-usage"] = deps.log_usage.run()
    if deps.healthz is not None:
        tasks["healthz-http"] = serve_http(
            create_healthz_app(deps.slis),
            host=deps.healthz.host,
            port=deps.healthz.port,
            name="healthz",
            reuse_port=True,
        )
    if deps.read_only is not None:
        read_only = deps.read_only
        tasks["read-only-http"] = when_set(
            deps.pods.settled,
            lambda: serve_http(
                create_app(deps)
                if deps.http_requests is None
                else counted_app(create_app(deps), deps.http_requests),
                host=read_only.host,
                port=read_only.port,
                name="read-only",
                reuse_port=True,
            ),
        )
    if deps.cluster is not None:
        for name, run in cluster_tasks(deps.cluster).items():
            # Pod statuses and mirror pods wait for the pod view as well: an empty view
            # would read as "no static pods" and delete every mirror pod as an orphan.
            # A replica elected as it starts (the new leader after a handover, say)
            # gets there within one reload.
            loaded = deps.pods.loaded if name == "pod-status" else None
            tasks[name] = when_elected(deps.elected, run, also=loaded)
    if deps.kubelet_api is not None:
        # Only with the API on --port: the server loads FastAPI and cryptography.
        from klet.status_reporter.kubeletapi.server import serve_kubelet_api

        kubelet_api = deps.kubelet_api
        tasks["kubelet-api"] = when_set(
            deps.pods.settled, lambda: serve_kubelet_api(kubelet_api, reuse_port=True)
        )
    return tasks


async def main(deps: Deps, *, handle_signals: bool = True) -> int:
    """Run the service until SIGTERM/SIGINT (returns 0) or a root task ends (raises
    RootTaskFailed, after the others were cancelled); the lease is released and the bus
    closed either way.

    handle_signals=False leaves the signals alone (the service runs inside a test)."""
    try:
        await run_supervised(root_tasks(deps), handle_signals=handle_signals)
    finally:
        await release_quietly(deps.lease)
        await deps.close()
    return 0
