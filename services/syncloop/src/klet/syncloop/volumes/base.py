"""The seam between the volume manager and its plugins (one plugin per volume type).

A plugin recognises its volumes in the pod spec (`handles`), makes a volume ready on
the host (`set_up`, called at every sync of the pod so that it also refreshes content
such as a ConfigMap's files, and therefore idempotent) and removes it (`tear_down`).
Each plugin keeps its volumes under `<root-dir>/pods/<uid>/volumes/<dir_name>/<name>`,
`dir_name` being upstream's escaped plugin name (`kubernetes.io~empty-dir`), so tools
that know the kubelet's layout find them where they expect.

A volume that cannot be set up raises `VolumeError`; its text becomes the cause in the
`FailedMount` event (`MountVolume.SetUp failed for volume "x" : <cause>`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from klet.model.podvalidation import checked_component
from klet.model.types import JSON
from klet.syncloop.environment.envvars import NodeFacts
from klet.syncloop.environment.kubeobjects import KubeObjects

ObjectReader = KubeObjects
"""What a plugin reads ConfigMaps and Secrets through (kubeobjects' reader)."""


@dataclass(frozen=True)
class Block:
    """What `set_up` returns for a raw block volume (`volumeMode: Block`): the device
    node the runtime hands to containers that list the volume in `volumeDevices`, and
    whether it is read-only (the containers then get cgroup permission "r" on it, as
    upstream's makeBlockVolumes gives a read-only volume, instead of "mrw")."""

    device: Path
    read_only: bool = False


class VolumeError(Exception):
    """Why a volume cannot be set up; the text goes into the FailedMount event."""


@dataclass(frozen=True)
class VolumeContext:
    """What a plugin may need about the pod whose volume it sets up."""

    pod: JSON
    pod_dir: Path
    """`<root-dir>/pods/<uid>`; a plugin's volume lives in `volume_dir(...)` below it."""
    objects: ObjectReader | None
    """ConfigMaps and Secrets from the apiserver; None standalone."""
    tokens: TokenIssuer | None
    """Service-account tokens (TokenRequest); None standalone."""
    node: NodeFacts
    pod_ip: str

    def volume_dir(self, plugin: VolumePlugin, name: str) -> Path:
        """Where `plugin` keeps the volume called `name` of this pod."""
        return volume_path(self.pod_dir, dir_name=plugin.dir_name, name=name)


def volume_type(volume: JSON) -> str:
    """The volume's source field (`emptyDir`, `persistentVolumeClaim`, ...); "" if none."""
    return next((str(k) for k in volume if k != "name"), "")


def volume_path(pod_dir: Path, *, dir_name: str, name: str) -> Path:
    """`<pod_dir>/volumes/<dir_name>/<name>`, the kubelet's layout."""
    return (
        pod_dir
        / "volumes"
        / checked_component(dir_name, what="volume plugin")
        / checked_component(name, what="volume name")
    )


class TokenIssuer(Protocol):
    """Issues service-account tokens bound to a pod (TokenRequest)."""

    async def token(
        self, pod: JSON, *, service_account: str, audience: str, expiration_s: int
    ) -> tuple[str, float]:
        """The token and when it expires (seconds since the epoch)."""
        ...


class VolumePlugin(Protocol):
    """One volume type."""

    dir_name: str
    """Upstream's escaped plugin name, e.g. `kubernetes.io~empty-dir`."""

    def handles(self, volume: JSON) -> bool:
        """Whether this plugin serves the pod-spec volume `volume`."""
        ...

    async def set_up(self, volume: JSON, ctx: VolumeContext) -> Path | Block:
        """Make the volume ready and return the host path to mount into containers (a
        `Block` for a raw block volume).

        Called at every sync of the pod: idempotent, and refreshes content. Raises
        `VolumeError` with the cause when the volume cannot be set up."""
        ...

    async def tear_down(self, path: Path) -> None:
        """Remove the volume at `path` (a directory `set_up` made): unmount what the
        plugin mounted there first; never descend into a mounted filesystem."""
        ...
