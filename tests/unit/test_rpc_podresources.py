"""The PodResources v1 gRPC adapter (klet.rpc.podresources) in-process on a unix socket,
read by a client of the generated upstream-wire stubs: List, Get and
GetAllocatableResources carry pods, containers, devices with and without NUMA
topology and CPU IDs; Get of an unknown pod and Get with the KubeletPodResourcesGet gate
off fail with upstream's messages; upstream's rate limit (a fake clock: no waiting)
refuses the 11th call of a burst with RESOURCE_EXHAUSTED "rejected by rate limit" and
only the calls let through are counted for the requests metric, and Get's two errors
for the errors metric (the rate limit's refusal not); a
stale socket file is replaced at start, the directory is 0750, and the server removes
its socket when it stops; a container's DRA claims (dynamic_resources) on the wire."""

from __future__ import annotations

import asyncio
import stat
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from klet.model.podresources import (
    AllocatableResources,
    ClaimResource,
    ContainerDevices,
    ContainerResources,
    DynamicResource,
    PodResources,
    TokenBucket,
)
from klet.rpc.gen.klet.podresources.v1 import api_pb2 as pb
from klet.rpc.gen.klet.podresources.v1 import api_pb2_grpc as pb_grpc
from klet.rpc.podresources import pod_to_pb, serve_pod_resources

FOO = "example.com/foo"
WEB = PodResources(
    name="web",
    namespace="ns1",
    containers=(
        ContainerResources(
            "main",
            devices=(ContainerDevices(FOO, "foo-0", 1), ContainerDevices(FOO, "foo-1")),
            cpu_ids=(1,),
        ),
        ContainerResources("side"),
    ),
)


@dataclass
class Source:
    pods: list[PodResources] = field(default_factory=lambda: [WEB])
    get_gate: bool = True

    def list_pods(self) -> list[PodResources]:
        return self.pods

    def get_pod(self, namespace: str, name: str) -> PodResources | None:
        return next((p for p in self.pods if (p.namespace, p.name) == (namespace, name)), None)

    def allocatable(self) -> AllocatableResources:
        return AllocatableResources(
            devices=(ContainerDevices(FOO, "foo-0", 1), ContainerDevices(FOO, "foo-1"))
        )

    def get_enabled(self) -> bool:
        return self.get_gate


@dataclass
class Served:
    source: Source
    client: pb_grpc.PodResourcesListerStub
    socket: Path
    now: list[float]
    counted: list[str]
    failed: list[str]


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    source = Source()
    socket = tmp_path / "root" / "pod-resources" / "kubelet.sock"
    socket.parent.mkdir(parents=True, mode=0o755)
    socket.write_text("stale")  # left by a process that died
    now = [100.0]
    counted: list[str] = []
    failed: list[str] = []
    ready = asyncio.Event()
    server = asyncio.create_task(
        serve_pod_resources(
            source,
            socket,
            ready=ready,
            limiter=TokenBucket(),
            clock=lambda: now[0],
            on_request=counted.append,
            on_error=failed.append,
        )
    )
    await asyncio.wait_for(ready.wait(), 10)
    channel = grpc.aio.insecure_channel(f"unix://{socket}")
    try:
        stub = pb_grpc.PodResourcesListerStub(channel)  # type: ignore[no-untyped-call]
        yield Served(source, stub, socket, now, counted, failed)
    finally:
        await channel.close(None)
        server.cancel()
        await asyncio.gather(server, return_exceptions=True)


def _devices(
    c: pb.ContainerResources | pb.AllocatableResourcesResponse,
) -> list[tuple[str, list[str], list[int]]]:
    return [
        (d.resource_name, list(d.device_ids), [n.ID for n in d.topology.nodes]) for d in c.devices
    ]


async def test_list_get_and_allocatable_on_the_wire(served: Served) -> None:
    assert stat.S_ISSOCK(served.socket.stat().st_mode)  # the stale file was replaced
    assert stat.S_IMODE(served.socket.parent.stat().st_mode) == 0o750
    listed = await served.client.List(pb.ListPodResourcesRequest(), timeout=10)
    (pod,) = listed.pod_resources
    assert (pod.name, pod.namespace, [c.name for c in pod.containers]) == (
        "web",
        "ns1",
        ["main", "side"],
    )
    main = pod.containers[0]
    assert _devices(main) == [(FOO, ["foo-0"], [1]), (FOO, ["foo-1"], [])]
    assert not main.devices[1].HasField("topology")
    assert list(main.cpu_ids) == [1]
    assert list(main.memory) == [] and list(main.dynamic_resources) == []

    got = await served.client.Get(
        pb.GetPodResourcesRequest(pod_name="web", pod_namespace="ns1"), timeout=10
    )
    assert got.pod_resources == pod

    alloc = await served.client.GetAllocatableResources(
        pb.AllocatableResourcesRequest(), timeout=10
    )
    assert _devices(alloc) == [(FOO, ["foo-0"], [1]), (FOO, ["foo-1"], [])]
    assert list(alloc.cpu_ids) == [] and list(alloc.memory) == []


async def test_get_errors_are_upstreams(served: Served) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await served.client.Get(
            pb.GetPodResourcesRequest(pod_name="gone", pod_namespace="ns1"), timeout=10
        )
    assert (err.value.code(), err.value.details()) == (
        grpc.StatusCode.UNKNOWN,
        "pod gone in namespace ns1 not found",
    )
    served.source.get_gate = False
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await served.client.Get(
            pb.GetPodResourcesRequest(pod_name="web", pod_namespace="ns1"), timeout=10
        )
    assert (err.value.code(), err.value.details()) == (
        grpc.StatusCode.UNKNOWN,
        "PodResources API Get method disabled",
    )
    assert (served.counted, served.failed) == (["Get", "Get"], ["Get", "Get"])


async def test_rate_limit_refuses_beyond_the_burst(served: Served) -> None:
    for _ in range(10):  # the full bucket of a fresh server, the clock standing still
        await served.client.List(pb.ListPodResourcesRequest(), timeout=10)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await served.client.GetAllocatableResources(pb.AllocatableResourcesRequest(), timeout=10)
    assert (err.value.code(), err.value.details()) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "rejected by rate limit",
    )
    served.now[0] += 0.015  # one token back (1.5) after 15 ms at 100 per second
    await served.client.Get(
        pb.GetPodResourcesRequest(pod_name="web", pod_namespace="ns1"), timeout=10
    )
    # The requests metric counts what the limit let through, the refused call not.
    assert served.counted == ["List"] * 10 + ["Get"]
    assert served.failed == []


async def test_the_socket_goes_with_the_server(tmp_path: Path) -> None:
    socket = tmp_path / "pod-resources" / "kubelet.sock"
    ready = asyncio.Event()
    server = asyncio.create_task(serve_pod_resources(Source(), socket, ready=ready))
    await asyncio.wait_for(ready.wait(), 10)
    assert socket.exists()
    server.cancel()
    await asyncio.gather(server, return_exceptions=True)
    assert not socket.exists()


def test_dynamic_resources_on_the_wire() -> None:
    claim = DynamicResource(
        "gpu", "ns1", (ClaimResource("gpu.example.com", "pool", "gpu-0", ("gpu.example.com/g=0",)),)
    )
    wire = pod_to_pb(
        PodResources("web", "ns1", (ContainerResources("main", dynamic_resources=(claim,)),))
    )
    [dynamic] = wire.containers[0].dynamic_resources
    assert (dynamic.claim_name, dynamic.claim_namespace) == ("gpu", "ns1")
    [res] = dynamic.claim_resources
    assert (res.driver_name, res.pool_name, res.device_name) == ("gpu.example.com", "pool", "gpu-0")
    assert [d.name for d in res.cdi_devices] == ["gpu.example.com/g=0"]
