"""The labels and annotations upstream's kubelet puts on sandboxes and containers.

Using the same keys means `crictl` shows klet's pods the way operators know, and a
restarted syncloop (or an upstream kubelet, for that matter) can re-adopt what runs.
"""

from __future__ import annotations

POD_NAME = "io.kubernetes.pod.name"
POD_NAMESPACE = "io.kubernetes.pod.namespace"
POD_UID = "io.kubernetes.pod.uid"
CONTAINER_NAME = "io.kubernetes.container.name"
CONTAINER_TYPE = "io.kubernetes.container.type"  # upstream sets it to "container"
KUBELET_MANAGED = "io.kubernetes.container.managed-by"  # klet-only: which agent made it

CONTAINER_HASH = "io.kubernetes.container.hash"
CONTAINER_RESTART_COUNT = "io.kubernetes.container.restartCount"
TERMINATION_MESSAGE_PATH = "io.kubernetes.container.terminationMessagePath"
TERMINATION_MESSAGE_POLICY = "io.kubernetes.container.terminationMessagePolicy"
CONTAINER_PORTS = "io.kubernetes.container.ports"
CONTAINER_PRESTOP_HANDLER = "io.kubernetes.container.preStopHandler"  # JSON, for orphan kills
POD_TERMINATION_GRACE_PERIOD = "io.kubernetes.pod.terminationGracePeriod"
POD_DELETION_GRACE_PERIOD = "io.kubernetes.pod.deletionGracePeriod"

MANAGED_BY = "klet"


def sandbox_labels(
    *, name: str, namespace: str, uid: str, pod_labels: dict[str, str]
) -> dict[str, str]:
    """Pod labels plus the identity labels (the identity wins over a same-named pod label)."""
    labels = dict(pod_labels)
    labels.update(
        {POD_NAME: name, POD_NAMESPACE: namespace, POD_UID: uid, KUBELET_MANAGED: MANAGED_BY}
    )
    return labels


def container_labels(*, pod_name: str, namespace: str, uid: str, container: str) -> dict[str, str]:
    return {
        POD_NAME: pod_name,
        POD_NAMESPACE: namespace,
        POD_UID: uid,
        CONTAINER_NAME: container,
        CONTAINER_TYPE: "container",
        KUBELET_MANAGED: MANAGED_BY,
    }


def restart_count(annotations: dict[str, str]) -> int:
    try:
        return int(annotations.get(CONTAINER_RESTART_COUNT, "0"))
    except ValueError:
        return 0
