"""Pure helpers over a pod's API JSON: container hash, grace periods, log paths, QoS.

The container hash decides whether a running container still matches its spec; it
must stay stable across klet releases (an unstable hash restarts every container on
upgrade, upstream issue 63814), so it covers an explicit, versioned allow-list of
fields and is stored as `v1:<hex>`.
"""

from __future__ import annotations

import hashlib
import json

from klet.model import layout
from klet.model import pod as podmodel
from klet.model.podvalidation import checked_component
from klet.model.types import JSON

HASH_VERSION = "v1"
_HASHED_FIELDS = (
    "name",
    "image",
    "command",
    "args",
    "workingDir",
    "env",
    "envFrom",
    "ports",
    "stdin",
    "stdinOnce",
    "tty",
)

MINIMUM_GRACE_PERIOD_S = 2
DEFAULT_GRACE_PERIOD_S = 30


def container_hash(container: JSON) -> str:
    subset = {
        k: container[k]
        for k in _HASHED_FIELDS
        if k in container and container[k] not in (None, [], "")
    }
    digest = hashlib.sha256(
        json.dumps(subset, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()
    return f"{HASH_VERSION}:{digest[:16]}"


def containers(pod: JSON) -> list[JSON]:
    return list(pod.get("spec", {}).get("containers") or [])


def init_containers(pod: JSON) -> list[JSON]:
    return list(pod.get("spec", {}).get("initContainers") or [])


def ephemeral_containers(pod: JSON) -> list[JSON]:
    """The pod's ephemeral (debug) containers, added through pods/ephemeralcontainers."""
    return list(pod.get("spec", {}).get("ephemeralContainers") or [])


def is_sidecar(container: JSON) -> bool:
    """A restartable init container (`restartPolicy: Always`): upstream's sidecar."""
    return container.get("restartPolicy") == "Always"


def field_path(pod: JSON, name: str) -> str:
    """An event's fieldPath for a container: spec.containers{x}, spec.initContainers{x}
    or spec.ephemeralContainers{x}."""
    if any(c.get("name") == name for c in init_containers(pod)):
        return f"spec.initContainers{{{name}}}"
    if any(c.get("name") == name for c in ephemeral_containers(pod)):
        return f"spec.ephemeralContainers{{{name}}}"
    return f"spec.containers{{{name}}}"


def meta(pod: JSON) -> JSON:
    m: JSON = pod.get("metadata") or {}
    return m


def restart_policy(pod: JSON) -> str:
    return str(pod.get("spec", {}).get("restartPolicy") or "Always")


def grace_period_s(pod: JSON, override: int | None = None) -> int:
    """Seconds a container gets between SIGTERM and SIGKILL, as upstream's killContainer.

    An override (eviction, a PodControl.KillPod, a probe's grace) and the deletion's
    grace each win over the spec's; with both, the smaller (upstream only ever shortens
    a pod's grace period); never below upstream's 2 s minimum.
    """
    given = [
        int(g) for g in (override, meta(pod).get("deletionGracePeriodSeconds")) if g is not None
    ]
    if given:
        grace = min(given)
    else:
        spec_grace = pod.get("spec", {}).get("terminationGracePeriodSeconds")
        grace = DEFAULT_GRACE_PERIOD_S if spec_grace is None else int(spec_grace)
    return max(grace, MINIMUM_GRACE_PERIOD_S)


def deletion_grace_s(pod: JSON) -> int:
    """A deleted pod's grace: deletionGracePeriodSeconds as the apiserver set it (upstream
    treats it as the truth, longer than the spec's or not), else the spec's; floor 2 s."""
    deletion = meta(pod).get("deletionGracePeriodSeconds")
    if deletion is None:
        spec_grace = pod.get("spec", {}).get("terminationGracePeriodSeconds")
        grace = DEFAULT_GRACE_PERIOD_S if spec_grace is None else int(spec_grace)
    else:
        grace = int(deletion)
    return max(grace, MINIMUM_GRACE_PERIOD_S)


DEADLINE_EXCEEDED = (
    "DeadlineExceeded",
    "Pod was active on the node longer than the specified deadline",
)


def deadline_at(pod: JSON, started_at: float | None) -> float | None:
    """When spec.activeDeadlineSeconds runs out for a pod active since `started_at`."""
    deadline = pod.get("spec", {}).get("activeDeadlineSeconds")
    if deadline is None or started_at is None:
        return None
    return started_at + int(deadline)


def pod_log_dir_name(pod: JSON) -> str:
    m = meta(pod)
    name = layout.pod_log_dir_name(
        str(m.get("namespace", "default")), str(m.get("name", "")), str(m.get("uid", ""))
    )
    return checked_component(name, what="pod log directory")


def backoff_key(pod: JSON, container: JSON) -> str:
    m = meta(pod)
    pod_part = f"{m.get('namespace')}_{m.get('name')}_{m.get('uid')}"
    return f"{pod_part}_{container.get('name')}_{container_hash(container)}"


def image_pull_policy(container: JSON) -> str:
    policy = container.get("imagePullPolicy")
    if policy:
        return str(policy)
    image = str(container.get("image", ""))
    last = image.rsplit("/", 1)[-1]
    if "@" in last:
        return "IfNotPresent"
    tag = last.split(":", 1)[1] if ":" in last else "latest"
    return "Always" if tag == "latest" else "IfNotPresent"


def qos_class(pod: JSON) -> str:
    """Guaranteed, Burstable or BestEffort, as upstream's GetPodQOS (`klet.model.pod`:
    cpu and memory, pod-level resources where set, the API's own class when given)."""
    return podmodel.qos_class(pod)


def pod_cgroup_parent(pod: JSON, cgroup_root: str) -> str:
    """The pod's cgroup by its QoS class under `<cgroupRoot>/kubepods`
    (`klet.model.layout.pod_cgroup`)."""
    return layout.pod_cgroup(str(meta(pod).get("uid", "")), qos_class(pod), cgroup_root)
