"""The read-only and healthz HTTP apps, in-process through httpx.ASGITransport: the
PodList served from the view (also while the bus is down; one encoding per change of
the view, shared with the kubelet API's /pods), /healthz and /healthz/<name> with the
kubelet API's checks and answers (10248: ping alone), /metrics/slis shared by the three
listeners, /metrics (with
the node's own series and the services' scrape failures), /metrics/probes,
/metrics/cadvisor (served only with the kubelet API's CRI client), and the listeners
build_deps derives from the settings."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from klet.bus import BusUnavailable, NodeBus
from klet.config import KletSettings
from klet.config import Settings as KletSettingsRoot
from klet.config.kubelet import KubeletAuthorization, KubeletConfiguration
from klet.model.types import JSON
from klet.obs import ServicePort
from klet.status_reporter.kubeletapi import build_kubelet_api_deps
from klet.status_reporter.kubeletapi.app import create_app as create_kubelet_api
from klet.status_reporter.kubeletapi.healthchecks import (
    CheckResult,
    SliMetrics,
    kubelet_health_checks,
)
from klet.status_reporter.kubeletapi.readonly import counted_app, create_app, create_healthz_app
from klet.status_reporter.metrics.instruments import Metrics
from klet.status_reporter.pods import listing
from klet.status_reporter.pods.podcache import PodCache
from klet.status_reporter.wiring import DEFAULT_SERVICE_PORT, Deps, Listener, Overrides, build_deps
from klet.testbed.fakes.bus import FakeBus
from klet.testbed.fakes.kubeletapi import FakeRuntime
from klet.testbed.fakes.status_reporter import desired_record, make_pod, status_record
from prometheus_client import CollectorRegistry

from tests.unit.status_reporter.helpers import KletCfg


@dataclass(frozen=True)
class KubeletCfg:
    address: str = "0.0.0.0"
    read_only_port: int = 0
    healthz_port: int = 10248
    healthz_bind_address: str = "127.0.0.1"


@dataclass(frozen=True)
class Settings:
    kubelet: KubeletCfg = field(default_factory=KubeletCfg)
    klet: KletCfg = field(default_factory=KletCfg)


@dataclass
class Fakes:
    bus: FakeBus = field(default_factory=FakeBus)

    def __post_init__(self) -> None:
        node = NodeBus.of(self.bus, service="status-reporter")
        self.desired = node.desired
        self.status = node.status
        self.feed = node.podstatus

    def deps(self, settings: Settings | None = None) -> Deps:
        return build_deps(
            settings or Settings(),
            overrides=Overrides(
                bus=self.bus.connect(),  # one lease per bus: a bus per Deps
                lease_holder="test",
                desired=self.desired,
                status=self.status,
                feed=self.feed,
                registry=CollectorRegistry(),
            ),
        )


@pytest.fixture
def fakes() -> Fakes:
    return Fakes()


@asynccontextmanager
async def client_for(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://node1") as client:
        yield client


async def test_pods_serves_the_view_as_a_podlist(fakes: Fakes) -> None:
    web, db = make_pod("web"), make_pod("db", namespace="prod")
    fakes.bus.seed(fakes.desired, "uid-web", desired_record(web))
    fakes.bus.seed(fakes.desired, "uid-db", desired_record(db))
    running = {"phase": "Running", "containerStatuses": [{"name": "app", "ready": True}]}
    fakes.bus.seed(fakes.status, "uid-web", status_record(web, version=4, status=running))
    deps = fakes.deps()
    await deps.pods.reload()

    async with client_for(create_app(deps)) as client:
        resp = await client.get("/pods")
        assert resp.status_code == 200
        assert resp.headers["content-type"] == "application/json"
        body = resp.json()
        assert body == {
            "kind": "PodList",
            "apiVersion": "v1",
            "metadata": {},
            "items": [
                {**web, "status": running},
                {**db, "status": {"phase": "Pending"}},
            ],
        }

        # Redis goes away: the same list keeps being served.
        fakes.bus.error = BusUnavailable("fake bus down")
        calls = len(fakes.bus.calls)
        assert (await client.get("/pods")).json() == body
        assert len(fakes.bus.calls) == calls  # a request never reads the bus


class FakeSyncloop:
    """The `syncloop` check, answering what the test sets (None: passes)."""

    def __init__(self) -> None:
        self.result: CheckResult = None
        self.calls = 0

    async def __call__(self) -> CheckResult:
        self.calls += 1
        return self.result


def with_syncloop(deps: Deps, syncloop: FakeSyncloop) -> Deps:
    """`deps` whose read-only /healthz asks `syncloop` (on its own SLI registry)."""
    return dataclasses.replace(
        deps, health=kubelet_health_checks(syncloop=syncloop, slis=deps.slis)
    )


async def test_healthz_and_metrics(fakes: Fakes, tmp_path: Path) -> None:
    deps = fakes.deps(Settings(klet=KletCfg(run_dir=tmp_path)))  # no other service's port
    deps = with_syncloop(deps, FakeSyncloop())
    async with client_for(create_app(deps)) as client:
        resp = await client.get("/healthz")
        assert (resp.status_code, resp.text) == (200, "ok")
        assert resp.headers["content-type"].startswith("text/plain")
        metrics = await client.get("/metrics")
        assert metrics.status_code == 200
        assert metrics.headers["content-type"].startswith("text/plain; version=")
        assert "kubelet_running_pods 0.0" in metrics.text
        assert 'kubelet_node_name{node="node1"} 1.0' in metrics.text
        # no other service publishes a port here: each is counted absent
        assert (
            'klet_metrics_scrape_failures_total{reason="absent",service="syncloop"} 1.0'
            in metrics.text
        )
        assert "_created" not in metrics.text
        probes = await client.get("/metrics/probes")
        assert probes.status_code == 200
        assert "kubelet_running_pods" not in probes.text
        assert (await client.get("/docs")).status_code == 404


async def test_healthz_app_serves_only_healthz() -> None:
    async with client_for(create_healthz_app(SliMetrics())) as client:
        assert (await client.get("/healthz")).text == "ok"
        assert (await client.get("/pods")).status_code == 404
        assert (await client.get("/metrics")).status_code == 404
        assert (await client.get("/metrics/slis")).status_code == 404


async def test_healthz_port_runs_ping_alone() -> None:
    """10248 is upstream's healthz handler without checks: `ping` alone."""
    async with client_for(create_healthz_app(SliMetrics())) as client:
        verbose = await client.get("/healthz", params={"verbose": ""})
        assert (verbose.status_code, verbose.text) == (200, "[+]ping ok\nhealthz check passed\n")
        assert (await client.get("/healthz/ping")).text == "ok"
        for other in ("log", "syncloop"):
            assert (await client.get(f"/healthz/{other}")).status_code == 404


async def test_read_only_healthz_answers_as_the_kubelet_api(fakes: Fakes) -> None:
    """The read-only port runs the kubelet API's checks (ping, log, syncloop) on the
    same syncloop check: /healthz, ?verbose, ?exclude and /healthz/<name> get the same
    status and body on both ports, passing and with syncloop failing."""
    syncloop = FakeSyncloop()
    deps = with_syncloop(fakes.deps(), syncloop)
    settings = KletSettingsRoot(
        kubelet=KubeletConfiguration(authorization=KubeletAuthorization(mode="AlwaysAllow")),
        klet=KletSettings(service="status-reporter", node_name="node1"),
    )
    api_deps = build_kubelet_api_deps(
        settings,
        pods=deps.pods,
        runtime=FakeRuntime(),
        registry=CollectorRegistry(),
        apiserver=None,
        slis=deps.slis,
        syncloop=syncloop,
    )
    requests = [
        ("/healthz", {}),
        ("/healthz", {"verbose": ""}),
        ("/healthz", {"verbose": "", "exclude": "syncloop"}),
        ("/healthz", {"exclude": "nope"}),
        ("/healthz/ping", {}),
        ("/healthz/log", {}),
        ("/healthz/syncloop", {}),
        ("/healthz/nope", {}),
    ]
    async with (
        client_for(create_app(deps)) as ro,
        client_for(create_kubelet_api(api_deps)) as secure,
    ):

        async def answers(client: httpx.AsyncClient) -> list[tuple[int, str, str]]:
            out = []
            for path, params in requests:
                r = await client.get(path, params=params)
                out.append((r.status_code, r.text, r.headers.get("x-content-type-options")))
            return out

        passing = await answers(ro)
        assert passing == await answers(secure)
        assert passing[1] == (
            200,
            "[+]ping ok\n[+]log ok\n[+]syncloop ok\nhealthz check passed\n",
            "nosniff",
        )
        assert passing[-1][0] == 404
        syncloop.result = "syncloop unhealthy: replica pid 7 (127.0.0.1:1): /healthz answered 500"
        failing = await answers(ro)
        assert failing == await answers(secure)
        assert failing[0][0] == 500
        assert "[-]syncloop failed: reason withheld\nhealthz check failed\n" in failing[0][1]
        assert failing[2][0] == 200  # syncloop excluded
        assert failing[6] == (500, f"internal server error: {syncloop.result}\n", "nosniff")
    assert syncloop.calls > 0


async def test_the_three_listeners_record_in_one_sli_registry(fakes: Fakes) -> None:
    """/metrics/slis on the read-only port shows the checks of its own /healthz and of
    10248's (one registry, as upstream's); DELETE resets it."""
    deps = with_syncloop(fakes.deps(), FakeSyncloop())
    assert deps.kubelet_api is None or deps.kubelet_api.slis is deps.slis
    async with (
        client_for(create_app(deps)) as ro,
        client_for(create_healthz_app(deps.slis)) as healthz,
    ):
        assert (await ro.get("/healthz")).status_code == 200
        assert (await healthz.get("/healthz")).status_code == 200
        assert (await ro.get("/healthz/log")).status_code == 200  # per-check: not recorded
        page = await ro.get("/metrics/slis")
        assert page.headers["content-type"].startswith("text/plain; version=")
        text = page.text
        ping = 'kubernetes_healthchecks_total{name="ping",status="success",type="healthz"}'
        assert f"{ping} 2.0" in text  # the read-only port's and 10248's
        for name in ("log", "syncloop"):
            labels = f'name="{name}",status="success",type="healthz"'
            assert f"kubernetes_healthchecks_total{{{labels}}} 1.0" in text
        assert 'kubernetes_healthcheck{name="syncloop",type="healthz"} 1.0' in text
        reset = await ro.delete("/metrics/slis")
        assert (reset.status_code, reset.text) == (200, "metrics reset\n")
        assert "kubernetes_healthchecks_total{" not in (await ro.get("/metrics/slis")).text
        assert (await ro.post("/metrics/slis")).status_code == 405


def test_listeners_follow_upstream_defaults(fakes: Fakes) -> None:
    deps = fakes.deps()
    assert deps.read_only is None  # readOnlyPort 0: off
    assert deps.healthz == Listener("127.0.0.1", 10248)
    assert deps.service == ServicePort(
        "status-reporter", "127.0.0.1", DEFAULT_SERVICE_PORT, run_dir=Path("/run/klet")
    )

    deps = fakes.deps(
        Settings(
            kubelet=KubeletCfg(read_only_port=10255, healthz_port=0),
            klet=KletCfg(service_port=0, service_port_file=Path("/tmp/sr.port")),
        )
    )
    assert deps.read_only == Listener("0.0.0.0", 10255)  # bound to `address`, as upstream
    assert deps.healthz is None  # healthzPort 0: off
    assert deps.service == ServicePort(  # 0: any free port, said in the port files
        "status-reporter",
        "127.0.0.1",
        0,
        run_dir=Path("/run/klet"),
        port_file=Path("/tmp/sr.port"),
    )


class FakeContainerMetrics:
    def __init__(self) -> None:
        self.scrapes = 0

    async def page(self) -> bytes:
        self.scrapes += 1
        return b"container_scrape_error 0.0\n"


async def test_metrics_cadvisor_only_with_the_kubelet_api(fakes: Fakes) -> None:
    deps = fakes.deps()  # no kubelet API (enableServer unset): no CRI client to read through
    assert deps.container_metrics is None
    async with client_for(create_app(deps)) as client:
        assert (await client.get("/metrics/cadvisor")).status_code == 404
    page = FakeContainerMetrics()
    with_api = dataclasses.replace(deps, container_metrics=page)
    async with client_for(create_app(with_api)) as client:
        resp = await client.get("/metrics/cadvisor")
        assert (resp.status_code, resp.text) == (200, "container_scrape_error 0.0\n")
        assert resp.headers["content-type"].startswith("text/plain; version=")
        assert page.scrapes == 1


async def test_pods_on_both_ports_serves_one_encoding_per_change(fakes: Fakes) -> None:
    # The read-only port and the kubelet API answer /pods from the same pod cache; the
    # PodList is encoded once per change of the view, not once per request (issue 42).
    encodes: list[int] = []

    def encode(pod_list: JSON) -> bytes:
        encodes.append(len(pod_list["items"]))
        return listing.encode_pod_list(pod_list)

    web = make_pod("web")
    fakes.bus.seed(fakes.desired, "uid-web", desired_record(web))
    cache = PodCache(
        desired=fakes.desired,
        status=fakes.status,
        feed=fakes.feed,
        metrics=Metrics(CollectorRegistry()),
        encode=encode,
    )
    await cache.reload()
    read_only = create_app(dataclasses.replace(fakes.deps(), pods=cache))
    settings = KletSettingsRoot(
        kubelet=KubeletConfiguration(authorization=KubeletAuthorization(mode="AlwaysAllow")),
        klet=KletSettings(service="status-reporter", node_name="node1"),
    )
    api_deps = build_kubelet_api_deps(
        settings, pods=cache, runtime=FakeRuntime(), registry=CollectorRegistry(), apiserver=None
    )
    async with (
        client_for(read_only) as ro,
        client_for(create_kubelet_api(api_deps)) as secure,
    ):
        answers = [await c.get("/pods") for _ in range(5) for c in (ro, secure)]
        assert encodes == [1]
        assert {(a.status_code, a.headers["content-type"], a.content) for a in answers} == {
            (200, "application/json", cache.pod_list_json())
        }
        assert [i["metadata"]["name"] for i in answers[0].json()["items"]] == ["web"]

        db = make_pod("db", namespace="prod")
        fakes.bus.seed(fakes.desired, "uid-db", desired_record(db))
        await cache.reload()  # the view changed: the next request encodes it, once
        after = [await c.get("/pods") for _ in range(5) for c in (secure, ro)]
        assert encodes == [1, 2]
        assert {a.content for a in after} == {cache.pod_list_json()}
        assert [i["metadata"]["name"] for i in after[0].json()["items"]] == ["web", "db"]


async def test_read_only_requests_are_counted_as_upstreams_readonly_server(fakes: Fakes) -> None:
    deps = fakes.deps()
    await deps.pods.reload()
    assert deps.http_requests is not None  # wiring's, shared with 10250's listener
    registry = deps.registry

    def value(name: str, method: str, path: str) -> float | None:
        labels = {"method": method, "path": path, "server_type": "readonly"}
        return registry.get_sample_value(name, {**labels, "long_running": "false"})

    app = counted_app(create_app(deps), deps.http_requests)
    async with client_for(app) as client:  # type: ignore[arg-type]
        assert (await client.get("/pods")).status_code == 200
        assert (await client.get("/pods")).status_code == 200
        assert (await client.get("/metrics/probes")).status_code == 200
        # configz is no read-only path: "other", as upstream's without debugging handlers
        assert (await client.get("/configz")).status_code == 404
        assert (await client.request("BREW", "/pods")).status_code == 405
    assert value("kubelet_http_requests_total", "GET", "pods") == 2
    assert value("kubelet_http_requests_duration_seconds_count", "GET", "pods") == 2
    assert value("kubelet_http_inflight_requests", "GET", "pods") == 0
    assert value("kubelet_http_requests_total", "GET", "metrics/probes") == 1
    assert value("kubelet_http_requests_total", "GET", "other") == 1
    assert value("kubelet_http_requests_total", "other", "pods") == 1
