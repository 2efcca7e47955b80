"""upstream's `kubelet_container_log_filesystem_used_bytes{uid,namespace,pod,container}`:
the bytes each container's logs take on the filesystem.

Upstream's log metrics collector asks its stats provider for every pod's stats at each
scrape and serves each container's `logs.usedBytes`, which is a `du` of the container's
log directory (`<podLogsDir>/<namespace>_<name>_<uid>/<container>/`), the same walk
`/stats/summary` reports as the container's `logs` (klet.stats.host.dir_usage). Here a
root task (`run`) measures the log directories of the pods the view lists every
`period_s` in a worker thread and the collector serves the last measurement, so a scrape
never walks the filesystem in the event loop and costs nothing more; a value is at most
one period old. Every container directory present under a listed pod's log directory
counts, as upstream counts every container its runtime still lists (an exited one
included, until it is removed); a pod not listed, or without a log directory, has no
series, nor has a directory that could not be read whole (`/stats/summary` leaves such
a count out too).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple, Protocol

from klet.model import layout
from klet.model.types import JSON
from klet.stats.host import dir_usage
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric

log = logging.getLogger(__name__)

NAME = "kubelet_container_log_filesystem_used_bytes"
LABELS = ("uid", "namespace", "pod", "container")
PERIOD_S = 15.0
"""How often the log directories are measured (a walk of a few files per container)."""


class PodRef(NamedTuple):
    """A pod whose log directory is measured."""

    uid: str
    namespace: str
    name: str


class PodView(Protocol):
    """The node's pods as a v1 PodList (the pod cache)."""

    def pod_list(self) -> JSON: ...


def pod_refs(pod_list: JSON) -> list[PodRef]:
    """The pods of a v1 PodList that have a UID, namespace ("default" if none) and
    name."""
    items = pod_list.get("items")
    out: list[PodRef] = []
    for pod in items if isinstance(items, list) else []:
        meta = pod.get("metadata") if isinstance(pod, dict) else None
        if not isinstance(meta, dict):
            continue
        uid, name = meta.get("uid"), meta.get("name")
        if uid and name:
            out.append(PodRef(str(uid), str(meta.get("namespace") or "default"), str(name)))
    return out


def measure(pod_logs_dir: Path, pods: Sequence[PodRef]) -> dict[tuple[str, ...], int]:
    """(uid, namespace, pod, container) → bytes of that container's log directory, for
    each container directory under each pod's log directory (blocking: a worker
    thread's)."""
    out: dict[tuple[str, ...], int] = {}
    for pod in pods:
        pod_dir = pod_logs_dir / layout.pod_log_dir_name(pod.namespace, pod.name, pod.uid)
        try:
            containers = sorted(e for e in pod_dir.iterdir() if e.is_dir())
        except OSError:  # no log directory (yet, or any more)
            continue
        for container in containers:
            usage = dir_usage(container)
            if usage.complete:  # a partial walk is a lower bound, not the usage
                out[(pod.uid, pod.namespace, pod.name, container.name)] = usage.bytes
    return out


class ContainerLogUsage:
    """The gauge family, served from the last `measure_once`."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        pods: PodView,
        pod_logs_dir: Path,
        period_s: float = PERIOD_S,
    ) -> None:
        self._pods = pods
        self._dir = pod_logs_dir
        self._period_s = period_s
        self._usage: Mapping[tuple[str, ...], int] = {}
        registry.register(self)

    async def measure_once(self) -> None:
        """Measure the log directories of the pods the view lists now."""
        refs = pod_refs(self._pods.pod_list())
        self._usage = await asyncio.to_thread(measure, self._dir, refs)

    async def run(self) -> None:
        while True:
            await self.measure_once()
            await asyncio.sleep(self._period_s)

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            NAME, "Bytes used by the container's logs on the filesystem.", labels=list(LABELS)
        )
        for labels, used in sorted(self._usage.items()):
            family.add_metric(list(labels), float(used))
        yield family


__all__ = ["ContainerLogUsage", "PodRef", "measure", "pod_refs"]
