"""Graceful node shutdown: upstream's node shutdown manager, in the eviction service.

The eviction service is where it belongs here: it already kills pods by rank through
syncloop's PodControl.KillPod with a reason, a message and a grace-period override,
and it already contributes node conditions. The shutdown manager adds one more reason
to kill, in priority order.

How it behaves, restated from upstream's `pkg/kubelet/nodeshutdown`:

- **Periods.** `shutdownGracePeriodByPodPriority` as given, or the two periods upstream
  migrates `shutdownGracePeriod`/`shutdownGracePeriodCriticalPods` into: priority 0
  gets the requested period minus the critical one, system-cluster-critical priority
  (2000000000) gets the critical one. No period (the default 0s): nothing happens, the
  node shuts down at once, as upstream; nor is logind's client (klet.logind, and with
  it dbus-fast) imported, so the default node does not carry it (issue 42). Periods are
  sorted by priority, low first.
- **Groups.** A pod goes to the period with the highest priority at or below its own;
  one below every period goes to the lowest, one above all to the highest.
- **Lock.** At start it takes a logind *delay* inhibitor lock for shutdown, after making
  sure logind's InhibitDelayMaxSec is at least the sum of the periods (a drop-in under
  /etc/systemd/logind.conf.d and a reload, as upstream; when that still does not take,
  the service stops with the two values in the message).
- **On PrepareForShutdown(true)** (or SIGUSR1, upstream's manual trigger): a Node Event
  `NodeShutdown`, the Node's Ready condition False with "node is shutting down"
  (eviction's `Ready` contribution, which also makes syncloop reject new pods with
  reason `NodeShutdown`), then group by group, lowest priority first: every pod of the
  group is killed at once with the group's grace period (the pod's own when shorter),
  preStop hooks included, and its status made Failed with reason `Terminated`, message
  "Pod was terminated in response to imminent node shutdown." and the DisruptionTarget
  condition; the next group starts when this one is down or its period is over. Then the
  lock is released and logind goes on. PrepareForShutdown(false) (cancelled): the
  condition is cleared and the lock taken again.
- **Restarts and replicas.** Every replica of the eviction service holds its own lock
  and handles the shutdown itself (KillPod is idempotent, so two replicas killing the
  same pod kill it once); only the leader writes the condition. A replica that starts
  while logind is already preparing for shutdown (its `PreparingForShutdown` property)
  takes its lock and handles it at once, so a restart in the middle of a shutdown
  finishes the job, and with two replicas a restart never leaves the node unlocked.
- **Metrics.** `kubelet_graceful_shutdown_start_time_seconds` and
  `kubelet_graceful_shutdown_end_time_seconds`, kept across restarts in
  `<root-dir>/graceful_node_shutdown_state` as upstream keeps them; served at 0 by a
  node without periods, as upstream registers them whatever the configuration.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import logging
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from klet.config.kubelet import KubeletConfiguration
from klet.eviction.manager import ActivePod, NodeEvent, PodKiller, PodLister
from klet.model.flowcontrol import BackoffPolicy
from klet.model.node import NODE_SHUTTING_DOWN, SHUTDOWN_POD_MESSAGE, SHUTDOWN_POD_REASON
from klet.model.pod import SYSTEM_CRITICAL_PRIORITY, pod_priority
from klet.model.records import NodeConditionRecord
from klet.model.types import JSON, PodUID
from klet.retry import call_retrying, delay_after
from prometheus_client import CollectorRegistry, Gauge

log = logging.getLogger(__name__)

REASON = SHUTDOWN_POD_REASON
MESSAGE = SHUTDOWN_POD_MESSAGE
EVENT_REASON = "NodeShutdown"
STATE_FILE = "graceful_node_shutdown_state"
READY = "Ready"
KILL_MARGIN_S = 30.0
"""KillPod's deadline past the grace period (its stop and the status report)."""


@dataclass(frozen=True, order=True)
class Period:
    """One `shutdownGracePeriodByPodPriority` entry."""

    priority: int
    grace_s: int


def periods(
    *,
    grace_s: float,
    critical_s: float,
    by_priority: Sequence[Mapping[str, Any]],
) -> list[Period]:
    """The periods the manager works with, sorted by priority (see the docstring)."""
    if by_priority:
        out = [
            Period(int(p.get("priority", 0)), int(p.get("shutdownGracePeriodSeconds", 0)))
            for p in by_priority
        ]
        return sorted(out)
    if grace_s <= 0 or critical_s > grace_s:
        return []
    return [
        Period(0, int(grace_s - critical_s)),
        Period(SYSTEM_CRITICAL_PRIORITY, int(critical_s)),
    ]


def requested_s(plan: Sequence[Period]) -> int:
    """How long logind must wait for the whole shutdown: the sum of the periods."""
    return sum(p.grace_s for p in plan)


@dataclass
class Group:
    period: Period
    pods: list[ActivePod] = field(default_factory=list)


def group_by_priority(plan: Sequence[Period], pods: Sequence[ActivePod]) -> list[Group]:
    """Each pod in the group of the highest period priority at or below its own."""
    groups = [Group(p) for p in plan]
    if not groups:
        return groups
    keys = [p.priority for p in plan]
    for active in pods:
        priority = pod_priority(active.pod)
        index = bisect.bisect_right(keys, priority) - 1
        groups[max(index, 0)].pods.append(active)
    return groups


def pod_grace_s(period: Period, pod: JSON) -> int:
    """The group's grace period, or the pod's own when that is shorter."""
    own = (pod.get("spec") or {}).get("terminationGracePeriodSeconds")
    if isinstance(own, int) and own <= period.grace_s:
        return own
    return period.grace_s


def time_gauges(registry: CollectorRegistry) -> Callable[[float, float], None]:
    """The two upstream gauges of the last graceful shutdown, and their setter."""
    start = Gauge(
        "kubelet_graceful_shutdown_start_time_seconds",
        "When the last graceful node shutdown began (Unix seconds)",
        registry=registry,
    )
    end = Gauge(
        "kubelet_graceful_shutdown_end_time_seconds",
        "When the last graceful node shutdown ended (Unix seconds; 0 while under way)",
        registry=registry,
    )

    def set_times(started: float, ended: float) -> None:
        start.set(started)
        end.set(ended)

    return set_times


class ReadyTable(Protocol):
    """eviction's own node conditions on the bus (`node:eviction`), keyed by type."""

    async def put(self, key: str, record: NodeConditionRecord) -> None: ...
    async def delete(self, key: str) -> None: ...


class Logind(Protocol):
    """systemd-logind on the system bus (`klet.systemd.logind.LogindClient`)."""

    async def inhibit_delay_max_s(self) -> float: ...
    async def ensure_inhibit_delay(self, seconds: int) -> None:
        """Write the InhibitDelayMaxSec drop-in and have logind reload it."""

    async def take_delay_lock(self, who: str, why: str) -> int:
        """A delay inhibitor lock for shutdown; returns its file descriptor."""

    async def preparing_for_shutdown(self) -> bool: ...
    def shutdown_signals(self) -> AsyncIterator[bool]:
        """PrepareForShutdown's argument each time logind emits it; ends when the
        connection to the bus is lost."""


class StateFile:
    """upstream's localStorage: the times of the last shutdown, as JSON."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> tuple[float, float]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return 0.0, 0.0
        except (OSError, ValueError) as err:
            log.error(
                "cannot read the graceful shutdown state",
                extra={"path": str(self.path), "error": str(err)},
            )
            return 0.0, 0.0
        return float(data.get("startTime", 0.0)), float(data.get("endTime", 0.0))

    def store(self, start: float, end: float) -> None:
        tmp = self.path.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps({"startTime": start, "endTime": end}))
            os.replace(tmp, self.path)
        except OSError as err:
            log.error(
                "cannot store the graceful shutdown state",
                extra={"path": str(self.path), "error": str(err)},
            )


@dataclass(frozen=True)
class ShutdownDeps:
    logind: Logind
    pods: PodLister
    killer: PodKiller
    conditions: ReadyTable
    node_event: NodeEvent
    state: StateFile
    leading: Callable[[], bool]
    set_times: Callable[[float, float], None]
    """Publish the start and end times (the two gauges)."""
    release: Callable[[int], None] = os.close
    clock: Callable[[], float] = time.time


class ShutdownManager:
    """Holds the inhibitor lock and handles a shutdown (see the module docstring)."""

    def __init__(self, deps: ShutdownDeps, plan: Sequence[Period]) -> None:
        self.deps = deps
        self.plan = list(plan)
        self.lock: int | None = None
        self.watched = False
        """The last `run` got as far as watching logind's signals."""
        self.shutting_down = False
        self.handled = 0
        """Shutdowns handled to the end (tests, readiness)."""
        start, end = deps.state.load()
        if start:
            deps.set_times(start, end)

    async def start(self) -> None:
        """Make logind wait long enough, then take the lock. Raises on failure (logind
        or the bus unreachable, a delay that cannot be raised)."""
        wanted = requested_s(self.plan)
        current = await self.deps.logind.inhibit_delay_max_s()
        if wanted > current:
            await self.deps.logind.ensure_inhibit_delay(wanted)
            current = await self.deps.logind.inhibit_delay_max_s()
            if wanted > current:
                raise RuntimeError(
                    f"logind's InhibitDelayMaxSec is {current:g}s after the override, less than "
                    f"the {wanted}s the shutdown grace periods need"
                )
        await self._take_lock()

    async def _take_lock(self) -> None:
        fd = await self.deps.logind.take_delay_lock(
            "kubelet", "Kubelet needs time to handle node shutdown"
        )
        self._release()
        self.lock = fd

    def drop_lock(self) -> None:
        """Release the lock (the connection it came from is gone, or the service ends)."""
        self._release()

    def _release(self) -> None:
        if self.lock is not None:
            fd, self.lock = self.lock, None
            try:
                self.deps.release(fd)
            except OSError as err:
                log.warning("cannot release the inhibitor lock", extra={"error": str(err)})

    async def run(self) -> None:
        """Start, handle a shutdown already under way, then follow logind's signals.
        Raises LogindUnavailable when logind or the bus goes (the caller starts again,
        which takes a new lock)."""
        self.watched = False
        await self.start()
        log.info(
            "node shutdown manager holds its inhibitor lock",
            extra={"periods": [(p.priority, p.grace_s) for p in self.plan]},
        )
        self.watched = True
        if await self.deps.logind.preparing_for_shutdown():
            await self.on_signal(True)
        async for shutting_down in self.deps.logind.shutdown_signals():
            await self.on_signal(shutting_down)

    async def trigger(self) -> None:
        """SIGUSR1: handle a shutdown as if logind had announced one."""
        await self.on_signal(True)

    async def on_signal(self, shutting_down: bool) -> None:
        log.info(
            "node shutdown manager detected a shutdown event", extra={"shutdown": shutting_down}
        )
        message = (
            "Shutdown manager detected shutdown event"
            if shutting_down
            else "Shutdown manager detected shutdown cancellation"
        )
        self.deps.node_event("Normal", EVENT_REASON, message)
        self.shutting_down = shutting_down
        await self._write_condition()
        if shutting_down:
            await self.handle()
        else:
            await self._take_lock()

    async def publish_condition(self) -> None:
        """Write the Ready contribution as this replica sees the node (at election too,
        so a new leader never leaves one from before a reboot in place)."""
        await self._write_condition()

    async def _write_condition(self) -> None:
        """False with "node is shutting down" while it shuts down; no contribution
        otherwise (the other services' and the runtime's say whether it is Ready)."""
        if not self.deps.leading():
            return
        try:
            if self.shutting_down:
                record = NodeConditionRecord(
                    type=READY, status="False", at=self.deps.clock(), message=NODE_SHUTTING_DOWN
                )
                await self.deps.conditions.put(READY, record)
            else:
                await self.deps.conditions.delete(READY)
        except Exception as err:  # noqa: BLE001 - the kills matter more than the condition
            log.error("cannot write the shutting-down condition", extra={"error": str(err)})

    async def handle(self) -> None:
        """Kill the active pods group by group, then release the lock."""
        start = self.deps.clock()
        self.deps.state.store(start, 0.0)
        self.deps.set_times(start, 0.0)
        try:
            pods = await self.deps.pods.active()
            for group in group_by_priority(self.plan, pods):
                if group.pods:
                    await self._kill_group(group)
        finally:
            end = self.deps.clock()
            self.deps.state.store(start, end)
            self.deps.set_times(start, end)
            self.handled += 1
            log.info(
                "node shutdown handled, releasing the inhibitor lock",
                extra={"seconds": round(end - start, 3)},
            )
            self._release()

    async def _kill_group(self, group: Group) -> None:
        log.info(
            "shutdown manager killing pods",
            extra={
                "priority": group.period.priority,
                "grace_s": group.period.grace_s,
                "pods": len(group.pods),
            },
        )
        kills = [asyncio.ensure_future(self._kill(p, group.period)) for p in group.pods]
        done, pending = await asyncio.wait(kills, timeout=group.period.grace_s)
        if pending:
            log.warning(
                "shutdown manager pod killing timed out, going on with the next group",
                extra={
                    "priority": group.period.priority,
                    "grace_s": group.period.grace_s,
                    "left": len(pending),
                },
            )
            for task in pending:
                task.cancel()
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                log.warning(
                    "shutdown manager failed killing a pod", extra={"error": str(task.exception())}
                )

    async def _kill(self, active: ActivePod, period: Period) -> None:
        pod = active.pod
        meta = pod.get("metadata") or {}
        grace = pod_grace_s(period, pod)
        log.info(
            "shutdown manager killing pod with gracePeriod",
            extra={"pod": f"{meta.get('namespace')}/{meta.get('name')}", "grace_s": grace},
        )
        await self.deps.killer.kill_pod(
            PodUID(str(meta.get("uid", ""))),
            grace_period_s=grace,
            reason=REASON,
            message=MESSAGE,
            timeout_s=grace + KILL_MARGIN_S,
        )


RETRY_S = 1.0
MAX_RETRY_S = 30.0


class _NotWatching(Exception):
    """A run of the manager ended before it watched logind's signals (why: its text)."""


async def supervise(
    manager: ShutdownManager,
    *,
    retry_s: float = RETRY_S,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """The root task: run the manager, and after logind or the bus is lost (or could
    not be reached at all) log why once and try again, 1 s then doubling to 30 s, as
    upstream reconnects (through klet's retry policy, `klet.retry`; a run that got as
    far as watching starts the back-off over). The node's pods are never touched for
    that. SIGUSR1 handles a shutdown at once (upstream's manual trigger)."""
    # klet.logind loads dbus-fast: only a node with shutdown periods (a manager) does.
    from klet.logind import LogindError, LogindUnavailable

    loop = asyncio.get_running_loop()
    usr1 = asyncio.Event()
    try:
        loop.add_signal_handler(signal.SIGUSR1, usr1.set)
    except (NotImplementedError, RuntimeError, ValueError):
        pass  # not the main thread (tests): no manual trigger

    async def manual() -> None:
        while True:
            await usr1.wait()
            usr1.clear()
            log.info("received SIGUSR1: handling a node shutdown")
            await manager.trigger()

    policy = BackoffPolicy(retry_s, MAX_RETRY_S)
    last_error = ""

    def report(error: str, wait_s: float) -> None:
        nonlocal last_error
        if error != last_error:
            log.error(
                "node shutdown manager cannot watch for shutdowns, retrying",
                extra={"error": error, "retry_s": wait_s},
            )
            last_error = error

    async def watch() -> str:
        """One run of the manager; why it ended once it had watched."""
        try:
            await manager.run()
            error = "the shutdown signals ended"
        except (LogindUnavailable, LogindError, RuntimeError) as err:
            error = str(err)
        if not manager.watched:
            raise _NotWatching(error)
        return error

    trigger = asyncio.create_task(manual())
    try:
        after_failures = 0
        while True:
            # The lock (if any) stays held while waiting: the next start takes a new one.
            error = await call_retrying(
                watch,
                policy,
                on=_NotWatching,
                before_wait=lambda err, wait_s: report(str(err), wait_s),
                sleep=sleep,
                after_failures=after_failures,
            )
            last_error = ""  # it ran: lost later, not refused at start
            report(error, delay_after(policy, 1))
            await sleep(delay_after(policy, 1))
            after_failures = 1
    finally:
        trigger.cancel()
        manager.drop_lock()
        try:
            loop.remove_signal_handler(signal.SIGUSR1)
        except (NotImplementedError, RuntimeError, ValueError):
            pass


def build(
    kubelet: KubeletConfiguration,
    *,
    root_dir: Path,
    pods: PodLister,
    killer: PodKiller,
    conditions: ReadyTable,
    node_event: NodeEvent,
    leading: Callable[[], bool],
    registry: CollectorRegistry,
    logind: Logind | None = None,
) -> ShutdownManager | None:
    """The manager for this configuration, or None when no grace period is set (then
    the node shuts down at once, as upstream's).

    The two time gauges are registered either way: upstream's metrics.Register adds them
    whenever its GracefulNodeShutdown gates are on (always, in klet), so a node without
    periods serves them at 0, as upstream's stub manager leaves them."""
    set_times = time_gauges(registry)
    plan = periods(
        grace_s=kubelet.shutdown_grace_period,
        critical_s=kubelet.shutdown_grace_period_critical_pods,
        by_priority=kubelet.shutdown_grace_period_by_pod_priority,
    )
    if not plan:
        return None
    if logind is None:
        from klet.logind import LogindClient  # dbus-fast, loaded only for a plan

        logind = LogindClient()
    deps = ShutdownDeps(
        logind=logind,
        pods=pods,
        killer=killer,
        conditions=conditions,
        node_event=node_event,
        state=StateFile(root_dir / STATE_FILE),
        leading=leading,
        set_times=set_times,
    )
    return ShutdownManager(deps, plan)
