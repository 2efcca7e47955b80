"""The read-only port's own CRI client for /metrics/cadvisor (metrics/lazyruntime.py):
nothing is opened until the first scrape; that scrape opens exactly one client, even
when several arrive at once, and later scrapes reuse it; shutdown closes it only if it
was opened, and nothing is opened after shutdown."""

from __future__ import annotations

import asyncio
from pathlib import Path

from klet.cgroups import CgroupStats
from klet.cgroups.detail import CgroupDetail
from klet.cri.types import FilesystemUsageInfo
from klet.model.types import JSON
from klet.stats import HostReader, StatsProvider
from klet.status_reporter.metrics.containermetrics import ContainerMetrics
from klet.status_reporter.metrics.lazyruntime import ClosableRuntime, LazyRuntime
from klet.testbed.fakes.stats import FakeCgroups, FakeStatsRuntime


class FakeClient(FakeStatsRuntime):
    """A runtime client that records its closing."""

    def __init__(self) -> None:
        super().__init__()
        self.closed = False

    async def close(self) -> None:
        self.closed = True


class Opener:
    """The factory LazyRuntime calls: counts the clients it opens."""

    def __init__(self, tmp: Path) -> None:
        self.clients: list[FakeClient] = []
        self._tmp = tmp

    def __call__(self) -> ClosableRuntime:
        client = FakeClient()
        client.image_fs = [FilesystemUsageInfo(0, str(self._tmp), 1, 1)]
        self.clients.append(client)
        return client


class NoPods:
    def pod_list(self) -> JSON:
        return {"kind": "PodList", "items": []}


def page_over(runtime: LazyRuntime, tmp: Path) -> ContainerMetrics:
    proc, sys = tmp / "proc", tmp / "sys"
    proc.mkdir()
    sys.mkdir()
    (proc / "stat").write_text("btime 1700000000\n")
    cg = FakeCgroups()
    cg.groups["/"] = CgroupStats(None, None, None, None)
    cg.details["/"] = CgroupDetail(cpu_usage_ns=7)
    host = HostReader(
        cgroups=cg, root_dir=tmp, cgroup_root="/", pod_logs_dir=tmp, proc=proc, sys=sys
    )
    return ContainerMetrics(StatsProvider(runtime, host), NoPods())


async def test_the_first_scrape_opens_one_client_and_the_next_reuses_it(tmp_path: Path) -> None:
    opener = Opener(tmp_path)
    runtime = LazyRuntime(opener)
    page = page_over(runtime, tmp_path)
    assert opener.clients == [] and not runtime.opened  # built: nothing opened

    first = await page.page()
    assert len(opener.clients) == 1 and runtime.opened
    assert b"container_cpu_usage_seconds_total" in first
    assert b"container_scrape_error 0" in first
    assert opener.clients[0].calls == 4  # the pass's four CRI reads, through the client

    await page.page()
    assert len(opener.clients) == 1
    assert opener.clients[0].calls == 8

    await runtime.close()
    assert opener.clients[0].closed and not runtime.opened


async def test_concurrent_first_scrapes_open_one_client(tmp_path: Path) -> None:
    opener = Opener(tmp_path)
    page = page_over(LazyRuntime(opener), tmp_path)
    pages = await asyncio.gather(page.page(), page.page(), page.page())
    assert len(opener.clients) == 1
    assert opener.clients[0].calls == 12
    assert all(b"container_scrape_error 0" in p for p in pages)


async def test_closing_an_unopened_client_opens_nothing_and_later_scrapes_report_it(
    tmp_path: Path,
) -> None:
    opener = Opener(tmp_path)
    runtime = LazyRuntime(opener)
    page = page_over(runtime, tmp_path)
    await runtime.close()
    assert opener.clients == []

    late = await page.page()  # a scrape racing shutdown: the page, with the runtime's error
    assert opener.clients == []
    assert b"container_scrape_error 1" in late
