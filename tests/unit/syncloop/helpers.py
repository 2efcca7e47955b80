"""Builders of pods and runtime state for syncloop's pure-function tests."""

from __future__ import annotations

from typing import Any

from klet.cri import labels as L
from klet.cri.types import ContainerState, ContainerStatusInfo, SandboxState
from klet.model.types import ContainerID, SandboxID
from klet.syncloop import podspec
from klet.syncloop.runtimepod import RuntimePod, SandboxView, sort_newest_first

S = 1_000_000_000  # ns per second


def pod(*names: str, policy: str = "Always", uid: str = "u1", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web-node1", "namespace": "default", "uid": uid},
        "spec": {
            "restartPolicy": policy,
            "containers": [{"name": n, "image": "registry.klet.test/busybox:1.36"} for n in names],
            **spec,
        },
    }


def ctr(
    p: dict[str, Any],
    name: str,
    state: ContainerState,
    *,
    n: int = 0,
    exit_code: int = 0,
    finished_s: float = 0,
    created_s: float | None = None,
    hash_: str | None = None,
) -> ContainerStatusInfo:
    spec = next(c for c in p["spec"]["containers"] if c["name"] == name)
    return ContainerStatusInfo(
        id=ContainerID(f"{name}-{n}"),
        name=name,
        attempt=n,
        state=state,
        created_at=int((created_s if created_s is not None else 100 + n) * S),
        started_at=int((100 + n) * S),
        finished_at=int(finished_s * S),
        exit_code=exit_code,
        image=spec["image"],
        image_ref="sha256:abc",
        reason="",
        message="",
        log_path="",
        annotations={
            L.CONTAINER_HASH: hash_ or podspec.container_hash(spec),
            L.CONTAINER_RESTART_COUNT: str(n),
        },
    )


def sandbox(
    state: SandboxState = SandboxState.READY, *, attempt: int = 0, ip: str = "10.1.0.2"
) -> SandboxView:
    return SandboxView(SandboxID(f"sb-{attempt}"), attempt, state, created_at=attempt, ip=ip)


def runtime(sandboxes: list[SandboxView], containers: list[ContainerStatusInfo]) -> RuntimePod:
    return RuntimePod(
        uid="u1",
        sandboxes=tuple(sorted(sandboxes, key=lambda s: s.attempt, reverse=True)),
        containers=sort_newest_first(containers),
    )
