"""The status-reporter process: its supervised root tasks.

Root tasks, each named so a crash says which one died:

- `pod-view-reload` and `podstatus-consumer`: the two refresh loops of the pod view;
- `service-http`: the private /healthz /readyz /metrics port (klet.obs); ready while
  the pod view has loaded and the bus answers;
- `healthz-http`: upstream's healthz listener (127.0.0.1:10248 by default; off at 0);
- `read-only-http`: the read-only kubelet API, only when readOnlyPort is set;
- cluster mode only (a kubeconfig is set, see `cluster.py`): `node-status`,
  `node-lease`, `pod-status` and `events`.

If any of them ends, the others are cancelled and the process exits non-zero so its
supervisor restarts it; the loops themselves survive Redis outages, so that only happens
on a real bug or a port that cannot be bound. SIGTERM/SIGINT stop everything cleanly
(`run_supervised`), and the Redis pool is closed on the way out.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

from klet.obs import create_health_app, run_supervised, serve_http, serve_service_port
from klet.status_reporter.api import create_app, create_healthz_app
from klet.status_reporter.cluster import cluster_tasks
from klet.status_reporter.kubeletapi import serve_kubelet_api
from klet.status_reporter.wiring import Deps


def root_tasks(deps: Deps) -> dict[str, Coroutine[Any, Any, None]]:
    """The named root coroutines for `deps` (not started)."""
    # No health checks beyond the built-in ping: a Redis outage must not fail a
    # liveness probe (the last view is still served). Readiness says whether the view
    # is current: loaded once and the bus reachable.
    service_app = create_health_app(
        registry=deps.registry,
        checks={},
        ready=lambda: deps.pods.loaded.is_set() and deps.pods.bus_available,
    )
    tasks: dict[str, Coroutine[Any, Any, None]] = {
        "pod-view-reload": deps.pods.run_reloader(),
        "podstatus-consumer": deps.pods.run_consumer(),
        "service-http": serve_service_port(service_app, deps.service),
    }
    if deps.healthz is not None:
        tasks["healthz-http"] = serve_http(
            create_healthz_app(), host=deps.healthz.host, port=deps.healthz.port, name="healthz"
        )
    if deps.read_only is not None:
        tasks["read-only-http"] = serve_http(
            create_app(deps),
            host=deps.read_only.host,
            port=deps.read_only.port,
            name="read-only",
        )
    if deps.cluster is not None:
        tasks.update(cluster_tasks(deps.cluster))
    if deps.kubelet_api is not None:
        tasks["kubelet-api"] = serve_kubelet_api(deps.kubelet_api)
    return tasks


async def main(deps: Deps, *, handle_signals: bool = True) -> int:
    """Run the service until SIGTERM/SIGINT (returns 0) or a root task ends (raises
    RootTaskFailed, after the others were cancelled); the bus is closed either way.

    handle_signals=False leaves the signals alone (the service runs inside a test)."""
    try:
        await run_supervised(root_tasks(deps), handle_signals=handle_signals)
    finally:
        await deps.close()
    return 0
