"""The probe manager: one task per (container instance, probe kind) and the results cache.

The pod worker tells it after every sync what the pod has (`update`): a running
container instance with probes gets one task per probe, an instance that is no longer
running has its tasks cancelled and its results dropped, and a removed pod loses
everything (`remove_pod`). Results are keyed by container ID, so a restarted container
starts from the initial values with fresh counters, as upstream's workers do when they
see a new container ID.

A task sleeps until its probe is due, asks probes.py whether to run it, runs the
handler (handlers.py) under a node-wide semaphore so a burst of probes cannot starve
the event loop or the runtime, counts the outcome against the thresholds, records the
upstream events (`Unhealthy`, `ProbeWarning`) and publishes the result. When a
published result changes, the pod's worker is woken (`on_change`), which recomputes the
status (readiness, `started`) and the actions (liveness and startup failures kill the
container). Probes never run inside a pod worker, so a slow probe never delays a sync.

After a syncloop restart the controller starts the probes of every running container
its last published statuses show (`start_carried`), all at once, before any pod's first
sync: the restart syncs every pod together, and a pod's probes waited for its own sync
(up to two seconds under load, issue 42). Each pod's first sync aligns them with what
the runtime really runs.

When a startup probe succeeds, the instance's readiness worker runs at once instead of
at the end of its period (upstream's prober triggers it manually when it sees the
container started): a readiness probe with a long period would otherwise keep a started
container unready for up to that period. initialDelaySeconds still holds.

Every probe run that produced a result (an error is not one) is reported to the
`observer` (upstream's prober_probe_total and prober_probe_duration_seconds; wiring
passes metrics.ProberMetrics), which forgets a pod's series when the pod is removed.

`run()` is syncloop's root task for probing: the tasks live in its task group, so they
stop when it stops, and probes only run while it runs.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from klet.cri.types import ContainerState
from klet.model.types import JSON, ContainerID
from klet.syncloop.containers.handlers import (
    ExecRunner,
    HandlerResult,
    run_exec,
    run_grpc,
    run_http_get,
    run_tcp,
)
from klet.syncloop.environment import envvars
from klet.syncloop.eventrecorder import EventSink
from klet.syncloop.model import podspec
from klet.syncloop.model.runtimepod import RuntimePod
from klet.syncloop.probing import probes
from klet.syncloop.probing.proberesults import ProbeKind

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProbeSettings:
    max_concurrent: int = 32
    """Probes (handler runs) in flight at once on the node; the others wait their turn."""


@dataclass(frozen=True)
class ProbeRun:
    """One probe run with a result, as the metrics see it."""

    kind: ProbeKind
    pod_uid: str
    pod: str
    namespace: str
    container: str
    ok: bool
    duration_s: float  # from the start of the run (retries included) to its result


class ProbeObserver(Protocol):
    def observe(self, run: ProbeRun) -> None:
        """A probe ran and produced a result."""
        ...

    def forget_pod(self, uid: str) -> None:
        """The pod was removed: drop what was kept about its probes."""
        ...


@dataclass
class _Instance:
    """One running container instance and its probe tasks."""

    container: JSON
    started_at: float  # seconds since the epoch
    tasks: dict[ProbeKind, asyncio.Task[None]] = field(default_factory=dict)
    carried: bool = False
    """Its results start from a status published before a syncloop restart."""
    readiness_due: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the startup probe succeeds: the readiness worker runs without waiting."""


@dataclass
class _Pod:
    pod: JSON
    pod_ip: str = ""
    deleting: bool = False
    instances: dict[ContainerID, _Instance] = field(default_factory=dict)


Sleep = Callable[[float], Awaitable[None]]


class ProbeManager:
    """Runs the probes of every pod; implements `ProbeResults` for the pure decisions."""

    def __init__(
        self,
        cri: ExecRunner,
        *,
        events: EventSink,
        on_change: Callable[[str], None],
        settings: ProbeSettings | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Sleep = asyncio.sleep,
        jitter: Callable[[], float] = random.random,
        observer: ProbeObserver | None = None,
    ) -> None:
        self.cri = cri
        self.events = events
        self.on_change = on_change
        self.settings = settings or ProbeSettings()
        self.clock = clock
        self.sleep = sleep
        self.jitter = jitter
        self.observer = observer
        self.started_at = clock()
        self._semaphore = asyncio.Semaphore(self.settings.max_concurrent)
        self._pods: dict[str, _Pod] = {}
        self._results: dict[tuple[ProbeKind, ContainerID], bool] = {}
        self._group: asyncio.TaskGroup | None = None
        self._pending: list[tuple[str, ContainerID, probes.ProbeSpec]] = []
        self.in_flight = 0  # handler runs going on now (bounded by the semaphore)

    # -- ProbeResults ----------------------------------------------------------------

    def result(self, kind: ProbeKind, container_id: ContainerID) -> bool | None:
        return self._results.get((kind, container_id))

    # -- what the pod workers call ---------------------------------------------------

    def update(
        self,
        pod: JSON,
        runtime: RuntimePod,
        *,
        pod_ip: str,
        deleting: bool,
        carried: Mapping[str, probes.CarriedProbes] | None = None,
    ) -> None:
        """Align the probe tasks of one pod with what runs now. `carried`: what the
        status published before a restart said of the running containers' probes, by
        container ID; their workers start from it (`probes.starting_result`)."""
        uid = runtime.uid
        entry = self._pods.get(uid)
        if entry is None:
            entry = self._pods[uid] = _Pod(pod)
        entry.pod, entry.pod_ip, entry.deleting = pod, pod_ip, deleting
        specs = {c["name"]: c for c in [*podspec.init_containers(pod), *podspec.containers(pod)]}
        running = {
            c.id: c
            for c in runtime.containers
            if c.state == ContainerState.RUNNING and c.name in specs
        }
        for cid in [cid for cid in entry.instances if cid not in running]:
            self._drop_instance(entry, cid)
        for cid, status in running.items():
            if cid in entry.instances:
                continue
            started_at = status.started_at / 1e9 if status.started_at else self.clock()
            before = (carried or {}).get(cid)
            self._add_instance(uid, entry, cid, specs[status.name], started_at, before)

    def start_carried(self, uid: str, pod: JSON, status: JSON) -> int:
        """Start the probes of the containers a restarted syncloop's last published
        `status` showed running, before the pod's first sync has read the runtime (the
        restart's syncs of every pod take a second or more under load, and each pod's
        probes used to wait for its own). They start from the published readiness and
        `started` (`probes.starting_result`) and their first run comes within
        CARRIED_CHECK_S for a cheap handler; the pod IP is the status's. The pod's first
        sync (`update`) keeps the instances the runtime still runs and drops the others,
        results and all. A pod whose sync already got here is left alone. Returns how
        many container instances got probes."""
        if uid in self._pods:
            return 0
        specs = {c["name"]: c for c in [*podspec.init_containers(pod), *podspec.containers(pod)]}
        entry = self._pods[uid] = _Pod(pod, pod_ip=str(status.get("podIP") or ""))
        for inst in probes.carried_instances(status):
            container = specs.get(inst.name)
            if container is None:
                continue
            cid = ContainerID(inst.container_id)
            started_at = inst.started_at if inst.started_at is not None else self.clock()
            self._add_instance(uid, entry, cid, container, started_at, inst.probes)
        if not entry.instances:
            del self._pods[uid]
        return len(entry.instances)

    def _add_instance(
        self,
        uid: str,
        entry: _Pod,
        cid: ContainerID,
        container: JSON,
        started_at: float,
        before: probes.CarriedProbes | None,
    ) -> None:
        """One running container instance's probe workers, from `before` if carried."""
        declared = probes.container_probes(container)
        if not declared:
            return
        entry.instances[cid] = _Instance(container, started_at, carried=before is not None)
        for spec in declared:
            initial = probes.starting_result(spec.kind, before)
            if initial is not None:
                # No wake-up: the status already treats a probe that has not
                # succeeded yet this way.
                self._results[(spec.kind, cid)] = initial
            self._start(uid, cid, spec)

    def remove_pod(self, uid: str) -> None:
        """The pod is gone: stop its probes and forget their results."""
        entry = self._pods.pop(uid, None)
        if entry is None:
            return
        for cid in list(entry.instances):
            self._drop_instance(entry, cid)
        if self.observer is not None:
            self.observer.forget_pod(uid)

    def probing(self, uid: str) -> dict[ContainerID, list[ProbeKind]]:
        """The probe tasks still running for a pod (for tests and debugging)."""
        entry = self._pods.get(uid)
        if entry is None:
            return {}
        return {
            cid: [k for k, t in inst.tasks.items() if not t.done()]
            for cid, inst in entry.instances.items()
        }

    # -- the root task ---------------------------------------------------------------

    async def run(self) -> None:
        """Own every probe task until cancelled; then they are all cancelled too."""
        try:
            async with asyncio.TaskGroup() as group:
                self._group = group
                pending, self._pending = self._pending, []
                for uid, cid, spec in pending:
                    self._start(uid, cid, spec)
                await asyncio.Future()  # the group lives until syncloop stops
        finally:
            self._group = None

    # -- internals -------------------------------------------------------------------

    def _start(self, uid: str, cid: ContainerID, spec: probes.ProbeSpec) -> None:
        entry = self._pods.get(uid)
        inst = entry.instances.get(cid) if entry is not None else None
        if inst is None:
            return
        if self._group is None:
            self._pending.append((uid, cid, spec))
            return
        name = f"probe-{spec.kind.value.lower()}-{cid[:12]}"
        inst.tasks[spec.kind] = self._group.create_task(self._work(uid, cid, spec), name=name)

    def _drop_instance(self, entry: _Pod, cid: ContainerID) -> None:
        inst = entry.instances.pop(cid)
        for task in inst.tasks.values():
            task.cancel()
        for kind in ProbeKind:
            self._results.pop((kind, cid), None)

    def _set(self, uid: str, cid: ContainerID, kind: ProbeKind, value: bool) -> None:
        before = self._results.get((kind, cid))
        self._results[(kind, cid)] = value
        if kind == ProbeKind.STARTUP and value:
            entry = self._pods.get(uid)
            inst = entry.instances.get(cid) if entry is not None else None
            if inst is not None:
                inst.readiness_due.set()
        if before is not value:
            log.info(
                "probe result changed",
                extra={"uid": uid, "container_id": cid, "probe": kind.value, "success": value},
            )
            self.on_change(uid)

    async def _sleep_until(self, at: float) -> None:
        delay = at - self.clock()
        if delay > 0:
            await self.sleep(delay)

    async def _wait_due(self, at: float, due: asyncio.Event) -> None:
        """Sleep until `at`, or less if `due` is set meanwhile; `due` is consumed."""
        delay = at - self.clock()
        if delay > 0 and not due.is_set():
            sleeper = asyncio.ensure_future(self.sleep(delay))
            waiter = asyncio.ensure_future(due.wait())
            try:
                await asyncio.wait((sleeper, waiter), return_when=asyncio.FIRST_COMPLETED)
            finally:
                sleeper.cancel()
                waiter.cancel()
                await asyncio.gather(sleeper, waiter, return_exceptions=True)
        due.clear()

    async def _work(self, uid: str, cid: ContainerID, spec: probes.ProbeSpec) -> None:
        try:
            await self._loop(uid, cid, spec)
        except asyncio.CancelledError:
            raise
        except Exception:  # a broken probe must not take syncloop down with it
            log.exception("probe worker failed", extra={"uid": uid, "container_id": cid})

    async def _loop(self, uid: str, cid: ContainerID, spec: probes.ProbeSpec) -> None:
        entry = self._pods[uid]
        inst = entry.instances[cid]
        at = probes.first_probe_at(
            spec,
            container_started_at=inst.started_at,
            now=self.clock(),
            prober_started_at=self.started_at,
            jitter=self.jitter(),
            carried=inst.carried,
        )
        counter = probes.Counter()
        earliest = inst.started_at + spec.initial_delay_s
        while True:
            if spec.kind == ProbeKind.READINESS:
                await self._wait_due(at, inst.readiness_due)
                await self._sleep_until(earliest)
            else:
                await self._sleep_until(at)
            begun = self.clock()
            started = probes.container_started(
                inst.container, running=True, startup=self.result(ProbeKind.STARTUP, cid)
            )
            decision = probes.gate(spec.kind, started=started, deleting=entry.deleting)
            if decision == probes.Gate.STOP_SUCCESS:
                self._set(uid, cid, spec.kind, True)
                return
            if decision == probes.Gate.RUN:
                ok = await self._probe(entry, cid, inst, spec)
                if ok is not None:
                    self._observe(uid, entry, inst, spec.kind, ok=ok, begun=begun)
                    step = probes.record(spec, counter, ok)
                    counter = step.counter
                    if step.publish is not None:
                        self._set(uid, cid, spec.kind, step.publish)
                    if step.hold:
                        return
            at = probes.next_probe_at(spec, last_probe_at=begun, now=self.clock())

    def _observe(
        self, uid: str, entry: _Pod, inst: _Instance, kind: ProbeKind, *, ok: bool, begun: float
    ) -> None:
        if self.observer is None:
            return
        meta = entry.pod.get("metadata") or {}
        run = ProbeRun(
            kind=kind,
            pod_uid=uid,
            pod=str(meta.get("name", "")),
            namespace=str(meta.get("namespace", "")),
            container=str(inst.container.get("name", "")),
            ok=ok,
            duration_s=self.clock() - begun,
        )
        self.observer.observe(run)

    async def _probe(
        self, entry: _Pod, cid: ContainerID, inst: _Instance, spec: probes.ProbeSpec
    ) -> bool | None:
        """Run the handler (retrying errors as upstream); the outcome, None for an error."""
        result = HandlerResult(False, "", error=True)
        for _ in range(probes.MAX_PROBE_RETRIES):
            async with self._semaphore:
                self.in_flight += 1
                try:
                    result = await self._handle(entry, cid, inst, spec)
                finally:
                    self.in_flight -= 1
            if not result.error:
                break
        name = inst.container.get("name", "")
        path = podspec.field_path(entry.pod, name)
        if result.error:
            reason, message = probes.error_event(spec.kind, result.message)
            self.events.emit(entry.pod, "Warning", reason, message, field_path=path)
            return None
        if result.warning:
            reason, message = probes.warning_event(spec.kind, result.message)
            self.events.emit(entry.pod, "Warning", reason, message, field_path=path)
        if not result.ok:
            reason, message = probes.failure_event(spec.kind, result.message)
            self.events.emit(entry.pod, "Warning", reason, message, field_path=path)
        return result.ok

    async def _handle(
        self, entry: _Pod, cid: ContainerID, inst: _Instance, spec: probes.ProbeSpec
    ) -> HandlerResult:
        try:
            if spec.handler == "exec":
                return await run_exec(
                    self.cri,
                    cid,
                    static_command(spec.action, inst.container),
                    timeout_s=spec.timeout_s,
                )
            if spec.handler == "httpGet":
                return await run_http_get(
                    spec.action,
                    pod_ip=entry.pod_ip,
                    container=inst.container,
                    timeout_s=spec.timeout_s,
                )
            if spec.handler == "tcpSocket":
                return await run_tcp(
                    spec.action,
                    pod_ip=entry.pod_ip,
                    container=inst.container,
                    timeout_s=spec.timeout_s,
                )
            return await run_grpc(spec.action, pod_ip=entry.pod_ip, timeout_s=spec.timeout_s)
        except Exception as err:  # noqa: BLE001 - a handler bug is a probe error, not a crash
            log.warning("probe handler raised", extra={"container_id": cid, "error": repr(err)})
            return HandlerResult(False, f"{type(err).__name__}: {err}", error=True)


def static_command(action: JSON, container: JSON) -> list[str]:
    """An exec probe's command with `$(VAR)` expanded from the container's plain `value`s.

    upstream expands probe commands with the static variables only: no valueFrom, no
    envFrom (ExpandContainerCommandOnlyStatic).
    """
    env = {
        str(e["name"]): str(e["value"])
        for e in container.get("env") or []
        if isinstance(e, dict) and "name" in e and "value" in e
    }
    return [envvars.expand(str(arg), env.get) for arg in action.get("command") or []]
