"""gRPC clients of a CSI driver's node plugin and of a plugin's registration socket.

Two sockets per driver on a node: the registration socket the driver's
node-driver-registrar puts in `<root-dir>/plugins_registry/` (pluginregistration v1:
what it is, then told whether it was taken), and the driver's own endpoint, where the
CSI Identity and Node services answer. Every call has a deadline (a driver that hangs
must not hang a pod's sync); a failed call is `CSIError` with the gRPC status code name,
and an endpoint that does not answer at all is `DriverUnavailable` (a kind of it), so
callers can tell "retry later" from "the driver said no". A node client given an
`observer` tells it of every call it makes (the driver, upstream's full gRPC method
name, grpc-go's name of the status code, seconds), which syncloop turns into upstream's
`csi_operations_seconds`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from klet.cancellation import raise_if_cancelled
from klet.rpc.gen.klet.csi.v1 import csi_pb2 as csi
from klet.rpc.gen.klet.csi.v1 import csi_pb2_grpc as csi_grpc
from klet.rpc.gen.klet.pluginregistration.v1 import registration_pb2 as reg
from klet.rpc.gen.klet.pluginregistration.v1 import registration_pb2_grpc as reg_grpc
from klet.rpc.statuscodes import go_code

DEFAULT_TIMEOUT_S = 10.0
"""A node call's deadline unless the caller gives one (upstream's CSI client uses
minutes for stage and publish; these clients take theirs per call)."""

CHANNEL_OPTIONS = (("grpc.max_reconnect_backoff_ms", 5_000), ("grpc.use_local_subchannel_pool", 1))
"""A driver on a local socket that was down is tried again within seconds (gRPC's
default back-off grows to two minutes), and each client connects on its own: channels
to one socket otherwise share gRPC's global subchannel, so a client that failed again
and again while the driver was away would make the first call of a fresh one (the
registration of the restarted driver) fail at once with the old error."""

_UNAVAILABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


class CSIError(Exception):
    """A driver refused a call or failed it; `code` is the gRPC status code's name."""

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__(message)
        self.code = code


class DriverUnavailable(CSIError):
    """The socket did not answer (no listener, gone, or past the deadline)."""


@dataclass(frozen=True)
class Capability:
    """How a volume is used (CSI `VolumeCapability`): a mounted filesystem or a block
    device, and the access mode by its CSI name (`SINGLE_NODE_WRITER`, ...)."""

    access_mode: str
    block: bool = False
    fs_type: str = ""
    mount_flags: tuple[str, ...] = ()
    mount_group: str = ""  # the pod's fsGroup, for a driver with VOLUME_MOUNT_GROUP


@dataclass(frozen=True)
class Volume:
    """What stage and publish tell a driver about one volume."""

    volume_id: str
    capability: Capability
    volume_context: dict[str, str] = field(default_factory=dict)
    publish_context: dict[str, str] = field(default_factory=dict)
    secrets: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class VolumeStats:
    """A published volume's usage (CSI `NodeGetVolumeStats`), in the Summary API's
    names (`capacityBytes`, `usedBytes`, `inodesFree`, ...): only what the driver gave."""

    usage: dict[str, int]
    abnormal: bool = False
    message: str = ""


@dataclass(frozen=True)
class PluginInfo:
    """What a registration socket says (pluginregistration `GetInfo`)."""

    type: str
    name: str
    endpoint: str
    supported_versions: tuple[str, ...]


@dataclass(frozen=True)
class DriverInfo:
    """The driver's identity (CSI `GetPluginInfo`)."""

    name: str
    vendor_version: str


@dataclass(frozen=True)
class NodeInfo:
    """What the driver calls this node (CSI `NodeGetInfo`)."""

    node_id: str
    max_volumes_per_node: int  # 0: no limit
    topology: dict[str, str] = field(default_factory=dict)


def _target(socket: Path | str) -> str:
    path = str(socket)
    if path.startswith("unix://"):
        return path
    return f"unix://{path}"


async def _call(method: Any, request: Any, timeout_s: float, what: str) -> Any:
    try:
        return await method(request, timeout=timeout_s)
    except grpc.aio.AioRpcError as err:
        raise_if_cancelled(err)
        kind = DriverUnavailable if err.code() in _UNAVAILABLE else CSIError
        raise kind(f"{what}: {err.code().name}: {err.details()}", code=err.code().name) from err


CallObserver = Callable[[str, str, str, float], None]
"""Told (driver name, gRPC method such as `/csi.v1.Node/NodeStageVolume`, status code as
grpc-go names it: `OK`, `DeadlineExceeded`, ..., seconds) after every node client call."""


class RegistrationClient:
    """The pluginregistration v1 service on one registration socket."""

    def __init__(self, socket: Path, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.socket = socket
        self._timeout = timeout_s
        self._channel = grpc.aio.insecure_channel(_target(socket), options=CHANNEL_OPTIONS)
        self._stub = reg_grpc.RegistrationStub(self._channel)

    async def get_info(self) -> PluginInfo:
        reply = await _call(self._stub.GetInfo, reg.InfoRequest(), self._timeout, "GetInfo")
        return PluginInfo(
            type=reply.type,
            name=reply.name,
            endpoint=reply.endpoint,
            supported_versions=tuple(reply.supported_versions),
        )

    async def notify(self, *, registered: bool, error: str = "") -> None:
        status = reg.RegistrationStatus(plugin_registered=registered, error=error)
        await _call(
            self._stub.NotifyRegistrationStatus, status, self._timeout, "NotifyRegistrationStatus"
        )

    async def close(self) -> None:
        await self._channel.close(None)


class CSIClient:
    """The Identity and Node services of one CSI driver endpoint."""

    def __init__(
        self,
        endpoint: Path | str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        driver: str = "",
        observer: CallObserver | None = None,
    ) -> None:
        self.endpoint = str(endpoint)
        self.driver = driver
        self._timeout = timeout_s
        self._observer = observer
        self._channel = grpc.aio.insecure_channel(_target(endpoint), options=CHANNEL_OPTIONS)
        self._identity = csi_grpc.IdentityStub(self._channel)
        self._node = csi_grpc.NodeStub(self._channel)

    async def _call(self, service: str, method: Any, request: Any, what: str) -> Any:
        started, code = time.perf_counter(), "OK"
        try:
            return await _call(method, request, self._timeout, what)
        except CSIError as err:
            code = go_code(err.code)
            raise
        except asyncio.CancelledError:
            code = "Canceled"
            raise
        finally:
            if self._observer is not None:
                seconds = time.perf_counter() - started
                self._observer(self.driver, f"/csi.v1.{service}/{what}", code, seconds)

    async def plugin_info(self) -> DriverInfo:
        reply = await self._call(
            "Identity", self._identity.GetPluginInfo, csi.GetPluginInfoRequest(), "GetPluginInfo"
        )
        return DriverInfo(name=reply.name, vendor_version=reply.vendor_version)

    async def node_info(self) -> NodeInfo:
        reply = await self._call(
            "Node", self._node.NodeGetInfo, csi.NodeGetInfoRequest(), "NodeGetInfo"
        )
        return NodeInfo(
            node_id=reply.node_id,
            max_volumes_per_node=int(reply.max_volumes_per_node),
            topology=dict(reply.accessible_topology.segments),
        )

    async def node_capabilities(self) -> frozenset[str]:
        """The Node service's RPC capabilities by name (`STAGE_UNSTAGE_VOLUME`, ...)."""
        reply = await self._call(
            "Node",
            self._node.NodeGetCapabilities,
            csi.NodeGetCapabilitiesRequest(),
            "NodeGetCapabilities",
        )
        names = csi.NodeServiceCapability.RPC.Type
        return frozenset(
            names.Name(c.rpc.type) for c in reply.capabilities if c.WhichOneof("type") == "rpc"
        )

    async def stage(self, volume: Volume, *, staging_path: str) -> None:
        """NodeStageVolume: make the volume ready at the node's global path."""
        request = csi.NodeStageVolumeRequest(
            volume_id=volume.volume_id,
            publish_context=volume.publish_context,
            staging_target_path=staging_path,
            volume_capability=_capability(volume.capability),
            secrets=volume.secrets,
            volume_context=volume.volume_context,
        )
        await self._call("Node", self._node.NodeStageVolume, request, "NodeStageVolume")

    async def unstage(self, volume_id: str, *, staging_path: str) -> None:
        request = csi.NodeUnstageVolumeRequest(
            volume_id=volume_id, staging_target_path=staging_path
        )
        await self._call("Node", self._node.NodeUnstageVolume, request, "NodeUnstageVolume")

    async def publish(
        self, volume: Volume, *, target_path: str, staging_path: str = "", read_only: bool = False
    ) -> None:
        """NodePublishVolume: make the volume appear at the pod's `target_path`."""
        request = csi.NodePublishVolumeRequest(
            volume_id=volume.volume_id,
            publish_context=volume.publish_context,
            staging_target_path=staging_path,
            target_path=target_path,
            volume_capability=_capability(volume.capability),
            readonly=read_only,
            secrets=volume.secrets,
            volume_context=volume.volume_context,
        )
        await self._call("Node", self._node.NodePublishVolume, request, "NodePublishVolume")

    async def unpublish(self, volume_id: str, *, target_path: str) -> None:
        request = csi.NodeUnpublishVolumeRequest(volume_id=volume_id, target_path=target_path)
        await self._call("Node", self._node.NodeUnpublishVolume, request, "NodeUnpublishVolume")

    async def expand(
        self,
        volume: Volume,
        *,
        volume_path: str,
        staging_path: str = "",
        required_bytes: int,
    ) -> int:
        """NodeExpandVolume: grow the published volume's filesystem; the new capacity
        the driver reports (0: it did not say)."""
        request = csi.NodeExpandVolumeRequest(
            volume_id=volume.volume_id,
            volume_path=volume_path,
            capacity_range=csi.CapacityRange(required_bytes=required_bytes),
            staging_target_path=staging_path,
            volume_capability=_capability(volume.capability),
            secrets=volume.secrets,
        )
        reply = await self._call("Node", self._node.NodeExpandVolume, request, "NodeExpandVolume")
        return int(reply.capacity_bytes)

    async def volume_stats(
        self, volume_id: str, *, volume_path: str, staging_path: str = ""
    ) -> VolumeStats:
        request = csi.NodeGetVolumeStatsRequest(
            volume_id=volume_id, volume_path=volume_path, staging_target_path=staging_path
        )
        reply = await self._call(
            "Node", self._node.NodeGetVolumeStats, request, "NodeGetVolumeStats"
        )
        usage: dict[str, int] = {}
        for u in reply.usage:
            if u.unit == csi.VolumeUsage.BYTES:
                names = ("capacityBytes", "availableBytes", "usedBytes")
            elif u.unit == csi.VolumeUsage.INODES:
                names = ("inodes", "inodesFree", "inodesUsed")
            else:
                continue
            usage.update(zip(names, (int(u.total), int(u.available), int(u.used)), strict=True))
        condition = reply.volume_condition
        return VolumeStats(
            usage=usage, abnormal=bool(condition.abnormal), message=str(condition.message)
        )

    async def close(self) -> None:
        await self._channel.close(None)


def _capability(cap: Capability) -> Any:
    modes = csi.VolumeCapability.AccessMode.Mode
    try:
        mode = modes.Value(cap.access_mode)
    except ValueError as err:
        message = f"unknown CSI access mode {cap.access_mode!r}"
        raise CSIError(message, code="INVALID_ARGUMENT") from err
    access = csi.VolumeCapability.AccessMode(mode=mode)
    if cap.block:
        return csi.VolumeCapability(block=csi.VolumeCapability.BlockVolume(), access_mode=access)
    mount = csi.VolumeCapability.MountVolume(
        fs_type=cap.fs_type, mount_flags=list(cap.mount_flags), volume_mount_group=cap.mount_group
    )
    return csi.VolumeCapability(mount=mount, access_mode=access)
