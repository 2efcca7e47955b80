"""The kubelet API's `/healthz` with upstream's named checks, and `/metrics/slis`, the
component SLI metrics that record them.

Upstream's kubelet installs three checks on its `/healthz` (`ping`, `log`, `syncloop`),
serves each alone on `/healthz/<name>`, and records every run of the root `/healthz` in
`kubernetes_healthcheck{name,type}` (1 passed, 0 failed) and
`kubernetes_healthchecks_total{name,type,status}` (`type="healthz"`, `status` success or
error) on a registry of their own, served on `/metrics/slis` (a DELETE there resets
them). klet gives each check the meaning it can observe:

- `ping`: always passes (the API answers).
- `log`: logging is not blocked. Upstream flushes klog once a minute and fails when the
  last flush finished over two minutes ago. klet flushes the root logger's handlers (in
  a worker thread, one at a time) when a check finds the last flush over a minute old,
  waits for it a moment, and fails when the last finished flush is over two minutes
  old: a handler whose stream blocks (a full stderr pipe) holds its lock, so its flush
  never finishes and the check fails two minutes later, as upstream's would.
- `syncloop`: upstream fails when its sync loop has not iterated for max(2 ×
  resync interval, 5 min). klet's sync loop is another process (syncloop), so the check
  asks it: every live syncloop replica named by the port files in the run dir
  (`klet.portfiles`, the same files `/metrics` is gathered from, loopback only) must
  answer its own private `/healthz` with 200 within `SYNCLOOP_TIMEOUT_S`: its process
  answers, and on the leading replica the PLEG relisted within its threshold (upstream's 3 min,
  or twice the evented PLEG's period), the nearest thing klet has to the loop iterating. No live
  replica at all fails too (nothing runs the pods).

The report follows upstream's healthz handler (k8s.io/apiserver's): `ok`, or with
`?verbose` a `[+]name ok` line per check then `healthz check passed`; a failure is a
500 with `[-]name failed: reason withheld` lines (the reason goes to the log) and
`healthz check failed`; `?exclude=name` skips a check (`[+]name excluded: ok`) and warns
about names it does not know. `/healthz/<name>` answers `ok` or a 500 with the reason,
and records nothing, as upstream's per-check handlers.

Upstream installs the same three checks and `/metrics/slis` on the read-only port
(`readOnlyPort`: its server is the kubelet API's without authentication), and
`healthz.InstallHandler(mux)` with no checks on the healthz port (10248), which is
`ping` alone, recorded in the same SLI registry: status-reporter builds one
`SliMetrics` and gives it to all three listeners (`healthz_port_checks` for 10248).

The verdicts (`log_verdict`, `syncloop_verdict`) and the report (`render_report`) are
pure; `HealthChecks` is the thin shell that runs the checks and records them.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from klet.obs.logs import OnceLogger
from klet.portfiles import PortRecord, live_replicas
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

CHECKS = ("ping", "log", "syncloop")
"""Upstream's checks of the kubelet's /healthz, in its order."""
HEALTHZ = "healthz"
"""The `type` label: the health endpoint the check ran for."""
LOG_FLUSH_EVERY_S = 60.0
LOG_BLOCKED_AFTER_S = 120.0
LOG_FLUSH_WAIT_S = 1.0
"""How long a check waits for the flush it started before it judges."""
SYNCLOOP_TIMEOUT_S = 2.0

CheckResult = str | None
"""None when the check passed, else why it failed."""
Check = Callable[[], Awaitable[CheckResult]]


# -- pure decisions ----------------------------------------------------------------------


def log_verdict(last_flushed: float, now: float) -> CheckResult:
    """Whether logging is blocked: the last finished flush is too old."""
    if now - last_flushed < LOG_BLOCKED_AFTER_S:
        return None
    return f"logging blocked: no flush finished for {now - last_flushed:.0f}s"


def syncloop_verdict(run_dir: str, answers: Mapping[PortRecord, int | str]) -> CheckResult:
    """Whether syncloop is alive: every live replica's /healthz status (an int), or the
    error of asking it (a str). No replica at all fails."""
    if not answers:
        return f"no live syncloop replica has a port file in {run_dir}/ports/syncloop"
    bad = [
        f"replica pid {r.pid} ({r.host}:{r.port}): "
        + (f"/healthz answered {a}" if isinstance(a, int) else a)
        for r, a in sorted(answers.items(), key=lambda ra: ra[0].pid)
        if a != 200
    ]
    return "syncloop unhealthy: " + "; ".join(bad) if bad else None


@dataclass(frozen=True)
class Report:
    status: int
    body: str


def _quoted(names: Sequence[str]) -> str:
    return ",".join(f'"{n}"' for n in names)


def render_report(
    results: Mapping[str, CheckResult],
    *,
    order: Sequence[str],
    excluded: set[str],
    verbose: bool,
    kind: str = HEALTHZ,
) -> Report:
    """Upstream's healthz answer for the checks `order` that ran (`results`) and those
    `excluded` (checks named in `excluded` need not be in `results`)."""
    lines = []
    for name in order:
        if name in excluded:
            lines.append(f"[+]{name} excluded: ok\n")
        elif results[name] is None:
            lines.append(f"[+]{name} ok\n")
        else:
            lines.append(f"[-]{name} failed: reason withheld\n")
    unknown = sorted(excluded - set(order))
    if unknown:
        lines.append(
            f"warn: some health checks cannot be excluded: no matches for {_quoted(unknown)}\n"
        )
    if any(results[n] is not None for n in order if n not in excluded):
        return Report(500, "".join(lines) + f"{kind} check failed\n")
    if not verbose:
        return Report(200, "ok")
    return Report(200, "".join(lines) + f"{kind} check passed\n")


# -- the SLI metrics ---------------------------------------------------------------------


class _StartTime(Collector):
    """process_start_time_seconds alone, as upstream's SLI registry has it."""

    def __init__(self) -> None:
        self._process = ProcessCollector(registry=None)

    def collect(self) -> list[Metric]:
        return [m for m in self._process.collect() if m.name == "process_start_time_seconds"]


class SliMetrics:
    """The registry of `/metrics/slis` (upstream's slis.Registry)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.healthcheck = Gauge(
            "kubernetes_healthcheck",
            "This metric records the result of a single healthcheck.",
            ["name", "type"],
            registry=self.registry,
        )
        self.healthchecks = Counter(
            "kubernetes_healthchecks",
            "This metric records the results of all healthcheck.",
            ["name", "type", "status"],
            registry=self.registry,
        )
        self.registry.register(_StartTime())

    def observe(self, name: str, kind: str, result: CheckResult) -> None:
        self.healthcheck.labels(name=name, type=kind).set(1 if result is None else 0)
        status = "success" if result is None else "error"
        self.healthchecks.labels(name=name, type=kind, status=status).inc()

    def reset(self) -> None:
        """Forget every recorded check (upstream's DELETE /metrics/slis)."""
        self.healthcheck.clear()
        self.healthchecks.clear()

    def page(self) -> bytes:
        return generate_latest(self.registry)


# -- the checks --------------------------------------------------------------------------


def flush_logging() -> None:
    """Flush every handler of the root logger (blocks while one's stream does)."""
    for handler in logging.getLogger().handlers:
        handler.flush()


class LogCheck:
    """The `log` check (see the module)."""

    def __init__(
        self,
        *,
        flush: Callable[[], None] = flush_logging,
        clock: Callable[[], float] = time.monotonic,
        wait_s: float = LOG_FLUSH_WAIT_S,
    ) -> None:
        self._flush = flush
        self._clock = clock
        self._wait_s = wait_s
        self._last = clock()
        self._flushing: asyncio.Task[None] | None = None

    async def _run_flush(self) -> None:
        try:
            await asyncio.to_thread(self._flush)
            self._last = self._clock()
        finally:
            self._flushing = None

    async def __call__(self) -> CheckResult:
        if self._flushing is None and self._clock() - self._last >= LOG_FLUSH_EVERY_S:
            self._flushing = asyncio.create_task(self._run_flush(), name="healthz-log-flush")
        if self._flushing is not None:
            # a flush stuck in its thread stays the one in flight (never a second)
            await asyncio.wait([self._flushing], timeout=self._wait_s)
        return log_verdict(self._last, self._clock())


Replicas = Callable[[str], Sequence[PortRecord]]
"""The live replicas of a service (by default `klet.portfiles.live_replicas` over the run
dir, dead replicas' files left for their owners to clean)."""
FetchStatus = Callable[[PortRecord], Awaitable[int]]
"""The status of one replica's private /healthz; raises when it cannot be asked."""


class SyncloopCheck:
    """The `syncloop` check (see the module)."""

    def __init__(
        self,
        *,
        run_dir: Path,
        replicas: Replicas | None = None,
        fetch: FetchStatus | None = None,
        timeout_s: float = SYNCLOOP_TIMEOUT_S,
    ) -> None:
        self.run_dir = run_dir
        self._replicas = replicas or functools.partial(live_replicas, run_dir, remove_dead=False)
        self._fetch = fetch
        self.timeout_s = timeout_s

    async def __call__(self) -> CheckResult:
        records = list(self._replicas("syncloop"))
        if not records:
            return syncloop_verdict(str(self.run_dir), {})
        if self._fetch is not None:
            return syncloop_verdict(str(self.run_dir), await self._ask(records, self._fetch))
        import httpx  # as nodemetrics: loaded at the first check, not at start
        from klet.status_reporter.metrics.nodemetrics import scrape_url

        async with httpx.AsyncClient(timeout=self.timeout_s, trust_env=False) as client:

            async def http_status(record: PortRecord) -> int:
                # scrape_url refuses a port file naming any host but the loopback
                url = scrape_url(record).removesuffix("/metrics") + "/healthz"
                return (await client.get(url)).status_code

            return syncloop_verdict(str(self.run_dir), await self._ask(records, http_status))

    async def _ask(
        self, records: Sequence[PortRecord], fetch: FetchStatus
    ) -> dict[PortRecord, int | str]:
        async def one(record: PortRecord) -> int | str:
            try:
                async with asyncio.timeout(self.timeout_s):
                    return await fetch(record)
            except TimeoutError:
                return f"/healthz did not answer within {self.timeout_s:g}s"
            except Exception as err:  # any failure to ask is an unhealthy answer
                return f"/healthz could not be asked: {type(err).__name__}: {err}"

        return dict(zip(records, await asyncio.gather(*map(one, records)), strict=True))


async def _ping() -> CheckResult:
    return None


class HealthChecks:
    """Runs the named checks for /healthz and /healthz/<name>, recording the root ones
    in `slis`."""

    def __init__(self, checks: Mapping[str, Check], slis: SliMetrics) -> None:
        self.checks = dict(checks)
        self.slis = slis
        self._failures = OnceLogger(log, level=logging.WARNING)

    async def _run(self, name: str) -> CheckResult:
        try:
            result = await self.checks[name]()
        except Exception as err:  # a raising check is a failed check, never a crash
            result = f"{type(err).__name__}: {err}"
        if result is None:
            self._failures.clear(name, f"health check {name} passed", check=name)
        else:
            self._failures.error(
                name, f"health check {name} failed", cause=result, check=name, reason=result
            )
        return result

    async def report(self, *, excluded: set[str], verbose: bool) -> Report:
        order = list(self.checks)
        run = [n for n in order if n not in excluded]
        results = dict(zip(run, await asyncio.gather(*map(self._run, run)), strict=True))
        for name, result in results.items():
            self.slis.observe(name, HEALTHZ, result)
        return render_report(results, order=order, excluded=excluded, verbose=verbose)

    async def one(self, name: str) -> Report | None:
        """The answer of /healthz/<name>; None when no check has that name."""
        if name not in self.checks:
            return None
        result = await self._run(name)
        if result is None:
            return Report(200, "ok")
        return Report(500, f"internal server error: {result}\n")


def kubelet_health_checks(
    *, syncloop: Check, slis: SliMetrics, log_check: Check | None = None
) -> HealthChecks:
    """The kubelet API's checks, upstream's three in its order."""
    return HealthChecks({"ping": _ping, "log": log_check or LogCheck(), "syncloop": syncloop}, slis)


def healthz_port_checks(slis: SliMetrics) -> HealthChecks:
    """The healthz port's checks: `ping` alone, as upstream's handler without checks."""
    return HealthChecks({"ping": _ping}, slis)
