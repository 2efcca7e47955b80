"""Where things live on a node: the names every service and `klet up` agree on.

Pure names and paths, no I/O; the directories they sit in come from settings
(`--run-dir`, `--root-dir`, `podLogsDir`).

- Service ports: each service's private `/healthz`, `/readyz` and `/metrics` port when
  `--service-port` is not given (upstream has none: the kubelet is one process);
  `--service-port=0` lets the kernel pick a free one, so replicas sharing the host's
  network do not collide.
- Port files: every replica says where its service port listens in
  `<run-dir>/ports/<service>/<hostname>-<pid>-<token>.json` (klet.portfiles writes and reads
  them), so operators and scrapers find replicas on ephemeral ports.
- Lease slots: each service's replica and leader slot files (klet.bus.holder,
  klet.bus.leaderslot) in a directory of its own, `<run-dir>/leases/<service>/`, so a
  deployment can mount each service its own and no service can lock another's slot.
- Sockets under the run directory: each of the project's gRPC APIs in a directory of
  its server's own, `<run-dir>/grpc/<service>/<service>.sock` (mode 0700, see
  `klet.rpc.unixserver`), so a deployment can mount each client the directories of the
  sockets it calls and no others (image-gc, which serves GarbageCollector, never sees
  syncloop's PodControl); the private Redis of `klet up` in `<run-dir>/redis/redis.sock`.
- Pod cgroups (cgroupfs names, as upstream's QoS container manager makes them):
  Guaranteed pods directly under `<cgroupRoot>/kubepods` (`/kubepods` for the
  default root), the others under `.../kubepods/{burstable,besteffort}`, each in
  `pod<uid>`.
- Pod directories under the root directory: `<root-dir>/pods/<uid>` (volumes,
  container termination logs, the managed /etc/hosts), as upstream's `getPodDir`.
- Pod log directories: `<podLogsDir>/<namespace>_<name>_<uid>` (upstream's
  `BuildPodLogsDirectory`); a pod's name and namespace cannot contain `_`, so the UID
  can be read back from the name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from klet.model.podresources import SOCKET_DIR as POD_RESOURCES_DIR
from klet.model.podresources import SOCKET_NAME as POD_RESOURCES_SOCKET

DEFAULT_SERVICE_PORTS: Mapping[str, int] = MappingProxyType(
    {
        "pod-source": 10260,
        "syncloop": 10261,
        "status-reporter": 10262,
        "eviction": 10263,
        "image-gc": 10264,
    }
)


def resolve_service_port(service: str, port: int | None) -> int:
    """The port `service` listens on: `port` when given (0 = any free port), else its
    default. Raises KeyError for an unknown service."""
    return DEFAULT_SERVICE_PORTS[service] if port is None else port


PORTS_DIR = "ports"

LEASES_DIR = "leases"

GRPC_SOCKET_DIR = "grpc"
SYNCLOOP = "syncloop"
"""Serves PodControl."""
IMAGE_GC = "image-gc"
"""Serves GarbageCollector."""
EVICTION = "eviction"
"""Serves Eviction (DryRun)."""
GRPC_SERVERS = (SYNCLOOP, EVICTION, IMAGE_GC)
"""The services that serve a gRPC API (pod-source and status-reporter serve none)."""

CRI_PROXY_DIR = "cri"
"""The CRI allow-list proxy's sockets, one per reading service (klet.cri.proxy)."""

PODS_DIR = "pods"

REDIS_DIR = "redis"
REDIS_SOCKET = "redis.sock"

KUBEPODS = "/kubepods"
QOS_GUARANTEED = "Guaranteed"
_QOS_PARENTS = ("burstable", "besteffort")


DEVICE_PLUGINS_DIR = "device-plugins"
"""Under the root dir, as upstream's DevicePluginPath: the registration socket
`kubelet.sock` and the plugins' own sockets."""
DEVICE_PLUGINS_SOCKET = "kubelet.sock"

UNIX_PATH_MAX = 107
"""The longest path a unix socket can be bound at: sun_path holds 108 bytes, the last
one the terminating NUL."""


def served_sockets(run_dir: Path, root_dir: Path) -> list[Path]:
    """Every unix socket klet's services and `klet up` listen on, under the run and root
    directories (settings refuse directories whose sockets would not fit UNIX_PATH_MAX:
    a bind would fail only when the service got there, and end it)."""
    services = sorted(DEFAULT_SERVICE_PORTS)
    return [
        *(grpc_socket(run_dir, s) for s in GRPC_SERVERS),
        *(cri_proxy_socket(run_dir, s) for s in services),
        redis_socket(run_dir),
        root_dir / DEVICE_PLUGINS_DIR / DEVICE_PLUGINS_SOCKET,
        root_dir / POD_RESOURCES_DIR / POD_RESOURCES_SOCKET,
    ]


def grpc_socket_dir(run_dir: Path, service: str) -> Path:
    """The directory of `service`'s gRPC socket, its alone: `<run-dir>/grpc/<service>`."""
    return run_dir / GRPC_SOCKET_DIR / service


def grpc_socket(run_dir: Path, service: str) -> Path:
    """The unix socket `service` serves its gRPC API on:
    `<run-dir>/grpc/<service>/<service>.sock`."""
    return grpc_socket_dir(run_dir, service) / f"{service}.sock"


def cri_proxy_socket(run_dir: Path, service: str) -> Path:
    """Where the CRI proxy serves `service`: `<run-dir>/cri/<service>.sock`."""
    return run_dir / CRI_PROXY_DIR / f"{service}.sock"


def port_files_dir(run_dir: Path, service: str) -> Path:
    """Where the replicas of `service` publish their port files: `<run-dir>/ports/<service>`."""
    return run_dir / PORTS_DIR / service


def lease_slots_dir(run_dir: Path, service: str) -> Path:
    """The directory of `service`'s lease slots: `<run-dir>/leases/<service>`."""
    return run_dir / LEASES_DIR / service


def holder_slot(run_dir: Path, service: str) -> Path:
    """`service`'s replica slot (klet.bus.holder): `<run-dir>/leases/<service>/holder`."""
    return lease_slots_dir(run_dir, service) / "holder"


def leader_slot(run_dir: Path, service: str) -> Path:
    """`service`'s leader slot (klet.bus.leaderslot): `<run-dir>/leases/<service>/leader`."""
    return lease_slots_dir(run_dir, service) / "leader"


def replica_name(hostname: str, pid: int, token: str) -> str:
    """A replica's name in port file names: `<hostname>-<pid>-<token>`, the hostname
    reduced to characters safe in a file name. The token is the process's own random
    one: replicas in containers of their own PID namespace on the host's network share
    the hostname and are all pid 1."""
    host = re.sub(r"[^A-Za-z0-9._-]", "_", hostname).lstrip(".") or "host"
    return f"{host}-{pid}-{token}"


def port_file(run_dir: Path, service: str, replica: str) -> Path:
    """The port file of one replica: `<run-dir>/ports/<service>/<replica>.json`."""
    return port_files_dir(run_dir, service) / f"{replica}.json"


def redis_socket(run_dir: Path) -> Path:
    """The private Redis's unix socket: `<run-dir>/redis/redis.sock`."""
    return run_dir / REDIS_DIR / REDIS_SOCKET


def pods_dir(root_dir: Path) -> Path:
    return root_dir / PODS_DIR


def pod_dir(root_dir: Path, uid: str) -> Path:
    """A pod's directory; `uid` must already be a safe path component."""
    return pods_dir(root_dir) / uid


def kubepods(cgroup_root: str) -> str:
    """The cgroup all pods go under: `<cgroupRoot>/kubepods` (`/kubepods` for the
    default root, "" or "/"), as upstream names it for either cgroup driver."""
    return cgroup_root.rstrip("/") + KUBEPODS


def pod_cgroup(uid: str, qos_class: str, cgroup_root: str) -> str:
    """The cgroup of a pod of `qos_class` (Guaranteed, Burstable, BestEffort)."""
    top = kubepods(cgroup_root)
    if qos_class == QOS_GUARANTEED:
        return f"{top}/pod{uid}"
    return f"{top}/{qos_class.lower()}/pod{uid}"


def node_cgroups(cgroup_root: str) -> tuple[str, ...]:
    """The cgroups above the pods': `<cgroupRoot>/kubepods` and its QoS parents."""
    top = kubepods(cgroup_root)
    return (top, *(f"{top}/{q}" for q in _QOS_PARENTS))


def pod_cgroup_candidates(uid: str, cgroup_root: str) -> tuple[str, ...]:
    """Every cgroup a pod may have, for a reader that does not know its QoS class."""
    top = kubepods(cgroup_root)
    return (f"{top}/pod{uid}", *(f"{top}/{q}/pod{uid}" for q in _QOS_PARENTS))


def pod_log_dir_name(namespace: str, name: str, uid: str) -> str:
    """A pod's log directory under podLogsDir."""
    return f"{namespace}_{name}_{uid}"


def pod_log_dir_uid(dir_name: str) -> str:
    """The pod UID of a pod log directory name ("" if the name is not one)."""
    parts = dir_name.split("_")
    return parts[2] if len(parts) == 3 and all(parts) else ""
