"""Pod and container `securityContext` → CRI security settings, as pure functions.

The rules are upstream's (kuberuntime's security context, sandbox and namespace code,
`securitycontext.DetermineEffectiveSecurityContext`):

- The effective context of a container starts from the pod's seLinuxOptions, runAsUser,
  runAsGroup and runAsNonRoot; each field the container sets replaces the pod's
  (capabilities and seLinuxOptions as whole objects). seccompProfile: the container's,
  else the pod's. appArmorProfile: the container's, else the deprecated per-container
  annotation, else the pod's.
- Without a runAsUser the image's user is passed on (its uid, or its name), and
  runAsNonRoot is checked against it; an image that names no user runs as root.
- Supplemental groups are pod-level: fsGroup first, then supplementalGroups.
- no_new_privs is set only when allowPrivilegeEscalation is explicitly false.
- Capability names are passed through as written; the runtime interprets them
  (containerd upper-cases them and prefixes `CAP_`, and treats `ALL` specially).
- Namespaces: hostNetwork / hostIPC → the node's; PID: hostPID → the node's,
  shareProcessNamespace → the pod's, otherwise the container's own.
- The sandbox runs privileged when any container of the pod is, always with the
  runtime's default seccomp profile, and with the pod's user, groups and SELinux.
- Sysctl names written with slashes are converted to dots before they reach runc.

What upstream reports as a container configuration error (runAsNonRoot violated, a
Localhost profile without a name, an unknown supplementalGroupsPolicy) raises
`SecurityConfigError` carrying upstream's message; the caller turns it into
`CreateContainerConfigError`. The API server rejects `allowPrivilegeEscalation: false`
together with `privileged` or an added `CAP_SYS_ADMIN`; nothing validates static pods
for that here, so such a container is refused the same way rather than started with
contradictory settings.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Any

from klet.cri.types import (
    ImageInfo,
    LinuxContainerSecurity,
    LinuxSandboxSecurity,
    NamespaceMode,
    NamespaceOptions,
    ProfileType,
    SecurityProfile,
    SELinuxOptions,
)
from klet.model.types import JSON

MAX_USER_ID = 2**31 - 1
SUPPLEMENTAL_GROUPS_POLICIES = ("Merge", "Strict")
APPARMOR_ANNOTATION_PREFIX = "container.apparmor.security.beta.kubernetes.io/"
APPARMOR_RUNTIME_DEFAULT = "runtime/default"
APPARMOR_UNCONFINED = "unconfined"
APPARMOR_LOCALHOST_PREFIX = "localhost/"

# The paths upstream masks and makes read-only under the Default procMount (kept in
# step with the container engines' own lists); Unmasked sends none.
DEFAULT_MASKED_PATHS = (
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
)
DEFAULT_READONLY_PATHS = (
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
)


class SecurityConfigError(Exception):
    """The container's security settings cannot be applied (upstream's message)."""


@dataclass(frozen=True)
class SecuritySettings:
    """Node-level security settings of the KubeletConfiguration."""

    seccomp_default: bool = False
    """seccompDefault: containers without a seccompProfile get RuntimeDefault."""
    seccomp_profile_root: str = "/var/lib/kubelet/seccomp"
    """Where Localhost seccomp profiles live: `<root-dir>/seccomp`."""


@dataclass(frozen=True)
class ImageUser:
    """The user an image runs as, as ImageStatus reports it: a uid or a name."""

    uid: int | None = 0
    username: str = ""


def image_user(info: ImageInfo | None) -> ImageUser:
    """Upstream's reading of ImageStatus: the uid if numeric, else the name, else root."""
    if info is not None and info.uid is not None:
        return ImageUser(uid=info.uid)
    if info is not None and info.username:
        return ImageUser(uid=None, username=info.username)
    return ImageUser(uid=0)


def _pod_sc(pod: JSON) -> JSON:
    return (pod.get("spec") or {}).get("securityContext") or {}


def effective_context(pod: JSON, container: JSON) -> JSON:
    """The container's security context with the pod's defaults filled in."""
    pod_sc = _pod_sc(pod)
    effective: dict[str, Any] = {
        k: pod_sc[k]
        for k in ("seLinuxOptions", "runAsUser", "runAsGroup", "runAsNonRoot")
        if pod_sc.get(k) is not None
    }
    for k, v in (container.get("securityContext") or {}).items():
        if v is not None:
            effective[k] = v
    return effective


def namespaces(pod: JSON) -> NamespaceOptions:
    spec = pod.get("spec") or {}
    if spec.get("hostPID"):
        pid = NamespaceMode.NODE
    elif spec.get("shareProcessNamespace"):
        pid = NamespaceMode.POD
    else:
        pid = NamespaceMode.CONTAINER
    return NamespaceOptions(
        network=NamespaceMode.NODE if spec.get("hostNetwork") else NamespaceMode.POD,
        pid=pid,
        ipc=NamespaceMode.NODE if spec.get("hostIPC") else NamespaceMode.POD,
    )


def supplemental_groups(pod: JSON) -> tuple[int, ...]:
    """fsGroup, then the pod's supplementalGroups, in upstream's order."""
    sc = _pod_sc(pod)
    groups = [int(sc["fsGroup"])] if sc.get("fsGroup") is not None else []
    groups += [int(g) for g in sc.get("supplementalGroups") or ()]
    return tuple(groups)


def supplemental_groups_policy(pod: JSON) -> str:
    policy = _pod_sc(pod).get("supplementalGroupsPolicy")
    if policy is None:
        return "Merge"
    if policy not in SUPPLEMENTAL_GROUPS_POLICIES:
        raise SecurityConfigError(f"unsupported supplementalGroupsPolicy: {policy}")
    return str(policy)


def normalize_sysctl_name(name: str) -> str:
    """`net/ipv4/conf/eth0.100/rp_filter` → `net.ipv4.conf.eth0/100.rp_filter`.

    A name whose first separator is a slash uses slashes as separators, so dots and
    slashes swap; a name that starts with a dot-separated part is already canonical.
    """
    first = next((i for i, ch in enumerate(name) if ch in "./"), -1)
    if first < 0 or name[first] == ".":
        return name
    return name.translate(str.maketrans("./", "/."))


def sysctls(pod: JSON) -> dict[str, str]:
    return {
        normalize_sysctl_name(str(s["name"])): str(s.get("value", ""))
        for s in _pod_sc(pod).get("sysctls") or ()
    }


def _all_containers(pod: JSON) -> list[JSON]:
    spec = pod.get("spec") or {}
    return [
        *(spec.get("initContainers") or ()),
        *(spec.get("containers") or ()),
        *(spec.get("ephemeralContainers") or ()),
    ]


def has_privileged_container(pod: JSON) -> bool:
    return any(
        bool((c.get("securityContext") or {}).get("privileged")) for c in _all_containers(pod)
    )


def _selinux(options: JSON | None) -> SELinuxOptions | None:
    if options is None:
        return None
    return SELinuxOptions(
        user=str(options.get("user", "")),
        role=str(options.get("role", "")),
        type=str(options.get("type", "")),
        level=str(options.get("level", "")),
    )


def sandbox_security(pod: JSON) -> LinuxSandboxSecurity:
    """The sandbox's security context. An unknown supplementalGroupsPolicy is left to
    the container, which reports it (the sandbox itself runs no workload)."""
    sc = _pod_sc(pod)
    policy = sc.get("supplementalGroupsPolicy")
    return LinuxSandboxSecurity(
        namespaces=namespaces(pod),
        run_as_user=_int_or_none(sc.get("runAsUser")),
        run_as_group=_int_or_none(sc.get("runAsGroup")),
        supplemental_groups=supplemental_groups(pod),
        supplemental_groups_policy=policy if policy in SUPPLEMENTAL_GROUPS_POLICIES else "Merge",
        privileged=has_privileged_container(pod),
        seccomp=SecurityProfile(ProfileType.RUNTIME_DEFAULT),
        selinux=_selinux(sc.get("seLinuxOptions")),
    )


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def _seccomp_from_field(profile: JSON, settings: SecuritySettings) -> SecurityProfile:
    kind = profile.get("type")
    if kind == "RuntimeDefault":
        return SecurityProfile(ProfileType.RUNTIME_DEFAULT)
    if kind == "Localhost":
        name = profile.get("localhostProfile")
        if not name:
            raise SecurityConfigError(
                "localhostProfile must be set if seccompProfile type is Localhost."
            )
        return SecurityProfile(
            ProfileType.LOCALHOST, posixpath.join(settings.seccomp_profile_root, str(name))
        )
    return SecurityProfile(ProfileType.UNCONFINED)


def seccomp_profile(pod: JSON, container: JSON, settings: SecuritySettings) -> SecurityProfile:
    for sc in (container.get("securityContext") or {}, _pod_sc(pod)):
        if sc.get("seccompProfile") is not None:
            return _seccomp_from_field(sc["seccompProfile"], settings)
    if settings.seccomp_default:
        return SecurityProfile(ProfileType.RUNTIME_DEFAULT)
    return SecurityProfile(ProfileType.UNCONFINED)


def _apparmor_from_annotation(value: str) -> JSON | None:
    if value == APPARMOR_RUNTIME_DEFAULT:
        return {"type": "RuntimeDefault"}
    if value == APPARMOR_UNCONFINED:
        return {"type": "Unconfined"}
    if value.startswith(APPARMOR_LOCALHOST_PREFIX):
        return {"type": "Localhost", "localhostProfile": value[len(APPARMOR_LOCALHOST_PREFIX) :]}
    return None  # an invalid annotation counts as none


def apparmor_profile(pod: JSON, container: JSON) -> tuple[SecurityProfile | None, str]:
    """(the profile, its deprecated string form); (None, "") when nothing asks for one."""
    profile = (container.get("securityContext") or {}).get("appArmorProfile")
    if profile is None:
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        value = annotations.get(APPARMOR_ANNOTATION_PREFIX + str(container.get("name", "")))
        profile = _apparmor_from_annotation(str(value)) if value is not None else None
    if profile is None:
        profile = _pod_sc(pod).get("appArmorProfile")
    if profile is None:
        return None, ""
    kind = profile.get("type")
    if kind == "RuntimeDefault":
        return SecurityProfile(ProfileType.RUNTIME_DEFAULT), APPARMOR_RUNTIME_DEFAULT
    if kind == "Unconfined":
        return SecurityProfile(ProfileType.UNCONFINED), APPARMOR_UNCONFINED
    if kind == "Localhost":
        name = profile.get("localhostProfile")
        if name is None:
            raise SecurityConfigError("missing localhost apparmor profile name")
        return (
            SecurityProfile(ProfileType.LOCALHOST, str(name)),
            APPARMOR_LOCALHOST_PREFIX + str(name),
        )
    raise SecurityConfigError(f'unknown apparmor profile type: "{kind}"')


def _pod_ref(pod: JSON, container: JSON) -> str:
    meta = pod.get("metadata") or {}
    pod_name = f"{meta.get('name', '')}_{meta.get('namespace', 'default')}({meta.get('uid', '')})"
    return f'(pod: "{pod_name}", container: {container.get("name", "")})'


def verify_run_as_non_root(pod: JSON, container: JSON, user: ImageUser) -> None:
    """Raise with upstream's message when runAsNonRoot forbids what would run."""
    sc = effective_context(pod, container)
    if not sc.get("runAsNonRoot"):
        return
    ref = _pod_ref(pod, container)
    if sc.get("runAsUser") is not None:
        if int(sc["runAsUser"]) == 0:
            raise SecurityConfigError(f"container's runAsUser breaks non-root policy {ref}")
        return
    if user.uid is None:
        if user.username:
            raise SecurityConfigError(
                f"container has runAsNonRoot and image has non-numeric user ({user.username}), "
                f"cannot verify user is non-root {ref}"
            )
        return
    if user.uid == 0:
        raise SecurityConfigError(f"container has runAsNonRoot and image will run as root {ref}")
    if not 0 <= user.uid <= MAX_USER_ID:
        raise SecurityConfigError(
            f"container has runAsNonRoot and image has an invalid user id ({user.uid}). "
            f"(Must be 1-({MAX_USER_ID})): must be between 0 and {MAX_USER_ID}, inclusive "
            f"{ref}"
        )


def privilege_escalation_errors(container: JSON) -> list[str]:
    """The API server's checks on allowPrivilegeEscalation: false (its exact rule: only
    the literal `CAP_SYS_ADMIN` counts, as upstream validation compares it)."""
    sc = container.get("securityContext") or {}
    if sc.get("allowPrivilegeEscalation") is not False:
        return []
    errors = []
    if sc.get("privileged"):
        errors.append("cannot set `allowPrivilegeEscalation` to false and `privileged` to true")
    if "CAP_SYS_ADMIN" in ((sc.get("capabilities") or {}).get("add") or ()):
        errors.append(
            "cannot set `allowPrivilegeEscalation` to false and `capabilities.Add` CAP_SYS_ADMIN"
        )
    return errors


def container_security(
    pod: JSON,
    container: JSON,
    *,
    image: ImageUser | None,
    settings: SecuritySettings = SecuritySettings(),
) -> LinuxContainerSecurity:
    """The CRI security context of one container.

    `image` is the image's user from ImageStatus; None leaves the user to the runtime
    and checks runAsNonRoot only against an explicit runAsUser.
    """
    errors = privilege_escalation_errors(container)
    if errors:
        name = container.get("name", "")
        raise SecurityConfigError(
            f"invalid securityContext of container {name}: {'; '.join(errors)}"
        )
    verify_run_as_non_root(pod, container, image or ImageUser(uid=None))
    sc = effective_context(pod, container)
    seccomp = seccomp_profile(pod, container, settings)
    apparmor, apparmor_name = apparmor_profile(pod, container)
    run_as_user = _int_or_none(sc.get("runAsUser"))
    username = ""
    if run_as_user is None and image is not None:
        run_as_user, username = image.uid, image.username
    caps = sc.get("capabilities") or {}
    unmasked = sc.get("procMount") == "Unmasked"
    allow_escalation = sc.get("allowPrivilegeEscalation")
    return LinuxContainerSecurity(
        namespaces=namespaces(pod),
        run_as_user=run_as_user,
        run_as_username=username,
        run_as_group=_int_or_none(sc.get("runAsGroup")),
        supplemental_groups=supplemental_groups(pod),
        supplemental_groups_policy=supplemental_groups_policy(pod),
        privileged=bool(sc.get("privileged")),
        add_capabilities=tuple(str(c) for c in caps.get("add") or ()),
        drop_capabilities=tuple(str(c) for c in caps.get("drop") or ()),
        readonly_rootfs=bool(sc.get("readOnlyRootFilesystem")),
        no_new_privs=allow_escalation is False,
        masked_paths=() if unmasked else DEFAULT_MASKED_PATHS,
        readonly_paths=() if unmasked else DEFAULT_READONLY_PATHS,
        seccomp=seccomp,
        apparmor=apparmor,
        apparmor_profile=apparmor_name,
        selinux=_selinux(sc.get("seLinuxOptions")),
    )
