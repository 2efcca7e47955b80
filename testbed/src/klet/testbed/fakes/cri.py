"""`FakeRuntimeService`: an in-memory CRI runtime for unit tests (STYLE rule 7).

It has `RuntimeClient`'s async methods and signatures, so a consumer typed by a
Protocol over them accepts either, and it keeps real state instead of canned answers:
sandboxes go READY → NOTREADY (stop) → gone (remove); containers go CREATED → RUNNING
(start) → EXITED (stop, or `exit_container` for a process that ends by itself). Where
containerd 1.6 has an opinion the fake follows it: RemovePodSandbox and RemoveContainer
force-stop what still runs, sandbox and container names are reserved per attempt, a
container is created only in a ready sandbox from an image that is present.

It presents the client's contract, not the raw gRPC one: stop and remove calls on an
unknown ID succeed (the client swallows NotFound there), reads and starts on an unknown
ID raise `NotFound`. Injected failures (`fail_next`, `fail_always`, `fail_pull`) are
raised as given, before any state changes. Every call is logged in `calls` as
`(RPC name, *string arguments)` (for the list calls, their selector's "key=value"s),
and `hooks[RPC name]` is awaited inside that call,
which lets a test interleave other work with a call in flight. Times are nanoseconds
from the injected `clock`; nothing here sleeps or does I/O.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import ipaddress
import os
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from klet.cri.errors import CRIError, EventsUnsupported, NotFound, RuntimeUnavailable
from klet.cri.types import (
    AuthConfig,
    Container,
    ContainerConfig,
    ContainerState,
    ContainerStatsInfo,
    ContainerStatusInfo,
    EventKind,
    ImageInfo,
    LinuxResources,
    RuntimeCondition,
    RuntimeEvent,
    RuntimeVersion,
    Sandbox,
    SandboxConfig,
    SandboxState,
    SandboxStatusInfo,
    Subscribed,
)
from klet.model.types import ContainerID, ImageRef, SandboxID

ExecResponder = Callable[[ContainerID, list[str]], tuple[int, bytes, bytes]]

KILLED_EXIT_CODE = 137  # 128 + SIGKILL: what a stopped container reports in the fake
_LIVE = (ContainerState.RUNNING, ContainerState.UNKNOWN)  # what stop and remove must kill

METHODS = frozenset(
    "Version Status RunPodSandbox StopPodSandbox RemovePodSandbox PodSandboxStatus ListPodSandbox"
    " CreateContainer StartContainer StopContainer RemoveContainer ListContainers ContainerStatus"
    " ExecSync ReopenContainerLog CheckpointContainer PullImage ImageStatus ListImages"
    " RemoveImage".split()
)  # the CRI RPC names used in `calls`, `hooks` and error injection


@dataclass
class FakeSandbox:
    id: SandboxID
    config: SandboxConfig
    state: SandboxState
    created_at: int
    ip: str = ""


@dataclass
class FakeContainer:
    id: ContainerID
    sandbox_id: SandboxID
    config: ContainerConfig
    image: ImageInfo
    created_at: int
    log_path: str
    state: ContainerState = ContainerState.CREATED
    started_at: int = 0
    finished_at: int = 0
    exit_code: int = 0
    reason: str = ""
    message: str = ""
    log_reopens: int = 0
    updates: list[LinuxResources] = field(default_factory=list)
    """Every UpdateContainerResources it was given, in order."""
    memory_usage_bytes: int | None = None
    """What ContainerStats reports as its memory usage (None: absent)."""


def _selector_args(selector: dict[str, str] | None) -> list[str]:
    """A label selector as it appears in `calls`: sorted "key=value" strings."""
    return sorted(f"{k}={v}" for k, v in (selector or {}).items())


def _id_args(object_id: str | None) -> list[str]:
    """An ID filter as it appears in `calls`: "id=<id>", or nothing."""
    return [f"id={object_id}"] if object_id else []


def _matches(labels: dict[str, str], selector: dict[str, str] | None) -> bool:
    return all(labels.get(k) == v for k, v in (selector or {}).items())


class FakeRuntimeService:
    """A CRI runtime and image service kept in dictionaries; see the module docstring."""

    def __init__(
        self, *, clock: Callable[[], int] = time.time_ns, pod_cidr: str = "10.88.0.0/16"
    ) -> None:
        self.clock = clock
        self.sandboxes: dict[SandboxID, FakeSandbox] = {}
        self.containers: dict[ContainerID, FakeContainer] = {}
        self.images: dict[ImageRef, ImageInfo] = {}
        self.calls: list[tuple[str, ...]] = []
        self.hooks: dict[str, Callable[[], Awaitable[None]]] = {}
        self._fail_next: dict[str, deque[CRIError]] = {}
        self._fail_always: dict[str, CRIError] = {}
        self._pull_errors: dict[str, CRIError] = {}
        self._registry_users: dict[str, tuple[str, str]] = {}
        self._network = ipaddress.IPv4Network(pod_cidr)
        self._last_ip = 1  # host-local IPAM: .1 is the bridge, then round-robin
        self._seq = 0
        # What ExecSync answers: (exit code, stdout, stderr) for a container and command;
        # it may raise (a CRIError with code DEADLINE_EXCEEDED is a timed-out command).
        # None answers success with no output.
        self.exec_responder: ExecResponder | None = None
        # Host PIDs container_pid answers, by container ID (a test sets them).
        self.pids: dict[ContainerID, int] = {}
        self.cgroup_driver_name = "cgroupfs"
        # CheckpointContainer's archives: location -> (container ID, timeout sent). The
        # fake writes no file; a test reads what a runtime would have written where.
        self.checkpoints: dict[str, tuple[ContainerID, int]] = {}
        self.closed = False  # close() was called (the client's channel would be gone)

    # -- test controls ---------------------------------------------------------------

    def fail_next(self, method: str, exc: CRIError) -> None:
        """Make the next call of `method` (a CRI RPC name) raise `exc`; calls queue up."""
        self._fail_next.setdefault(self._known(method), deque()).append(exc)

    def fail_always(self, method: str, exc: CRIError | None) -> None:
        """Make every call of `method` raise `exc` until called again with None."""
        if exc is None:
            self._fail_always.pop(self._known(method), None)
        else:
            self._fail_always[self._known(method)] = exc

    def fail_pull(self, image: str, exc: CRIError | None) -> None:
        """Make PullImage of `image` raise `exc` (NotFound for a missing tag); None heals it."""
        if exc is None:
            self._pull_errors.pop(image, None)
        else:
            self._pull_errors[image] = exc

    def require_auth(self, registry: str, username: str, password: str) -> None:
        """Make pulls from `registry` (an image name's host part) need these credentials.

        A pull without them, or with others, fails as containerd's does against a
        registry that answers 401; `auth` (base64 `user:password`) counts as well as
        username and password.
        """
        self._registry_users[registry] = (username, password)

    def add_image(
        self, ref: str, size: int = 0, *, uid: int | None = None, username: str = ""
    ) -> ImageInfo:
        """Make `ref` (a tag or `name@digest`) present, with a stable `sha256:` ID.

        `uid` / `username` are the image's configured user as ImageStatus reports it
        (containerd: a numeric user is a uid, a name is a username, none is neither).
        """
        image_id = ImageRef("sha256:" + hashlib.sha256(ref.encode()).hexdigest())
        digested = "@" in ref
        info = ImageInfo(
            id=image_id,
            repo_tags=() if digested else (ref,),
            repo_digests=(ref,) if digested else (),
            size=size,
            uid=uid,
            username=username,
        )
        self.images[image_id] = info
        return info

    def exit_container(
        self, container_id: ContainerID, code: int, reason: str | None = None, message: str = ""
    ) -> None:
        """The container's process ends by itself: RUNNING → EXITED with `code`.

        `reason` defaults to containerd's: "Completed" for 0, "Error" otherwise.
        """
        c = self._container(container_id)
        if c.state != ContainerState.RUNNING:
            raise ValueError(f"container {container_id} is {c.state.name}, not RUNNING")
        self._exit(c, code, reason or ("Completed" if code == 0 else "Error"), message)

    def calls_of(self, method: str) -> list[tuple[str, ...]]:
        return [c for c in self.calls if c[0] == method]

    # -- internals -------------------------------------------------------------------

    @staticmethod
    def _known(method: str) -> str:
        if method not in METHODS:
            raise ValueError(f"not a CRI method: {method!r}")
        return method

    async def _enter(self, method: str, *args: str) -> None:
        self.calls.append((method, *args))
        hook = self.hooks.get(method)
        if hook is not None:
            await hook()
        queued = self._fail_next.get(method)
        if queued:
            raise queued.popleft()
        if method in self._fail_always:
            raise self._fail_always[method]

    def _next_id(self, kind: str) -> str:
        self._seq += 1
        return f"{kind}-{self._seq:04d}"

    def _sandbox(self, sandbox_id: SandboxID) -> FakeSandbox:
        try:
            return self.sandboxes[sandbox_id]
        except KeyError:
            raise NotFound(f"sandbox {sandbox_id!r} not found", code="NOT_FOUND") from None

    def _container(self, container_id: ContainerID) -> FakeContainer:
        try:
            return self.containers[container_id]
        except KeyError:
            raise NotFound(f"container {container_id!r} not found", code="NOT_FOUND") from None

    def _resolve(self, image: str) -> ImageInfo | None:
        return next(
            (
                i
                for i in self.images.values()
                if image == i.id or image in i.repo_tags or image in i.repo_digests
            ),
            None,
        )

    def _allocate_ip(self) -> str:
        in_use = {s.ip for s in self.sandboxes.values() if s.ip}
        size = self._network.num_addresses - 2
        for step in range(1, size + 1):
            offset = (self._last_ip + step - 1) % size + 1
            ip = str(self._network.network_address + offset)
            if offset > 1 and ip not in in_use:
                self._last_ip = offset
                return ip
        raise CRIError(f"no IP addresses available in range {self._network}")

    def _exit(self, c: FakeContainer, code: int, reason: str, message: str = "") -> None:
        c.state, c.exit_code, c.reason, c.message = ContainerState.EXITED, code, reason, message
        c.finished_at = self.clock()

    def _force_stop(self, sandbox: FakeSandbox) -> None:
        for c in self.containers.values():
            if c.sandbox_id == sandbox.id and c.state in _LIVE:
                self._exit(c, KILLED_EXIT_CODE, "Error")
        sandbox.state, sandbox.ip = SandboxState.NOTREADY, ""

    # -- RuntimeService --------------------------------------------------------------

    async def close(self) -> None:
        self.closed = True

    async def settle(self) -> bool:
        """True: every fake call completes within the await its caller made, so none
        is ever left running after the caller is cancelled."""
        return True

    async def version(self) -> RuntimeVersion:
        await self._enter("Version")
        return RuntimeVersion("fake", "1.6.0-fake", "v1")

    async def cgroup_driver(self) -> str:
        """`cgroup_driver_name` (cgroupfs unless a test sets it), as RuntimeConfig says."""
        await self._enter("RuntimeConfig")
        return self.cgroup_driver_name

    async def status(self) -> list[RuntimeCondition]:
        await self._enter("Status")
        return [RuntimeCondition("RuntimeReady", True), RuntimeCondition("NetworkReady", True)]

    async def run_pod_sandbox(
        self, config: SandboxConfig, *, runtime_handler: str = ""
    ) -> SandboxID:
        await self._enter("RunPodSandbox", config.uid, str(config.attempt))
        key = (config.name, config.namespace, config.uid, config.attempt)
        if any(
            (s.config.name, s.config.namespace, s.config.uid, s.config.attempt) == key
            for s in self.sandboxes.values()
        ):
            raise CRIError(f"failed to reserve sandbox name {key}: name is reserved")
        sid = SandboxID(self._next_id("sandbox"))
        ip = "" if config.host_network else self._allocate_ip()
        self.sandboxes[sid] = FakeSandbox(sid, config, SandboxState.READY, self.clock(), ip)
        return sid

    async def stop_pod_sandbox(self, sandbox_id: SandboxID) -> None:
        await self._enter("StopPodSandbox", sandbox_id)
        if sandbox_id in self.sandboxes:
            self._force_stop(self.sandboxes[sandbox_id])

    async def remove_pod_sandbox(self, sandbox_id: SandboxID) -> None:
        await self._enter("RemovePodSandbox", sandbox_id)
        sandbox = self.sandboxes.get(sandbox_id)
        if sandbox is None:
            return
        self._force_stop(sandbox)  # containerd force-stops a sandbox before removing it
        for cid in [c.id for c in self.containers.values() if c.sandbox_id == sandbox_id]:
            del self.containers[cid]
        del self.sandboxes[sandbox_id]

    async def pod_sandbox_status(self, sandbox_id: SandboxID) -> SandboxStatusInfo:
        await self._enter("PodSandboxStatus", sandbox_id)
        s = self._sandbox(sandbox_id)
        return SandboxStatusInfo(
            id=s.id,
            state=s.state,
            created_at=s.created_at,
            ip=s.ip,
            labels=dict(s.config.labels),
            annotations=dict(s.config.annotations),
        )

    async def list_pod_sandboxes(
        self, *, label_selector: dict[str, str] | None = None, sandbox_id: SandboxID | None = None
    ) -> list[Sandbox]:
        await self._enter("ListPodSandbox", *_selector_args(label_selector), *_id_args(sandbox_id))
        return [
            Sandbox(
                id=s.id,
                name=s.config.name,
                namespace=s.config.namespace,
                uid=s.config.uid,
                attempt=s.config.attempt,
                state=s.state,
                created_at=s.created_at,
                labels=dict(s.config.labels),
                annotations=dict(s.config.annotations),
            )
            for s in self.sandboxes.values()
            if sandbox_id in (None, "", s.id) and _matches(s.config.labels, label_selector)
        ]

    async def create_container(
        self, sandbox_id: SandboxID, config: ContainerConfig, sandbox_config: SandboxConfig
    ) -> ContainerID:
        await self._enter("CreateContainer", sandbox_id, config.name, str(config.attempt))
        sandbox = self._sandbox(sandbox_id)
        if sandbox.state != SandboxState.READY:
            raise CRIError(f"sandbox {sandbox_id} is not ready: no running task found")
        if any(
            c.sandbox_id == sandbox_id
            and c.config.name == config.name
            and c.config.attempt == config.attempt
            for c in self.containers.values()
        ):
            raise CRIError(f"failed to reserve container name {config.name}_{config.attempt}")
        image = self._resolve(config.image)
        if image is None:
            raise NotFound(f"failed to resolve image {config.image!r}: not found", code="NOT_FOUND")
        cid = ContainerID(self._next_id("container"))
        log_path = os.path.join(sandbox_config.log_directory, config.log_path)
        self.containers[cid] = FakeContainer(
            cid, sandbox_id, config, image, self.clock(), log_path if config.log_path else ""
        )
        return cid

    async def start_container(self, container_id: ContainerID) -> None:
        await self._enter("StartContainer", container_id)
        c = self._container(container_id)
        if c.state != ContainerState.CREATED:
            raise CRIError(f"container {container_id} is in {c.state.value} state")
        if self._sandbox(c.sandbox_id).state != SandboxState.READY:
            raise CRIError(f"sandbox {c.sandbox_id} of container {container_id} is not ready")
        c.state, c.started_at = ContainerState.RUNNING, self.clock()

    async def stop_container(self, container_id: ContainerID, *, timeout_s: int) -> None:
        await self._enter("StopContainer", container_id, str(timeout_s))
        c = self.containers.get(container_id)
        if c is not None and c.state in _LIVE:
            self._exit(c, KILLED_EXIT_CODE, "Error")

    async def update_container_resources(
        self, container_id: ContainerID, resources: LinuxResources
    ) -> None:
        await self._enter("UpdateContainerResources", container_id)
        c = self._container(container_id)
        if c.state not in _LIVE:
            raise CRIError(f"container {container_id} is not running or created")
        c.updates.append(resources)

    async def container_stats(self, container_id: ContainerID) -> ContainerStatsInfo:
        await self._enter("ContainerStats", container_id)
        c = self._container(container_id)
        now = self.clock()
        return ContainerStatsInfo(
            container_id,
            c.config.name,
            c.config.attempt,
            dict(c.config.labels),
            dict(c.config.annotations),
            now,
            None,
            None,
            now,
            None,
            c.memory_usage_bytes,
            None,
            None,
            None,
        )

    async def remove_container(self, container_id: ContainerID) -> None:
        await self._enter("RemoveContainer", container_id)
        c = self.containers.get(container_id)
        if c is None:
            return
        if c.state in _LIVE:
            self._exit(c, KILLED_EXIT_CODE, "Error")  # containerd force-stops before removing
        del self.containers[container_id]

    async def list_containers(
        self,
        *,
        sandbox_id: SandboxID | None = None,
        label_selector: dict[str, str] | None = None,
        container_id: ContainerID | None = None,
    ) -> list[Container]:
        await self._enter(
            "ListContainers", *_selector_args(label_selector), *_id_args(container_id)
        )
        return [
            Container(
                id=c.id,
                sandbox_id=c.sandbox_id,
                name=c.config.name,
                attempt=c.config.attempt,
                image=c.config.image,
                image_ref=c.image.id,
                state=c.state,
                created_at=c.created_at,
                labels=dict(c.config.labels),
                annotations=dict(c.config.annotations),
            )
            for c in self.containers.values()
            if sandbox_id in (None, "", c.sandbox_id)
            and container_id in (None, "", c.id)
            and _matches(c.config.labels, label_selector)
        ]

    async def container_status(self, container_id: ContainerID) -> ContainerStatusInfo:
        await self._enter("ContainerStatus", container_id)
        c = self._container(container_id)
        image = c.image.repo_tags[0] if c.image.repo_tags else c.image.id
        return ContainerStatusInfo(
            id=c.id,
            name=c.config.name,
            attempt=c.config.attempt,
            state=c.state,
            created_at=c.created_at,
            started_at=c.started_at,
            finished_at=c.finished_at,
            exit_code=c.exit_code,
            image=image,
            image_ref=c.image.id,
            reason=c.reason,
            message=c.message,
            log_path=c.log_path,
            labels=dict(c.config.labels),
            annotations=dict(c.config.annotations),
            mounts=c.config.mounts,
        )

    async def container_pid(self, container_id: ContainerID) -> int:
        """`pids[container_id]` when a test set one, else 0 (the runtime does not say)."""
        await self._enter("ContainerStatus", container_id)
        self._container(container_id)
        return self.pids.get(container_id, 0)

    async def reopen_container_log(self, container_id: ContainerID) -> None:
        """Counted in `log_reopens`; no file is touched (a test hook may create one).
        containerd refuses a container that is not running."""
        await self._enter("ReopenContainerLog", container_id)
        c = self._container(container_id)
        if c.state != ContainerState.RUNNING:
            raise CRIError(f"container {container_id} is not running")
        c.log_reopens += 1

    async def exec_sync(
        self, container_id: ContainerID, cmd: list[str], *, timeout_s: int
    ) -> tuple[int, bytes, bytes]:
        await self._enter("ExecSync", container_id, *cmd)
        if self._container(container_id).state != ContainerState.RUNNING:
            raise CRIError(f"container {container_id} is not running")
        if self.exec_responder is not None:
            return self.exec_responder(container_id, list(cmd))
        return 0, b"", b""

    async def checkpoint_container(
        self, container_id: ContainerID, location: str, *, timeout_s: int = 0
    ) -> None:
        await self._enter("CheckpointContainer", container_id, location)
        if timeout_s < 0:
            raise ValueError("CheckpointContainer requires the timeout value to be >= 0")
        if self._container(container_id).state != ContainerState.RUNNING:
            raise CRIError(f"container {container_id} is not running")
        self.checkpoints[location] = (container_id, timeout_s)

    # -- ImageService ----------------------------------------------------------------

    async def pull_image(
        self,
        image: str,
        *,
        sandbox_config: SandboxConfig | None = None,
        auth: AuthConfig | None = None,
    ) -> ImageRef:
        await self._enter("PullImage", image, _user_of(auth))
        if image in self._pull_errors:
            raise self._pull_errors[image]
        required = self._registry_users.get(image.partition("/")[0])
        if required is not None and _credentials_of(auth) != required:
            raise CRIError(
                f'failed to pull and unpack image "{image}": failed to resolve reference '
                f'"{image}": pull access denied, repository does not exist or may require '
                "authorization: authorization failed: 401 Unauthorized",
                code="UNKNOWN",
            )
        present = self._resolve(image)
        return present.id if present is not None else self.add_image(image).id

    async def image_status(self, image: str) -> ImageInfo | None:
        await self._enter("ImageStatus", image)
        return self._resolve(image)

    async def list_images(self) -> list[ImageInfo]:
        await self._enter("ListImages")
        return list(self.images.values())

    async def remove_image(self, image: str) -> None:
        await self._enter("RemoveImage", image)
        found = self._resolve(image)
        if found is not None:
            del self.images[found.id]


def _credentials_of(auth: AuthConfig | None) -> tuple[str, str] | None:
    if auth is None:
        return None
    if auth.auth:
        user, _, password = base64.b64decode(auth.auth).decode().partition(":")
        return user, password
    return auth.username, auth.password


def _user_of(auth: AuthConfig | None) -> str:
    """The user a PullImage authenticated as, for the call log ("" = anonymous)."""
    credentials = _credentials_of(auth)
    return credentials[0] if credentials else ""


class FakeRuntimeEvents:
    """`klet.cri.containerevents.RuntimeEvents` for unit tests: events are pushed by the test.

    `push` delivers an event to the open subscription (queued until one is open);
    `drop` ends the open subscription with `RuntimeUnavailable`, as a runtime restart
    does; `refuse` makes the next subscriptions fail to open with `error` (None stops
    refusing); `unsupported` makes every subscription raise `EventsUnsupported`.
    `subscriptions` counts the subscriptions opened.
    """

    def __init__(self, *, source: str = "containerd") -> None:
        self.source = source
        self.unsupported = False
        self.subscriptions = 0
        self._refuse: CRIError | None = None
        self._queue: asyncio.Queue[RuntimeEvent | CRIError] = asyncio.Queue()

    def push(self, kind: EventKind, object_id: str, **fields: object) -> None:
        self._queue.put_nowait(
            RuntimeEvent(kind=kind, object_id=object_id, topic=f"fake/{kind.value}", **fields)  # type: ignore[arg-type]
        )

    def drop(self) -> None:
        self._queue.put_nowait(RuntimeUnavailable("the fake runtime restarted", code="UNAVAILABLE"))

    def refuse(self, error: CRIError | None) -> None:
        self._refuse = error

    async def subscribe(self) -> AsyncIterator[RuntimeEvent | Subscribed]:
        if self.unsupported:
            raise EventsUnsupported("no events in the fake", code="UNIMPLEMENTED")
        if self._refuse is not None:
            raise self._refuse
        self.subscriptions += 1
        yield Subscribed(self.source)
        while True:
            item = await self._queue.get()
            if isinstance(item, CRIError):
                raise item
            yield item


if TYPE_CHECKING:
    # mypy's proof that the fake is what syncloop consumes (the real client's proof is
    # beside the Protocol, in klet.syncloop.criprotocols).
    from klet.syncloop.criprotocols import NodeRuntime

    def _conforms(fake: FakeRuntimeService) -> NodeRuntime:
        return fake
