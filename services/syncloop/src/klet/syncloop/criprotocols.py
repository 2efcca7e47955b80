"""The CRI operations syncloop needs, as consumer-side Protocols (STYLE rule 5).

`klet.cri.RuntimeClient` (production) and `klet.testbed.fakes.cri.FakeRuntimeService`
(unit tests, in the test bed the image does not ship) both satisfy them structurally;
mypy proves it for the client in the `TYPE_CHECKING` block at the end and for the fake
at the end of its own module, so the fake cannot drift from the client unnoticed. Each
consumer should ask for the narrowest one: the runtime reader and PLEG only read, the
image puller only touches images, and the pod syncer needs the whole `RuntimeService`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from klet.cri.types import (
    AuthConfig,
    Container,
    ContainerConfig,
    ContainerStatsInfo,
    ContainerStatusInfo,
    ImageInfo,
    LinuxResources,
    RuntimeVersion,
    Sandbox,
    SandboxConfig,
    SandboxStatusInfo,
)
from klet.model.types import ContainerID, ImageRef, SandboxID


class RuntimeReader(Protocol):
    """What PodRuntime (runtime.py) and the relister (relisting.py) read."""

    async def list_pod_sandboxes(
        self, *, label_selector: dict[str, str] | None = None, sandbox_id: SandboxID | None = None
    ) -> list[Sandbox]: ...

    async def pod_sandbox_status(self, sandbox_id: SandboxID) -> SandboxStatusInfo: ...

    async def list_containers(
        self,
        *,
        sandbox_id: SandboxID | None = None,
        label_selector: dict[str, str] | None = None,
        container_id: ContainerID | None = None,
    ) -> list[Container]: ...

    async def container_status(self, container_id: ContainerID) -> ContainerStatusInfo: ...


class ImageService(Protocol):
    """What the ImagePuller (images.py) calls."""

    async def image_status(self, image: str) -> ImageInfo | None: ...

    async def pull_image(
        self,
        image: str,
        *,
        sandbox_config: SandboxConfig | None = None,
        auth: AuthConfig | None = None,
    ) -> ImageRef: ...


class RuntimeService(RuntimeReader, ImageService, Protocol):
    """Every CRI call syncloop makes; what PodSyncer (syncpod.py) acts through."""

    async def run_pod_sandbox(
        self, config: SandboxConfig, *, runtime_handler: str = ""
    ) -> SandboxID: ...

    async def stop_pod_sandbox(self, sandbox_id: SandboxID) -> None: ...

    async def remove_pod_sandbox(self, sandbox_id: SandboxID) -> None: ...

    async def create_container(
        self, sandbox_id: SandboxID, config: ContainerConfig, sandbox_config: SandboxConfig
    ) -> ContainerID: ...

    async def start_container(self, container_id: ContainerID) -> None: ...

    async def stop_container(self, container_id: ContainerID, *, timeout_s: int) -> None: ...

    async def container_pid(self, container_id: ContainerID) -> int: ...  # execwait.py

    async def remove_container(self, container_id: ContainerID) -> None: ...

    async def exec_sync(
        self, container_id: ContainerID, cmd: list[str], *, timeout_s: int
    ) -> tuple[int, bytes, bytes]: ...  # lifecycle hooks (hooks.py)


class NodeRuntime(RuntimeService, Protocol):
    """The CRI client as syncloop's wiring holds it (`wiring.Deps.cri`): everything
    above plus log rotation's reopen, the version logged at start and `close` at exit."""

    async def version(self) -> RuntimeVersion: ...

    async def cgroup_driver(self) -> str: ...  # checked against cgroupDriver at start

    async def reopen_container_log(self, container_id: ContainerID) -> None: ...

    async def settle(self) -> bool: ...  # creations and starts still running, at exit

    async def update_container_resources(
        self, container_id: ContainerID, resources: LinuxResources
    ) -> None: ...  # in-place resize (pods/resizing.py)

    async def container_stats(self, container_id: ContainerID) -> ContainerStatsInfo: ...

    async def close(self) -> None: ...


if TYPE_CHECKING:
    from klet.cri import RuntimeClient

    def _conforms(real: RuntimeClient) -> NodeRuntime:
        return real  # the fake's conformance is proven beside it: klet.testbed.fakes.cri
