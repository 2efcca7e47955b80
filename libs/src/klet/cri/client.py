"""Asyncio CRI v1 client: the only module that imports the generated CRI stubs.

It speaks RuntimeService and ImageService over one gRPC channel per endpoint, gives
every call a deadline (runtimeRequestTimeout; image pulls get their own, longer one),
converts messages to the value types of `klet.cri.types`, and maps gRPC failures to
`NotFound` / `RuntimeUnavailable` / `CRIError`. Only idempotent reads are retried here
(a short tenacity policy); mutating calls are retried by their callers, which know
whether repeating them is safe.

The calls that make something (RunPodSandbox, CreateContainer, StartContainer) run to
their end even when their caller is cancelled, and `close()` waits for them (at most
`CRISettings.drain_s`). A service stopped in the middle of a start would otherwise
cancel the RPC: containerd then abandons the start seconds later ("failed to create
shim task: context canceled"), the container ends as a StartError that the next
syncloop reports as a failed start, and until then containerd refuses to remove it
("container is in starting state"). Restarting a service must not do that to a pod.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar

import grpc
from cri_api.v1 import api_pb2 as pb
from cri_api.v1 import api_pb2_grpc as pb_grpc
from klet.cancellation import raise_if_cancelled
from klet.cri.endpoint import channel_target
from klet.cri.errors import CRIError, NotFound, RuntimeUnavailable
from klet.cri.types import (
    AuthConfig,
    Container,
    ContainerConfig,
    ContainerState,
    ContainerStatsInfo,
    ContainerStatusInfo,
    FilesystemUsageInfo,
    ImageInfo,
    LinuxContainerSecurity,
    LinuxResources,
    LinuxSandboxSecurity,
    Mount,
    MountPropagation,
    NamespaceOptions,
    RuntimeCondition,
    RuntimeVersion,
    Sandbox,
    SandboxConfig,
    SandboxState,
    SandboxStatusInfo,
    SecurityProfile,
    SELinuxOptions,
)
from klet.model.types import ContainerID, ImageRef, SandboxID
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class CRISettings:
    """How to reach the runtime.

    `timeout_s` is runtimeRequestTimeout (upstream default 2 min); reads are retried
    `read_attempts` times with exponential back-off starting at `retry_initial_s`.
    """

    runtime_endpoint: str
    image_endpoint: str = ""
    timeout_s: float = 120.0
    pull_timeout_s: float = 600.0
    read_attempts: int = 3
    retry_initial_s: float = 0.2
    drain_s: float = 10.0
    """How long `close()` waits for sandbox and container creations and starts whose
    callers were cancelled (a service stopping) before it closes the channel."""


class RuntimeConfig(Protocol):
    """The KubeletConfiguration fields that say how to reach the runtime."""

    @property
    def container_runtime_endpoint(self) -> str: ...

    @property
    def image_service_endpoint(self) -> str: ...

    @property
    def runtime_request_timeout(self) -> float: ...


def cri_settings(kubelet: RuntimeConfig, **overrides: Any) -> CRISettings:
    """CRISettings from the configuration (containerRuntimeEndpoint,
    imageServiceEndpoint, runtimeRequestTimeout), as every service builds it."""
    return replace(
        CRISettings(
            runtime_endpoint=kubelet.container_runtime_endpoint,
            image_endpoint=kubelet.image_service_endpoint,
            timeout_s=kubelet.runtime_request_timeout,
        ),
        **overrides,
    )


def _forget_making(making: set[asyncio.Task[Any]]) -> Callable[[asyncio.Task[Any]], None]:
    """A done-callback: drop the task from `making`, and take its outcome so that one
    whose caller went away is not reported as never retrieved."""

    def done(task: asyncio.Task[Any]) -> None:
        making.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.debug("runtime call failed", extra={"call": task.get_name()})

    return done


def _map_error(err: grpc.aio.AioRpcError, what: str) -> CRIError:
    code = err.code()
    text = f"{what}: {code.name}: {err.details()}"
    if code == grpc.StatusCode.NOT_FOUND:
        return NotFound(text, code=code.name)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return RuntimeUnavailable(text, code=code.name)
    # containerd answers some missing-object cases with UNKNOWN + "not found".
    if "not found" in (err.details() or "").lower():
        return NotFound(text, code=code.name)
    return CRIError(text, code=code.name)


# grpc-go's names of the status codes where they are not the Python enum's in CamelCase.
_GO_CODE_NAMES = {"OK": "OK", "CANCELLED": "Canceled"}


def go_status_text(err: grpc.aio.AioRpcError) -> str:
    """A gRPC error as grpc-go's status error prints it: `rpc error: code = NotFound desc =
    ...` (upstream's kubelet passes such text on to its API's clients)."""
    name = err.code().name
    code = _GO_CODE_NAMES.get(name) or "".join(p.capitalize() for p in name.split("_"))
    return f"rpc error: code = {code} desc = {err.details() or ''}"


class CallObserver(Protocol):
    """Told of every unary CRI call: its method name, how long it took, whether it failed,
    and for RunPodSandbox the runtime handler it asked for (klet.obs.runtimeops turns this
    into upstream's kubelet_runtime_operations_* and kubelet_run_podsandbox_*)."""

    def observe(
        self, method: str, seconds: float, *, failed: bool, runtime_handler: str | None = None
    ) -> None: ...


class RuntimeClient:
    """RuntimeService + ImageService of one runtime."""

    def __init__(self, settings: CRISettings, *, observer: CallObserver | None = None) -> None:
        self.settings = settings
        self.observer = observer
        # gRPC's default reconnect back-off grows to two minutes: after a runtime
        # restart the first calls would fail for that long. A unix socket is cheap to
        # retry, so reconnect within a second.
        options = [
            ("grpc.max_receive_message_length", 16 * 1024 * 1024),
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000),
        ]
        self._channel = grpc.aio.insecure_channel(
            channel_target(settings.runtime_endpoint), options=options
        )
        image_endpoint = settings.image_endpoint or settings.runtime_endpoint
        self._image_channel = (
            self._channel
            if image_endpoint == settings.runtime_endpoint
            else grpc.aio.insecure_channel(channel_target(image_endpoint), options=options)
        )
        self._rt = pb_grpc.RuntimeServiceStub(self._channel)
        self._img = pb_grpc.ImageServiceStub(self._image_channel)
        self._making: set[asyncio.Task[Any]] = set()

    async def settle(self) -> bool:
        """Wait (at most `drain_s`) for the creations and starts whose callers were
        cancelled; False when some still run."""
        if not self._making:
            return True
        _, left = await asyncio.wait(set(self._making), timeout=self.settings.drain_s)
        if left:
            log.warning(
                "runtime calls still running after the drain",
                extra={"calls": sorted(t.get_name() for t in left)},
            )
        return not left

    async def close(self) -> None:
        await self.settle()
        await self._channel.close(None)
        if self._image_channel is not self._channel:
            await self._image_channel.close(None)

    async def _call(
        self,
        what: str,
        method: Any,
        request: Any,
        *,
        deadline_s: float | None = None,
        runtime_handler: str | None = None,
    ) -> Any:
        started, failed = time.perf_counter(), False
        try:
            return await method(request, timeout=deadline_s or self.settings.timeout_s)
        except grpc.aio.AioRpcError as err:
            failed = True
            raise_if_cancelled(err)
            raise _map_error(err, what) from err
        finally:
            if self.observer is not None:
                self.observer.observe(
                    what,
                    time.perf_counter() - started,
                    failed=failed,
                    runtime_handler=runtime_handler,
                )

    async def _make(
        self, what: str, method: Any, request: Any, *, runtime_handler: str | None = None
    ) -> Any:
        """`_call` for a creation or start: it runs on when the caller is cancelled, and
        `close()` waits for it (see the module docstring)."""
        task = asyncio.ensure_future(
            self._call(what, method, request, runtime_handler=runtime_handler)
        )
        task.set_name(what)
        self._making.add(task)
        task.add_done_callback(_forget_making(self._making))
        return await asyncio.shield(task)

    async def _read(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(RuntimeUnavailable),
            stop=stop_after_attempt(max(1, self.settings.read_attempts)),
            wait=wait_exponential(multiplier=self.settings.retry_initial_s, max=2.0),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                return await call()
        raise AssertionError("unreachable")  # pragma: no cover

    # -- runtime ---------------------------------------------------------------------

    async def version(self) -> RuntimeVersion:
        r = await self._read(
            "Version",
            lambda: self._call("Version", self._rt.Version, pb.VersionRequest(version="v1")),
        )
        return RuntimeVersion(r.runtime_name, r.runtime_version, r.runtime_api_version)

    async def status(self) -> list[RuntimeCondition]:
        r = await self._read(
            "Status", lambda: self._call("Status", self._rt.Status, pb.StatusRequest())
        )
        return [
            RuntimeCondition(c.type, c.status, c.reason, c.message) for c in r.status.conditions
        ]

    async def sandbox_image(self) -> str:
        """The runtime's sandbox (pause) image, from its verbose Status ("" if unsaid).

        containerd puts its CRI configuration in `info["config"]` (`sandboxImage`);
        containerd 1.6 does not report that image as pinned, so image GC asks here.
        """
        r = await self._read(
            "Status",
            lambda: self._call("Status", self._rt.Status, pb.StatusRequest(verbose=True)),
        )
        try:
            config = json.loads(r.info.get("config", "") or "{}")
        except ValueError:
            return ""
        image = config.get("sandboxImage") if isinstance(config, dict) else None
        return image if isinstance(image, str) else ""

    async def cgroup_driver(self) -> str:
        """The runtime's cgroup driver, `systemd` or `cgroupfs` ("" when it does not say).

        CRI `RuntimeConfig` (containerd 2.0 and later) answers directly. containerd 1.6
        and 1.7 do not implement it; their verbose Status carries the CRI configuration
        (`info["config"]`), whose default runtime's `options.SystemdCgroup` is the same
        setting (runc's, as `containerd.runtimes.runc.options` in config.toml).
        """
        try:
            r = await self._read(
                "RuntimeConfig",
                lambda: self._call(
                    "RuntimeConfig", self._rt.RuntimeConfig, pb.RuntimeConfigRequest()
                ),
            )
        except CRIError as err:
            if err.code != "UNIMPLEMENTED":
                raise
        else:
            if r.HasField("linux"):
                return "systemd" if r.linux.cgroup_driver == pb.SYSTEMD else "cgroupfs"
        status = await self._read(
            "Status",
            lambda: self._call("Status", self._rt.Status, pb.StatusRequest(verbose=True)),
        )
        return cgroup_driver_of_cri_config(status.info.get("config", ""))

    async def run_pod_sandbox(
        self, config: SandboxConfig, *, runtime_handler: str = ""
    ) -> SandboxID:
        r = await self._make(
            "RunPodSandbox",
            self._rt.RunPodSandbox,
            pb.RunPodSandboxRequest(config=_sandbox_pb(config), runtime_handler=runtime_handler),
            runtime_handler=runtime_handler,
        )
        return SandboxID(r.pod_sandbox_id)

    async def stop_pod_sandbox(self, sandbox_id: SandboxID) -> None:
        try:
            await self._call(
                "StopPodSandbox",
                self._rt.StopPodSandbox,
                pb.StopPodSandboxRequest(pod_sandbox_id=sandbox_id),
            )
        except NotFound:
            pass

    async def remove_pod_sandbox(self, sandbox_id: SandboxID) -> None:
        try:
            await self._call(
                "RemovePodSandbox",
                self._rt.RemovePodSandbox,
                pb.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id),
            )
        except NotFound:
            pass

    async def pod_sandbox_status(self, sandbox_id: SandboxID) -> SandboxStatusInfo:
        r = await self._read(
            "PodSandboxStatus",
            lambda: self._call(
                "PodSandboxStatus",
                self._rt.PodSandboxStatus,
                pb.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id),
            ),
        )
        s = r.status
        return SandboxStatusInfo(
            id=SandboxID(s.id),
            state=SandboxState(pb.PodSandboxState.Name(s.state)),
            created_at=s.created_at,
            ip=s.network.ip,
            additional_ips=tuple(ip.ip for ip in s.network.additional_ips),
            labels=dict(s.labels),
            annotations=dict(s.annotations),
        )

    async def list_pod_sandboxes(
        self, *, label_selector: dict[str, str] | None = None, sandbox_id: SandboxID | None = None
    ) -> list[Sandbox]:
        request = pb.ListPodSandboxRequest(
            filter=pb.PodSandboxFilter(id=sandbox_id or "", label_selector=label_selector or {})
        )
        r = await self._read(
            "ListPodSandbox", lambda: self._call("ListPodSandbox", self._rt.ListPodSandbox, request)
        )
        return [
            Sandbox(
                id=SandboxID(s.id),
                name=s.metadata.name,
                namespace=s.metadata.namespace,
                uid=s.metadata.uid,
                attempt=s.metadata.attempt,
                state=SandboxState(pb.PodSandboxState.Name(s.state)),
                created_at=s.created_at,
                labels=dict(s.labels),
                annotations=dict(s.annotations),
            )
            for s in r.items
        ]

    async def create_container(
        self, sandbox_id: SandboxID, config: ContainerConfig, sandbox_config: SandboxConfig
    ) -> ContainerID:
        r = await self._make(
            "CreateContainer",
            self._rt.CreateContainer,
            pb.CreateContainerRequest(
                pod_sandbox_id=sandbox_id,
                config=_container_pb(config),
                sandbox_config=_sandbox_pb(sandbox_config),
            ),
        )
        return ContainerID(r.container_id)

    async def start_container(self, container_id: ContainerID) -> None:
        await self._make(
            "StartContainer",
            self._rt.StartContainer,
            pb.StartContainerRequest(container_id=container_id),
        )

    async def stop_container(self, container_id: ContainerID, *, timeout_s: int) -> None:
        try:
            await self._call(
                "StopContainer",
                self._rt.StopContainer,
                pb.StopContainerRequest(container_id=container_id, timeout=timeout_s),
                deadline_s=self.settings.timeout_s + timeout_s,
            )
        except NotFound:
            pass

    async def update_container_resources(
        self, container_id: ContainerID, resources: LinuxResources
    ) -> None:
        """UpdateContainerResources: a running container's cgroup limits, in place (an
        in-place resize). Not retried: the caller re-plans from what it last applied."""
        await self._call(
            "UpdateContainerResources",
            self._rt.UpdateContainerResources,
            pb.UpdateContainerResourcesRequest(
                container_id=container_id, linux=_resources_pb(resources)
            ),
        )

    async def remove_container(self, container_id: ContainerID) -> None:
        try:
            await self._call(
                "RemoveContainer",
                self._rt.RemoveContainer,
                pb.RemoveContainerRequest(container_id=container_id),
            )
        except NotFound:
            pass

    async def list_containers(
        self,
        *,
        sandbox_id: SandboxID | None = None,
        label_selector: dict[str, str] | None = None,
        container_id: ContainerID | None = None,
    ) -> list[Container]:
        flt = pb.ContainerFilter(
            id=container_id or "",
            pod_sandbox_id=sandbox_id or "",
            label_selector=label_selector or {},
        )
        r = await self._read(
            "ListContainers",
            lambda: self._call(
                "ListContainers", self._rt.ListContainers, pb.ListContainersRequest(filter=flt)
            ),
        )
        return [
            Container(
                id=ContainerID(c.id),
                sandbox_id=SandboxID(c.pod_sandbox_id),
                name=c.metadata.name,
                attempt=c.metadata.attempt,
                image=c.image.image,
                image_ref=c.image_ref,
                state=ContainerState(pb.ContainerState.Name(c.state)),
                created_at=c.created_at,
                labels=dict(c.labels),
                annotations=dict(c.annotations),
            )
            for c in r.containers
        ]

    async def container_status(self, container_id: ContainerID) -> ContainerStatusInfo:
        r = await self._read(
            "ContainerStatus",
            lambda: self._call(
                "ContainerStatus",
                self._rt.ContainerStatus,
                pb.ContainerStatusRequest(container_id=container_id),
            ),
        )
        s = r.status
        return ContainerStatusInfo(
            id=ContainerID(s.id),
            name=s.metadata.name,
            attempt=s.metadata.attempt,
            state=ContainerState(pb.ContainerState.Name(s.state)),
            created_at=s.created_at,
            started_at=s.started_at,
            finished_at=s.finished_at,
            exit_code=s.exit_code,
            image=s.image.image,
            image_ref=s.image_ref,
            reason=s.reason,
            message=s.message,
            log_path=s.log_path,
            labels=dict(s.labels),
            annotations=dict(s.annotations),
            mounts=tuple(
                Mount(
                    container_path=m.container_path,
                    host_path=m.host_path,
                    readonly=m.readonly,
                    propagation=MountPropagation(pb.MountPropagation.Name(m.propagation)),
                    selinux_relabel=m.selinux_relabel,
                )
                for m in s.mounts
            ),
        )

    async def container_pid(self, container_id: ContainerID) -> int:
        """The host PID of the container's process, from the runtime's verbose status
        (containerd puts it in `info["info"]` as `pid`); 0 when the runtime does not say
        or the container has no process."""
        r = await self._read(
            "ContainerStatus",
            lambda: self._call(
                "ContainerStatus",
                self._rt.ContainerStatus,
                pb.ContainerStatusRequest(container_id=container_id, verbose=True),
            ),
        )
        try:
            pid = json.loads(r.info.get("info", "") or "{}").get("pid", 0)
        except (ValueError, AttributeError):
            return 0
        return pid if isinstance(pid, int) and pid > 0 else 0

    async def reopen_container_log(self, container_id: ContainerID) -> None:
        """Make the runtime reopen the container's log file at its log path (after the
        file was renamed away by log rotation). Fails if the container is not running."""
        await self._call(
            "ReopenContainerLog",
            self._rt.ReopenContainerLog,
            pb.ReopenContainerLogRequest(container_id=container_id),
        )

    async def exec_sync(
        self, container_id: ContainerID, cmd: list[str], *, timeout_s: int
    ) -> tuple[int, bytes, bytes]:
        r = await self._call(
            "ExecSync",
            self._rt.ExecSync,
            pb.ExecSyncRequest(container_id=container_id, cmd=cmd, timeout=timeout_s),
            deadline_s=timeout_s + self.settings.timeout_s,
        )
        return int(r.exit_code), bytes(r.stdout), bytes(r.stderr)

    async def checkpoint_container(
        self, container_id: ContainerID, location: str, *, timeout_s: int = 0
    ) -> None:
        """Checkpoint a running container into the archive at `location`, a path on the
        node (CRI CheckpointContainer). As upstream's CRI client, a `timeout_s` above
        runtimeRequestTimeout is the call's deadline and is sent to the runtime; any
        smaller one is raised to runtimeRequestTimeout. A failure's message is gRPC's
        own form as Go prints it (`rpc error: code = Unimplemented desc = ...`), which
        the kubelet API passes on and its clients match on. ValueError when
        `timeout_s` is negative."""
        if timeout_s < 0:
            raise ValueError("CheckpointContainer requires the timeout value to be >= 0")
        default = int(self.settings.timeout_s)
        longer = timeout_s > default
        try:
            await self._call(
                "CheckpointContainer",
                self._rt.CheckpointContainer,
                pb.CheckpointContainerRequest(
                    container_id=container_id,
                    location=location,
                    timeout=timeout_s if longer else default,
                ),
                deadline_s=float(timeout_s) if longer else None,
            )
        except CRIError as err:
            cause = err.__cause__
            if isinstance(cause, grpc.aio.AioRpcError):
                raise type(err)(go_status_text(cause), code=err.code) from cause
            raise

    # -- streaming (the runtime's stream server URLs) and stats ---------------------------

    async def exec(
        self,
        container_id: ContainerID,
        cmd: list[str],
        *,
        tty: bool = False,
        stdin: bool = False,
        stdout: bool = True,
        stderr: bool = True,
    ) -> str:
        """The URL of the runtime's streaming server serving this exec (CRI Exec)."""
        r = await self._call(
            "Exec",
            self._rt.Exec,
            pb.ExecRequest(
                container_id=container_id,
                cmd=cmd,
                tty=tty,
                stdin=stdin,
                stdout=stdout,
                stderr=stderr,
            ),
        )
        return str(r.url)

    async def attach(
        self,
        container_id: ContainerID,
        *,
        tty: bool = False,
        stdin: bool = False,
        stdout: bool = True,
        stderr: bool = True,
    ) -> str:
        """The URL of the runtime's streaming server serving this attach (CRI Attach)."""
        r = await self._call(
            "Attach",
            self._rt.Attach,
            pb.AttachRequest(
                container_id=container_id, tty=tty, stdin=stdin, stdout=stdout, stderr=stderr
            ),
        )
        return str(r.url)

    async def port_forward(self, sandbox_id: SandboxID, ports: list[int] | None = None) -> str:
        """The URL of the runtime's streaming server forwarding to the sandbox (CRI
        PortForward); `ports` may be empty (SPDY clients name ports per stream)."""
        r = await self._call(
            "PortForward",
            self._rt.PortForward,
            pb.PortForwardRequest(pod_sandbox_id=sandbox_id, port=list(ports or [])),
        )
        return str(r.url)

    async def list_container_stats(
        self,
        *,
        container_id: ContainerID | None = None,
        sandbox_id: SandboxID | None = None,
        label_selector: dict[str, str] | None = None,
    ) -> list[ContainerStatsInfo]:
        flt = pb.ContainerStatsFilter(
            id=container_id or "",
            pod_sandbox_id=sandbox_id or "",
            label_selector=label_selector or {},
        )
        r = await self._read(
            "ListContainerStats",
            lambda: self._call(
                "ListContainerStats",
                self._rt.ListContainerStats,
                pb.ListContainerStatsRequest(filter=flt),
            ),
        )
        return [_container_stats(s) for s in r.stats]

    async def container_stats(self, container_id: ContainerID) -> ContainerStatsInfo:
        r = await self._read(
            "ContainerStats",
            lambda: self._call(
                "ContainerStats",
                self._rt.ContainerStats,
                pb.ContainerStatsRequest(container_id=container_id),
            ),
        )
        return _container_stats(r.stats)

    async def image_fs_info(self) -> tuple[list[FilesystemUsageInfo], list[FilesystemUsageInfo]]:
        """(image filesystems, container filesystems) as the image service reports them."""
        r = await self._read(
            "ImageFsInfo",
            lambda: self._call("ImageFsInfo", self._img.ImageFsInfo, pb.ImageFsInfoRequest()),
        )
        return (
            [_fs_usage(f) for f in r.image_filesystems],
            [_fs_usage(f) for f in r.container_filesystems],
        )

    # -- images ----------------------------------------------------------------------

    async def pull_image(
        self,
        image: str,
        *,
        sandbox_config: SandboxConfig | None = None,
        auth: AuthConfig | None = None,
    ) -> ImageRef:
        request = pb.PullImageRequest(image=pb.ImageSpec(image=image))
        if sandbox_config is not None:
            request.sandbox_config.CopyFrom(_sandbox_pb(sandbox_config))
        if auth is not None:
            request.auth.CopyFrom(
                pb.AuthConfig(
                    username=auth.username,
                    password=auth.password,
                    auth=auth.auth,
                    server_address=auth.server_address,
                    identity_token=auth.identity_token,
                    registry_token=auth.registry_token,
                )
            )
        r = await self._call(
            "PullImage", self._img.PullImage, request, deadline_s=self.settings.pull_timeout_s
        )
        return ImageRef(r.image_ref)

    async def image_status(self, image: str) -> ImageInfo | None:
        r = await self._read(
            "ImageStatus",
            lambda: self._call(
                "ImageStatus",
                self._img.ImageStatus,
                pb.ImageStatusRequest(image=pb.ImageSpec(image=image)),
            ),
        )
        if not r.image.id:
            return None
        return _image(r.image)

    async def list_images(self) -> list[ImageInfo]:
        r = await self._read(
            "ListImages",
            lambda: self._call("ListImages", self._img.ListImages, pb.ListImagesRequest()),
        )
        return [_image(i) for i in r.images]

    async def remove_image(self, image: str) -> None:
        try:
            await self._call(
                "RemoveImage",
                self._img.RemoveImage,
                pb.RemoveImageRequest(image=pb.ImageSpec(image=image)),
            )
        except NotFound:
            pass


def _u64(message: Any, name: str) -> int | None:
    """The value of an optional UInt64Value field, or None when the runtime left it out."""
    return int(getattr(message, name).value) if message.HasField(name) else None


def _fs_usage(f: Any) -> FilesystemUsageInfo:
    return FilesystemUsageInfo(
        timestamp_ns=int(f.timestamp),
        mountpoint=f.fs_id.mountpoint,
        used_bytes=_u64(f, "used_bytes"),
        inodes_used=_u64(f, "inodes_used"),
    )


def _container_stats(s: Any) -> ContainerStatsInfo:
    a = s.attributes
    return ContainerStatsInfo(
        id=ContainerID(a.id),
        name=a.metadata.name,
        attempt=a.metadata.attempt,
        labels=dict(a.labels),
        annotations=dict(a.annotations),
        cpu_timestamp_ns=int(s.cpu.timestamp),
        cpu_usage_core_ns=_u64(s.cpu, "usage_core_nano_seconds"),
        cpu_usage_nano_cores=_u64(s.cpu, "usage_nano_cores"),
        memory_timestamp_ns=int(s.memory.timestamp),
        memory_working_set_bytes=_u64(s.memory, "working_set_bytes"),
        memory_usage_bytes=_u64(s.memory, "usage_bytes"),
        memory_rss_bytes=_u64(s.memory, "rss_bytes"),
        memory_available_bytes=_u64(s.memory, "available_bytes"),
        writable_layer=_fs_usage(s.writable_layer) if s.HasField("writable_layer") else None,
    )


def _image(i: Any) -> ImageInfo:
    return ImageInfo(
        id=ImageRef(i.id),
        repo_tags=tuple(i.repo_tags),
        repo_digests=tuple(i.repo_digests),
        size=int(i.size),
        pinned=bool(i.pinned),
        uid=int(i.uid.value) if i.HasField("uid") else None,
        username=i.username,
    )


def _sandbox_pb(c: SandboxConfig) -> Any:
    ns_mode = pb.NamespaceMode
    cfg = pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(
            name=c.name, uid=c.uid, namespace=c.namespace, attempt=c.attempt
        ),
        hostname=c.hostname,
        log_directory=c.log_directory,
        labels=c.labels,
        annotations=c.annotations,
        port_mappings=[
            pb.PortMapping(
                protocol=getattr(pb.Protocol, p.protocol.upper(), pb.Protocol.TCP),
                container_port=p.container_port,
                host_port=p.host_port,
                host_ip=p.host_ip,
            )
            for p in c.port_mappings
        ],
        linux=pb.LinuxPodSandboxConfig(
            cgroup_parent=c.cgroup_parent,
            security_context=pb.LinuxSandboxSecurityContext(
                namespace_options=pb.NamespaceOption(
                    network=ns_mode.NODE if c.host_network else ns_mode.POD,
                    pid=ns_mode.NODE if c.host_pid else ns_mode.CONTAINER,
                    ipc=ns_mode.NODE if c.host_ipc else ns_mode.POD,
                )
            ),
            sysctls=c.sysctls,
        ),
    )
    if c.security is not None:
        cfg.linux.security_context.CopyFrom(_sandbox_security_pb(c.security))
    if c.dns is not None:
        cfg.dns_config.CopyFrom(
            pb.DNSConfig(
                servers=list(c.dns.servers),
                searches=list(c.dns.searches),
                options=list(c.dns.options),
            )
        )
    return cfg


def _container_pb(c: ContainerConfig) -> Any:
    cfg = pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name=c.name, attempt=c.attempt),
        image=pb.ImageSpec(image=c.image),
        command=list(c.command),
        args=list(c.args),
        working_dir=c.working_dir,
        envs=[pb.KeyValue(key=k, value=v) for k, v in c.envs],
        mounts=[
            pb.Mount(
                container_path=m.container_path,
                host_path=m.host_path,
                readonly=m.readonly,
                propagation=pb.MountPropagation.Value(m.propagation.value),
                selinux_relabel=m.selinux_relabel,
            )
            for m in c.mounts
        ],
        devices=[
            pb.Device(
                container_path=d.container_path, host_path=d.host_path, permissions=d.permissions
            )
            for d in c.devices
        ],
        labels=c.labels,
        annotations=c.annotations,
        log_path=c.log_path,
        stdin=c.stdin,
        stdin_once=c.stdin_once,
        tty=c.tty,
        CDI_devices=[pb.CDIDevice(name=n) for n in c.cdi_devices],
    )
    if c.stop_signal:
        cfg.stop_signal = _signal(c.stop_signal)
    if c.resources is not None:
        cfg.linux.resources.CopyFrom(_resources_pb(c.resources))
    if c.security is not None:
        cfg.linux.security_context.CopyFrom(_container_security_pb(c.security))
    return cfg


def _resources_pb(r: LinuxResources) -> Any:
    return pb.LinuxContainerResources(
        cpu_shares=r.cpu_shares,
        cpu_quota=r.cpu_quota,
        cpu_period=r.cpu_period,
        memory_limit_in_bytes=r.memory_limit_bytes,
        oom_score_adj=r.oom_score_adj,
        memory_swap_limit_in_bytes=r.memory_swap_limit_bytes,
        hugepage_limits=[
            pb.HugepageLimit(page_size=size, limit=limit) for size, limit in r.hugepage_limits
        ],
        unified=r.unified,
        cpuset_cpus=r.cpuset_cpus,
        cpuset_mems=r.cpuset_mems,
    )


def _signal(name: str) -> Any:
    """The CRI Signal for an API stop signal name (`SIGRTMIN+1` is `SIGRTMINPLUS1`)."""
    key = name.upper().replace("+", "PLUS").replace("-", "MINUS")
    try:
        return pb.Signal.Value(key)
    except ValueError as err:
        raise CRIError(f"unknown stop signal {name!r}") from err


def _namespaces_pb(n: NamespaceOptions) -> Any:
    mode = pb.NamespaceMode
    return pb.NamespaceOption(
        network=mode.Value(n.network.value),
        pid=mode.Value(n.pid.value),
        ipc=mode.Value(n.ipc.value),
        target_id=n.target_id,
    )


def _profile_pb(p: SecurityProfile) -> Any:
    return pb.SecurityProfile(
        profile_type=pb.SecurityProfile.ProfileType.Value(p.type.value),
        localhost_ref=p.localhost_ref,
    )


def _selinux_pb(o: SELinuxOptions) -> Any:
    return pb.SELinuxOption(user=o.user, role=o.role, type=o.type, level=o.level)


def _sandbox_security_pb(s: LinuxSandboxSecurity) -> Any:
    sc = pb.LinuxSandboxSecurityContext(
        namespace_options=_namespaces_pb(s.namespaces),
        supplemental_groups=list(s.supplemental_groups),
        supplemental_groups_policy=pb.SupplementalGroupsPolicy.Value(s.supplemental_groups_policy),
        privileged=s.privileged,
    )
    _set_identity_pb(sc, s)
    return sc


def _set_identity_pb(sc: Any, s: LinuxSandboxSecurity | LinuxContainerSecurity) -> None:
    """The optional fields both security contexts share: user, group, seccomp, SELinux."""
    if s.run_as_user is not None:
        sc.run_as_user.value = s.run_as_user
    if s.run_as_group is not None:
        sc.run_as_group.value = s.run_as_group
    if s.seccomp is not None:
        sc.seccomp.CopyFrom(_profile_pb(s.seccomp))
    if s.selinux is not None:
        sc.selinux_options.CopyFrom(_selinux_pb(s.selinux))


def _container_security_pb(s: LinuxContainerSecurity) -> Any:
    sc = pb.LinuxContainerSecurityContext(
        namespace_options=_namespaces_pb(s.namespaces),
        run_as_username=s.run_as_username,
        supplemental_groups=list(s.supplemental_groups),
        supplemental_groups_policy=pb.SupplementalGroupsPolicy.Value(s.supplemental_groups_policy),
        privileged=s.privileged,
        readonly_rootfs=s.readonly_rootfs,
        no_new_privs=s.no_new_privs,
        masked_paths=list(s.masked_paths),
        readonly_paths=list(s.readonly_paths),
        apparmor_profile=s.apparmor_profile,
    )
    if s.add_capabilities or s.drop_capabilities:
        sc.capabilities.CopyFrom(
            pb.Capability(
                add_capabilities=list(s.add_capabilities),
                drop_capabilities=list(s.drop_capabilities),
            )
        )
    _set_identity_pb(sc, s)
    if s.apparmor is not None:
        sc.apparmor.CopyFrom(_profile_pb(s.apparmor))
    return sc


def cgroup_driver_of_cri_config(text: str) -> str:
    """`systemd`, `cgroupfs` or "" from containerd's CRI configuration as its verbose
    Status gives it (JSON): the default runtime's `SystemdCgroup` option."""
    try:
        config = json.loads(text or "{}")
    except ValueError:
        return ""
    containerd = config.get("containerd") if isinstance(config, dict) else None
    if not isinstance(containerd, dict):
        return ""
    runtimes = containerd.get("runtimes")
    default = containerd.get("defaultRuntimeName") or "runc"
    runtime = runtimes.get(default) if isinstance(runtimes, dict) else None
    if not isinstance(runtime, dict):
        return ""
    options = runtime.get("options")
    if not isinstance(options, dict):
        return "cgroupfs"
    return "systemd" if options.get("SystemdCgroup") is True else "cgroupfs"
