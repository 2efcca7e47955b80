"""Gathering the node's metrics (nodemetrics.py) from fake replicas: the leading
replica's exposition is the one used, a hung, failing or leaderless service is left
out within the time bound and counted by reason, a standby status-reporter serves its
leader's metrics with its own process families, the prober families go to
/metrics/probes only; and the port-file replicas are found and fetched over HTTP, on the
loopback only: a port file naming any other host is refused before a request is sent,
logged once naming the file and counted at every scrape."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from klet.obs import create_health_app, leader_metric, serve_http
from klet.portfiles import PortFiles, PortRecord
from klet.status_reporter.metrics import metricsmerge
from klet.status_reporter.metrics.nodemetrics import (
    NodeMetrics,
    NotLoopback,
    Replica,
    port_file_replicas,
    scrape_url,
)
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest


def exposition(service: str, *, leading: bool, extra: str = "") -> str:
    registry = CollectorRegistry()
    leader_metric(registry, service=service, leading=lambda: leading)
    Gauge("process_open_fds", "fds", registry=registry).set(99)
    if extra:
        Gauge(extra, f"{service}'s", registry=registry).set(2 if leading else 1)
    return generate_latest(registry).decode()


def record(service: str, port: int) -> PortRecord:
    return PortRecord(service, "127.0.0.1", port, 1, "host")


class Fleet:
    """Replicas by service, and what each one's /metrics does."""

    def __init__(self) -> None:
        self.replicas: dict[str, list[PortRecord]] = {}
        self.answers: dict[int, str | Exception | None] = {}  # None: hangs
        self.fetched: list[int] = []

    def add(self, service: str, answer: str | Exception | None) -> None:
        port = 1000 + len(self.answers)
        self.replicas.setdefault(service, []).append(record(service, port))
        self.answers[port] = answer

    def list(self, service: str) -> Sequence[Replica]:
        return [
            Replica(r, Path(f"/run/klet/ports/{service}/h-{r.port}.json"))
            for r in self.replicas.get(service, [])
        ]

    async def fetch(self, rec: PortRecord) -> str:
        self.fetched.append(rec.port)
        answer = self.answers[rec.port]
        if answer is None:
            await asyncio.Event().wait()
        if isinstance(answer, Exception):
            raise answer
        assert isinstance(answer, str)
        return answer


def own_registry(*, leading: bool) -> CollectorRegistry:
    registry = CollectorRegistry()
    leader_metric(registry, service="status-reporter", leading=lambda: leading)
    Gauge("process_open_fds", "fds", registry=registry).set(7)
    Gauge("process_start_time_seconds", "start", registry=registry).set(1234)
    Gauge("kubelet_node_name", "name", ["node"], registry=registry).labels("n1").set(1)
    return registry


def node_metrics(fleet: Fleet, *, leading: bool = True, timeout_s: float = 1.0) -> NodeMetrics:
    return NodeMetrics(
        own_registry(leading=leading),
        leading=lambda: leading,
        replicas=fleet.list,
        fetch=fleet.fetch,
        timeout_s=timeout_s,
    )


def values(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in metricsmerge.parse(text.decode())
        for s in f.samples
    }


def failures(nm: NodeMetrics, service: str, reason: str) -> float:
    return nm.failures.labels(service=service, reason=reason)._value.get()


async def test_the_leading_replicas_metrics_are_merged_with_our_own() -> None:
    fleet = Fleet()
    fleet.add("syncloop", exposition("syncloop", leading=False, extra="kubelet_running_pods"))
    fleet.add("syncloop", exposition("syncloop", leading=True, extra="kubelet_running_pods"))
    fleet.add("pod-source", exposition("pod-source", leading=True))
    fleet.add("eviction", exposition("eviction", leading=True))
    fleet.add("image-gc", exposition("image-gc", leading=True))
    nm = node_metrics(fleet)
    got = values(await nm.metrics())
    assert got[("kubelet_running_pods", ())] == 2  # the leader's, not the standby's
    for service in ("syncloop", "pod-source", "eviction", "image-gc", "status-reporter"):
        assert got[("klet_leader", (("service", service),))] == 1
    assert got[("kubelet_node_name", (("node", "n1"),))] == 1
    assert got[("process_open_fds", ())] == 7  # this process's, not theirs
    assert all(failures(nm, s, r) == 0 for s in ("syncloop", "eviction") for r in ("error",))


async def test_a_hung_service_is_left_out_within_the_bound_and_counted() -> None:
    fleet = Fleet()
    fleet.add("syncloop", None)
    fleet.add("pod-source", RuntimeError("connection refused"))
    fleet.add("eviction", exposition("eviction", leading=False))
    fleet.add("image-gc", exposition("image-gc", leading=True, extra="klet_image_gc_images"))
    nm = node_metrics(fleet, timeout_s=0.2)
    started = time.monotonic()
    got = values(await nm.metrics())
    assert time.monotonic() - started < 1.0
    assert failures(nm, "syncloop", "timeout") == 1
    assert failures(nm, "pod-source", "error") == 1
    assert failures(nm, "eviction", "absent") == 1  # replicas, none leading
    assert failures(nm, "image-gc", "absent") == 0
    assert got[("klet_image_gc_images", ())] == 2
    assert ("klet_leader", (("service", "syncloop"),)) not in got
    # the counter is in the scrape itself
    key = ("klet_metrics_scrape_failures_total", (("reason", "timeout"), ("service", "syncloop")))
    assert got[key] == 1


async def test_no_replica_at_all_is_absent() -> None:
    nm = node_metrics(Fleet())
    await nm.metrics()
    assert failures(nm, "syncloop", "absent") == 1
    assert failures(nm, "status-reporter", "absent") == 0  # we lead: not fetched


async def test_a_standby_serves_its_leaders_status_reporter_metrics() -> None:
    fleet = Fleet()
    fleet.add(
        "status-reporter",
        exposition("status-reporter", leading=True, extra="klet_status_reporter_view_age_seconds"),
    )
    nm = node_metrics(fleet, leading=False)
    got = values(await nm.metrics())
    assert got[("klet_leader", (("service", "status-reporter"),))] == 1
    assert got[("klet_status_reporter_view_age_seconds", ())] == 2
    assert got[("process_open_fds", ())] == 7
    assert ("kubelet_node_name", (("node", "n1"),)) not in got  # the leader's instead


async def test_a_standby_without_a_leader_serves_its_own() -> None:
    nm = node_metrics(Fleet(), leading=False)
    got = values(await nm.metrics())
    assert got[("klet_leader", (("service", "status-reporter"),))] == 0
    assert failures(nm, "status-reporter", "absent") == 1


async def test_probe_metrics_are_served_apart() -> None:
    registry = CollectorRegistry()
    leader_metric(registry, service="syncloop", leading=lambda: True)
    Counter("prober_probe", "runs", ["probe_type", "result"], registry=registry).labels(
        "Readiness", "successful"
    ).inc(3)
    fleet = Fleet()
    fleet.add("syncloop", generate_latest(registry).decode())
    fleet.add("eviction", None)  # hung: /metrics/probes does not ask it
    nm = node_metrics(fleet, timeout_s=0.2)
    probes = values(await nm.probes())
    assert fleet.fetched == [1000]  # syncloop's replica only
    key = ("prober_probe_total", (("probe_type", "Readiness"), ("result", "successful")))
    assert probes[key] == 3
    # and this process's start time, as upstream's probes registry has it
    assert {name for name, _ in probes} == {"prober_probe_total", "process_start_time_seconds"}
    main = values(await nm.metrics())
    assert key not in main
    assert ("process_start_time_seconds", ()) in main


@pytest.mark.parametrize(
    ("host", "url"),
    [
        ("127.0.0.1", "http://127.0.0.1:9/metrics"),
        ("0.0.0.0", "http://127.0.0.1:9/metrics"),
        ("::", "http://[::1]:9/metrics"),
        ("", "http://127.0.0.1:9/metrics"),
        ("127.0.0.2", "http://127.0.0.2:9/metrics"),
        ("::1", "http://[::1]:9/metrics"),
    ],
)
def test_scrape_url(host: str, url: str) -> None:
    assert scrape_url(PortRecord("syncloop", host, 9, 1, "h")) == url


@pytest.mark.parametrize(
    "host", ["10.0.0.5", "169.254.169.254", "example.com", "localhost.evil", "::ffff:10.0.0.5"]
)
def test_a_port_file_naming_another_host_is_not_scraped(host: str) -> None:
    with pytest.raises(NotLoopback, match=f"names host '{host}'"):
        scrape_url(PortRecord("syncloop", host, 9, 1, "h"))


def refused(nm: NodeMetrics, service: str) -> float:
    return float(nm.refused.labels(service=service)._value.get())


async def test_a_replica_on_another_host_is_never_fetched_logged_once_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fetched: list[PortRecord] = []

    async def fetch(record: PortRecord) -> str:
        fetched.append(record)
        return exposition(record.service, leading=True)

    planted = Path("/run/klet/ports/syncloop/h-1-abcd.json")
    files = {"syncloop": [Replica(PortRecord("syncloop", "169.254.169.254", 80, 1, "h"), planted)]}
    nm = NodeMetrics(
        own_registry(leading=True),
        leading=lambda: True,
        replicas=lambda service: files.get(service, []),
        fetch=fetch,
    )
    caplog.set_level(logging.WARNING, "klet.status_reporter.metrics.nodemetrics")
    await nm.metrics()
    await nm.metrics()
    assert fetched == []
    assert failures(nm, "syncloop", "error") == 2
    assert refused(nm, "syncloop") == 2  # at every scrape
    logged = [r for r in caplog.records if "not loopback" in r.getMessage()]
    assert len(logged) == 1  # once per file
    assert logged[0].__dict__["port_file"] == str(planted)
    assert logged[0].__dict__["host"] == "169.254.169.254"
    # the file gone and planted again: logged again
    files["syncloop"] = []
    await nm.metrics()
    files["syncloop"] = [Replica(PortRecord("syncloop", "10.0.0.5", 80, 1, "h"), planted)]
    await nm.metrics()
    assert len([r for r in caplog.records if "not loopback" in r.getMessage()]) == 2


async def test_a_refused_file_beside_a_loopback_leader_leaves_the_service_in() -> None:
    fleet = Fleet()
    fleet.add("syncloop", exposition("syncloop", leading=True, extra="pleg_x"))
    evil = Replica(PortRecord("syncloop", "10.0.0.5", 80, 1, "h"), Path("/p/evil.json"))
    nm = NodeMetrics(
        own_registry(leading=True),
        leading=lambda: True,
        replicas=lambda service: [*fleet.list(service), evil] if service == "syncloop" else [],
        fetch=fleet.fetch,
    )
    got = values(await nm.metrics())
    assert got[("pleg_x", ())] == 2
    assert refused(nm, "syncloop") == 1
    assert failures(nm, "syncloop", "error") == 0


async def test_replicas_are_found_by_their_port_files_and_fetched(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    leader_metric(registry, service="syncloop", leading=lambda: True)
    Gauge("volume_manager_total_volumes", "v", registry=registry).set(4)
    app = create_health_app(registry=registry, checks={}, ready=lambda: True)
    ready = asyncio.Event()
    files = PortFiles("syncloop", run_dir=tmp_path)
    server = asyncio.create_task(
        serve_http(
            app,
            host="127.0.0.1",
            port=0,
            name="syncloop",
            ready=ready,
            on_listening=files.publish,
        )
    )
    try:
        await asyncio.wait_for(ready.wait(), 5)
        nm = NodeMetrics(
            own_registry(leading=True),
            leading=lambda: True,
            replicas=port_file_replicas(tmp_path),
        )
        got = values(await nm.metrics())
        assert got[("volume_manager_total_volumes", ())] == 4
        assert failures(nm, "syncloop", "error") == 0
    finally:
        server.cancel()
        await asyncio.gather(server, return_exceptions=True)
        files.withdraw()


async def test_a_planted_port_file_is_named_by_its_path(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    planted = PortFiles("eviction", run_dir=tmp_path, hostname="h", pid=7, token="beef")
    planted.publish("169.254.169.254", 80)  # a live writer's file naming another host
    assert planted.published is not None
    try:
        replicas = port_file_replicas(tmp_path)
        assert replicas("eviction") == [
            Replica(PortRecord("eviction", "169.254.169.254", 80, 7, "h"), planted.published)
        ]
        nm = NodeMetrics(own_registry(leading=True), leading=lambda: True, replicas=replicas)
        caplog.set_level(logging.WARNING, "klet.status_reporter.metrics.nodemetrics")
        await nm.metrics()
        (logged,) = [r for r in caplog.records if "not loopback" in r.getMessage()]
        assert logged.__dict__["port_file"] == str(planted.published)
        assert refused(nm, "eviction") == 1
    finally:
        planted.withdraw()
