"""The device plugin API (deviceplugin v1beta1) on the wire: the registration server
syncloop serves on `<root-dir>/device-plugins/kubelet.sock` and the client of each
plugin's own socket.

Only translation between protobuf messages and `klet.model.devices`; what a
registration means and what is allocated is syncloop's (`klet.syncloop.devices`). A
failed call raises `DevicePluginError` with the plugin's own words, which syncloop
puts in the container's waiting message as upstream does.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path

import grpc
from klet.cancellation import raise_if_cancelled
from klet.model.devices import (
    Device,
    DeviceMount,
    DeviceNode,
    DeviceRunOptions,
    PluginOptions,
    Registration,
)
from klet.rpc.gen.klet.deviceplugin.v1beta1 import deviceplugin_pb2 as pb
from klet.rpc.gen.klet.deviceplugin.v1beta1 import deviceplugin_pb2_grpc as pb_grpc

VERSION = "v1beta1"
PRE_START_TIMEOUT_S = 30.0
"""upstream's KubeletPreStartContainerRPCTimeoutInSecs."""
CALL_TIMEOUT_S = 10.0
"""Deadline of Allocate and GetPreferredAllocation (upstream sets none; a plugin that
hangs must not hold a pod worker for ever: the container is retried)."""


class DevicePluginError(Exception):
    """A call to a device plugin failed; the message says which and why."""


def decode_response(blob: bytes) -> DeviceRunOptions:
    """A serialized ContainerAllocateResponse as what the CRI config gets."""
    r = pb.ContainerAllocateResponse.FromString(blob)
    return DeviceRunOptions(
        envs=tuple(sorted(r.envs.items())),
        mounts=tuple(DeviceMount(m.container_path, m.host_path, m.read_only) for m in r.mounts),
        devices=tuple(
            DeviceNode(d.container_path, d.host_path, d.permissions or "mrw") for d in r.devices
        ),
        annotations=tuple(sorted(r.annotations.items())),
        cdi_devices=tuple(c.name for c in r.cdi_devices),
    )


def _device(d: pb.Device) -> Device:
    return Device(id=d.ID, health=d.health, numa_nodes=tuple(n.ID for n in d.topology.nodes))


class GrpcPlugin:
    """One registered plugin's DevicePlugin API on its socket."""

    def __init__(self, socket: Path) -> None:
        self.socket = socket
        self.channel = grpc.aio.insecure_channel(f"unix://{socket}")
        self.stub = pb_grpc.DevicePluginStub(self.channel)  # type: ignore[no-untyped-call]

    async def options(self) -> PluginOptions:
        """GetDevicePluginOptions: what a plugin registered through the plugin watcher
        asks for (a Register on kubelet.sock carries them in the request)."""
        try:
            r = await self.stub.GetDevicePluginOptions(pb.Empty(), timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as err:
            raise_if_cancelled(err)
            raise DevicePluginError(
                f"failed to get device plugin options: {err.details()}"
            ) from err
        return PluginOptions(
            pre_start_required=r.pre_start_required,
            get_preferred_allocation_available=r.get_preferred_allocation_available,
        )

    async def list_and_watch(self) -> AsyncIterator[list[Device]]:
        """Each device list the plugin sends, until its stream ends (returns) or fails
        (DevicePluginError)."""
        try:
            async for response in self.stub.ListAndWatch(pb.Empty()):
                yield [_device(d) for d in response.devices]
        except grpc.aio.AioRpcError as err:
            raise_if_cancelled(err)
            raise DevicePluginError(f"ListAndWatch ended: {err.details()}") from err

    async def preferred(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        request = pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=list(available),
                    must_include_deviceIDs=list(must_include),
                    allocation_size=size,
                )
            ]
        )
        try:
            response = await self.stub.GetPreferredAllocation(request, timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as err:
            raise_if_cancelled(err)
            raise DevicePluginError(
                f"device plugin GetPreferredAllocation rpc failed with err: {err.details()}"
            ) from err
        if not response.container_responses:
            return []
        return list(response.container_responses[0].deviceIDs)

    async def allocate(self, device_ids: Sequence[str]) -> bytes:
        request = pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devices_ids=list(device_ids))]
        )
        try:
            response = await self.stub.Allocate(request, timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as err:
            raise_if_cancelled(err)
            raise DevicePluginError(
                f"device plugin Allocate rpc failed with err: {err.details()}"
            ) from err
        if len(response.container_responses) != 1:
            raise DevicePluginError(
                f"device plugin Allocate answered {len(response.container_responses)} "
                "container responses for 1 container request"
            )
        return bytes(response.container_responses[0].SerializeToString(deterministic=True))

    async def pre_start(self, device_ids: Sequence[str]) -> None:
        try:
            await self.stub.PreStartContainer(
                pb.PreStartContainerRequest(devices_ids=list(device_ids)),
                timeout=PRE_START_TIMEOUT_S,
            )
        except grpc.aio.AioRpcError as err:
            raise_if_cancelled(err)
            raise DevicePluginError(
                f"device plugin PreStartContainer rpc failed with err: {err.details()}"
            ) from err

    async def close(self) -> None:
        await self.channel.close(None)


Register = Callable[[Registration], Awaitable[str]]
"""Takes a registration; returns why it is refused, "" when taken."""


class _Registration(pb_grpc.RegistrationServicer):
    def __init__(self, register: Register) -> None:
        self.register = register

    async def Register(  # noqa: N802 - the gRPC method's name
        self, request: pb.RegisterRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.Empty:
        why = await self.register(
            Registration(
                version=request.version,
                endpoint=request.endpoint,
                resource_name=request.resource_name,
                options=PluginOptions(
                    pre_start_required=request.options.pre_start_required,
                    get_preferred_allocation_available=(
                        request.options.get_preferred_allocation_available
                    ),
                ),
            )
        )
        if why:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, why)
        return pb.Empty()


async def serve_registration(
    socket: Path, register: Register, *, ready: asyncio.Event | None = None
) -> None:
    """Serve `v1beta1.Registration` on `socket` until cancelled (the socket is left to
    the caller's directory's permissions: plugins run as root, as upstream expects)."""
    server = grpc.aio.server()
    pb_grpc.add_RegistrationServicer_to_server(_Registration(register), server)  # type: ignore[no-untyped-call]
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    if ready is not None:
        ready.set()
    try:
        await server.wait_for_termination()
    finally:
        await server.stop(grace=None)
