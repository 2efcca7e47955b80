"""The eviction manager: one monitoring pass (`run_once`) and the loop around it (`run`).

Restates upstream's `managerImpl.synchronize` around the pure pieces (`thresholds`,
`ranking`), with every effect behind a small consumer-side interface:

1. observe the node (`SignalSource`), evaluate the thresholds
   (`thresholds.evaluate`) and write the pressure conditions to eviction's own bus
   table `node:eviction` (`MemoryPressure`, ... as "True"/"False"; status-reporter puts upstream's
   reasons and messages on the Node, syncloop's admission reads them);
2. local storage limits: every pod over an emptyDir sizeLimit or its ephemeral-storage
   limit is evicted, whatever the node's pressure; if any was, the pass ends there.
   The pods are measured only for what reads them (`ranking.pods_to_measure`): all of them
   when a threshold is met (the ranking), else only those a limit applies to, and
   none when no pod has one: an idle node's pass measured every pod's cgroups,
   processes and log directories every 10 s for nothing (issue 42: 90% of eviction's
   idle CPU);
3. of the thresholds past their grace period whose signal was measured anew, the first
   by eviction priority (memory first) is reclaimed: for a disk signal image-gc's
   FreeSpace (dead containers, then unused images) is asked first, bounded by
   `reclaim_timeout_s`, and the node measured again (again for up to
   `reclaim_settle_s` until what FreeSpace reported freed shows: the runtime may
   release it a moment later); nothing is evicted if every threshold is then clear by
   its minimum reclaim. An unreachable image-gc only costs that timeout: eviction goes
   on;
4. the active pods are ranked for the signal and the first one that is not critical is
   evicted through syncloop's PodControl.KillPod: reason `Evicted`, upstream's
   message, grace 1 s for a hard threshold (upstream's immediate eviction), for a soft
   one min(evictionMaxPodGracePeriod, the pod's own) (0 = the pod's own). One pod per
   pass; `run` then waits (at most 30 s) for the pod to be reported terminal and
   measures again at once, as upstream; otherwise it sleeps the monitoring period.

Active pods are the desired pods whose last reported status is not terminal
(Succeeded/Failed). That, and PodControl's idempotent kill, is what keeps a restarted
eviction service from evicting a pod twice: an evicted pod is Failed and is never a
candidate again. They come from copies of the `desired` and `status` tables
(klet.bus.tablecopy) that each pass brings up to date by reading the two tables'
generation counters (one round trip) and reading a table again only when its counter
moved, decoding only the rows that changed; both are read in full every `full_read_s`
anyway. An idle node's pass decoded every desired pod and status before (issue 42);
now it decodes none.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from klet.bus import BusError
from klet.bus.tablecopy import CopiedTable, TableCopy, TableWatch
from klet.eviction import ranking
from klet.eviction.metrics import Metrics
from klet.eviction.ranking import Candidate, FsLayout
from klet.eviction.signals import Observations, PodUsage, Signal, SignalSource
from klet.eviction.thresholds import (
    Evaluation,
    EvictionConfig,
    Threshold,
    ThresholdState,
    evaluate,
    threshold_value,
    thresholds_met,
    with_containerfs_thresholds,
)
from klet.model.pod import is_critical
from klet.model.podhistory import EVICTION_NOTE
from klet.model.records import DesiredPod, NodeConditionRecord, PodStatusRecord
from klet.model.types import JSON, PodUID
from klet.obs import OnceLogger
from klet.rpc.eviction import DryRunResult, RankedPod, SignalReading

log = logging.getLogger(__name__)

IMMEDIATE_GRACE_S = 1  # upstream's immediateEvictionGracePeriodSeconds
CLEANUP_TIMEOUT_S = 30.0  # upstream's podCleanupTimeout
CLEANUP_POLL_S = 1.0
TERMINAL_PHASES = ("Succeeded", "Failed")


class PodKiller(Protocol):
    """syncloop's PodControl.KillPod (`klet.rpc.podcontrol.PodControlClient`)."""

    async def kill_pod(
        self,
        uid: PodUID,
        *,
        grace_period_s: int | None,
        reason: str,
        message: str,
        timeout_s: float | None = None,
    ) -> bool: ...


FreeSpace = Callable[[int], Awaitable[int]]
"""Ask image-gc to free this many bytes (dead containers, then unused images); returns
the bytes freed. Raises when image-gc cannot be reached."""

NodeEvent = Callable[[str, str, str], None]
"""Record an Event (type, reason, message) on this Node; queues, never blocks."""

PodNote = Callable[[JSON, str, JSON], None]
"""Record in a pod's history only (pod, message, detail) why it is being evicted: the
signal, its threshold, what was available and the ranking (`klet why`; no Event)."""

NOTE_REASON = EVICTION_NOTE


class ConditionTable(Protocol):
    """Eviction's own node conditions on the bus (`node:eviction`), keyed by type."""

    async def put(self, key: str, record: NodeConditionRecord) -> None: ...


@dataclass(frozen=True)
class ActivePod:
    pod: JSON
    status: JSON | None


FULL_READ_S = 60.0
"""How often BusPods reads both tables in full whatever their generations say (upstream's
syncFrequency): a write that bypassed the fenced write shows within it."""


class BusPods:
    """Active pods from the bus: desired, and not reported terminal by syncloop."""

    def __init__(
        self,
        *,
        desired: CopiedTable[DesiredPod],
        status: CopiedTable[PodStatusRecord],
        full_read_s: float = FULL_READ_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.desired = TableCopy(desired)
        self.status = TableCopy(status)
        self._tables = TableWatch(self.desired, self.status, full_every_s=full_read_s, clock=clock)

    async def active(self) -> list[ActivePod]:
        await self._tables.refresh()
        desired, statuses = self.desired.records, self.status.records
        out: list[ActivePod] = []
        for uid, rec in desired.items():
            st = statuses.get(uid)
            if st is not None and (st.terminated or st.status.get("phase") in TERMINAL_PHASES):
                continue
            out.append(ActivePod(rec.pod, st.status if st is not None else None))
        return out


class PodLister(Protocol):
    async def active(self) -> list[ActivePod]: ...


@dataclass(frozen=True)
class ManagerSettings:
    """How the manager runs (all durations in seconds)."""

    monitoring_period_s: float = 10.0
    """upstream's evictionMonitoringPeriod (a constant there)."""
    reclaim_timeout_s: float = 10.0
    """Bound on one FreeSpace call; past it eviction goes on without it."""
    reclaim_settle_s: float = 5.0
    """How long the bytes FreeSpace reports freed may take to show in a measurement
    before the manager decides without them (containerd gives a removed container's
    writable layer back at its next metadata garbage collection, not at once)."""
    reclaim_settle_poll_s: float = 0.5
    kill_timeout_margin_s: float = 30.0
    """KillPod waits for the containers to stop: its deadline is the grace plus this."""
    local_storage_capacity_isolation: bool = True
    """localStorageCapacityIsolation: evict pods over their local storage limits."""


@dataclass(frozen=True)
class Deps:
    """What the manager acts through (see the module docstring)."""

    source: SignalSource
    pods: PodLister
    killer: PodKiller
    free_space: FreeSpace
    conditions: ConditionTable
    layout: Callable[[], Awaitable[FsLayout]]
    node_event: NodeEvent
    metrics: Metrics
    volumes_exist: Callable[[str], bool]
    """Whether a pod still has volumes on the node (its `volumes` directory): an evicted
    pod's emptyDir holds its disk until syncloop tears it down."""
    pod_note: PodNote | None = None
    """Where the choice of each evicted pod is noted for its history; None: nowhere."""


@dataclass
class Eviction:
    """One pod the manager evicted."""

    uid: PodUID
    name: str
    signal: str
    message: str
    grace_s: int


class EvictionManager:
    def __init__(
        self,
        deps: Deps,
        *,
        config: EvictionConfig,
        settings: ManagerSettings = ManagerSettings(),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.deps = deps
        self.config = config
        self.settings = settings
        self.clock = clock
        self.thresholds: list[Threshold] = list(config.thresholds)
        self.state = ThresholdState()
        self.layout: FsLayout | None = None
        self.conditions: frozenset[str] = frozenset()
        self.last_observations: Observations = {}
        self.evicted: dict[str, float] = {}  # uid -> when this process evicted it
        self.passes = 0  # measurements taken (readiness: at least one)
        self._once = OnceLogger(log, level=logging.WARNING)

    # -- one pass --------------------------------------------------------------------

    async def run_once(self) -> list[Eviction]:
        """One monitoring pass; returns the pods it evicted (at most one for pressure).
        Counted in the metrics once it is over, decision and eviction included."""
        evicted = await self._pass()
        self.deps.metrics.passes.inc()
        return evicted

    async def _pass(self) -> list[Eviction]:
        if self.layout is None:
            self.layout = await self._detect_layout()
        # The node alone: the pods are measured below only when something will read them.
        observations, _ = await self.deps.source.observe(pods=())
        self.passes += 1
        now = self.clock()
        self._record_observations(observations)
        evaluation = evaluate(
            observations,
            self.thresholds,
            self.state,
            now=now,
            transition_period_s=self.config.pressure_transition_period_s,
        )
        await self._write_conditions(evaluation.conditions, now)
        updated = [
            t for t in evaluation.met if _updated(t.signal, observations, self.last_observations)
        ]
        self.last_observations = observations

        if not updated and not self.settings.local_storage_capacity_isolation:
            return []
        active = await self._active()
        if active is None:
            return []
        measured = ranking.pods_to_measure((p.pod for p in active), ranking_needed=bool(updated))
        if measured is not None and not measured:
            return []  # no threshold met and no pod with a local storage limit
        _, usage = await self.deps.source.observe(pods=measured)
        candidates = self._candidate_list(active, usage)
        if self.settings.local_storage_capacity_isolation:
            evicted = await self._local_storage_evictions(candidates)
            if evicted:
                return evicted
        if not updated:
            return []
        signals = ranking.by_eviction_priority(t.signal for t in updated)
        if not signals:
            return []
        signal = signals[0]
        threshold = next(t for t in updated if t.signal == signal)
        resource = ranking.SIGNAL_RESOURCE[signal]
        log.info("attempting to reclaim", extra={"resource": resource, "signal": signal.value})
        self.deps.node_event("Warning", "EvictionThresholdMet", f"Attempting to reclaim {resource}")
        if ranking.reclaims_node_level(signal, layout=self.layout):
            if await self._reclaim_node_level(signal, observations):
                log.info("reduced the pressure without evicting pods", extra={"resource": resource})
                return []
        if not candidates:
            log.error("thresholds met, but no pods are active to evict")
            return []
        ranked = ranking.rank(signal, candidates, layout=self.layout)
        quantity, available = _threshold_met_info(resource, updated, observations)
        for t in updated:
            seen = observations.get(t.signal)
            if seen is not None:
                self.deps.metrics.stats_age.labels(t.signal.value).observe(max(now - seen.time, 0))
        for c in ranked:
            if is_critical(c.pod):
                log.error("cannot evict a critical pod", extra={"pod": c.full_name})
                continue
            message = ranking.eviction_message(
                resource, c, threshold_quantity=quantity, available=available
            )
            grace = self._grace(threshold, c.pod)
            seen = observations.get(signal)
            self._note(
                c,
                signal=signal.value,
                threshold=threshold.describe(),
                available=(
                    ranking.format_amount(resource, seen.available) if seen is not None else None
                ),
                why=ranking.rank_reason(signal, c, layout=self.layout),
                grace=grace,
            )
            if await self._evict(c, grace=grace, message=message):
                self.deps.metrics.evictions.labels(signal.value).inc()
                return [Eviction(c.uid, c.full_name, signal.value, message, grace)]
            return []
        log.info("unable to evict any pods from the node")
        return []

    # -- the dry-run ------------------------------------------------------------------

    async def dry_run(self, thresholds: Sequence[Threshold] | None = None) -> DryRunResult:
        """What `run_once` would do now, decided as it decides and not acted on: a fresh
        measurement, the thresholds evaluated on a copy of the state (grace periods and
        held conditions count as they would), local storage violators, node-level
        reclaim and the ranking. Nothing is killed, written, recorded or freed, and no
        state or metric of the manager changes. `thresholds` (hard, from
        `parse_expressions`) replace the configured ones for this answer."""
        layout = self.layout or await self.deps.layout()
        base = self.config.thresholds if thresholds is None else thresholds
        active_thresholds = with_containerfs_thresholds(
            base,
            dedicated_image_fs=layout.dedicated_image_fs,
            split_container_fs=layout.split_container_fs,
        )
        observations, usage = await self.deps.source.observe()
        now = self.clock()
        state = copy.deepcopy(self.state)
        if thresholds is not None:
            # Only what the given thresholds carry: a configured threshold still held
            # by its minimum reclaim is not among them.
            state.first_observed = {
                t: at for t, at in state.first_observed.items() if t in active_thresholds
            }
            state.met = [t for t in state.met if t in active_thresholds]
        evaluation = evaluate(
            observations,
            active_thresholds,
            state,
            now=now,
            transition_period_s=self.config.pressure_transition_period_s,
        )
        readings = _readings(observations, active_thresholds, evaluation)
        conditions = tuple(c for c in ranking.PRESSURE_CONDITIONS if c in evaluation.conditions)
        described = tuple(t.describe() for t in active_thresholds)

        def result(
            summary: str, *, signal: str = "", reclaim: int = 0, pods: Sequence[RankedPod] = ()
        ) -> DryRunResult:
            return DryRunResult(
                readings, conditions, signal, reclaim, tuple(pods), summary, described
            )

        candidates = self._candidate_list(await self.deps.pods.active(), usage)
        if self.settings.local_storage_capacity_isolation:
            violators = [
                RankedPod(
                    c.full_name,
                    c.uid,
                    f"over its local storage limit ({v.signal})",
                    critical=is_critical(c.pod),
                    evict=not is_critical(c.pod),
                    message=v.message if not is_critical(c.pod) else "",
                    grace_period_s=IMMEDIATE_GRACE_S,
                )
                for c, v in _local_storage_violations(candidates)
            ]
            if any(p.evict for p in violators):
                names = ", ".join(p.pod for p in violators if p.evict)
                return result(
                    f"would evict {names} for exceeding local storage limits, then end the pass",
                    pods=violators,
                )
        signals = ranking.by_eviction_priority(t.signal for t in evaluation.met)
        if not signals:
            crossed = [t.describe() for t in evaluation.crossed]
            if crossed:
                return result("no threshold past its grace period; crossed: " + ", ".join(crossed))
            return result("no threshold is met: nothing would be evicted")
        signal = signals[0]
        threshold = next(t for t in evaluation.met if t.signal == signal)
        resource = ranking.SIGNAL_RESOURCE[signal]
        reclaim = 0
        first = ""
        if ranking.reclaims_node_level(signal, layout=layout):
            reclaim = _reclaim_wanted(signal, observations, active_thresholds)
            first = (
                f"would ask image-gc to free {reclaim} bytes first and evict only if "
                f"{signal.value} is still below its threshold plus minimum reclaim; "
            )
        ranked = ranking.rank(signal, candidates, layout=layout)
        quantity, available = _threshold_met_info(resource, evaluation.met, observations)
        pods: list[RankedPod] = []
        chosen = ""
        for c in ranked:
            critical = is_critical(c.pod)
            evict = not critical and not chosen
            pods.append(
                RankedPod(
                    c.full_name,
                    c.uid,
                    ranking.rank_reason(signal, c, layout=layout),
                    critical=critical,
                    evict=evict,
                    message=ranking.eviction_message(
                        resource, c, threshold_quantity=quantity, available=available
                    )
                    if evict
                    else "",
                    grace_period_s=self._grace(threshold, c.pod) if evict else 0,
                )
            )
            if evict:
                chosen = c.full_name
        if chosen:
            action = f"would evict {chosen} (one pod per pass)"
        elif candidates:
            action = "no pod can be evicted (every candidate is critical)"
        else:
            action = "no pod is active to evict"
        return result(
            f"{signal.value} is met: {first}{action}",
            signal=signal.value,
            reclaim=reclaim,
            pods=pods,
        )

    # -- the loop ---------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            try:
                evicted = await self.run_once()
            except BusError as err:
                self._once.error("pass", f"eviction pass failed, retrying: {err}")
                evicted = []
            else:
                self._once.clear("pass")
            if evicted:
                await self.wait_for_cleanup([e.uid for e in evicted])
            else:
                await asyncio.sleep(self.settings.monitoring_period_s)

    async def wait_for_cleanup(self, uids: Sequence[str]) -> bool:
        """Until no evicted pod is active any more and none has volumes left (upstream's
        waitForPodsCleanup with podResourcesAreReclaimed): measuring again before an
        evicted pod's emptyDir is gone would find the same pressure and evict another."""
        deadline = self.clock() + CLEANUP_TIMEOUT_S
        while self.clock() < deadline:
            try:
                active = {
                    (p.pod.get("metadata") or {}).get("uid") for p in await self.deps.pods.active()
                }
            except BusError:
                active = set(uids)
            if not active.intersection(uids) and not any(
                self.deps.volumes_exist(uid) for uid in uids
            ):
                log.info("evicted pods cleaned up", extra={"uids": list(uids)})
                return True
            await asyncio.sleep(CLEANUP_POLL_S)
        log.info("timed out waiting for evicted pods to be cleaned up", extra={"uids": list(uids)})
        return False

    # -- steps ------------------------------------------------------------------------

    async def _detect_layout(self) -> FsLayout:
        layout = await self.deps.layout()
        self.thresholds = with_containerfs_thresholds(
            self.config.thresholds,
            dedicated_image_fs=layout.dedicated_image_fs,
            split_container_fs=layout.split_container_fs,
        )
        log.info(
            "filesystem layout",
            extra={
                "dedicated_image_fs": layout.dedicated_image_fs,
                "split_container_fs": layout.split_container_fs,
                "thresholds": [t.describe() for t in self.thresholds],
            },
        )
        return layout

    def _record_observations(self, observations: Observations) -> None:
        m = self.deps.metrics
        for signal, seen in observations.items():
            m.available.labels(signal.value).set(seen.available)
            m.capacity.labels(signal.value).set(seen.capacity)
        for t in self.thresholds:
            against = observations.get(t.signal)
            if against is not None:
                kind = "hard" if t.hard else "soft"
                m.threshold.labels(t.signal.value, kind).set(threshold_value(t, against.capacity))

    async def _write_conditions(self, conditions: frozenset[str], now: float) -> None:
        for type_ in ranking.PRESSURE_CONDITIONS:
            on = type_ in conditions
            self.deps.metrics.condition.labels(type_).set(1 if on else 0)
            if on != (type_ in self.conditions):
                log.info("node condition changed", extra={"condition": type_, "status": on})
        self.conditions = conditions
        try:
            for type_ in ranking.PRESSURE_CONDITIONS:
                status = "True" if type_ in conditions else "False"
                record = NodeConditionRecord(type=type_, status=status, at=now)
                await self.deps.conditions.put(type_, record)
        except BusError as err:
            self._once.error("conditions", f"cannot write the node conditions: {err}")
        else:
            self._once.clear("conditions")

    async def _active(self) -> list[ActivePod] | None:
        """The active pods (None when the bus cannot say); forgets the evictions of
        pods no longer active."""
        try:
            active = await self.deps.pods.active()
        except BusError as err:
            self._once.error("pods", f"cannot list the active pods: {err}")
            return None
        self._once.clear("pods")
        listed = {str((p.pod.get("metadata") or {}).get("uid", "")) for p in active}
        # A pod no longer active has a terminal status or is gone: nothing can pick it
        # again, so its entry goes (else the map grows with every eviction for good).
        self.evicted = {uid: at for uid, at in self.evicted.items() if uid in listed}
        return active

    def _candidate_list(
        self, active: Sequence[ActivePod], usage: Mapping[str, PodUsage]
    ) -> list[Candidate]:
        out = []
        for p in active:
            uid = str((p.pod.get("metadata") or {}).get("uid", ""))
            if uid in self.evicted:
                continue  # this process evicted it; its status has not caught up yet
            out.append(Candidate(p.pod, usage.get(uid)))
        return out

    async def _local_storage_evictions(self, candidates: Sequence[Candidate]) -> list[Eviction]:
        out: list[Eviction] = []
        for c, violation in _local_storage_violations(candidates):
            if is_critical(c.pod):
                log.error("cannot evict a critical pod", extra={"pod": c.full_name})
                continue
            self._note(
                c,
                signal=violation.signal,
                threshold="its local storage limit",
                available=None,
                why=violation.message,
                grace=IMMEDIATE_GRACE_S,
            )
            if await self._evict(c, grace=IMMEDIATE_GRACE_S, message=violation.message):
                self.deps.metrics.evictions.labels(violation.signal).inc()
                out.append(
                    Eviction(
                        c.uid, c.full_name, violation.signal, violation.message, IMMEDIATE_GRACE_S
                    )
                )
        return out

    async def _reclaim_node_level(self, signal: Signal, observations: Observations) -> bool:
        """FreeSpace, then measure again: True when every threshold is clear by its
        minimum reclaim (no pod needs to go)."""
        wanted = _reclaim_wanted(signal, observations, self.thresholds)
        started = time.monotonic()
        freed = 0
        try:
            async with asyncio.timeout(self.settings.reclaim_timeout_s):
                freed = await self.deps.free_space(wanted)
        except TimeoutError:
            self.deps.metrics.reclaims.labels("timeout").inc()
            log.warning(
                "image-gc did not answer FreeSpace in time, evicting without it",
                extra={"timeout_s": self.settings.reclaim_timeout_s},
            )
        except Exception as err:  # noqa: BLE001 - any failure of the peer: evict without it
            self.deps.metrics.reclaims.labels("error").inc()
            log.warning("FreeSpace failed, evicting without it", extra={"error": str(err)})
        else:
            self.deps.metrics.reclaims.labels("ok").inc()
            log.info(
                "node-level reclaim done",
                extra={
                    "signal": signal.value,
                    "asked": wanted,
                    "freed": freed,
                    "seconds": round(time.monotonic() - started, 3),
                },
            )
        return await self._clear_after_reclaim(signal, observations, freed)

    async def _clear_after_reclaim(self, signal: Signal, before: Observations, freed: int) -> bool:
        """Measure again: True when every threshold is clear by its minimum reclaim.
        While one is still met and `signal` has not yet gained the `freed` bytes image-gc
        reported, measure again every `reclaim_settle_poll_s`, for `reclaim_settle_s` at
        most: the runtime may release them a moment after FreeSpace returned (containerd
        removes a deleted container's snapshot at its next garbage collection, which a
        busy host delays), and deciding on the stale reading would evict a pod for
        space that is already free."""
        began = time.monotonic()
        start = before.get(signal)
        polls = 0
        while True:
            after, _ = await self.deps.source.observe(pods=())
            waited_s = round(time.monotonic() - began, 3)
            if not thresholds_met(after, self.thresholds, enforce_min_reclaim=True):
                if polls:
                    log.info(
                        "the space FreeSpace freed showed after a wait",
                        extra={"signal": signal.value, "polls": polls, "waited_s": waited_s},
                    )
                return True
            seen = after.get(signal)
            if freed <= 0 or start is None or seen is None:
                return False
            gained = seen.available - start.available
            if gained >= freed:
                return False  # it showed, and it was not enough
            if waited_s >= self.settings.reclaim_settle_s:
                log.info(
                    "the space FreeSpace reported freed has not shown; deciding without it",
                    extra={
                        "signal": signal.value,
                        "freed": freed,
                        "gained": gained,
                        "waited_s": waited_s,
                    },
                )
                return False
            polls += 1
            await asyncio.sleep(self.settings.reclaim_settle_poll_s)

    def _grace(self, threshold: Threshold, pod: JSON) -> int:
        if threshold.hard:
            return IMMEDIATE_GRACE_S
        own = ranking.pod_grace_period(pod)
        cap = self.config.max_pod_grace_period_s
        return min(cap, own) if cap > 0 else own

    def _note(
        self,
        c: Candidate,
        *,
        signal: str,
        threshold: str,
        available: str | None,
        why: str,
        grace: int,
    ) -> None:
        if self.deps.pod_note is None:
            return
        left = f", {available} available" if available is not None else ""
        message = f"{signal}: {threshold} met{left}; chosen: {why}; grace {grace}s"
        detail: JSON = {"signal": signal, "threshold": threshold, "rank": why, "grace": grace}
        if available is not None:
            detail["available"] = available
        self.deps.pod_note(c.pod, message, detail)

    async def _evict(self, c: Candidate, *, grace: int, message: str) -> bool:
        log.info(
            "evicting pod",
            extra={"pod": c.full_name, "uid": c.uid, "grace_s": grace, "eviction_message": message},
        )
        try:
            found = await self.deps.killer.kill_pod(
                c.uid,
                grace_period_s=grace,
                reason=ranking.REASON,
                message=message,
                timeout_s=grace + self.settings.kill_timeout_margin_s,
            )
        except Exception as err:  # noqa: BLE001 - syncloop unreachable: try again next pass
            self._once.error("kill", f"pod failed to evict: {err}")
            return False
        self._once.clear("kill")
        if not found:
            log.info("pod to evict is gone already", extra={"pod": c.full_name})
            return False
        self.evicted[c.uid] = self.clock()
        log.info("pod is evicted successfully", extra={"pod": c.full_name})
        return True


def _readings(
    observations: Observations, thresholds: Sequence[Threshold], evaluation: Evaluation
) -> tuple[SignalReading, ...]:
    """Every observed signal against each of its thresholds (one row without, if none)."""
    out = []
    for signal, seen in sorted(observations.items(), key=lambda kv: kv[0].value):
        mine = [t for t in thresholds if t.signal == signal]
        if not mine:
            out.append(SignalReading(signal.value, seen.available, seen.capacity))
        for t in mine:
            out.append(
                SignalReading(
                    signal.value,
                    seen.available,
                    seen.capacity,
                    threshold=t.describe(),
                    threshold_value=threshold_value(t, seen.capacity),
                    crossed=t in evaluation.crossed,
                    met=t in evaluation.met,
                )
            )
    return tuple(out)


def _local_storage_violations(
    candidates: Sequence[Candidate],
) -> list[tuple[Candidate, ranking.LocalStorageViolation]]:
    """The candidates over a local storage limit, each with its violation."""
    out = []
    for c in candidates:
        if c.usage is None:
            continue
        violation = ranking.local_storage_violation(c.pod, c.usage)
        if violation is not None:
            out.append((c, violation))
    return out


def _reclaim_wanted(
    signal: Signal, observations: Observations, thresholds: Sequence[Threshold]
) -> int:
    """The bytes FreeSpace is asked for: what brings `signal` back above its thresholds
    plus their minimum reclaim; for inodes (not askable in bytes) everything unused."""
    seen = observations.get(signal)
    wanted = 0
    if seen is not None:
        for t in thresholds:
            if t.signal == signal:
                target = threshold_value(t, seen.capacity)
                if t.min_reclaim is not None:
                    target += t.min_reclaim.of(seen.capacity)
                wanted = max(wanted, target - seen.available)
    if ranking.SIGNAL_RESOURCE[signal] == ranking.INODES or wanted <= 0:
        # Inodes cannot be asked for in bytes: free whatever is unused.
        wanted = seen.capacity if seen is not None else 2**62
    return wanted


def _updated(signal: Signal, observations: Observations, last: Observations) -> bool:
    """upstream's thresholdsUpdatedStats: act only on a signal measured anew."""
    seen = observations.get(signal)
    if seen is None:
        return False
    before = last.get(signal)
    return before is None or seen.time == 0 or seen.time > before.time


def _threshold_met_info(
    resource: str, thresholds: Sequence[Threshold], observations: Observations
) -> tuple[int | None, int | None]:
    """upstream's getThresholdMetInfo: the first threshold of `resource` with an
    observation gives the message's threshold quantity and available amount."""
    for t in thresholds:
        if ranking.SIGNAL_RESOURCE.get(t.signal) != resource:
            continue
        seen = observations.get(t.signal)
        if seen is not None:
            return threshold_value(t, seen.capacity), seen.available
    return None, None
