"""What the PodResources API (podresources v1) answers, as pure values and decisions.

syncloop's leader serves the API (`klet.syncloop.podresources` gathers the pods and
the device manager's allocations, `klet.rpc.podresources` is the wire); the shape of
each answer is decided here, after upstream's server (pkg/kubelet/apis/podresources):

- A pod lists its regular containers and its restartable (sidecar) init containers,
  sidecars first, as upstream; init containers that run to completion are left out.
- Devices are listed one per entry, one entry per NUMA node the device sits on, or
  one entry without topology when its plugin reported none (upstream's
  containerDevicesFromResourceDeviceInstances). Upstream walks Go maps, so its order
  is unspecified; klet sorts by resource, device and node so answers are stable.
- The rate limit is upstream's token bucket (golang.org/x/time/rate) with its
  DefaultQPS 100 and DefaultBurstTokens 10: a full bucket at start, one token per call,
  a refusal when none is left. Time is an argument, so the bucket is tested without
  waiting.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from klet.model.devices import HEALTHY, Device
from klet.model.types import JSON

DEFAULT_QPS = 100.0
"""upstream's podresources.DefaultQPS."""
DEFAULT_BURST = 10
"""upstream's podresources.DefaultBurstTokens."""
NO_NUMA = -1
"""The NUMA key of devices without topology in the device checkpoint (upstream's
nodeWithoutTopology)."""
SOCKET_DIR = "pod-resources"
"""Under the root dir, as upstream's getPodResourcesDir."""
SOCKET_NAME = "kubelet.sock"
"""upstream's podresources.Socket ("kubelet") as a unix endpoint."""
RATE_LIMITED = "rejected by rate limit"
"""upstream's ErrorLimitExceeded message (code ResourceExhausted)."""
GET_DISABLED = "PodResources API Get method disabled"


def pod_not_found(namespace: str, name: str) -> str:
    """upstream's Get error for a pod the node does not have."""
    return f"pod {name} in namespace {namespace} not found"


@dataclass(frozen=True)
class ContainerDevices:
    """One device of one resource, on one NUMA node (None: no topology reported)."""

    resource: str
    device_id: str
    numa_node: int | None = None


@dataclass(frozen=True)
class ContainerMemory:
    memory_type: str
    size: int
    numa_nodes: tuple[int, ...] = ()


@dataclass(frozen=True)
class ClaimResource:
    """One device a DRA driver prepared for a claim, with the CDI devices upstream's
    answer lists beside it (see DynamicResource)."""

    driver_name: str
    pool_name: str
    device_name: str
    cdi_devices: tuple[str, ...] = ()


@dataclass(frozen=True)
class DynamicResource:
    """A prepared ResourceClaim a container uses (upstream's DynamicResource)."""

    claim_name: str
    claim_namespace: str
    claim_resources: tuple[ClaimResource, ...] = ()


@dataclass(frozen=True)
class ContainerResources:
    name: str
    devices: tuple[ContainerDevices, ...] = ()
    cpu_ids: tuple[int, ...] = ()
    memory: tuple[ContainerMemory, ...] = ()
    dynamic_resources: tuple[DynamicResource, ...] = ()


@dataclass(frozen=True)
class PodResources:
    name: str
    namespace: str
    containers: tuple[ContainerResources, ...] = ()


@dataclass(frozen=True)
class AllocatableResources:
    devices: tuple[ContainerDevices, ...] = ()
    cpu_ids: tuple[int, ...] = ()
    memory: tuple[ContainerMemory, ...] = ()


NumaDevices = Mapping[int, Sequence[str] | None]
"""A checkpoint entry's devices: NUMA node (NO_NUMA: none) to device IDs."""
DevicesOf = Callable[[str, str], Mapping[str, NumaDevices]]
"""(pod UID, container name) -> the devices it holds, by resource."""
CpusOf = Callable[[str, str], Sequence[int]]
"""(pod UID, container name) -> its exclusive CPUs."""


def listed_containers(pod: JSON) -> list[str]:
    """The containers a pod's answer names: restartable init containers, then the
    regular ones (upstream's List and Get)."""
    spec = pod.get("spec") or {}
    sidecars = [
        str(c.get("name"))
        for c in spec.get("initContainers") or []
        if c.get("restartPolicy") == "Always"
    ]
    return sidecars + [str(c.get("name")) for c in spec.get("containers") or []]


def held_devices(held: Mapping[str, NumaDevices]) -> tuple[ContainerDevices, ...]:
    """A container's devices (by resource, then NUMA node) as the answer's entries. A
    device on several NUMA nodes gets one entry per node; NO_NUMA gives no topology."""
    out = {
        ContainerDevices(resource, device, None if node == NO_NUMA else node)
        for resource, by_node in held.items()
        for node, ids in by_node.items()
        for device in ids or ()
    }
    return tuple(sorted(out, key=_device_key))


def allocatable_devices(devices: Mapping[str, Iterable[Device]]) -> tuple[ContainerDevices, ...]:
    """The healthy devices of every resource (upstream's GetAllocatableDevices: all
    devices filtered by health), one entry per NUMA node each."""
    out = [
        ContainerDevices(resource, d.id, node)
        for resource, listed in devices.items()
        for d in listed
        if d.health == HEALTHY
        for node in (d.numa_nodes or (None,))
    ]
    return tuple(sorted(set(out), key=_device_key))


def _device_key(d: ContainerDevices) -> tuple[str, str, int]:
    return (d.resource, d.device_id, -1 if d.numa_node is None else d.numa_node)


def pod_resources(pod: JSON, *, devices_of: DevicesOf, cpus_of: CpusOf) -> PodResources:
    """One pod's answer."""
    meta = pod.get("metadata") or {}
    uid = str(meta.get("uid") or "")
    return PodResources(
        name=str(meta.get("name") or ""),
        namespace=str(meta.get("namespace") or ""),
        containers=tuple(
            ContainerResources(
                name=name,
                devices=held_devices(devices_of(uid, name)),
                cpu_ids=tuple(sorted(cpus_of(uid, name))),
            )
            for name in listed_containers(pod)
        ),
    )


def find_pod(pods: Iterable[JSON], namespace: str, name: str) -> JSON | None:
    """The pod named namespace/name (upstream's GetPodByName), or None."""
    for pod in pods:
        meta = pod.get("metadata") or {}
        if meta.get("namespace") == namespace and meta.get("name") == name:
            return pod
    return None


@dataclass
class TokenBucket:
    """upstream's rate.Limiter as its Allow() uses it: `burst` tokens at start, `qps`
    added per second up to `burst`, one taken per allowed call."""

    qps: float = DEFAULT_QPS
    burst: int = DEFAULT_BURST
    _tokens: float | None = field(default=None, repr=False)
    _last: float = field(default=0.0, repr=False)

    def allow(self, now: float) -> bool:
        """Whether a call at monotonic time `now` may proceed (and takes its token)."""
        if self._tokens is None:
            self._tokens = float(self.burst)
        else:
            elapsed = max(0.0, now - self._last)
            self._tokens = min(float(self.burst), self._tokens + elapsed * self.qps)
        self._last = max(self._last, now)
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False
