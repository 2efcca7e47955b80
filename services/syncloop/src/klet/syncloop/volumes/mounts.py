"""A container's volumeMounts → the CRI mounts of the container (upstream's makeMounts).

Each volumeMount names a pod volume that the manager has set up; its host path (or a
`subPath` inside it) is bind-mounted at `mountPath`. The checks and messages are
upstream's, and a failure is the container's CreateContainerConfigError:

- a volumeMount naming no ready volume: `cannot find volume "x" to mount into container "c"`;
- `subPathExpr` is expanded with the container's environment (`$(VAR)`), and every
  variable it names must have a non-empty value (`missing value for A, B`);
- a subPath must be relative and free of `..`; it is opened without following symlinks
  (created when missing) and bind-mounted under the pod's `volume-subpaths`, and that
  bind mount is what the runtime gets, so a container sharing the volume cannot swap
  in a symlink to the node's root between the check and the mount (subpath.py);
- mountPropagation None/HostToContainer/Bidirectional → CRI private/host-to-container/
  bidirectional; Bidirectional only in a privileged container (upstream's validation).
- configMap, secret, downwardAPI and projected volumes are always mounted read-only,
  as upstream's plugins declare, and so is a claim, inline CSI or inline nfs volume with
  `readOnly: true` in the pod spec; every volume but hostPath and inline nfs asks for
  SELinux relabelling (upstream's NFS plugin declares no relabelling).
- `recursiveReadOnly: Enabled` fails as upstream does on a runtime without support
  (containerd 1.6 has none); `IfPossible` falls back to a plain read-only mount.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from klet.cri.types import Device, Mount, MountPropagation
from klet.model.types import JSON
from klet.syncloop.environment import envvars
from klet.syncloop.volumes.base import Block, volume_type
from klet.syncloop.volumes.subpath import SubPathError, SubPathMounter

READ_ONLY_TYPES = frozenset({"configMap", "secret", "downwardAPI", "projected"})
NOT_RELABELED = frozenset({"hostPath", "nfs"})

_PROPAGATION = {
    None: MountPropagation.PRIVATE,
    "": MountPropagation.PRIVATE,
    "None": MountPropagation.PRIVATE,
    "HostToContainer": MountPropagation.HOST_TO_CONTAINER,
    "Bidirectional": MountPropagation.BIDIRECTIONAL,
}


class MountConfigError(Exception):
    """A volumeMount cannot be honoured; the text is the CreateContainerConfigError message."""


def propagation(mode: str | None) -> MountPropagation:
    """The CRI propagation of a volumeMount's `mountPropagation`."""
    try:
        return _PROPAGATION[mode]
    except KeyError:
        raise MountConfigError(f'invalid MountPropagation mode: "{mode}"') from None


def container_field(pod: JSON, container: JSON) -> str:
    """`spec.containers[i]` / `spec.initContainers[i]` naming `container` in the pod."""
    spec = pod.get("spec") or {}
    for key in ("initContainers", "containers", "ephemeralContainers"):
        for i, c in enumerate(spec.get(key) or []):
            if c.get("name") == container.get("name"):
                return f"spec.{key}[{i}]"
    return "spec.containers[0]"


def check_propagation(pod: JSON, container: JSON, *, index: int, mode: str | None) -> None:
    """Bidirectional propagation only for privileged containers (upstream's validation)."""
    if mode != "Bidirectional":
        return
    if (container.get("securityContext") or {}).get("privileged") is True:
        return
    where = f"{container_field(pod, container)}.volumeMounts[{index}].mountPropagation"
    raise MountConfigError(
        f"{where}: Forbidden: Bidirectional mount propagation is available only to "
        "privileged containers"
    )


def expand_subpath_expr(expr: str, *, env: Mapping[str, str]) -> str:
    """Expand `$(VAR)` in a subPathExpr; every named variable must have a value."""
    missing: set[str] = set()

    def lookup(name: str) -> str:
        value = env.get(name, "")
        if not value:
            missing.add(name)
        return value

    expanded = envvars.expand(expr, lookup)
    if missing:
        raise MountConfigError(f"missing value for {', '.join(sorted(missing))}")
    return expanded


def validate_subpath(sub_path: str) -> None:
    """A subPath is relative and has no `..` element."""
    if sub_path.startswith("/"):
        raise MountConfigError(f"error SubPath `{sub_path}` must not be an absolute path")
    if ".." in sub_path.split("/"):
        raise MountConfigError(f"unable to provision SubPath `{sub_path}`: must not contain '..'")


def prepare_subpath(
    volume_path: Path,
    *,
    sub_path: str,
    mounter: SubPathMounter,
    mount_name: str,
    container: str,
    index: int,
) -> Path:
    """Bind-mount `sub_path` of the volume for the container's `index`-th volumeMount
    (see subpath.py) and return the host path to give the runtime."""
    try:
        return mounter.mount(
            volume_path, sub_path, volume=mount_name, container=container, index=index
        )
    except (OSError, SubPathError) as err:
        cause = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise MountConfigError(
            f'failed to prepare subPath for volumeMount "{mount_name}" of container '
            f'"{container}": subPath `{sub_path}`: {cause}'
        ) from err


def container_devices(
    container: JSON, *, devices: Mapping[str, Block], volumes: Mapping[str, Path]
) -> tuple[Device, ...]:
    """A container's volumeDevices → the CRI devices (upstream's makeBlockVolumes): each
    names a raw block volume that is ready; a filesystem volume there is refused. A
    read-only volume's device gets cgroup permission "r", any other "mrw"."""
    name = str(container.get("name", ""))
    out: list[Device] = []
    for vd in container.get("volumeDevices") or []:
        vol_name = str(vd.get("name", ""))
        device = devices.get(vol_name)
        if device is None and vol_name in volumes:
            raise MountConfigError(
                f'volume "{vol_name}" has volumeMode Filesystem, but is specified in '
                f'volumeDevices of container "{name}"'
            )
        if device is None:
            raise MountConfigError(
                f'cannot find volume "{vol_name}" to use as a device in container "{name}"'
            )
        out.append(
            Device(
                container_path=str(vd.get("devicePath") or ""),
                host_path=str(device.device),
                permissions="r" if device.read_only else "mrw",
            )
        )
    return tuple(out)


def source_read_only(volume: JSON) -> bool:
    """A claim, inline CSI or inline nfs volume that the pod spec makes read-only for
    every mount."""
    kind = volume_type(volume)
    return kind in ("persistentVolumeClaim", "csi", "nfs") and bool(
        (volume.get(kind) or {}).get("readOnly")
    )


def recursive_read_only(mount: JSON) -> None:
    """Upstream fails `Enabled` when the runtime cannot do it (containerd 1.6 cannot)."""
    if mount.get("recursiveReadOnly") == "Enabled":
        raise MountConfigError(
            "failed to resolve recursive read-only mode: volume "
            f'"{mount.get("name", "")}" requested recursive read-only mode, '
            "but it is not supported by the runtime"
        )


def container_mounts(
    pod: JSON,
    container: JSON,
    *,
    volumes: Mapping[str, Path],
    env: Iterable[tuple[str, str]],
    subpaths: SubPathMounter | None,
    devices: Mapping[str, Block] | None = None,
) -> tuple[Mount, ...]:
    """The CRI mounts for the container's volumeMounts; raises `MountConfigError`.

    `volumes` maps each ready volume's name to its host path (the manager's result),
    `devices` each raw block volume's to its device node (refused here);
    `env` is the container's finished environment (for subPathExpr); `subpaths` makes
    the pod's subPath bind mounts (None: no pod directory, so a subPath is refused).
    What earlier instances of the container left under `volume-subpaths` is removed
    first."""
    specs = {str(v.get("name")): v for v in (pod.get("spec") or {}).get("volumes") or []}
    kinds = {name: volume_type(v) for name, v in specs.items()}
    env_map = dict(env)
    name = str(container.get("name", ""))
    out: list[Mount] = []
    if subpaths is not None:
        try:
            subpaths.clear(name)
        except (OSError, SubPathError) as err:
            raise MountConfigError(
                f'failed to clean up subPath mounts of container "{name}": {err}'
            ) from err
    for index, vm in enumerate(container.get("volumeMounts") or []):
        vol_name = str(vm.get("name", ""))
        host = volumes.get(vol_name)
        if host is None and vol_name in (devices or {}):
            raise MountConfigError(
                f'volume "{vol_name}" has volumeMode Block, but is specified in volumeMounts '
                f'of container "{name}"'
            )
        if host is None:
            raise MountConfigError(
                f'cannot find volume "{vol_name}" to mount into container "{name}"'
            )
        sub_path = str(vm.get("subPath") or "")
        if vm.get("subPathExpr"):
            sub_path = expand_subpath_expr(str(vm["subPathExpr"]), env=env_map)
        if sub_path:
            validate_subpath(sub_path)
            if subpaths is None:
                raise MountConfigError(
                    f'cannot mount subPath `{sub_path}` of volume "{vol_name}" into container '
                    f'"{name}": no pod directory'
                )
            host = prepare_subpath(
                host,
                sub_path=sub_path,
                mounter=subpaths,
                mount_name=vol_name,
                container=name,
                index=index,
            )
        mode = vm.get("mountPropagation")
        prop = propagation(mode)
        check_propagation(pod, container, index=index, mode=mode)
        recursive_read_only(vm)
        mount_path = str(vm.get("mountPath") or "")
        if not mount_path.startswith("/"):
            mount_path = os.path.normpath("/" + mount_path)
        kind = kinds.get(vol_name, "")
        out.append(
            Mount(
                container_path=mount_path,
                host_path=str(host),
                readonly=bool(vm.get("readOnly"))
                or kind in READ_ONLY_TYPES
                or source_read_only(specs.get(vol_name) or {}),
                propagation=prop,
                selinux_relabel=kind not in NOT_RELABELED,
            )
        )
    return tuple(out)
