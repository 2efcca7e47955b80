"""A device plugin of the project's own for tests: fake devices backed by real files.

`FakeDevicePlugin` serves deviceplugin v1beta1's DevicePlugin on a socket of its own in
a node's `<root-dir>/device-plugins/` and registers on the `kubelet.sock` there, as a
real plugin (NVIDIA's, upstream's sample device plugin) does. It runs its own event
loop in a thread, so a test drives it with plain calls: `set_health`, `stop`.

Each device `dev-<i>` is backed by two real things under the plugin's directory: a
character device node (a copy of /dev/null, made with mknod) handed to the container as
`/dev/foo<i>`, and a file holding `device dev-<i>` mounted read-only at
`/var/foo/dev-<i>`. Allocate also answers an env `FOO_DEVICES` (the IDs, comma
separated) and an annotation, so a test reads every kind back from inside the
container. Like upstream's plugins it watches kubelet.sock and registers again when the
socket is re-created (a restarted node agent clears the directory, its own socket
included, so it serves again first). Every Allocate and PreStartContainer is recorded.

`SampleDevicePlugin` runs upstream's sample device plugin (tools/deviceplugin/build.sh)
in its plugin-watcher mode: its socket in the node's `plugins_registry/`, and with
REGISTER_CONTROL_FILE set it never calls kubelet.sock.
"""

from __future__ import annotations

import asyncio
import os
import signal
import stat
import subprocess
import threading
from collections.abc import AsyncIterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import grpc
from klet.rpc.gen.klet.deviceplugin.v1beta1 import deviceplugin_pb2 as pb
from klet.rpc.gen.klet.deviceplugin.v1beta1 import deviceplugin_pb2_grpc as pb_grpc

from tests.harness.waiting import wait_for


class _Servicer(pb_grpc.DevicePluginServicer):
    def __init__(self, plugin: FakeDevicePlugin) -> None:
        self.plugin = plugin

    async def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:  # noqa: N802
        return pb.DevicePluginOptions(pre_start_required=self.plugin.pre_start_required)

    async def ListAndWatch(self, request: Any, context: Any) -> AsyncIterator[Any]:  # noqa: N802
        while True:
            changed = self.plugin.changed
            yield pb.ListAndWatchResponse(
                devices=[pb.Device(ID=d, health=h) for d, h in self.plugin.health.items()]
            )
            await changed.wait()

    async def GetPreferredAllocation(self, request: Any, context: Any) -> Any:  # noqa: N802
        return pb.PreferredAllocationResponse(
            container_responses=[
                pb.ContainerPreferredAllocationResponse(
                    deviceIDs=sorted(r.available_deviceIDs, reverse=True)[: r.allocation_size]
                )
                for r in request.container_requests
            ]
        )

    async def Allocate(self, request: Any, context: Any) -> Any:  # noqa: N802
        out = []
        for r in request.container_requests:
            ids = list(r.devices_ids)
            self.plugin.allocations.append(ids)
            out.append(
                pb.ContainerAllocateResponse(
                    envs={"FOO_DEVICES": ",".join(ids)},
                    mounts=[
                        pb.Mount(
                            container_path=f"/var/foo/{d}",
                            host_path=str(self.plugin.files / d),
                            read_only=True,
                        )
                        for d in ids
                    ],
                    devices=[
                        pb.DeviceSpec(
                            container_path=f"/dev/foo{d.rsplit('-', 1)[1]}",
                            host_path=str(self.plugin.nodes / d),
                            permissions="rw",
                        )
                        for d in ids
                    ],
                    annotations={"example.com/foo-devices": ",".join(ids)},
                )
            )
        return pb.AllocateResponse(container_responses=out)

    async def PreStartContainer(self, request: Any, context: Any) -> Any:  # noqa: N802
        self.plugin.pre_starts.append(list(request.devices_ids))
        return pb.PreStartContainerResponse()


class FakeDevicePlugin:
    def __init__(
        self,
        plugin_dir: Path,
        backing: Path,
        *,
        resource: str = "example.com/foo",
        count: int = 2,
        name: str = "fake-foo.sock",
        pre_start_required: bool = True,
    ) -> None:
        self.plugin_dir = plugin_dir
        self.resource = resource
        self.name = name
        self.pre_start_required = pre_start_required
        self.files = backing / "files"
        self.nodes = backing / "nodes"
        self.files.mkdir(parents=True, exist_ok=True)
        self.nodes.mkdir(parents=True, exist_ok=True)
        null = os.stat("/dev/null")
        self.health: dict[str, str] = {}
        for i in range(count):
            d = f"dev-{i}"
            (self.files / d).write_text(f"device {d}\n")
            node = self.nodes / d
            if not node.exists():
                os.mknod(node, 0o666 | stat.S_IFCHR, null.st_rdev)
            self.health[d] = "Healthy"
        self.allocations: list[list[str]] = []
        self.pre_starts: list[list[str]] = []
        self.registrations = 0
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.changed = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    # -- called from the test's thread ------------------------------------------------

    def start(self) -> None:
        self.thread.start()
        self._call(self._start())

    def set_health(self, device: str, health: str) -> None:
        async def go() -> None:
            self.health[device] = health
            self._notify()

        self._call(go())

    def stop(self) -> None:
        """The plugin exits: its server and socket go, the node agent's stream ends."""
        if not self.thread.is_alive():
            return

        async def go() -> None:
            if self.task is not None:
                self.task.cancel()
                try:
                    await self.task
                except asyncio.CancelledError:
                    pass

        self._call(go())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def wait_registered(self, times: int, timeout_s: float = 30) -> None:
        wait_for(
            lambda: self.registrations >= times,
            timeout_s=timeout_s,
            what=f"{self.resource} registered {times} time(s)",
        )

    def _call(self, coro: Any) -> Any:
        fut: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return fut.result(30)

    # -- in the plugin's loop -----------------------------------------------------------

    def _notify(self) -> None:
        old, self.changed = self.changed, asyncio.Event()
        old.set()

    async def _start(self) -> None:
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        kubelet = self.plugin_dir / "kubelet.sock"
        while True:
            ident = await self._wait_socket(kubelet)
            server = grpc.aio.server()
            pb_grpc.add_DevicePluginServicer_to_server(_Servicer(self), server)  # type: ignore[no-untyped-call]
            sock = self.plugin_dir / self.name
            if sock.exists():
                sock.unlink()
            server.add_insecure_port(f"unix://{sock}")
            await server.start()
            try:
                await self._register(kubelet)
                # Serve until kubelet.sock is re-created (a restarted agent) or goes.
                while _identity(kubelet) == ident:  # noqa: ASYNC110 - polling a file
                    await asyncio.sleep(0.2)
            except grpc.aio.AioRpcError:
                await asyncio.sleep(0.5)
            finally:
                await server.stop(grace=None)

    async def _wait_socket(self, kubelet: Path) -> tuple[int, int]:
        while True:
            ident = _identity(kubelet)
            if ident is not None:
                return ident
            await asyncio.sleep(0.2)

    async def _register(self, kubelet: Path) -> None:
        async with grpc.aio.insecure_channel(f"unix://{kubelet}") as channel:
            stub = pb_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
            await stub.Register(
                pb.RegisterRequest(
                    version="v1beta1",
                    endpoint=self.name,
                    resource_name=self.resource,
                    options=pb.DevicePluginOptions(
                        pre_start_required=self.pre_start_required,
                        get_preferred_allocation_available=True,
                    ),
                ),
                timeout=10,
            )
        self.registrations += 1


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_ctime_ns)


REPO = Path(__file__).resolve().parents[2]
SAMPLE_BUILD_SH = REPO / "tools" / "deviceplugin" / "build.sh"
SAMPLE_RESOURCE = "example.com/resource"
"""The resource upstream's sample device plugin serves (devices Dev-1 and Dev-2)."""


def sample_device_plugin_binary() -> Path:
    """Build (when not cached) and return upstream's sample device plugin; AssertionError
    with build.sh's stderr when it fails."""
    res = subprocess.run(
        ["bash", str(SAMPLE_BUILD_SH)], capture_output=True, text=True, check=False
    )
    assert res.returncode == 0, f"{SAMPLE_BUILD_SH} exited {res.returncode}:\n{res.stderr[-3000:]}"
    return Path(res.stdout.splitlines()[-1])


class SampleDevicePlugin:
    """Upstream's sample device plugin registering through `registry` (a node's
    `<root-dir>/plugins_registry`), its log in `work/sample-device-plugin.log`."""

    def __init__(self, binary: Path, registry: Path, work: Path) -> None:
        self.binary = binary
        self.registry = registry
        self.control = work / "control" / "registration"  # never removed: no kubelet.sock
        self.log = work / "sample-device-plugin.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.registry.mkdir(mode=0o750, parents=True, exist_ok=True)
        self.control.parent.mkdir(parents=True, exist_ok=True)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PLUGIN_SOCK_DIR": str(self.registry),
            "REGISTER_CONTROL_FILE": str(self.control),
        }
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [str(self.binary)], env=env, stdout=out, stderr=subprocess.STDOUT
            )

    def sockets(self) -> list[Path]:
        """Its registration sockets in the registry (`dp.<unix time>`)."""
        return sorted(self.registry.glob("dp.*"))

    def logged(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        """SIGTERM, as a DaemonSet's pod gets: the plugin removes its socket and exits."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
