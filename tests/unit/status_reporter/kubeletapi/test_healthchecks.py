"""The kubelet API's named health checks and their SLI metrics: upstream's report
(ok, ?verbose, ?exclude and its warning, the 500 with reasons withheld), the `log`
verdict over a fake clock and a flush that blocks, the `syncloop` verdict over the
replicas' answers (none, one failing, one not answering), and what /healthz records in
kubernetes_healthcheck and kubernetes_healthchecks_total (and a reset forgets)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
from klet.portfiles import PortRecord
from klet.status_reporter.kubeletapi.healthchecks import (
    LOG_BLOCKED_AFTER_S,
    HealthChecks,
    LogCheck,
    SliMetrics,
    SyncloopCheck,
    kubelet_health_checks,
    log_verdict,
    render_report,
    syncloop_verdict,
)
from klet.testbed.fakes.kubeletapi import FakeCheck
from prometheus_client.parser import text_string_to_metric_families

ORDER = ["ping", "log", "syncloop"]


def record(pid: int, port: int = 10261) -> PortRecord:
    return PortRecord("syncloop", "127.0.0.1", port, pid, "n1")


def test_report_passing_plain_and_verbose() -> None:
    ok = dict.fromkeys(ORDER)
    assert render_report(ok, order=ORDER, excluded=set(), verbose=False).body == "ok"
    verbose = render_report(ok, order=ORDER, excluded=set(), verbose=True)
    assert (verbose.status, verbose.body) == (
        200,
        "[+]ping ok\n[+]log ok\n[+]syncloop ok\nhealthz check passed\n",
    )


def test_report_failure_withholds_the_reason() -> None:
    results = {"ping": None, "log": None, "syncloop": "no live syncloop replica"}
    report = render_report(results, order=ORDER, excluded=set(), verbose=False)
    assert report.status == 500
    assert report.body == (
        "[+]ping ok\n[+]log ok\n[-]syncloop failed: reason withheld\nhealthz check failed\n"
    )


def test_report_excluded_and_unknown_exclusions() -> None:
    results = {"ping": None, "log": None}
    report = render_report(results, order=ORDER, excluded={"syncloop", "zz", "aa"}, verbose=True)
    assert report.status == 200
    assert report.body == (
        "[+]ping ok\n[+]log ok\n[+]syncloop excluded: ok\n"
        'warn: some health checks cannot be excluded: no matches for "aa","zz"\n'
        "healthz check passed\n"
    )


def test_log_verdict_window() -> None:
    assert log_verdict(100.0, 100.0 + LOG_BLOCKED_AFTER_S - 1) is None
    reason = log_verdict(100.0, 100.0 + LOG_BLOCKED_AFTER_S + 5)
    assert reason == "logging blocked: no flush finished for 125s"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_log_check_flushes_once_a_minute_and_fails_when_a_flush_blocks() -> None:
    clock = Clock()
    flushes: list[float] = []
    release = threading.Event()
    blocking = False

    def flush() -> None:
        flushes.append(clock.now)
        if blocking:
            release.wait(10)

    check = LogCheck(flush=flush, clock=clock, wait_s=0.01)
    assert await check() is None and flushes == []  # just started: nothing to flush yet
    clock.now += 61
    assert await check() is None and flushes == [1061.0]
    assert await check() is None and flushes == [1061.0]  # flushed under a minute ago
    blocking = True
    clock.now += 61
    assert await check() is None  # the flush hangs, but the last one is recent
    clock.now += 100
    reason = await check()
    assert reason is not None and reason.startswith("logging blocked")
    assert flushes == [1061.0, 1122.0]  # one flush in flight, never a second
    release.set()
    for _ in range(100):  # the blocked flush finishes: logging works again
        if await check() is None:
            break
        await asyncio.sleep(0.01)
    assert await check() is None


def test_syncloop_verdict() -> None:
    assert syncloop_verdict("/run/klet", {record(1): 200, record(2): 200}) is None
    assert syncloop_verdict("/run/klet", {}) == (
        "no live syncloop replica has a port file in /run/klet/ports/syncloop"
    )
    reason = syncloop_verdict("/run/klet", {record(2): 500, record(1): 200, record(3): "refused"})
    assert reason == (
        "syncloop unhealthy: replica pid 2 (127.0.0.1:10261): /healthz answered 500; "
        "replica pid 3 (127.0.0.1:10261): refused"
    )


async def test_syncloop_check_asks_every_live_replica() -> None:
    asked: list[str] = []
    statuses = {11: 200, 12: 200}

    async def fetch(r: PortRecord) -> int:
        asked.append(r.service)
        if r.pid == 13:
            raise ConnectionRefusedError("connection refused")
        if r.pid == 14:
            await asyncio.sleep(10)
        return statuses[r.pid]

    replicas = [record(11), record(12)]
    check = SyncloopCheck(
        run_dir=Path("/run/klet"), replicas=lambda s: replicas, fetch=fetch, timeout_s=0.05
    )
    assert await check() is None and asked == ["syncloop", "syncloop"]
    statuses[12] = 500
    assert "pid 12 (127.0.0.1:10261): /healthz answered 500" in (await check() or "")
    replicas[1:] = [record(13), record(14)]
    reason = await check() or ""
    assert "pid 13 (127.0.0.1:10261): /healthz could not be asked: ConnectionRefusedError" in (
        reason
    )
    assert "pid 14 (127.0.0.1:10261): /healthz did not answer within 0.05s" in reason
    replicas.clear()
    assert (await check() or "").startswith("no live syncloop replica")


def samples(slis: SliMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(slis.page().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def test_root_checks_are_recorded_in_the_sli_metrics() -> None:
    slis = SliMetrics()
    syncloop = FakeCheck()
    checks = kubelet_health_checks(syncloop=syncloop, slis=slis, log_check=FakeCheck())
    assert (await checks.report(excluded=set(), verbose=False)).body == "ok"
    syncloop.result = "no live syncloop replica"
    assert (await checks.report(excluded={"log"}, verbose=False)).status == 500
    got = samples(slis)

    def key(family: str, **labels: str) -> tuple[str, tuple[tuple[str, str], ...]]:
        return (family, tuple(sorted(labels.items())))

    assert got[key("kubernetes_healthcheck", name="ping", type="healthz")] == 1
    assert got[key("kubernetes_healthcheck", name="syncloop", type="healthz")] == 0
    total = "kubernetes_healthchecks_total"
    assert got[key(total, name="ping", type="healthz", status="success")] == 2
    assert got[key(total, name="log", type="healthz", status="success")] == 1  # excluded once
    assert got[key(total, name="syncloop", type="healthz", status="success")] == 1
    assert got[key(total, name="syncloop", type="healthz", status="error")] == 1
    assert got[key("process_start_time_seconds")] > 0
    # a single check's own endpoint records nothing, and says why it failed
    one = await checks.one("syncloop")
    assert one is not None and (one.status, one.body) == (
        500,
        "internal server error: no live syncloop replica\n",
    )
    assert await checks.one("nope") is None
    assert samples(slis) == got
    slis.reset()
    assert {name for name, _ in samples(slis)} == {"process_start_time_seconds"}


async def test_a_raising_check_fails_instead_of_crashing() -> None:
    async def broken() -> str | None:
        raise RuntimeError("boom")

    checks = HealthChecks({"ping": FakeCheck(), "broken": broken}, SliMetrics())
    report = await checks.report(excluded=set(), verbose=True)
    assert report.status == 500 and "[-]broken failed: reason withheld" in report.body
    one = await checks.one("broken")
    assert one is not None and one.body == "internal server error: RuntimeError: boom\n"


@pytest.mark.parametrize("name", ["ping", "log", "syncloop"])
async def test_upstream_names_in_order(name: str) -> None:
    checks = kubelet_health_checks(syncloop=FakeCheck(), slis=SliMetrics(), log_check=FakeCheck())
    assert list(checks.checks) == ORDER
    assert await checks.one(name) is not None
