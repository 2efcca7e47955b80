"""A container's volumeMounts → the CRI mounts of the container (upstream's makeMounts).

Each volumeMount names a pod volume that the manager has set up; its host path (or a
`subPath` inside it) is bind-mounted at `mountPath`. The checks and messages are
upstream's, and a failure is the container's CreateContainerConfigError:

- a volumeMount naming no ready volume: `cannot find volume "x" to mount into container "c"`;
- `subPathExpr` is expanded with the container's environment (`$(VAR)`), and every
  variable it names must have a non-empty value (`missing value for A, B`);
- a subPath must be relative and free of `..`; what it names is created when missing
  (with the volume root's mode, as upstream's SafeMakeDir), and after resolving
  symlinks it must still lie inside the volume, so a symlink planted in a volume cannot
  expose the node's files. Upstream also bind-mounts the checked path to close the
  window between the check and the container's start; klet passes the checked path.
- mountPropagation None/HostToContainer/Bidirectional → CRI private/host-to-container/
  bidirectional; Bidirectional only in a privileged container (upstream's validation).
- configMap, secret, downwardAPI and projected volumes are always mounted read-only,
  as upstream's plugins declare; every volume but hostPath asks for SELinux relabelling.
- `recursiveReadOnly: Enabled` fails as upstream does on a runtime without support
  (containerd 1.6 has none); `IfPossible` falls back to a plain read-only mount.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path

from klet.cri.types import Mount, MountPropagation
from klet.model.types import JSON
from klet.syncloop import envvars
from klet.syncloop.volumes.base import volume_type

READ_ONLY_TYPES = frozenset({"configMap", "secret", "downwardAPI", "projected"})
NOT_RELABELED = frozenset({"hostPath"})

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


def _within(path: str, base: str) -> bool:
    return path == base or path.startswith(base.rstrip("/") + "/")


def prepare_subpath(volume_path: Path, *, sub_path: str, mount_name: str, container: str) -> Path:
    """The host path of `sub_path` inside the volume, created when missing, checked to
    stay inside the volume once symlinks are resolved."""
    base = os.path.realpath(volume_path)
    target = os.path.join(volume_path, sub_path)
    if not os.path.lexists(target):
        try:
            _safe_make_dir(base, sub_path)
        except (OSError, ValueError) as err:
            raise MountConfigError(
                f'failed to create subPath directory for volumeMount "{mount_name}" '
                f'of container "{container}"'
            ) from err
    resolved = os.path.realpath(target)
    if not _within(resolved, base) or not os.path.exists(resolved):
        raise MountConfigError(
            f'failed to prepare subPath for volumeMount "{mount_name}" of container "{container}"'
        )
    return Path(resolved)


def _safe_make_dir(base: str, sub_path: str) -> None:
    """Create `sub_path` under `base` one element at a time, each with the mode of the
    volume root, refusing to go through anything that leaves `base`."""
    mode = stat.S_IMODE(os.stat(base).st_mode)
    current = base
    for part in [p for p in sub_path.split("/") if p not in ("", ".")]:
        nxt = os.path.join(current, part)
        if os.path.lexists(nxt):
            nxt = os.path.realpath(nxt)
            if not _within(nxt, base):
                raise ValueError(f"{nxt} is not within {base}")
            if not os.path.isdir(nxt):
                raise ValueError(f"{nxt} is not a directory")
        else:
            os.mkdir(nxt, mode)
            os.chmod(nxt, mode)  # mkdir is subject to the umask
        current = nxt


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
) -> tuple[Mount, ...]:
    """The CRI mounts for the container's volumeMounts; raises `MountConfigError`.

    `volumes` maps each ready volume's name to its host path (the manager's result);
    `env` is the container's finished environment (for subPathExpr)."""
    kinds = {
        str(v.get("name")): volume_type(v) for v in (pod.get("spec") or {}).get("volumes") or []
    }
    env_map = dict(env)
    name = str(container.get("name", ""))
    out: list[Mount] = []
    for index, vm in enumerate(container.get("volumeMounts") or []):
        vol_name = str(vm.get("name", ""))
        host = volumes.get(vol_name)
        if host is None:
            raise MountConfigError(
                f'cannot find volume "{vol_name}" to mount into container "{name}"'
            )
        sub_path = str(vm.get("subPath") or "")
        if vm.get("subPathExpr"):
            sub_path = expand_subpath_expr(str(vm["subPathExpr"]), env=env_map)
        if sub_path:
            validate_subpath(sub_path)
            host = prepare_subpath(host, sub_path=sub_path, mount_name=vol_name, container=name)
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
                readonly=bool(vm.get("readOnly")) or kind in READ_ONLY_TYPES,
                propagation=prop,
                selinux_relabel=kind not in NOT_RELABELED,
            )
        )
    return tuple(out)
