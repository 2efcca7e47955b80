"""The PodResources API v1 on the wire: the server syncloop's leader runs on
`<root-dir>/pod-resources/kubelet.sock` (upstream's ListenAndServePodResources).

Only translation between `klet.model.podresources` values and protobuf messages, and
upstream's rate limit in front of every call; what the answers hold is the source's
(`klet.syncloop.podresources`). The errors are upstream's: a call beyond the rate limit
is RESOURCE_EXHAUSTED "rejected by rate limit"; Get of a pod the node does not have,
or with the KubeletPodResourcesGet gate off, is an error without a code of its own
(UNKNOWN, as a Go `fmt.Errorf` from a handler is) with upstream's message.

The socket: upstream makes `<root-dir>/pod-resources` 0750 and replaces a stale
socket file at start; so does this server, and at its end it removes the socket it
made (not one a newer server made in its place meanwhile). The socket keeps the
umask's mode: its readers are node agents that run as root, as upstream expects.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import grpc
from klet.model.podresources import (
    GET_DISABLED,
    RATE_LIMITED,
    AllocatableResources,
    ContainerDevices,
    ContainerMemory,
    ContainerResources,
    DynamicResource,
    PodResources,
    TokenBucket,
    pod_not_found,
)
from klet.rpc.gen.klet.podresources.v1 import api_pb2 as pb
from klet.rpc.gen.klet.podresources.v1 import api_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

DIR_MODE = 0o750


class PodResourcesSource(Protocol):
    """What the server answers from (syncloop's `PodResourcesView`)."""

    def list_pods(self) -> Sequence[PodResources]: ...

    def get_pod(self, namespace: str, name: str) -> PodResources | None: ...

    def allocatable(self) -> AllocatableResources: ...

    def get_enabled(self) -> bool:
        """The KubeletPodResourcesGet gate."""
        ...


def _topology(nodes: Sequence[int]) -> pb.TopologyInfo | None:
    return pb.TopologyInfo(nodes=[pb.NUMANode(ID=n) for n in nodes]) if nodes else None


def _devices(devices: Sequence[ContainerDevices]) -> list[pb.ContainerDevices]:
    return [
        pb.ContainerDevices(
            resource_name=d.resource,
            device_ids=[d.device_id],
            topology=_topology(() if d.numa_node is None else (d.numa_node,)),
        )
        for d in devices
    ]


def _memory(memory: Sequence[ContainerMemory]) -> list[pb.ContainerMemory]:
    return [
        pb.ContainerMemory(memory_type=m.memory_type, size=m.size, topology=_topology(m.numa_nodes))
        for m in memory
    ]


def _dynamic(resources: Sequence[DynamicResource]) -> list[pb.DynamicResource]:
    return [
        pb.DynamicResource(
            claim_name=r.claim_name,
            claim_namespace=r.claim_namespace,
            claim_resources=[
                pb.ClaimResource(
                    cdi_devices=[pb.CDIDevice(name=n) for n in c.cdi_devices],
                    driver_name=c.driver_name,
                    pool_name=c.pool_name,
                    device_name=c.device_name,
                )
                for c in r.claim_resources
            ],
        )
        for r in resources
    ]


def _container(c: ContainerResources) -> pb.ContainerResources:
    return pb.ContainerResources(
        name=c.name,
        devices=_devices(c.devices),
        cpu_ids=list(c.cpu_ids),
        memory=_memory(c.memory),
        dynamic_resources=_dynamic(c.dynamic_resources),
    )


def pod_to_pb(p: PodResources) -> pb.PodResources:
    return pb.PodResources(
        name=p.name, namespace=p.namespace, containers=[_container(c) for c in p.containers]
    )


def allocatable_to_pb(a: AllocatableResources) -> pb.AllocatableResourcesResponse:
    return pb.AllocatableResourcesResponse(
        devices=_devices(a.devices), cpu_ids=list(a.cpu_ids), memory=_memory(a.memory)
    )


Context = grpc.aio.ServicerContext[object, object]


OnRequest = Callable[[str], None]
"""Told the method of every call the rate limit lets through (the requests metric); as
`on_error`, of every call answered with an error after that (Get's disabled gate or
unknown pod, as upstream counts them; the rate limit's refusals are not)."""


def _uncounted(method: str) -> None:
    pass


class _Lister(pb_grpc.PodResourcesListerServicer):
    def __init__(
        self,
        source: PodResourcesSource,
        limiter: TokenBucket,
        clock: Callable[[], float],
        on_request: OnRequest,
        on_error: OnRequest,
    ) -> None:
        self.source, self.limiter, self.clock = source, limiter, clock
        self.on_request, self.on_error = on_request, on_error

    async def _limit(self, context: Context, method: str) -> None:
        if not self.limiter.allow(self.clock()):
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, RATE_LIMITED)
        self.on_request(method)

    async def List(  # noqa: N802 - the gRPC method's name
        self, request: pb.ListPodResourcesRequest, context: Context
    ) -> pb.ListPodResourcesResponse:
        await self._limit(context, "List")
        return pb.ListPodResourcesResponse(
            pod_resources=[pod_to_pb(p) for p in self.source.list_pods()]
        )

    async def GetAllocatableResources(  # noqa: N802 - the gRPC method's name
        self, request: pb.AllocatableResourcesRequest, context: Context
    ) -> pb.AllocatableResourcesResponse:
        await self._limit(context, "GetAllocatableResources")
        return allocatable_to_pb(self.source.allocatable())

    async def Get(  # noqa: N802 - the gRPC method's name
        self, request: pb.GetPodResourcesRequest, context: Context
    ) -> pb.GetPodResourcesResponse:
        await self._limit(context, "Get")
        if not self.source.get_enabled():
            self.on_error("Get")
            await context.abort(grpc.StatusCode.UNKNOWN, GET_DISABLED)
        pod = self.source.get_pod(request.pod_namespace, request.pod_name)
        if pod is None:
            self.on_error("Get")
            await context.abort(
                grpc.StatusCode.UNKNOWN, pod_not_found(request.pod_namespace, request.pod_name)
            )
        return pb.GetPodResourcesResponse(pod_resources=pod_to_pb(pod))


def _prepare(socket: Path) -> None:
    socket.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(socket.parent, DIR_MODE)
    socket.unlink(missing_ok=True)  # a socket left by a process that died


def _remove_if_ours(socket: Path, inode: int | None) -> None:
    try:
        if inode is not None and os.stat(socket).st_ino == inode:
            socket.unlink()
    except FileNotFoundError:
        pass


async def serve_pod_resources(
    source: PodResourcesSource,
    socket: Path,
    *,
    ready: asyncio.Event | None = None,
    limiter: TokenBucket | None = None,
    clock: Callable[[], float] = time.monotonic,
    on_request: OnRequest = _uncounted,
    on_error: OnRequest = _uncounted,
) -> None:
    """Serve `v1.PodResourcesLister` on `socket` until cancelled."""
    await asyncio.to_thread(_prepare, socket)
    server = grpc.aio.server()
    pb_grpc.add_PodResourcesListerServicer_to_server(  # type: ignore[no-untyped-call]
        _Lister(source, limiter or TokenBucket(), clock, on_request, on_error), server
    )
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    inode: int | None = os.stat(socket).st_ino
    log.info("serving the podresources API", extra={"endpoint": f"unix://{socket}"})
    if ready is not None:
        ready.set()
    try:
        await server.wait_for_termination()
    finally:
        try:
            await server.stop(grace=None)
        finally:  # stop() of a cancelled task raises CancelledError before it is done
            _remove_if_ours(socket, inode)
