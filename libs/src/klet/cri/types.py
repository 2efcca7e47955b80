"""Plain value types for what the agent sends to and reads from a CRI runtime.

Services build and read these; only `klet.cri.client` converts them to and from the
generated CRI messages, so the protobuf layer stops at the adapter (STYLE.md rule 19).
Times are nanoseconds since the epoch, as CRI reports them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from klet.model.types import ContainerID, ImageRef, SandboxID


class SandboxState(Enum):
    READY = "SANDBOX_READY"
    NOTREADY = "SANDBOX_NOTREADY"


class ContainerState(Enum):
    CREATED = "CONTAINER_CREATED"
    RUNNING = "CONTAINER_RUNNING"
    EXITED = "CONTAINER_EXITED"
    UNKNOWN = "CONTAINER_UNKNOWN"


@dataclass(frozen=True)
class Sandbox:
    id: SandboxID
    name: str
    namespace: str
    uid: str
    attempt: int
    state: SandboxState
    created_at: int
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SandboxStatusInfo:
    id: SandboxID
    state: SandboxState
    created_at: int
    ip: str
    additional_ips: tuple[str, ...] = ()
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Container:
    id: ContainerID
    sandbox_id: SandboxID
    name: str
    attempt: int
    image: str
    image_ref: str
    state: ContainerState
    created_at: int
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ContainerStatusInfo:
    id: ContainerID
    name: str
    attempt: int
    state: ContainerState
    created_at: int
    started_at: int
    finished_at: int
    exit_code: int
    image: str
    image_ref: str
    reason: str
    message: str
    log_path: str
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    """The container's mounts as the runtime reports them (the termination-log file is one)."""


@dataclass(frozen=True)
class ImageInfo:
    id: ImageRef
    repo_tags: tuple[str, ...]
    repo_digests: tuple[str, ...]
    size: int
    pinned: bool = False
    uid: int | None = None
    """The image's configured user when it is numeric (CRI `Image.uid`), else None."""
    username: str = ""
    """The image's configured user when it is a name (CRI `Image.username`)."""


@dataclass(frozen=True)
class AuthConfig:
    """Registry credentials for one PullImage (CRI AuthConfig); empty fields are unset.

    `auth` is the docker config's base64 `user:password`; the kubelet itself fills only
    `username` and `password` from its keyring, as upstream does.
    """

    username: str = ""
    password: str = ""
    auth: str = ""
    server_address: str = ""
    identity_token: str = ""
    registry_token: str = ""


@dataclass(frozen=True)
class PortMapping:
    container_port: int
    host_port: int = 0
    host_ip: str = ""
    protocol: str = "TCP"


class MountPropagation(Enum):
    """CRI MountPropagation: how mounts below a bind mount travel between host and container."""

    PRIVATE = "PROPAGATION_PRIVATE"
    HOST_TO_CONTAINER = "PROPAGATION_HOST_TO_CONTAINER"
    BIDIRECTIONAL = "PROPAGATION_BIDIRECTIONAL"


@dataclass(frozen=True)
class Mount:
    container_path: str
    host_path: str
    readonly: bool = False
    propagation: MountPropagation = MountPropagation.PRIVATE
    selinux_relabel: bool = False


@dataclass(frozen=True)
class Device:
    """A host device node handed to a container (CRI `Device`): a raw block volume."""

    container_path: str
    host_path: str
    permissions: str = "mrw"  # cgroup device access: mknod, read, write


@dataclass(frozen=True)
class DNSConfig:
    servers: tuple[str, ...] = ()
    searches: tuple[str, ...] = ()
    options: tuple[str, ...] = ()


class NamespaceMode(Enum):
    """CRI NamespaceMode: whose namespace a container joins (TARGET: another
    container's, named by `NamespaceOptions.target_id`; an ephemeral container's PID
    namespace when it targets a container)."""

    POD = "POD"
    CONTAINER = "CONTAINER"
    NODE = "NODE"
    TARGET = "TARGET"


@dataclass(frozen=True)
class NamespaceOptions:
    network: NamespaceMode = NamespaceMode.POD
    pid: NamespaceMode = NamespaceMode.CONTAINER
    ipc: NamespaceMode = NamespaceMode.POD
    target_id: str = ""
    """The container whose namespace a TARGET mode joins; empty otherwise."""


class ProfileType(Enum):
    """CRI SecurityProfile.ProfileType, for seccomp and AppArmor."""

    RUNTIME_DEFAULT = "RuntimeDefault"
    UNCONFINED = "Unconfined"
    LOCALHOST = "Localhost"


@dataclass(frozen=True)
class SecurityProfile:
    type: ProfileType
    localhost_ref: str = ""


@dataclass(frozen=True)
class SELinuxOptions:
    user: str = ""
    role: str = ""
    type: str = ""
    level: str = ""


@dataclass(frozen=True)
class LinuxSandboxSecurity:
    """CRI LinuxSandboxSecurityContext: what the sandbox (pause) process runs with."""

    namespaces: NamespaceOptions = NamespaceOptions()
    run_as_user: int | None = None
    run_as_group: int | None = None
    supplemental_groups: tuple[int, ...] = ()
    supplemental_groups_policy: str = "Merge"
    """CRI SupplementalGroupsPolicy name: "Merge" or "Strict"."""
    privileged: bool = False
    seccomp: SecurityProfile | None = None
    selinux: SELinuxOptions | None = None


@dataclass(frozen=True)
class LinuxContainerSecurity:
    """CRI LinuxContainerSecurityContext. None and empty fields are left out of the
    request, so the runtime applies its own default for them."""

    namespaces: NamespaceOptions = NamespaceOptions()
    run_as_user: int | None = None
    run_as_username: str = ""
    run_as_group: int | None = None
    supplemental_groups: tuple[int, ...] = ()
    supplemental_groups_policy: str = "Merge"
    privileged: bool = False
    add_capabilities: tuple[str, ...] = ()
    drop_capabilities: tuple[str, ...] = ()
    readonly_rootfs: bool = False
    no_new_privs: bool = False
    masked_paths: tuple[str, ...] = ()
    readonly_paths: tuple[str, ...] = ()
    seccomp: SecurityProfile | None = None
    apparmor: SecurityProfile | None = None
    apparmor_profile: str = ""
    """The deprecated string form of `apparmor`, for runtimes that only read that."""
    selinux: SELinuxOptions | None = None


@dataclass(frozen=True)
class SandboxConfig:
    name: str
    namespace: str
    uid: str
    attempt: int
    hostname: str
    log_directory: str
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    port_mappings: tuple[PortMapping, ...] = ()
    cgroup_parent: str = ""
    dns: DNSConfig | None = None
    host_network: bool = False
    host_pid: bool = False
    host_ipc: bool = False
    security: LinuxSandboxSecurity | None = None
    """The sandbox's security context; None keeps the namespaces from the host_* flags."""
    sysctls: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class LinuxResources:
    cpu_shares: int = 0
    cpu_quota: int = 0
    cpu_period: int = 0
    memory_limit_bytes: int = 0
    oom_score_adj: int = 0
    memory_swap_limit_bytes: int = 0
    """Memory plus swap (cgroup v1 memory.memsw.limit_in_bytes); 0 = not set."""
    hugepage_limits: tuple[tuple[str, int], ...] = ()
    """(page size as the runtime names it, "2MB" or "1GB"; limit in bytes)."""
    unified: dict[str, str] = field(default_factory=dict)
    """cgroup v2 files by name (memory.swap.max)."""
    cpuset_cpus: str = ""
    """The CPUs the container may run on (`0-1,3`); "" leaves the runtime's (all)."""
    cpuset_mems: str = ""
    """The NUMA nodes of its memory (`0` or `0-1`); "" leaves the runtime's (all)."""


@dataclass(frozen=True)
class ContainerConfig:
    name: str
    attempt: int
    image: str
    command: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    working_dir: str = ""
    envs: tuple[tuple[str, str], ...] = ()
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    log_path: str = ""
    mounts: tuple[Mount, ...] = ()
    devices: tuple[Device, ...] = ()
    stdin: bool = False
    stdin_once: bool = False
    tty: bool = False
    resources: LinuxResources | None = None
    security: LinuxContainerSecurity | None = None
    stop_signal: str = ""
    """lifecycle.stopSignal (`SIGUSR1`, `SIGRTMIN+1`, ...); empty leaves the image's."""
    cdi_devices: tuple[str, ...] = ()
    """Fully qualified CDI device names (`vendor.com/class=name`), from device plugins."""


@dataclass(frozen=True)
class RuntimeCondition:
    type: str
    status: bool
    reason: str = ""
    message: str = ""


@dataclass(frozen=True)
class RuntimeVersion:
    runtime_name: str
    runtime_version: str
    runtime_api_version: str


@dataclass(frozen=True)
class FilesystemUsageInfo:
    """One filesystem the runtime uses (ImageFsInfo). Absent CRI values are None."""

    timestamp_ns: int
    mountpoint: str
    used_bytes: int | None
    inodes_used: int | None


@dataclass(frozen=True)
class ContainerStatsInfo:
    """One container's resource usage (ListContainerStats). Absent CRI values are None."""

    id: ContainerID
    name: str
    attempt: int
    labels: dict[str, str]
    annotations: dict[str, str]
    cpu_timestamp_ns: int
    cpu_usage_core_ns: int | None
    cpu_usage_nano_cores: int | None
    memory_timestamp_ns: int
    memory_working_set_bytes: int | None
    memory_usage_bytes: int | None
    memory_rss_bytes: int | None
    memory_available_bytes: int | None
    writable_layer: FilesystemUsageInfo | None


# -- runtime events (klet.cri.containerevents) ------------------------------------------------


class EventKind(Enum):
    CREATED = "created"
    STARTED = "started"
    EXITED = "exited"
    OOM = "oom"
    DELETED = "deleted"


@dataclass(frozen=True)
class RuntimeEvent:
    """Something happened to a sandbox or container.

    `object_id` is a CRI container ID or sandbox ID (containerd's events do not say
    which); `pod_uid` is set when the runtime said (CRI events carry the sandbox's
    status), else "". `at` is the runtime's Unix time of the event, 0 when unknown.
    """

    kind: EventKind
    object_id: str
    topic: str
    pod_uid: str = ""
    exit_status: int | None = None
    at: float = 0.0


@dataclass(frozen=True)
class Subscribed:
    """The subscription is open; `source` is "cri" or "containerd"."""

    source: str
