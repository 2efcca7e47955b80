"""POST /checkpoint/{namespace}/{pod}/{container}: the checkpoint of a running container
on the project's fake CRI runtime (klet.testbed.fakes.cri: the archive's location and timeout
it was asked for), upstream's 404s (pod, container, unparsable timeout) and 500s (the
container not running, a negative timeout, the runtime's error passed on in gRPC's Go
form as for a runtime without CheckpointContainer), the JSON body naming the archive,
and the route's absence with the ContainerCheckpoint gate off or the debugging handlers
off. The real runtime's Unimplemented answer is tests/integration/test_checkpoint.py's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from klet.cri import labels as L
from klet.cri.errors import CRIError
from klet.cri.types import Container, ContainerConfig, ContainerState, SandboxConfig
from klet.model.types import ContainerID, SandboxID
from klet.status_reporter.kubeletapi import KubeletApiDeps, KubeletApiSettings
from klet.status_reporter.kubeletapi.app import create_app
from klet.status_reporter.kubeletapi.checkpoint import (
    CheckpointError,
    archive_path,
    checkpoint,
    parse_timeout,
)
from klet.status_reporter.kubeletapi.deps import kubelet_api_metrics
from klet.testbed.fakes.cri import FakeRuntimeService
from klet.testbed.fakes.kubeletapi import FakeCheck, FakePodView, FakeRuntime
from klet.testbed.fakes.stats import FakeCgroups
from prometheus_client import CollectorRegistry

UID = "0b7e0c52-0000-4000-8000-0000000000c1"
IMAGE = "registry.klet.test/busybox:1.36"
AT = datetime(2026, 11, 28, 17, 50, 3, tzinfo=UTC)


def pod() -> dict[str, Any]:
    return {
        "metadata": {"name": "web", "namespace": "ns", "uid": UID},
        "spec": {
            "containers": [{"name": "app"}],
            "initContainers": [{"name": "init"}],
            "ephemeralContainers": [{"name": "debug"}],
        },
    }


def pod_list() -> dict[str, Any]:
    return {"kind": "PodList", "items": [pod()]}


async def running_app(cri: FakeRuntimeService) -> ContainerID:
    """The pod's sandbox and its running container `app`, labelled as syncloop labels."""
    cri.add_image(IMAGE)
    sandbox = SandboxConfig(
        name="web",
        namespace="ns",
        uid=UID,
        attempt=0,
        hostname="web",
        log_directory=f"/var/log/pods/ns_web_{UID}",
        labels={L.POD_UID: UID},
    )
    sid = await cri.run_pod_sandbox(sandbox)
    config = ContainerConfig(
        name="app",
        attempt=0,
        image=IMAGE,
        log_path="app/0.log",
        labels={L.POD_UID: UID, L.CONTAINER_NAME: "app"},
    )
    cid = await cri.create_container(sid, config, sandbox)
    await cri.start_container(cid)
    return cid


async def test_checkpoint_asks_the_runtime_for_an_archive_under_root_dir(tmp_path: Path) -> None:
    cri = FakeRuntimeService()
    cid = await running_app(cri)
    body = await checkpoint(cri, pod_list(), tmp_path, ("ns", "web", "app"), ["5", "30"], now=AT)
    location = tmp_path / "checkpoints" / "checkpoint-web_ns-app-2026-11-28T17:50:03Z.tar"
    assert body == '{"items":["' + str(location) + '"]}'
    # the last timeout given is the one sent; the directory exists, private, as upstream's
    assert cri.checkpoints == {str(location): (cid, 30)}
    assert location.parent.is_dir() and location.parent.stat().st_mode & 0o777 == 0o700
    assert cri.calls_of("CheckpointContainer") == [("CheckpointContainer", cid, str(location))]


async def test_the_container_must_be_running(tmp_path: Path) -> None:
    cri = FakeRuntimeService()
    cid = await running_app(cri)
    cri.exit_container(cid, 0)
    with pytest.raises(CheckpointError) as err:
        await checkpoint(cri, pod_list(), tmp_path, ("ns", "web", "app"), [], now=AT)
    assert (err.value.status, err.value.body) == (
        500,
        "checkpointing of ns/web/app failed (container app not found)",
    )
    # an init container the spec names, never started: the same answer
    with pytest.raises(CheckpointError) as err:
        await checkpoint(cri, pod_list(), tmp_path, ("ns", "web", "init"), [], now=AT)
    assert err.value.body == "checkpointing of ns/web/init failed (container init not found)"
    assert cri.checkpoints == {}


async def test_upstreams_not_found_answers(tmp_path: Path) -> None:
    cri = FakeRuntimeService()
    await running_app(cri)
    cases = [
        (("ns", "other", "app"), [], "pod does not exist"),
        (("other", "web", "app"), [], "pod does not exist"),
        (("ns", "web", "nope"), [], "container nope does not exist"),
        (("ns", "web", "app"), ["10", "ten"], "cannot parse value of timeout parameter"),
    ]
    for target, timeouts, body in cases:
        with pytest.raises(CheckpointError) as err:
            await checkpoint(cri, pod_list(), tmp_path, target, timeouts, now=AT)
        assert (err.value.status, err.value.body) == (404, body)
    assert cri.calls_of("CheckpointContainer") == []


async def test_runtime_errors_are_passed_on_in_the_500(tmp_path: Path) -> None:
    cri = FakeRuntimeService()
    await running_app(cri)
    unimplemented = (
        "rpc error: code = Unimplemented desc = unknown method CheckpointContainer "
        "for service runtime.v1.RuntimeService"
    )
    cri.fail_next("CheckpointContainer", CRIError(unimplemented, code="UNIMPLEMENTED"))
    with pytest.raises(CheckpointError) as err:
        await checkpoint(cri, pod_list(), tmp_path, ("ns", "web", "app"), [], now=AT)
    assert (err.value.status, err.value.body) == (
        500,
        f"checkpointing of ns/web/app failed ({unimplemented})",
    )
    with pytest.raises(CheckpointError) as err:
        await checkpoint(cri, pod_list(), tmp_path, ("ns", "web", "app"), ["-1"], now=AT)
    assert err.value.body == (
        "checkpointing of ns/web/app failed "
        "(CheckpointContainer requires the timeout value to be >= 0)"
    )


def test_timeout_and_archive_name() -> None:
    assert parse_timeout([]) == 0
    assert parse_timeout(["1", "+7"]) == 7
    assert parse_timeout(["-3"]) == -3
    for bad in ("", " 5", "5s", "1_0", "9223372036854775808"):
        with pytest.raises(CheckpointError):
            parse_timeout([bad])
    local = datetime(2026, 1, 2, 4, 5, 6).astimezone()
    name = archive_path(Path("/var/lib/kubelet"), "kube-system", "p", "c", local).name
    assert name == "checkpoint-p_kube-system-c-" + local.astimezone(UTC).strftime(
        "%Y-%m-%dT%H:%M:%SZ.tar"
    )


def deps_for(tmp_path: Path, runtime: FakeRuntime, **settings: Any) -> KubeletApiDeps:
    registry = CollectorRegistry()
    return KubeletApiDeps(
        settings=KubeletApiSettings(node_name="n1", root_dir=tmp_path, **settings),
        pods=FakePodView([pod()]),
        runtime=runtime,
        registry=registry,
        cgroups=FakeCgroups(),
        metrics=kubelet_api_metrics(registry),
        syncloop=FakeCheck(),
    )


async def client(deps: KubeletApiDeps) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app(deps))
    async with httpx.AsyncClient(transport=transport, base_url="https://n1") as c:
        yield c


def api_runtime() -> FakeRuntime:
    runtime = FakeRuntime()
    runtime.containers = [
        Container(
            ContainerID("c1"),
            SandboxID("s1"),
            "app",
            0,
            IMAGE,
            "sha",
            ContainerState.RUNNING,
            1,
            labels={L.POD_UID: UID, L.CONTAINER_NAME: "app"},
        )
    ]
    return runtime


async def test_the_route_post_only_json(tmp_path: Path) -> None:
    runtime = api_runtime()
    async for c in client(deps_for(tmp_path, runtime)):
        r = await c.post("/checkpoint/ns/web/app", params={"timeout": "200"})
        assert r.status_code == 200 and r.headers["content-type"] == "application/json"
        [location] = r.json()["items"]
        assert location.startswith(str(tmp_path / "checkpoints" / "checkpoint-web_ns-app-"))
        assert runtime.checkpoints == {location: (ContainerID("c1"), 200)}
        assert (await c.get("/checkpoint/ns/web/app")).status_code == 405
        r = await c.post("/checkpoint/ns/web/nope")
        assert (r.status_code, r.text) == (404, "container nope does not exist")
        runtime.failing["checkpoint_container"] = CRIError("rpc error: code = Unknown desc = x")
        r = await c.post("/checkpoint/ns/web/app")
        assert (r.status_code, r.text) == (
            500,
            "checkpointing of ns/web/app failed (rpc error: code = Unknown desc = x)",
        )


async def test_no_route_with_the_gate_or_debugging_handlers_off(tmp_path: Path) -> None:
    for settings in ({"container_checkpoint": False}, {"enable_debugging_handlers": False}):
        runtime = api_runtime()
        async for c in client(deps_for(tmp_path, runtime, **settings)):
            assert (await c.post("/checkpoint/ns/web/app")).status_code == 404
        assert runtime.checkpoints == {}
