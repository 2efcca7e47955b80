"""`/metrics/cadvisor` as both kubelet API ports serve it: one cgroup pass
(`StatsProvider.collect_cgroups`) rendered by the pure conversion in
`klet.stats.cadvisor`.

Nothing is cached between scrapes: every counter is the kernel's cumulative one, read
at the scrape, so two scrapes are two consistent readings and a rate over them is
right whoever else scrapes in between. Rendering runs in a worker thread as the reads
do: with 110 pods it is some thousands of samples, which the event loop (serving the
other endpoints and streams) should not wait on.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from klet.model.types import JSON
from klet.stats import StatsProvider
from klet.stats.cadvisor import CgroupSnapshot, pod_images, render, with_images

log = logging.getLogger(__name__)


class PodView(Protocol):
    """The node's pods as a v1 PodList (the pod cache): their containers' image names."""

    def pod_list(self) -> JSON: ...


class ContainerMetrics:
    """The `/metrics/cadvisor` page over `stats`, image names from `pods`."""

    def __init__(self, stats: StatsProvider, pods: PodView) -> None:
        self._stats = stats
        self._pods = pods
        self._error: str | None = None

    async def page(self) -> bytes:
        snapshot = await self._stats.collect_cgroups()
        self._note(snapshot)
        pods = self._pods.pod_list()
        images = pod_images(pods) if isinstance(pods, dict) else {}
        return await asyncio.to_thread(render, with_images(snapshot, images))

    def _note(self, snapshot: CgroupSnapshot) -> None:
        # Logged once per change: a runtime that stays down is one line, not one a scrape.
        if snapshot.runtime_error != self._error:
            self._error = snapshot.runtime_error
            if self._error is not None:
                log.warning("container metrics without the runtime", extra={"error": self._error})
