"""image-gc's root tasks: the lease, image detection, the image GC and container GC
loops, node events, the GarbageCollector gRPC server and the health/metrics port.

All run in one event loop under `run_supervised`; if one dies the process exits
non-zero and its supervisor restarts it, which is safe: the image records' times are in
the bus's `images` table and container GC holds no state. Only the lease holder runs
the loops and serves GarbageCollector; a standby serves its health port and waits.
A loop's failed iteration is logged once per distinct error and retried next period;
it never ends the loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from klet.bus.leader import hold, release_quietly
from klet.image_gc.wiring import Deps
from klet.obs import (
    OnceLogger,
    create_health_app,
    leader_metric,
    run_supervised,
    serve_service_port,
)
from klet.rpc.gc import serve_garbage_collector

log = logging.getLogger(__name__)


async def every(
    period_s: float, work: Callable[[], Awaitable[object]], *, name: str, errors: OnceLogger
) -> None:
    """Run `work` now and then every `period_s` seconds (upstream wait.Until)."""
    while True:
        try:
            await work()
        except Exception as err:  # noqa: BLE001 - logged once per distinct error, retried
            errors.error(name, f"{name} failed: {type(err).__name__}: {err}", loop=name)
        else:
            errors.clear(name, f"{name} works again", loop=name)
        await asyncio.sleep(period_s)


async def main(deps: Deps) -> int:
    elected = asyncio.Event()
    leader_metric(deps.registry, service="image-gc", leading=elected.is_set)
    serving = asyncio.Event()
    errors = OnceLogger(log, level=logging.WARNING)
    detected_at = 0.0
    periods = deps.periods

    async def gated(name: str, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
        await elected.wait()
        log.debug("starting root task", extra={"task": name})
        await work()

    async def detect() -> None:
        nonlocal detected_at
        await deps.images.detect()
        deps.metrics.images_tracked.set(len(deps.images.records))
        detected_at = time.monotonic()

    async def image_gc() -> None:
        if not deps.images.policy.periodic:
            log.info("ImageGCHighThresholdPercent is set 100, Disable image GC")
            await asyncio.Event().wait()
        await every(periods.image_gc_s, deps.collector.image_pass, name="image GC", errors=errors)

    started = time.monotonic()
    stale_after = 3 * periods.image_detect_s + 60

    def detection_fresh() -> bool:
        # Healthy while detection keeps succeeding (three periods of slack), or standing by.
        last = detected_at or started
        return not elected.is_set() or time.monotonic() - last < stale_after

    policy = deps.images.policy
    log.info(
        "image-gc starting",
        extra={
            "node": deps.settings.klet.node_name,
            "highThreshold": policy.high_threshold_percent,
            "lowThreshold": policy.low_threshold_percent,
            "minAge": policy.min_age_s,
            "maxAge": policy.max_age_s,
        },
    )
    health = create_health_app(
        registry=deps.registry,
        checks={"image-detection": detection_fresh},
        # Acting: leading, images detected once (FreeSpace needs the records) and
        # GarbageCollector served. A standby is healthy, not ready.
        ready=lambda: elected.is_set() and serving.is_set() and detected_at > 0,
    )
    try:
        await run_supervised(
            {
                "lease": hold(deps.lease, elected),
                "image-detect": gated(
                    "image-detect",
                    lambda: every(
                        periods.image_detect_s, detect, name="image detection", errors=errors
                    ),
                ),
                "image-gc": gated("image-gc", image_gc),
                "container-gc": gated(
                    "container-gc",
                    lambda: every(
                        periods.container_gc_s,
                        deps.collector.container_pass,
                        name="container GC",
                        errors=errors,
                    ),
                ),
                "node-events": deps.events.run(),
                "gc-server": gated(
                    "gc-server",
                    lambda: serve_garbage_collector(
                        deps.collector, deps.socket_path, ready=serving
                    ),
                ),
                "health": serve_service_port(health, deps.service_port),
            }
        )
    finally:
        await release_quietly(deps.lease)
        await deps.close()
    return 0
