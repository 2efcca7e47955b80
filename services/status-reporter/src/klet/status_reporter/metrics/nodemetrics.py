"""The node's kubelet metrics in one scrape: what 10250 (and the read-only port) serve on
`/metrics` and `/metrics/probes`.

Upstream's kubelet is one process; klet's metrics live in five. Each service keeps
serving its own on its private port (health, debugging), and status-reporter, which
serves the kubelet API, gathers them at every scrape: it reads the port files of each
service's live replicas (`klet.portfiles.live_replicas(run_dir, service)`), fetches
their private `/metrics` concurrently, keeps the exposition of the replica that says it
leads (`klet_leader{service} 1`, which each replica computes from its own lease at the
scrape, so it cannot disagree with what the replica does) and merges them
(`metricsmerge.py`).

Why scrape rather than have the services publish their expositions on the bus:

- it works the same in the three deployment shapes, because all three put a node's
  services on one network and one run directory: `klet up` runs them as processes of
  one host; docker-compose.yml runs them with `network_mode: host` and binds the run
  dir into each; the Helm chart runs them with `hostNetwork: true` and the run dir as
  one hostPath. A private port bound to 127.0.0.1 (the default) or a wildcard is
  reached on the loopback;
- a scrape is as fresh as a direct one, and costs nothing between scrapes; published
  expositions would be written every few seconds whether anyone reads them or not,
  and would need new bus keys and ACL grants for every service;
- the bus being down does not take the metrics away (they are how one sees it is down).

Bounds: the services are asked all at once and each service gets `timeout_s` in all; a
service that does not answer in time, answers an error, or has no replica that leads,
is left out of that scrape (its series are simply absent) and counted in
`klet_metrics_scrape_failures_total{service, reason}`, reason `timeout`, `error` or
`absent`. A hung service never holds the scrape longer than `timeout_s`.

Loopback only: a port file is a file in the run dir, and whoever can write one could
name any host in it, turning every scrape of 10250 into a request from the node to a
host of their choosing. The services are on the node's loopback in every deployment
shape, so a record naming any other host is refused before anything is sent: a literal
loopback address (127.0.0.0/8, ::1) or a wildcard bind (reached on the loopback) is
fetched, a name or any other address is not. A refused file is logged once (a warning
naming the file and the host; again only if it comes to name another host), counted at
every scrape in `klet_metrics_port_files_refused_total{service}`, and its service, if
no other replica answers as leader, is left out as `error`.

status-reporter itself: when this replica leads, its own registry is used directly;
when it stands by (several replicas share 10250 by SO_REUSEPORT), the leading
replica's exposition is fetched like the others', and this replica's own registry is
the fallback when none leads. The `process_*` and `python_*` families are always the
serving process's own.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from klet.obs.logs import OnceLogger
from klet.portfiles import PortRecord, live_replica_files
from klet.status_reporter.metrics import metricsmerge
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import Metric

log = logging.getLogger(__name__)

SELF = "status-reporter"
ORDER = ("syncloop", SELF, "pod-source", "eviction", "image-gc")
"""Merge order: a gauge two services export keeps the first one's value (syncloop's
runtime view before status-reporter's reported one)."""
PROBER = "syncloop"
"""The service whose prober fills /metrics/probes."""
FAILURE_REASONS = ("timeout", "error", "absent")
DEFAULT_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class Replica:
    """A live replica of a service: what its port file says, and which file says it."""

    record: PortRecord
    port_file: Path


Replicas = Callable[[str], Sequence[Replica]]
"""The live replicas of a service, from its port files."""
Fetch = Callable[[PortRecord], Awaitable[str]]
"""The text of one replica's private /metrics; raises on failure."""

_LOOPBACK = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


class NotLoopback(ValueError):
    """A port file names a host that is not this node's loopback (see the module)."""


def scrape_url(record: PortRecord) -> str:
    """Where a replica's private /metrics answers (a wildcard bind is reached on the
    loopback); NotLoopback for a record naming any host but a loopback address."""
    host = _LOOPBACK.get(record.host, record.host)
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise NotLoopback(
            f"port file of {record.service} (pid {record.pid}) names host {record.host!r}: "
            "only a loopback address or a wildcard bind is scraped"
        )
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{record.port}/metrics"


def port_file_replicas(run_dir: Path) -> Replicas:
    """The live replicas of a service as its port files under `run_dir` list them."""

    def replicas(service: str) -> Sequence[Replica]:
        # A few small files on a local filesystem: read in the loop, not a thread.
        found = live_replica_files(run_dir, service, remove_dead=False)
        return [Replica(record, path) for path, record in found]

    return replicas


class NodeMetrics:
    """The merged expositions (see the module); `metrics()` and `probes()` render them."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        leading: Callable[[], bool],
        replicas: Replicas,
        fetch: Fetch | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.registry = registry
        self._leading = leading
        self._replicas = replicas
        self._fetch = fetch
        self.timeout_s = timeout_s
        self.failures = Counter(
            "klet_metrics_scrape_failures",
            "Scrapes of the kubelet API's /metrics or /metrics/probes that lacked a "
            "service's metrics, by service and why: timeout, error (no answer, not 200, "
            "not an exposition) or absent (no live replica says it leads).",
            ["service", "reason"],
            registry=registry,
        )
        self.refused = Counter(
            "klet_metrics_port_files_refused",
            "Port files whose replica was not scraped because they name a host that is "
            "not this node's loopback, by service, counted at every scrape that read them.",
            ["service"],
            registry=registry,
        )
        for service in ORDER:
            self.refused.labels(service=service)
            for reason in FAILURE_REASONS:
                self.failures.labels(service=service, reason=reason)
        self._conflicts = OnceLogger(log, level=logging.WARNING)
        self._refusals: dict[str, OnceLogger] = {}

    def _loopback_only(self, service: str, replicas: Sequence[Replica]) -> list[PortRecord]:
        """The records of `replicas` that name a loopback host; each other one is counted
        and logged once per file (see the module)."""
        once = self._refusals.setdefault(service, OnceLogger(log, level=logging.WARNING))
        once.retain(r.port_file for r in replicas)  # files gone are forgotten
        allowed = []
        for replica in replicas:
            try:
                scrape_url(replica.record)
            except NotLoopback:
                self.refused.labels(service=service).inc()
                once.error(
                    replica.port_file,
                    "a port file names a host that is not loopback: its replica is not scraped",
                    cause=replica.record.host,
                    service=service,
                    port_file=str(replica.port_file),
                    host=replica.record.host,
                    pid=replica.record.pid,
                )
            else:
                allowed.append(replica.record)
        return allowed

    def _own(self) -> list[Metric]:
        return list(self.registry.collect())

    async def _leader_of(self, service: str, fetch: Fetch) -> list[Metric] | None:
        """The exposition of `service`'s leading replica; None (and counted) without one."""
        replicas = list(self._replicas(service))
        if not replicas:
            self.failures.labels(service=service, reason="absent").inc()
            return None
        records = self._loopback_only(service, replicas)

        async def one(record: PortRecord) -> list[Metric]:
            return metricsmerge.parse(await fetch(record))

        try:
            async with asyncio.timeout(self.timeout_s):
                answers = await asyncio.gather(*map(one, records), return_exceptions=True)
        except TimeoutError:
            self.failures.labels(service=service, reason="timeout").inc()
            log.debug("a service's metrics timed out", extra={"service": service})
            return None
        failed = len(records) < len(replicas)  # some refused
        for answer in answers:
            if isinstance(answer, BaseException):
                failed = True
                log.debug(
                    "a replica's metrics failed", extra={"service": service, "error": str(answer)}
                )
            elif metricsmerge.leads(answer, service):
                return answer
        self.failures.labels(service=service, reason="error" if failed else "absent").inc()
        return None

    async def _gather(self, services: Sequence[str]) -> dict[str, list[Metric] | None]:
        """The leading replica's exposition of each of `services` (None: left out)."""
        # Imported at the first scrape: a standalone node nobody scrapes (the read-only
        # port and 10250 are off by default there) never pays for httpx.
        import httpx

        async with httpx.AsyncClient(
            timeout=self.timeout_s,
            trust_env=False,  # no proxy from the environment for a loopback port
            verify=False,  # plain HTTP only; skips loading a CA bundle at every scrape
        ) as client:

            async def http_fetch(record: PortRecord) -> str:
                response = await client.get(scrape_url(record))
                response.raise_for_status()
                return response.text

            fetch = self._fetch or http_fetch
            results = await asyncio.gather(*(self._leader_of(s, fetch) for s in services))
        return dict(zip(services, results, strict=True))

    async def collect(self) -> tuple[list[Metric], list[Metric]]:
        """(`/metrics` families, `/metrics/probes` families) of the whole node."""
        by_service = await self._gather([s for s in ORDER if s != SELF or not self._leading()])
        own = self._own()
        process = [f for f in own if f.name.startswith(metricsmerge.PROCESS_PREFIXES)]
        sources: list[list[Metric]] = []
        for service in ORDER:
            if service == SELF:
                theirs = by_service.get(SELF)
                mine = own if theirs is None else theirs
                sources.append(process + metricsmerge.without_process_families(mine))
                continue
            families = by_service[service]
            if families is not None:
                sources.append(metricsmerge.without_process_families(families))
        merged = metricsmerge.merge(sources)
        for name in merged.conflicts:
            self._conflicts.error(name, "metric family dropped: its type differs", family=name)
        main, probes = metricsmerge.split_probes(merged.families)
        return main, probes + _start_time(process)

    async def metrics(self) -> bytes:
        """The node's `/metrics`."""
        main, _ = await self.collect()
        return metricsmerge.render_families(main)

    async def probes(self) -> bytes:
        """The node's `/metrics/probes`: syncloop's prober_probe_total and
        prober_probe_duration_seconds (only syncloop is asked), and this process's
        process_start_time_seconds, as upstream's probes registry has it."""
        syncloop = (await self._gather([PROBER]))[PROBER] or []
        _, probes = metricsmerge.split_probes(syncloop)
        return metricsmerge.render_families(probes + _start_time(self._own()))


def _start_time(families: Sequence[Metric]) -> list[Metric]:
    return [f for f in families if f.name == "process_start_time_seconds"]


class LocalMetrics:
    """`/metrics` and `/metrics/probes` from one registry, nothing fetched (unit tests
    of the apps, and a kubelet API without port files)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    async def metrics(self) -> bytes:
        main, _ = metricsmerge.split_probes(self.registry.collect())
        return metricsmerge.render_families(main)

    async def probes(self) -> bytes:
        _, probes = metricsmerge.split_probes(self.registry.collect())
        return metricsmerge.render_families(probes)


__all__ = ["LocalMetrics", "NodeMetrics", "Replica", "port_file_replicas", "scrape_url"]
