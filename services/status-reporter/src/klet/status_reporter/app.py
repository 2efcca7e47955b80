"""The status-reporter process: its supervised root tasks.

Root tasks, each named so a crash says which one died:

- `pod-view-reload` and `podstatus-consumer`: the two refresh loops of the pod view;
- `service-http`: the private /healthz /readyz /metrics port (klet.obs), ready once the
  pod view has loaded for the first time;
- `healthz-http`: upstream's healthz listener (127.0.0.1:10248 by default; off at 0);
- `read-only-http`: the read-only kubelet API, only when readOnlyPort is set.

If any of them ends, the others are cancelled and the process exits non-zero so its
supervisor restarts it; the loops themselves survive Redis outages, so that only happens
on a real bug or a port that cannot be bound.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Coroutine
from typing import Any

from klet.obs import create_health_app, run_supervised, serve_http
from klet.status_reporter.api import create_app, create_healthz_app
from klet.status_reporter.wiring import Deps

log = logging.getLogger(__name__)


def root_tasks(deps: Deps) -> dict[str, Coroutine[Any, Any, None]]:
    """The named root coroutines for `deps` (not started)."""
    service_app = create_health_app(
        registry=deps.registry,
        checks={"bus": lambda: deps.pods.bus_available},
        ready=deps.pods.loaded,
    )
    tasks: dict[str, Coroutine[Any, Any, None]] = {
        "pod-view-reload": deps.pods.run_reloader(),
        "podstatus-consumer": deps.pods.run_consumer(),
        "service-http": serve_http(
            service_app, host=deps.service.host, port=deps.service.port, name="service"
        ),
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
    return tasks


async def main(deps: Deps) -> int:
    """Run the service; return the process exit code.

    0 after SIGTERM/SIGINT (a requested stop), 1 when a root task ended on its own.
    Signals are turned into a cancellation here rather than left to the default
    handler, so the HTTP servers close their sockets and the Redis pool is released.
    """
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signals = (signal.SIGTERM, signal.SIGINT)
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    supervisor = asyncio.create_task(run_supervised(root_tasks(deps)), name="supervisor")
    stopper = asyncio.create_task(stop.wait(), name="stop-signal")
    try:
        await asyncio.wait({supervisor, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if stopper.done():
            log.info("stopping on signal")
            return 0
        err = supervisor.exception()
        log.error("a root task ended; exiting", extra={"error": repr(err)})
        return 1
    finally:
        for task in (supervisor, stopper):
            task.cancel()
        await asyncio.gather(supervisor, stopper, return_exceptions=True)
        for sig in signals:
            loop.remove_signal_handler(sig)
        await deps.close()
