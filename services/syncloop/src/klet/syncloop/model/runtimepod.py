"""What the runtime has for one pod, grouped from CRI by the upstream labels.

Built by the runtime adapter (runtime.py) and read by the pure decision functions; the
newest sandbox and the newest instance of each container come first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from klet.cri import labels as L
from klet.cri.types import ContainerState, ContainerStatusInfo, SandboxState
from klet.model.types import SandboxID
from klet.syncloop.model import podspec


@dataclass(frozen=True)
class SandboxView:
    id: SandboxID
    attempt: int
    state: SandboxState
    created_at: int
    ip: str = ""
    ips: tuple[str, ...] = ()
    host_network: bool = False


@dataclass(frozen=True)
class RuntimePod:
    uid: str
    sandboxes: tuple[SandboxView, ...] = ()  # newest first
    containers: tuple[ContainerStatusInfo, ...] = ()  # newest first per name

    @property
    def empty(self) -> bool:
        return not self.sandboxes and not self.containers

    def latest_sandbox(self) -> SandboxView | None:
        return self.sandboxes[0] if self.sandboxes else None

    def instances(self, name: str) -> list[ContainerStatusInfo]:
        """All instances of a container, newest first."""
        return [c for c in self.containers if c.name == name]

    def latest(self, name: str) -> ContainerStatusInfo | None:
        found = self.instances(name)
        return found[0] if found else None

    def running(self) -> list[ContainerStatusInfo]:
        return [c for c in self.containers if c.state == ContainerState.RUNNING]


def pod_ip_of(current: RuntimePod) -> str:
    """The IP of the pod's newest sandbox ("" when it has none, or uses the host network)."""
    latest = current.latest_sandbox()
    return latest.ip if latest is not None else ""


def hash_of(c: ContainerStatusInfo) -> str:
    return c.annotations.get(L.CONTAINER_HASH, "")


def restart_count_of(c: ContainerStatusInfo) -> int:
    return L.restart_count(c.annotations)


def sort_newest_first(statuses: list[ContainerStatusInfo]) -> tuple[ContainerStatusInfo, ...]:
    return tuple(sorted(statuses, key=lambda c: (c.created_at, c.attempt), reverse=True))


@dataclass
class PullState:
    """Image-pull outcome per container name, fed into the status (ErrImagePull ...)."""

    waiting: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (reason, message)


def recorded_grace(current: RuntimePod) -> int:
    """The largest terminationGracePeriodSeconds recorded on the pod's containers."""
    values = []
    for c in current.containers:
        try:
            values.append(int(c.annotations.get(L.POD_TERMINATION_GRACE_PERIOD, "")))
        except ValueError:
            continue
    return max(values, default=podspec.MINIMUM_GRACE_PERIOD_S)
