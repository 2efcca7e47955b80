"""Which CRI methods each reading service may call through the filtering proxy.

syncloop alone runs pods: it talks to the runtime directly. status-reporter (the
network-facing kubelet API), eviction and image-gc only read, or remove what is dead;
yet whoever can call CRI can start a privileged container (RunPodSandbox with a
privileged security context, CreateContainer mounting `/`), so a code-execution bug in
any of them would be root on the node. They therefore reach the runtime only through
klet.cri.proxy, which asks `refusal` for every call and forwards only what the caller's
list names; everything else — RunPodSandbox, CreateContainer, StartContainer,
UpdateRuntimeConfig, UpdateContainerResources, PullImage, a method CRI adds later — is
refused with PERMISSION_DENIED naming the method and the service.

The lists are what each service's code calls through klet.cri.RuntimeClient (its
wiring's managers, klet.stats' provider) plus the other read-only calls of the same
objects, so a reader that grows a new read does not fail on a node; a new write needs a
line here, which is the point. Pure: no I/O, under the "pure decisions" lint contract.
"""

from __future__ import annotations

from collections.abc import Mapping

RUNTIME = "runtime.v1.RuntimeService"
IMAGE = "runtime.v1.ImageService"

# Reads of the runtime's state and statistics: every reader may make them.
READS: frozenset[str] = frozenset(
    {
        f"/{RUNTIME}/Version",
        f"/{RUNTIME}/Status",
        f"/{RUNTIME}/RuntimeConfig",
        f"/{RUNTIME}/ListPodSandbox",
        f"/{RUNTIME}/PodSandboxStatus",
        f"/{RUNTIME}/ListContainers",
        f"/{RUNTIME}/ContainerStatus",
        f"/{RUNTIME}/ListContainerStats",
        f"/{RUNTIME}/ContainerStats",
        f"/{RUNTIME}/ListPodSandboxStats",
        f"/{RUNTIME}/PodSandboxStats",
        f"/{RUNTIME}/ListMetricDescriptors",
        f"/{RUNTIME}/ListPodSandboxMetrics",
        f"/{IMAGE}/ListImages",
        f"/{IMAGE}/ImageStatus",
        f"/{IMAGE}/ImageFsInfo",
    }
)

# The kubelet API's calls for its users (10250 authorizes each request first, as
# upstream's: nodes/proxy or nodes/checkpoint): exec, attach, port-forward, /run's
# ExecSync, and POST /checkpoint. Each acts in a container that already runs.
API_USER_CALLS: frozenset[str] = frozenset(
    {
        f"/{RUNTIME}/Exec",
        f"/{RUNTIME}/ExecSync",
        f"/{RUNTIME}/Attach",
        f"/{RUNTIME}/PortForward",
        f"/{RUNTIME}/CheckpointContainer",
    }
)

# Image and container garbage collection: removing images, and stopping then removing
# dead containers and sandboxes. Destructive, but nothing it allows makes or starts a
# container.
GC_CALLS: frozenset[str] = frozenset(
    {
        f"/{IMAGE}/RemoveImage",
        f"/{RUNTIME}/StopContainer",
        f"/{RUNTIME}/RemoveContainer",
        f"/{RUNTIME}/StopPodSandbox",
        f"/{RUNTIME}/RemovePodSandbox",
    }
)

ALLOWED: Mapping[str, frozenset[str]] = {
    "status-reporter": READS | API_USER_CALLS,
    "eviction": READS,
    "image-gc": READS | GC_CALLS,
}

# The services that reach the runtime through the proxy (syncloop and pod-source do not).
FILTERED_SERVICES: tuple[str, ...] = tuple(ALLOWED)


def refusal(service: str, method: str) -> str | None:
    """None when `service` may call the full gRPC `method` (`/runtime.v1.RuntimeService/
    ListContainers`); otherwise the message the caller gets with PERMISSION_DENIED."""
    allowed = ALLOWED.get(service)
    if allowed is None:
        return f"CRI method {method} refused: klet's CRI proxy has no allow-list for {service!r}"
    if method in allowed:
        return None
    return (
        f"CRI method {method} refused for {service}: klet's CRI proxy passes it only "
        "the calls in klet.cri.allowlist (reads"
        + {
            "status-reporter": ", exec/attach/port-forward/checkpoint for API users",
            "image-gc": ", image and dead-container removal",
        }.get(service, "")
        + ")"
    )
