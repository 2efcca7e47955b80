"""Builders of pods and runtime state for syncloop's tests, `wire`: syncloop's production
wiring (`build_deps`) over a fake runtime and a fake bus, and the fake clock and step-by-step
waits of its loop tests."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from klet.config import KletSettings, KubeletConfiguration, Settings
from klet.cri import labels as L
from klet.cri.types import ContainerState, ContainerStatusInfo, SandboxState
from klet.model.types import ContainerID, SandboxID
from klet.syncloop.admission.admit import NodeInfo
from klet.syncloop.containers.syncsettings import SyncSettings
from klet.syncloop.eventrecorder import EventSink
from klet.syncloop.model import podspec
from klet.syncloop.model.runtimepod import RuntimePod, SandboxView, sort_newest_first
from klet.syncloop.wiring import Deps, Overrides, build_deps
from klet.testbed.fakes.bus import FakeBus
from klet.testbed.fakes.cri import FakeRuntimeService
from prometheus_client import CollectorRegistry

S = 1_000_000_000  # ns per second


def pod(
    *names: str,
    policy: str = "Always",
    uid: str = "u1",
    inits: tuple[str | dict[str, Any], ...] = (),
    **spec: Any,
) -> dict[str, Any]:
    """A pod; `inits` are init container names, or dicts for sidecars and probes."""
    image = "registry.klet.test/busybox:1.36"
    init_specs = [
        {"name": i, "image": image} if isinstance(i, str) else {"image": image, **i} for i in inits
    ]
    out: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web-node1", "namespace": "default", "uid": uid},
        "spec": {
            "restartPolicy": policy,
            "containers": [{"name": n, "image": image} for n in names],
            **spec,
        },
    }
    if init_specs:
        out["spec"]["initContainers"] = init_specs
    return out


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
    specs = (
        p["spec"]["containers"]
        + p["spec"].get("initContainers", [])
        + p["spec"].get("ephemeralContainers", [])
    )
    spec = next(c for c in specs if c["name"] == name)
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


class Emitted(NamedTuple):
    type: str
    reason: str
    message: str
    field_path: str


class RecordedEvents:
    """An EventSink that keeps what was emitted, for assertions."""

    def __init__(self) -> None:
        self.records: list[Emitted] = []

    def emit(
        self, pod: Any, type_: str, reason: str, message: str, *, field_path: str = ""
    ) -> None:
        self.records.append(Emitted(type_, reason, message, field_path))

    def reasons(self) -> list[str]:
        return [e.reason for e in self.records]

    def of(self, reason: str) -> list[Emitted]:
        return [e for e in self.records if e.reason == reason]

    def message(self, reason: str) -> str:
        return next(e.message for e in self.records if e.reason == reason)

    def triples(self) -> list[tuple[str, str, str]]:
        """(type, reason, message) of each event."""
        return [(e.type, e.reason, e.message) for e in self.records]


class UidEvents:
    """An EventSink that keeps (pod uid, type, reason, message) of each Event, for tests
    that look at several pods' Events."""

    def __init__(self) -> None:
        self.emitted: list[tuple[str, str, str, str]] = []

    def emit(self, pod: Any, type_: str, reason: str, message: str, **_kw: Any) -> None:
        self.emitted.append((pod["metadata"]["uid"], type_, reason, message))


class IdleWorkers:
    """The controller's workers for a test that runs each pod's sync itself: a wake does
    nothing."""

    def wake(self, uid: str) -> None:
        pass


NODE = "node1"
HOST_IP = "192.168.1.10"


def wire(
    tmp_path: Path,
    cri: FakeRuntimeService,
    *,
    events: EventSink | None = None,
    clock: Callable[[], float] | None = None,
    sleep: Callable[[float], Awaitable[None]] | None = None,
    sync: SyncSettings | None = None,
    node: NodeInfo | None = None,
    bus: FakeBus | None = None,
    node_name: str = NODE,
) -> Deps:
    """syncloop as production builds it, over `cri`, a fresh `FakeBus` (or `bus`) and
    no pod cgroups, with volumes under `tmp_path/node`; `sync` defaults to SyncSettings
    with logs under `tmp_path` (and a test's own root_dir stays apart from the volumes'), and
    admission sees a node with room for ten pods unless `node` says otherwise. A
    `node_name` of "" turns off the controller's own check of spec.nodeName."""
    settings = Settings(
        kubelet=KubeletConfiguration(cgroups_per_qos=False),
        klet=KletSettings(
            service="syncloop",
            node_name=node_name,
            node_ip=HOST_IP,
            root_dir=tmp_path / "node",
            run_dir=tmp_path / "run",
        ),
    )
    return build_deps(
        settings,
        Overrides(
            bus=bus or FakeBus(NODE),
            cri=cri,
            events=events,
            registry=CollectorRegistry(),
            clock=clock,
            sleep=sleep,
            node=node or NodeInfo(name=NODE, labels={}, allocatable={"pods": 10}),
            sync=sync or SyncSettings(pod_logs_dir=tmp_path),
            consumer="test",
            lease_holder="test",
        ),
    )


class Held:
    """A fake runtime hook (`cri.hooks[rpc]`) that holds every call until the test sets
    `release`; `in_flight` counts the calls held now."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.in_flight = 0

    async def __call__(self) -> None:
        self.in_flight += 1
        try:
            await self.release.wait()
        finally:
            self.in_flight -= 1


class Clock:
    """A wall or monotonic clock that moves only when a test sets `t` (or `advance`s it);
    `ns` is the same instant in nanoseconds, for the fake runtime's clock."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def ns(self) -> int:
        return int(self.t * 1e9)

    def advance(self, seconds: float) -> None:
        self.t += seconds


async def until(done: Callable[[], bool], steps: int = 1000, *, bound_s: float = 10.0) -> None:
    """Yield to the running tasks, step by step, until `done()` holds: first `steps`
    times with no time passing, then every millisecond up to `bound_s`, for what runs
    in threads (a pod's directories are made with `asyncio.to_thread`), which a busy
    machine may not schedule within any number of event-loop steps."""
    for _ in range(steps):
        if done():
            return
        await asyncio.sleep(0)
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if done():
            return
        await asyncio.sleep(0.001)
    pytest.fail("the condition never held")


@contextlib.asynccontextmanager
async def running(loop: Awaitable[None]) -> AsyncIterator[None]:
    """Run a root loop as a task for the body of the `with`, then cancel it."""
    task = asyncio.ensure_future(loop)
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
