"""The probe manager (prober.py) with the fake CRI and a fake clock.

Covers: workers start for a running container instance and publish the initial values
(readiness false, liveness true, startup unknown); readiness follows exec outcomes with
the failure threshold, wakes the pod worker only on a change and records
`Readiness probe failed: <output>` for each failed run; a liveness failure is published
after the threshold and the worker stops (on hold); an exited instance loses its
workers and results, a new instance starts over; the startup probe gates readiness and
liveness (they do not run before it succeeds) and stops once it resolves, and its
success runs the readiness probe at once, however long its period (initialDelaySeconds
still holds);
after a restart, workers started from a published status alone (`start_carried`: its
readiness kept, no runtime read, the first run wakes the pod on a change) and aligned by the
pod's first sync (a running instance kept, a gone one dropped);
initialDelaySeconds and periodSeconds decide when probes run; a deleted pod's liveness
reports success and stops; handler errors are retried three times, then reported as
`errored` without changing the result; the exec command is expanded with the static
environment; the semaphore bounds how many probes run at once; `remove_pod` and
stopping `run()` cancel every task. Metrics: prober_probe_total counts every run with
a result by probe type and result (`successful`/`failed`), errors not at all, and
prober_probe_duration_seconds observes successes; a removed pod's series go.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from klet.cri import CRIError
from klet.cri import labels as L
from klet.cri.types import ContainerConfig, SandboxConfig
from klet.model.types import ContainerID, SandboxID
from klet.syncloop.metrics import Metrics, create_metrics
from klet.syncloop.model.runtimepod import RuntimePod
from klet.syncloop.pods.runtime import PodRuntime
from klet.syncloop.probing import probes
from klet.syncloop.probing.prober import ProbeManager, ProbeSettings
from klet.syncloop.probing.proberesults import ProbeKind
from klet.testbed.fakes.cri import FakeRuntimeService
from prometheus_client import CollectorRegistry

from .helpers import RecordedEvents

UID = "u1"
LIVE, READY, START = ProbeKind.LIVENESS, ProbeKind.READINESS, ProbeKind.STARTUP


class FakeClock:
    """Wall-clock seconds that move only when the test advances them."""

    def __init__(self, t: float = 1_000.0) -> None:
        self.t = t
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def __call__(self) -> float:
        return self.t

    def ns(self) -> int:
        return int(self.t * 1e9)

    async def sleep(self, delay: float) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self.t + delay, next(self._seq), fut))
        await fut

    async def advance(self, seconds: float) -> None:
        target = self.t + seconds
        await settle()
        while self._sleepers and self._sleepers[0][0] <= target:
            at, _, fut = heapq.heappop(self._sleepers)
            self.t = max(self.t, at)
            if not fut.done():
                fut.set_result(None)
            await settle()
        self.t = target
        await settle()


async def settle() -> None:
    for _ in range(30):
        await asyncio.sleep(0)


@dataclass
class Env:
    clock: FakeClock
    cri: FakeRuntimeService
    events: RecordedEvents
    prober: ProbeManager
    woken: list[str]
    exits: dict[str, int]  # command text -> exit code the fake ExecSync answers
    sandbox: SandboxID | None = None
    registry: CollectorRegistry | None = None

    async def runtime(self) -> RuntimePod:
        return await PodRuntime(self.cri).get(UID)

    async def start(self, name: str, attempt: int = 0) -> ContainerID:
        cfg = SandboxConfig(
            "web", "default", UID, 0, "web", "/tmp/klet-test-logs", {L.POD_UID: UID}
        )
        if self.sandbox is None:
            self.sandbox = await self.cri.run_pod_sandbox(cfg)
        ccfg = ContainerConfig(name, attempt, "busybox", labels={L.POD_UID: UID})
        cid = await self.cri.create_container(self.sandbox, ccfg, cfg)
        await self.cri.start_container(cid)
        return cid

    async def sync(self, pod: dict[str, Any], *, deleting: bool = False) -> None:
        self.prober.update(pod, await self.runtime(), pod_ip="10.88.0.2", deleting=deleting)
        await settle()

    def execs(self, command: str) -> int:
        return sum(1 for c in self.cri.calls_of("ExecSync") if " ".join(c[2:]) == command)


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    clock = FakeClock()
    cri = FakeRuntimeService(clock=clock.ns)
    cri.add_image("busybox")
    exits: dict[str, int] = {}

    def respond(cid: ContainerID, cmd: list[str]) -> tuple[int, bytes, bytes]:
        text = " ".join(cmd)
        return exits.get(text, 0), f"ran {text}".encode(), b""

    cri.exec_responder = respond
    events = RecordedEvents()
    woken: list[str] = []
    registry = CollectorRegistry()
    metrics: Metrics = create_metrics(registry)
    prober = ProbeManager(
        cri,
        events=events,
        on_change=woken.append,
        clock=clock,
        sleep=clock.sleep,
        jitter=lambda: 0.0,
        observer=metrics.prober,
    )
    prober.started_at = clock.t - 3600  # a prober running for long: no start-up jitter
    runner = asyncio.create_task(prober.run())
    await settle()
    yield Env(clock, cri, events, prober, woken, exits, registry=registry)
    runner.cancel()
    await asyncio.gather(runner, return_exceptions=True)


def pod(**probes: Any) -> dict[str, Any]:
    app = {"name": "app", "image": "busybox", **probes}
    return {
        "metadata": {"name": "web", "namespace": "default", "uid": UID},
        "spec": {"containers": [app]},
    }


def exec_probe(command: str, **timing: Any) -> dict[str, Any]:
    return {"exec": {"command": command.split()}, **timing}


async def test_after_a_restart_probes_start_from_what_was_published(env: Env) -> None:
    # A syncloop that restarts finds the container running, with the readiness and
    # `started` its last published status gave it: no flap to unready until a probe.
    p = pod(
        startupProbe=exec_probe("check started", periodSeconds=10),
        readinessProbe=exec_probe("check ready", periodSeconds=5, failureThreshold=1),
    )
    cid = await env.start("app")
    other = await env.start("other")
    published = {
        "containerStatuses": [
            {"name": "app", "containerID": f"containerd://{cid}", "ready": True,
             "started": True, "state": {"running": {}}},
            {"name": "gone", "containerID": "containerd://old", "ready": True,
             "started": True, "state": {"terminated": {}}},
        ]
    }  # fmt: skip
    carried = probes.carried_from_status(published)
    assert carried == {cid: probes.CarriedProbes(ready=True, started=True)}
    assert other not in carried
    env.prober.update(p, await env.runtime(), pod_ip="10.88.0.2", deleting=False, carried=carried)
    assert env.prober.result(READY, cid) is True and env.prober.result(START, cid) is True
    assert env.woken == []
    await env.clock.advance(0)
    assert env.execs("check started") == 0  # started already: not probed again
    # The next probe still decides: a readiness lost meanwhile is reported.
    env.exits["check ready"] = 1
    await env.clock.advance(5)
    assert env.prober.result(READY, cid) is False and env.woken == [UID]


def published_running(cid: str, *, ready: bool, started_at: str = "") -> dict[str, Any]:
    """A status syncloop published before it restarted: `app` running as `cid`."""
    running = {"startedAt": started_at} if started_at else {}
    return {
        "podIP": "10.88.0.7",
        "containerStatuses": [
            {"name": "app", "containerID": f"containerd://{cid}", "ready": ready,
             "started": True, "state": {"running": running}},
            {"name": "gone", "containerID": "containerd://old", "ready": True,
             "started": True, "state": {"terminated": {}}},
        ],
    }  # fmt: skip


async def test_a_restart_probes_carried_containers_before_the_pods_first_sync(env: Env) -> None:
    # Nothing read from the runtime: the published status alone starts the worker, from
    # its readiness (no wake-up), and its first run finds a readiness lost while
    # syncloop was away and wakes the pod's worker.
    p = pod(readinessProbe=exec_probe("check ready", periodSeconds=10, failureThreshold=1))
    cid = await env.start("app")
    env.exits["check ready"] = 1
    reads = len(env.cri.calls)
    assert env.prober.start_carried(UID, p, published_running(cid, ready=True)) == 1
    assert env.prober.result(READY, cid) is True
    assert env.prober.probing(UID) == {cid: [READY]}
    assert env.woken == []
    await env.clock.advance(0)
    assert env.execs("check ready") == 1
    assert [c[0] for c in env.cri.calls[reads:]] == ["ExecSync"]  # no runtime read
    assert env.prober.result(READY, cid) is False and env.woken == [UID]


async def test_carried_probes_are_aligned_by_the_pods_first_sync(env: Env) -> None:
    # The first sync keeps the instance the runtime still runs (no second worker, the
    # result kept) and drops one the status showed running that is gone.
    p = pod(readinessProbe=exec_probe("check ready", periodSeconds=5, failureThreshold=1))
    cid = await env.start("app")
    assert env.prober.start_carried(UID, p, published_running(cid, ready=True)) == 1
    gone = published_running("dead", ready=True)
    assert env.prober.start_carried("u2", {**p, "metadata": {"uid": "u2"}}, gone) == 1
    await env.sync(p)
    assert env.prober.probing(UID) == {cid: [READY]}
    assert env.prober.result(READY, cid) is True
    env.prober.update(p, RuntimePod("u2", [], []), pod_ip="", deleting=False)
    assert env.prober.probing("u2") == {}
    assert env.prober.result(READY, ContainerID("dead")) is None
    # A pod whose own sync came first is left to it; a pod without probes gets none.
    assert env.prober.start_carried(UID, p, published_running(cid, ready=False)) == 0
    assert env.prober.result(READY, cid) is True
    assert env.prober.start_carried("u3", pod(), published_running("c3", ready=True)) == 0
    assert env.prober.probing("u3") == {}


async def test_readiness_follows_outcomes_with_threshold(env: Env) -> None:
    p = pod(readinessProbe=exec_probe("check ready", periodSeconds=5, failureThreshold=2))
    cid = await env.start("app")
    env.prober.update(p, await env.runtime(), pod_ip="10.88.0.2", deleting=False)
    assert env.prober.result(READY, cid) is False  # initial value, before any probe
    assert env.woken == []  # the initial value changes nothing the status shows

    await env.clock.advance(0)  # the first probe runs at once
    assert env.execs("check ready") == 1
    assert env.prober.result(READY, cid) is True
    assert env.woken == [UID]

    env.exits["check ready"] = 1
    await env.clock.advance(5)
    assert env.prober.result(READY, cid) is True  # one failure is below the threshold
    await env.clock.advance(5)
    assert env.prober.result(READY, cid) is False
    assert env.woken == [UID, UID]
    failures = [e for e in env.events.records if e[1] == "Unhealthy"]
    assert (
        failures
        == [
            (
                "Warning",
                "Unhealthy",
                "Readiness probe failed: ran check ready",
                "spec.containers{app}",
            )
        ]
        * 2
    )

    await env.clock.advance(5)  # failing again publishes the same value: no wake-up
    assert env.woken == [UID, UID]
    assert env.execs("check ready") == 4


async def test_liveness_failure_holds_until_a_new_instance(env: Env) -> None:
    p = pod(livenessProbe=exec_probe("alive", periodSeconds=1, failureThreshold=3))
    env.exits["alive"] = 1
    cid = await env.start("app")
    env.prober.update(p, await env.runtime(), pod_ip="10.88.0.2", deleting=False)
    assert env.prober.result(LIVE, cid) is True
    await settle()
    for _ in range(2):
        await env.clock.advance(1)
    assert env.prober.result(LIVE, cid) is False
    assert env.woken == [UID]
    assert env.prober.probing(UID) == {cid: []}  # on hold: no probe runs any more
    runs = env.execs("alive")
    await env.clock.advance(10)
    assert env.execs("alive") == runs == 3

    # the container is killed and started again: the old results go, the new starts over
    await env.cri.stop_container(cid, timeout_s=2)
    new = await env.start("app", attempt=1)
    env.exits["alive"] = 0
    await env.sync(p)
    assert env.prober.result(LIVE, cid) is None
    assert env.prober.result(LIVE, new) is True
    assert env.prober.probing(UID) == {new: [LIVE]}


async def test_startup_probe_gates_readiness_and_liveness(env: Env) -> None:
    p = pod(
        startupProbe=exec_probe("started", periodSeconds=2, failureThreshold=10),
        readinessProbe=exec_probe("ready", periodSeconds=2),
        # Off the startup probe's beat: a liveness tick at the very instant the startup
        # probe succeeds may run or skip (in upstream too), so none falls there.
        livenessProbe=exec_probe("alive", periodSeconds=2, initialDelaySeconds=1),
    )
    env.exits["started"] = 1
    cid = await env.start("app")
    env.prober.update(p, await env.runtime(), pod_ip="10.88.0.2", deleting=False)
    assert env.prober.result(START, cid) is None
    await env.clock.advance(4)
    assert env.execs("started") == 3
    assert env.execs("ready") == env.execs("alive") == 0
    env.exits["started"] = 0
    await env.clock.advance(2)
    assert env.prober.result(START, cid) is True
    assert START not in env.prober.probing(UID)[cid]  # a started container is not re-probed
    assert env.execs("ready") == 1 and env.execs("alive") == 0  # readiness at once
    await env.clock.advance(2)
    assert env.execs("ready") == 2 and env.execs("alive") == 1
    assert env.prober.result(READY, cid) is True
    assert env.execs("started") == 4


async def test_startup_success_runs_readiness_at_once(env: Env) -> None:
    p = pod(
        startupProbe=exec_probe("started", periodSeconds=1, failureThreshold=30),
        readinessProbe=exec_probe("ready", periodSeconds=60),
    )
    env.exits["started"] = 1
    cid = await env.start("app")
    await env.sync(p)
    await env.clock.advance(2)
    assert env.execs("ready") == 0  # gated: not started yet
    env.exits["started"] = 0
    await env.clock.advance(1)
    assert env.prober.result(START, cid) is True
    # Within the same instant, not 60 s later.
    assert env.execs("ready") == 1
    assert env.prober.result(READY, cid) is True
    await env.clock.advance(59)
    assert env.execs("ready") == 1  # then every period, as before
    await env.clock.advance(1)
    assert env.execs("ready") == 2


async def test_startup_success_keeps_readinesss_initial_delay(env: Env) -> None:
    p = pod(
        startupProbe=exec_probe("started", periodSeconds=1),
        readinessProbe=exec_probe("ready", periodSeconds=60, initialDelaySeconds=10),
    )
    cid = await env.start("app")
    await env.sync(p)
    await env.clock.advance(1)
    assert env.prober.result(START, cid) is True
    await env.clock.advance(8)
    assert env.execs("ready") == 0
    await env.clock.advance(1)
    assert env.execs("ready") == 1


async def test_startup_failure_threshold(env: Env) -> None:
    p = pod(startupProbe=exec_probe("started", periodSeconds=1, failureThreshold=2))
    env.exits["started"] = 3
    cid = await env.start("app")
    await env.sync(p)
    await env.clock.advance(1)
    assert env.prober.result(START, cid) is False
    assert env.prober.probing(UID) == {cid: []}
    assert [e[2] for e in env.events.records] == ["Startup probe failed: ran started"] * 2


async def test_initial_delay_and_period(env: Env) -> None:
    p = pod(readinessProbe=exec_probe("ready", initialDelaySeconds=7, periodSeconds=3))
    await env.start("app")
    await env.sync(p)
    await env.clock.advance(6.9)
    assert env.execs("ready") == 0
    await env.clock.advance(0.1)
    assert env.execs("ready") == 1
    await env.clock.advance(2.9)
    assert env.execs("ready") == 1
    await env.clock.advance(0.1)
    assert env.execs("ready") == 2


async def test_deleted_pod_liveness_reports_success_and_stops(env: Env) -> None:
    p = pod(
        livenessProbe=exec_probe("alive", periodSeconds=1, failureThreshold=1),
        readinessProbe=exec_probe("ready", periodSeconds=1),
    )
    cid = await env.start("app")
    await env.sync(p)
    await env.clock.advance(0)
    env.exits["alive"] = 1
    await env.sync(p, deleting=True)
    await env.clock.advance(1)
    assert env.prober.result(LIVE, cid) is True
    assert env.prober.probing(UID) == {cid: [READY]}
    assert env.execs("alive") == 1


async def test_errors_are_retried_then_reported_without_a_result(env: Env) -> None:
    p = pod(readinessProbe=exec_probe("ready", periodSeconds=10))
    cid = await env.start("app")
    env.cri.fail_always("ExecSync", CRIError("ExecSync: UNKNOWN: runtime hiccup"))
    await env.sync(p)
    await env.clock.advance(0)
    assert env.execs("ready") == 3
    assert env.prober.result(READY, cid) is False  # still the initial value
    assert env.events.records == [
        (
            "Warning",
            "Unhealthy",
            "Readiness probe errored and resulted in unknown state: "
            "ExecSync: UNKNOWN: runtime hiccup",
            "spec.containers{app}",
        )
    ]
    env.cri.fail_always("ExecSync", None)
    await env.clock.advance(10)
    assert env.prober.result(READY, cid) is True


async def test_exec_command_uses_the_static_environment(env: Env) -> None:
    p = pod(
        env=[
            {"name": "FILE", "value": "/tmp/ok"},
            {"name": "DYN", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ],
        readinessProbe={"exec": {"command": ["test", "-f", "$(FILE)", "$(DYN)", "$$(FILE)"]}},
    )
    await env.start("app")
    await env.sync(p)
    await env.clock.advance(0)
    assert env.execs("test -f /tmp/ok $(DYN) $(FILE)") == 1


async def test_concurrency_is_bounded() -> None:
    clock = FakeClock()
    cri = FakeRuntimeService(clock=clock.ns)
    cri.add_image("busybox")
    gate = asyncio.Event()
    peak = 0
    prober = ProbeManager(
        cri,
        events=RecordedEvents(),
        on_change=lambda uid: None,
        settings=ProbeSettings(max_concurrent=2),
        clock=clock,
        sleep=clock.sleep,
        jitter=lambda: 0.0,
    )

    async def slow_exec() -> None:
        nonlocal peak
        peak = max(peak, prober.in_flight)
        await gate.wait()

    cri.hooks["ExecSync"] = slow_exec
    runner = asyncio.create_task(prober.run())
    env = Env(clock, cri, RecordedEvents(), prober, [], {})
    names = [f"c{i}" for i in range(5)]
    containers = [
        {"name": n, "image": "busybox", "readinessProbe": exec_probe("ready")} for n in names
    ]
    spec = {"metadata": {"name": "web", "uid": UID}, "spec": {"containers": containers}}
    for n in names:
        await env.start(n)
    await env.sync(spec)
    await clock.advance(0)
    assert prober.in_flight == 2 and peak == 2
    assert len(cri.calls_of("ExecSync")) == 2
    gate.set()
    await settle()
    assert len(cri.calls_of("ExecSync")) == 5 and peak == 2
    runner.cancel()
    await asyncio.gather(runner, return_exceptions=True)


async def test_remove_pod_and_stopping_run_cancel_everything(env: Env) -> None:
    p = pod(readinessProbe=exec_probe("ready"), livenessProbe=exec_probe("alive"))
    cid = await env.start("app")
    await env.sync(p)
    assert sorted(k.value for k in env.prober.probing(UID)[cid]) == ["Liveness", "Readiness"]
    env.prober.remove_pod(UID)
    await settle()
    assert env.prober.probing(UID) == {}
    assert env.prober.result(READY, cid) is None and env.prober.result(LIVE, cid) is None


async def test_updates_before_run_starts_are_started_by_run() -> None:
    clock = FakeClock()
    cri = FakeRuntimeService(clock=clock.ns)
    cri.add_image("busybox")
    prober = ProbeManager(
        cri, events=RecordedEvents(), on_change=lambda uid: None, clock=clock, sleep=clock.sleep
    )
    env = Env(clock, cri, RecordedEvents(), prober, [], {})
    cid = await env.start("app")
    await env.sync(pod(readinessProbe=exec_probe("ready")))
    assert env.prober.probing(UID) == {cid: []}
    runner = asyncio.create_task(prober.run())
    await settle()
    assert env.prober.probing(UID) == {cid: [READY]}
    runner.cancel()
    await asyncio.gather(runner, return_exceptions=True)
    assert env.prober.probing(UID) == {cid: []}


def probe_total(env: Env, probe_type: str, result: str, container: str = "app") -> float | None:
    assert env.registry is not None
    labels = {
        "probe_type": probe_type,
        "result": result,
        "container": container,
        "pod": "web",
        "namespace": "default",
        "pod_uid": UID,
    }
    return env.registry.get_sample_value("prober_probe_total", labels)


def duration_count(env: Env, probe_type: str) -> float | None:
    assert env.registry is not None
    labels = {"probe_type": probe_type, "container": "app", "pod": "web", "namespace": "default"}
    return env.registry.get_sample_value("prober_probe_duration_seconds_count", labels)


async def test_probe_runs_are_counted_by_type_and_result(env: Env) -> None:
    p = pod(
        readinessProbe=exec_probe("ready", periodSeconds=5, failureThreshold=3),
        livenessProbe=exec_probe("alive", periodSeconds=5, failureThreshold=3),
    )
    await env.start("app")
    await env.sync(p)
    await env.clock.advance(0)
    assert probe_total(env, "Readiness", "successful") == 1
    assert probe_total(env, "Liveness", "successful") == 1
    assert probe_total(env, "Readiness", "failed") is None
    assert duration_count(env, "Readiness") == 1

    env.exits["ready"] = 1
    await env.clock.advance(5)
    await env.clock.advance(5)
    # each run counts, also those below the failure threshold
    assert probe_total(env, "Readiness", "failed") == 2
    assert probe_total(env, "Readiness", "successful") == 1
    assert probe_total(env, "Liveness", "successful") == 3
    assert duration_count(env, "Readiness") == 1  # upstream times successes only
    assert duration_count(env, "Liveness") == 3


async def test_probe_errors_are_not_counted(env: Env) -> None:
    await env.start("app")
    env.cri.fail_always("ExecSync", CRIError("ExecSync: UNKNOWN: runtime hiccup"))
    await env.sync(pod(readinessProbe=exec_probe("ready", periodSeconds=10)))
    await env.clock.advance(0)
    assert env.execs("ready") == 3
    for result in ("successful", "failed", "unknown"):
        assert probe_total(env, "Readiness", result) is None


async def test_a_removed_pods_probe_series_are_deleted(env: Env) -> None:
    p = pod(startupProbe=exec_probe("started", periodSeconds=1, failureThreshold=5))
    env.exits["started"] = 1
    await env.start("app")
    await env.sync(p)
    await env.clock.advance(0)
    env.exits["started"] = 0
    await env.clock.advance(1)
    assert probe_total(env, "Startup", "failed") == 1
    assert probe_total(env, "Startup", "successful") == 1
    env.prober.remove_pod(UID)
    await settle()
    assert probe_total(env, "Startup", "failed") is None
    assert probe_total(env, "Startup", "successful") is None
    assert duration_count(env, "Startup") is None
