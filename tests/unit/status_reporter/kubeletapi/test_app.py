"""The kubelet API app in-process (httpx.ASGITransport) over fakes: /healthz, /pods,
/runningpods/, /configz, /metrics, /metrics/probes, /metrics/resource, /metrics/cadvisor,
/stats/summary, /run,
containerLogs (tail, previous, the conventional path when CRI forgot the container,
upstream's 400/404/422 answers),
the 405 of disabled debugging handlers, and how exec/attach/portForward requests are
resolved to the runtime's streaming URL."""

from __future__ import annotations

import asyncio
import dataclasses
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from klet.cgroups import CgroupStats
from klet.cgroups.detail import CgroupDetail
from klet.config import KletSettings, Settings
from klet.config.kubelet import KubeletAuthorization, KubeletConfiguration
from klet.cri import labels as L
from klet.cri.errors import CRIError
from klet.cri.types import (
    Container,
    ContainerState,
    ContainerStatsInfo,
    ContainerStatusInfo,
    FilesystemUsageInfo,
    Sandbox,
    SandboxState,
)
from klet.model.records import VolumeRecord
from klet.model.types import ContainerID, SandboxID
from klet.status_reporter.kubeletapi import (
    KubeletApiDeps,
    KubeletApiSettings,
    build_kubelet_api_deps,
)
from klet.status_reporter.kubeletapi.app import HttpProblem, create_app, resolve_stream_url
from klet.status_reporter.kubeletapi.deps import kubelet_api_metrics
from klet.status_reporter.kubeletapi.routes import StreamTarget
from klet.status_reporter.kubeletapi.stats import ephemeral_storage
from klet.testbed.fakes.kubeletapi import FakeCheck, FakePodView, FakeRuntime
from klet.testbed.fakes.stats import FakeCgroups
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families

UID = "0b7e0c52-0000-4000-8000-000000000001"


def log_line(text: str, second: int = 0) -> bytes:
    return f"2024-01-01T00:00:{second:02d}.000000000Z stdout F {text}\n".encode()


def make_pod(status: dict[str, Any]) -> dict[str, Any]:
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"name": "web", "namespace": "ns", "uid": UID},
        "spec": {"containers": [{"name": "app", "image": "busybox"}]},
        "status": {"phase": "Running", "containerStatuses": [{"name": "app", **status}]},
    }


class World:
    def __init__(self, tmp_path: Path, *, debugging: bool = True) -> None:
        self.tmp = tmp_path
        self.pods = FakePodView(
            [
                make_pod(
                    {
                        "restartCount": 1,
                        "state": {"running": {}},
                        "containerID": "containerd://c1",
                        "lastState": {"terminated": {"containerID": "containerd://c0"}},
                    }
                )
            ]
        )
        self.runtime = FakeRuntime()
        self.log = tmp_path / "c1.log"
        self.log.write_bytes(b"".join(log_line(f"line{i}", i) for i in range(5)))
        self.runtime.statuses[ContainerID("c1")] = self.status("c1", str(self.log))
        self.runtime.sandboxes = [
            Sandbox(
                SandboxID("s1"),
                "web",
                "ns",
                UID,
                0,
                SandboxState.READY,
                10**18,
                labels={L.POD_UID: UID},
            ),
        ]
        self.runtime.containers = [
            Container(
                ContainerID("c1"),
                SandboxID("s1"),
                "app",
                1,
                "busybox",
                "sha",
                ContainerState.RUNNING,
                2 * 10**18,
                labels={
                    L.POD_UID: UID,
                    L.CONTAINER_NAME: "app",
                    L.POD_NAME: "web",
                    L.POD_NAMESPACE: "ns",
                },
            ),
        ]
        self.registry = CollectorRegistry()
        Counter("klet_test_total", "a test counter", registry=self.registry).inc()
        self.cgroups = FakeCgroups()
        self.volumes = FakeVolumes()
        self.syncloop = FakeCheck()
        self.deps = KubeletApiDeps(
            settings=KubeletApiSettings(
                node_name="n1",
                pod_logs_dir=tmp_path / "pods",
                root_dir=tmp_path,
                enable_debugging_handlers=debugging,
                configz={"kubeletconfig": {"port": 10250}},
            ),
            pods=self.pods,
            runtime=self.runtime,
            registry=self.registry,
            cgroups=self.cgroups,
            metrics=kubelet_api_metrics(self.registry),
            syncloop=self.syncloop,
            volumes=self.volumes,
        )

    @staticmethod
    def status(
        cid: str, log_path: str, state: ContainerState = ContainerState.RUNNING
    ) -> ContainerStatusInfo:
        return ContainerStatusInfo(
            ContainerID(cid), "app", 1, state, 0, 0, 0, 0, "busybox", "sha", "", "", log_path
        )


class FakeVolumes:
    def __init__(self) -> None:
        self.records: list[VolumeRecord] = []

    def measured(self, pod_uid: str) -> list[VolumeRecord]:
        return [r for r in self.records if r.pod_uid == pod_uid]


@pytest.fixture
async def world(tmp_path: Path) -> World:
    return World(tmp_path)


async def client_for(world: World) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app(world.deps))
    async with httpx.AsyncClient(transport=transport, base_url="https://n1") as client:
        yield client


@pytest.fixture
async def client(world: World) -> AsyncIterator[httpx.AsyncClient]:
    async for c in client_for(world):
        yield c


async def test_simple_endpoints(client: httpx.AsyncClient, world: World) -> None:
    assert (await client.get("/healthz")).text == "ok"
    pods = (await client.get("/pods")).json()
    assert [p["metadata"]["name"] for p in pods["items"]] == ["web"]
    assert (await client.get("/configz")).json() == {"kubeletconfig": {"port": 10250}}
    assert "klet_test_total 1.0" in (await client.get("/metrics")).text
    # the prober's counter is served apart, on /metrics/probes, as upstream serves it
    Counter("prober_probe", "probe runs", ["probe_type"], registry=world.registry).labels(
        "Liveness"
    ).inc()
    metrics, probes = (await client.get("/metrics")).text, await client.get("/metrics/probes")
    assert "prober_probe_total" not in metrics
    assert probes.status_code == 200
    assert 'prober_probe_total{probe_type="Liveness"} 1.0' in probes.text
    assert "klet_test_total" not in probes.text
    running = (await client.get("/runningpods/")).json()
    assert running["items"][0]["metadata"]["uid"] == UID
    assert running["items"][0]["spec"]["containers"] == [
        {"name": "app", "image": "busybox", "resources": {}}
    ]


async def test_healthz_checks_and_their_sli_metrics(
    client: httpx.AsyncClient, world: World
) -> None:
    verbose = await client.get("/healthz", params={"verbose": ""})
    assert verbose.status_code == 200 and verbose.headers["x-content-type-options"] == "nosniff"
    assert verbose.text == "[+]ping ok\n[+]log ok\n[+]syncloop ok\nhealthz check passed\n"
    world.syncloop.result = "no live syncloop replica has a port file in /run/klet/ports/syncloop"
    failed = await client.get("/healthz")
    assert failed.status_code == 500
    assert failed.text.endswith("[-]syncloop failed: reason withheld\nhealthz check failed\n")
    assert (await client.get("/healthz", params={"exclude": "syncloop"})).text == "ok"
    one = await client.get("/healthz/syncloop")
    assert (one.status_code, one.text) == (500, f"internal server error: {world.syncloop.result}\n")
    assert (await client.get("/healthz/ping")).text == "ok"
    assert (await client.get("/healthz/nope")).status_code == 404
    slis = await client.get("/metrics/slis")
    assert slis.status_code == 200
    assert 'kubernetes_healthcheck{name="syncloop",type="healthz"} 0.0' in slis.text
    assert (
        'kubernetes_healthchecks_total{name="ping",status="success",type="healthz"} 3.0'
        in slis.text
    )
    assert "klet_test_total" not in slis.text  # the SLI page has its own registry
    reset = await client.delete("/metrics/slis")
    assert (reset.status_code, reset.text) == (200, "metrics reset\n")
    assert "kubernetes_healthcheck{" not in (await client.get("/metrics/slis")).text


async def test_container_logs(client: httpx.AsyncClient, world: World) -> None:
    r = await client.get("/containerLogs/ns/web/app")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert r.text == "line0\nline1\nline2\nline3\nline4\n"
    r = await client.get(
        "/containerLogs/ns/web/app", params={"tailLines": "2", "timestamps": "true"}
    )
    assert r.text == (
        "2024-01-01T00:00:03.000000000Z line3\n2024-01-01T00:00:04.000000000Z line4\n"
    )
    assert (await client.get("/containerLogs/ns/web/app?limitBytes=8")).text == "line0\nli"


async def test_container_logs_of_a_big_log_hold_a_bounded_amount(
    client: httpx.AsyncClient, world: World
) -> None:
    """tailLines=1 and limitBytes on an 8 MB log (with a rotated file beside it) never
    hold the log in memory: the answer is found from the end and streamed."""
    rotated = world.log.with_name("c1.log.20240101-000000")
    rotated.write_bytes(log_line("rotated") * 10)
    with world.log.open("wb") as f:
        for i in range(8):
            f.write(log_line("x" * 1000, i) * 1000)
        f.write(log_line("the last", 9))
    tracemalloc.start()
    try:
        tail = await client.get("/containerLogs/ns/web/app?tailLines=1")
        head = await client.get("/containerLogs/ns/web/app?limitBytes=20")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * 2**20, f"peak {peak} bytes"
    assert tail.text == "the last\n"
    assert head.text == "rotated\n" * 2 + "rota"


async def test_previous_log_from_the_conventional_path(
    client: httpx.AsyncClient, world: World
) -> None:
    # c0 is gone from the runtime: its file is found where syncloop put it.
    path = world.tmp / "pods" / f"ns_web_{UID}" / "app" / "0.log"
    path.parent.mkdir(parents=True)
    path.write_bytes(log_line("before the restart"))
    r = await client.get("/containerLogs/ns/web/app?previous=true")
    assert r.status_code == 200 and r.text == "before the restart\n"
    assert ("container_status", "c0") in world.runtime.calls


async def test_container_logs_errors(client: httpx.AsyncClient, world: World) -> None:
    r = await client.get("/containerLogs/ns/nope/app")
    assert (r.status_code, r.text) == (404, 'pod "nope" does not exist\n')
    r = await client.get("/containerLogs/ns/web/db")
    assert (r.status_code, r.text) == (404, 'container "db" not found in pod "web"\n')
    assert (await client.get("/containerLogs/ns/web/app?tailLines=-1")).status_code == 422
    assert (await client.get("/containerLogs/ns/web/app?follow=perhaps")).status_code == 400
    world.pods.pods[0]["status"]["containerStatuses"][0].pop("lastState")
    r = await client.get("/containerLogs/ns/web/app?previous=1")
    assert r.status_code == 400 and "previous terminated container" in r.text
    world.log.unlink()
    r = await client.get("/containerLogs/ns/web/app")
    assert r.status_code == 400 and r.text.startswith("failed to open log file")


async def test_debugging_handlers_off(tmp_path: Path) -> None:
    world = World(tmp_path, debugging=False)
    async for client in client_for(world):
        for path in ("/containerLogs/ns/web/app", "/configz", "/runningpods/"):
            r = await client.get(path)
            assert (r.status_code, r.text) == (405, "Debug endpoints are disabled.\n")
        assert (await client.post("/run/ns/web/app?cmd=ls")).status_code == 405
        assert (await client.get("/pods")).status_code == 200
    with pytest.raises(HttpProblem) as err:
        await resolve_stream_url(
            world.deps,
            StreamTarget("exec", "ns", "web", container="app"),
            "command=ls&output=1",
            websocket=False,
        )
    assert err.value.status == 405


async def test_streaming_paths_need_an_upgrade(client: httpx.AsyncClient) -> None:
    for path in ("/exec/ns/web/app", "/attach/ns/web/x/app", "/portForward/ns/web"):
        r = await client.post(path)
        assert (r.status_code, r.text) == (400, "Upgrade request required")


async def test_run(client: httpx.AsyncClient, world: World) -> None:
    world.runtime.exec_output = (0, b"out\n", b"err\n")
    r = await client.post("/run/ns/web/app", params={"cmd": "cat /etc/hostname"})
    assert r.status_code == 200 and r.content == b"out\nerr\n"
    assert ("exec_sync", ("c1", ["cat", "/etc/hostname"])) in world.runtime.calls
    assert (await client.post(f"/run/ns/web/{UID}/app?cmd=ls")).status_code == 200
    assert (await client.post("/run/ns/web/wrong-uid/app?cmd=ls")).status_code == 404
    assert (await client.post("/run/ns/gone/app?cmd=ls")).status_code == 404


class HangingExec(FakeRuntime):
    """A runtime whose ExecSync never answers; records the timeout it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.timeouts: list[int] = []

    async def exec_sync(
        self, container_id: ContainerID, cmd: list[str], *, timeout_s: int
    ) -> tuple[int, bytes, bytes]:
        self.timeouts.append(timeout_s)
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_run_is_bounded_by_runtime_request_timeout(world: World) -> None:
    runtime = HangingExec()
    runtime.statuses, runtime.containers = world.runtime.statuses, world.runtime.containers
    settings = dataclasses.replace(world.deps.settings, runtime_request_timeout_s=0.2)
    world.deps = dataclasses.replace(world.deps, settings=settings, runtime=runtime)
    async for client in client_for(world):
        r = await asyncio.wait_for(client.post("/run/ns/web/app?cmd=sleep+3600"), 10)
        assert (r.status_code, r.text) == (
            500,
            "command did not finish within runtimeRequestTimeout (0.2s)",
        )
    assert runtime.timeouts == [1]  # the runtime is told to stop it too (whole seconds)


async def test_resolve_stream_url(world: World) -> None:
    rt = world.runtime
    url = await resolve_stream_url(
        world.deps,
        StreamTarget("exec", "ns", "web", container="app"),
        "command=sh&command=-c&command=echo+hi&input=1&output=1&tty=1",
        websocket=False,
    )
    assert url == rt.stream_url
    assert rt.calls[-1] == ("exec", ("c1", ["sh", "-c", "echo hi"], True, True, True, False))
    await resolve_stream_url(
        world.deps,
        StreamTarget("attach", "ns", "web", uid=UID, container="app"),
        "output=1&error=1",
        websocket=False,
    )
    assert rt.calls[-1] == ("attach", ("c1", False, False, True, True))
    await resolve_stream_url(
        world.deps, StreamTarget("portForward", "ns", "web"), "port=80&port=81", websocket=True
    )
    assert rt.calls[-1] == ("port_forward", ("s1", [80, 81]))

    async def status_of(target: StreamTarget, query: str = "output=1") -> int:
        with pytest.raises(HttpProblem) as err:
            await resolve_stream_url(world.deps, target, query, websocket=False)
        return err.value.status

    assert await status_of(StreamTarget("exec", "ns", "nope", container="app")) == 404
    assert await status_of(StreamTarget("exec", "ns", "web", uid="x", container="app")) == 404
    assert await status_of(StreamTarget("exec", "ns", "web", container="db")) == 404
    assert await status_of(StreamTarget("exec", "ns", "web", container="app"), "") == 400
    rt.sandboxes = []
    assert await status_of(StreamTarget("portForward", "ns", "web")) == 404


async def test_stats_summary(client: httpx.AsyncClient, world: World) -> None:
    cg = world.cgroups.groups
    cg["/"] = CgroupStats(4000, 3000, 10**9, 100)
    cg["/kubepods"] = CgroupStats(2000, 1500, 5 * 10**8, 10)
    cg[f"/kubepods/besteffort/pod{UID}"] = CgroupStats(1000, 800, 10**8, 3)
    world.runtime.image_fs = [FilesystemUsageInfo(0, str(world.tmp), 12345, 67)]
    world.runtime.stats = [
        ContainerStatsInfo(
            ContainerID("c1"),
            "app",
            1,
            {},
            {},
            5 * 10**18,
            10**7,
            None,
            5 * 10**18,
            700,
            900,
            600,
            None,
            FilesystemUsageInfo(0, "", 4096, 4),
        ),
    ]
    world.volumes.records = [
        VolumeRecord(
            pod_uid=UID,
            namespace="ns",
            pod="web",
            volume="data",
            claim="data-claim",
            unique_name="kubernetes.io/csi/d^h",
            usage={"capacityBytes": 100, "usedBytes": 10},
            measured_at=1.5,
        )
    ]
    cache = world.tmp / "pods" / UID / "volumes" / "kubernetes.io~empty-dir" / "cache"
    cache.mkdir(parents=True)
    (cache / "data").write_bytes(b"x" * 8192)
    first = (await client.get("/stats/summary")).json()
    node = first["node"]
    assert node["nodeName"] == "n1"
    assert node["cpu"]["usageCoreNanoSeconds"] == 10**9 and "usageNanoCores" not in node["cpu"]
    assert node["memory"]["workingSetBytes"] == 3000
    assert node["systemContainers"][0]["name"] == "pods"
    assert node["fs"]["capacityBytes"] > 0
    assert node["runtime"]["imageFs"]["usedBytes"] == 12345
    [pod] = first["pods"]
    assert pod["podRef"] == {"name": "web", "namespace": "ns", "uid": UID}
    assert pod["memory"]["workingSetBytes"] == 800
    assert pod["process_stats"] == {"process_count": 3}
    [c] = pod["containers"]
    assert c["name"] == "app" and c["memory"]["workingSetBytes"] == 700
    assert c["rootfs"]["usedBytes"] == 4096
    assert c["logs"]["usedBytes"] == 0
    empty_dir, claimed = pod["volume"]
    assert empty_dir["name"] == "cache"
    assert empty_dir["usedBytes"] >= 8192 and empty_dir["inodesUsed"] == 2  # as du counts
    assert empty_dir["capacityBytes"] == node["fs"]["capacityBytes"]  # the root dir's fs
    assert empty_dir["inodes"] == node["fs"]["inodes"] and "pvcRef" not in empty_dir
    # upstream's calcEphemeralStorage: writable layer + its logs + disk emptyDirs, not
    # the claimed volume; the root filesystem's size and free space
    ephemeral = pod["ephemeral-storage"]
    assert ephemeral["usedBytes"] == 4096 + c["logs"]["usedBytes"] + empty_dir["usedBytes"]
    assert ephemeral["inodesUsed"] == (
        c["rootfs"]["inodesUsed"] + c["logs"]["inodesUsed"] + empty_dir["inodesUsed"]
    )
    assert ephemeral["capacityBytes"] == node["fs"]["capacityBytes"]
    assert ephemeral["availableBytes"] == node["fs"]["availableBytes"]
    assert [claimed] == [
        {
            "time": "1970-01-01T00:00:01Z",
            "name": "data",
            "capacityBytes": 100,
            "usedBytes": 10,
            "pvcRef": {"name": "data-claim", "namespace": "ns"},
        }
    ]
    cg["/"] = CgroupStats(4000, 3000, 2 * 10**9, 100)
    second = (await client.get("/stats/summary")).json()
    assert second["node"]["cpu"]["usageNanoCores"] > 0
    light = (await client.get("/stats/summary?only_cpu_and_memory=true")).json()
    assert "fs" not in light["node"] and "logs" not in light["pods"][0]["containers"][0]
    assert "volume" not in light["pods"][0]
    assert "ephemeral-storage" not in light["pods"][0]


async def test_resource_metrics(client: httpx.AsyncClient, world: World) -> None:
    world.cgroups.groups["/"] = CgroupStats(4000, 3000, 2 * 10**9, 100)
    world.cgroups.groups[f"/kubepods/pod{UID}"] = CgroupStats(
        1000, 800, 10**9, 3, swap_usage_bytes=64
    )
    world.runtime.stats = [
        ContainerStatsInfo(
            ContainerID("c1"),
            "app",
            1,
            {},
            {},
            5 * 10**18,
            5 * 10**8,
            None,
            5 * 10**18,
            700,
            900,
            600,
            None,
            None,
        ),
    ]
    r = await client.get("/metrics/resource")
    assert r.status_code == 200
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }
    ref = (("namespace", "ns"), ("pod", "web"))
    assert samples[("node_cpu_usage_seconds_total", ())] == 2.0
    assert samples[("node_memory_working_set_bytes", ())] == 3000
    assert samples[("pod_cpu_usage_seconds_total", ref)] == 1.0
    assert samples[("pod_swap_usage_bytes", ref)] == 64  # the pod cgroup's swap
    labels = tuple(sorted((*ref, ("container", "app"))))
    assert samples[("container_cpu_usage_seconds_total", labels)] == 0.5
    assert samples[("container_memory_working_set_bytes", labels)] == 700
    assert samples[("container_start_time_seconds", labels)] == 2 * 10**9
    assert samples[("resource_scrape_error", ())] == 0
    world.runtime.failing["list_pod_sandboxes"] = CRIError("runtime down")
    r = await client.get("/metrics/resource")
    assert "resource_scrape_error 0" not in r.text and "resource_scrape_error 1" in r.text


async def test_container_usage_from_its_cgroup_when_the_runtime_gives_none(
    client: httpx.AsyncClient, world: World
) -> None:
    # containerd 1.6's stats on a host with an unmounted cgroup v1 controller: the
    # container is listed, with no CPU and no memory
    pod = f"/kubepods/pod{UID}"
    world.cgroups.groups[pod] = CgroupStats(1000, 800, 10**9, 3)
    world.cgroups.groups[f"{pod}/c1"] = CgroupStats(900, 650, 3 * 10**8, None)
    world.runtime.stats = [
        ContainerStatsInfo(
            ContainerID("c1"), "app", 1, {}, {}, 0, None, None, 0, None, None, None, None, None
        ),
    ]
    r = await client.get("/metrics/resource")
    labels = 'container="app",namespace="ns",pod="web"'
    assert f"container_cpu_usage_seconds_total{{{labels}}} 0.3 " in r.text
    assert f"container_memory_working_set_bytes{{{labels}}} 650 " in r.text
    [c] = (await client.get("/stats/summary")).json()["pods"][0]["containers"]
    assert c["cpu"]["usageCoreNanoSeconds"] == 3 * 10**8
    assert (c["memory"]["usageBytes"], c["memory"]["workingSetBytes"]) == (900, 650)
    # no cgroup either: no numbers rather than zeros
    del world.cgroups.groups[f"{pod}/c1"]
    [c] = (await client.get("/stats/summary")).json()["pods"][0]["containers"]
    assert "cpu" not in c and "memory" not in c


async def test_metrics_cadvisor(client: httpx.AsyncClient, world: World) -> None:
    pod = f"/kubepods/pod{UID}"
    for rel in ("/", pod, f"{pod}/c1"):
        world.cgroups.groups[rel] = CgroupStats(None, None, None, None)
    world.cgroups.details["/"] = CgroupDetail(cpu_usage_ns=9 * 10**9)
    world.cgroups.details[pod] = CgroupDetail(cpu_usage_ns=2 * 10**9, memory_working_set=800)
    world.cgroups.details[f"{pod}/c1"] = CgroupDetail(cpu_usage_ns=10**9, memory_working_set=700)
    # the runtime lists the image by ID; the label is its name, from the pod view
    world.runtime.containers = [dataclasses.replace(world.runtime.containers[0], image="sha256:1")]
    r = await client.get("/metrics/cadvisor")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }
    none = {"container": "", "image": "", "name": "", "namespace": "", "pod": ""}
    root = tuple(sorted({**none, "id": "/", "cpu": "total"}.items()))
    pod_labels = {**none, "id": pod, "pod": "web", "namespace": "ns"}
    app = {**pod_labels, "id": f"{pod}/c1", "container": "app", "image": "busybox", "name": "c1"}
    assert samples[("container_cpu_usage_seconds_total", root)] == 9.0
    assert samples[("container_cpu_usage_seconds_total", _key(pod_labels, cpu="total"))] == 2.0
    assert samples[("container_cpu_usage_seconds_total", _key(app, cpu="total"))] == 1.0
    assert samples[("container_memory_working_set_bytes", _key(app))] == 700
    assert samples[("container_scrape_error", ())] == 0
    world.runtime.failing["list_pod_sandboxes"] = CRIError("runtime down")
    r = await client.get("/metrics/cadvisor")
    assert "container_scrape_error 1.0" in r.text
    assert 'id="/",' in r.text and 'pod="web"' not in r.text


def _key(labels: dict[str, str], **extra: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({**labels, **extra}.items()))


def test_build_deps_from_settings(world: World) -> None:
    settings = Settings(
        kubelet=KubeletConfiguration(),
        klet=KletSettings(service="status-reporter", node_name="n1"),
    )
    with pytest.raises(ValueError, match="Webhook needs an apiserver"):
        build_kubelet_api_deps(
            settings, pods=world.pods, runtime=world.runtime, registry=world.registry,
            apiserver=None,
        )  # fmt: skip
    allow = dataclasses.replace(
        settings,
        kubelet=dataclasses.replace(
            settings.kubelet, authorization=KubeletAuthorization(mode="AlwaysAllow")
        ),
    )
    deps = build_kubelet_api_deps(
        allow, pods=world.pods, runtime=world.runtime, registry=CollectorRegistry(), apiserver=None
    )
    s = deps.settings
    assert (s.port, s.authorization_mode, s.authn.webhook, s.authn.x509) == (
        10250, "AlwaysAllow", True, False,
    )  # fmt: skip
    assert s.configz["kubeletconfig"]["kind"] == "KubeletConfiguration"
    assert s.fine_grained_authz and s.streaming_idle_timeout_s == 4 * 3600


async def test_why_serves_a_pods_history_from_the_lookup(world: World) -> None:
    asked: list[tuple[str, str]] = []

    async def lookup(namespace: str, name: str) -> dict[str, Any] | None:
        asked.append((namespace, name))
        if name == "down":
            from klet.bus import BusUnavailable

            raise BusUnavailable("connection refused")
        return {"answer": "Running, never restarted"} if name == "web" else None

    world.deps = dataclasses.replace(world.deps, history=lookup)
    async for client in client_for(world):
        found = await client.get("/why/ns/web")
        assert found.status_code == 200 and found.json() == {"answer": "Running, never restarted"}
        missing = await client.get("/why/ns/other")
        assert missing.status_code == 404 and "no history of pod ns/other" in missing.text
        down = await client.get("/why/ns/down")
        assert down.status_code == 503 and "connection refused" in down.text
    assert asked == [("ns", "web"), ("ns", "other"), ("ns", "down")]
    world.deps = dataclasses.replace(world.deps, history=None)
    async for client in client_for(world):
        off = await client.get("/why/ns/web")
        assert off.status_code == 404 and "not kept by this server" in off.text


def test_ephemeral_storage_adds_logs_only_with_a_writable_layer() -> None:
    containers = [
        {"rootfs": {"usedBytes": 10, "inodesUsed": 1}, "logs": {"usedBytes": 5, "inodesUsed": 2}},
        {"logs": {"usedBytes": 1000, "inodesUsed": 100}},  # no writable layer: as upstream
    ]
    empty_dirs = [{"name": "cache", "usedBytes": 7, "inodesUsed": 3}, {"name": "unread"}]
    got = ephemeral_storage(containers, empty_dirs, None, 0)
    assert (got["usedBytes"], got["inodesUsed"]) == (22, 6)
    assert "capacityBytes" not in got  # no statfs reading of the root filesystem
