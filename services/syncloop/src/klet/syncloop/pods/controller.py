"""The pod controller: desired pods in, one pod worker per UID, statuses out.

It holds syncloop's view of the world: one `PodSyncState` per pod (podstate.py: its
desired record, a kill request from PodControl, why it was made terminal) and the pods
the runtime has (woken by PLEG). `sync_once(uid)` is the body of a pod worker; as
upstream's pod workers it picks by the pod's place in its life between `sync_pod` (run
it as desired), `sync_terminating_pod` (stop a pod killed by request, made terminal or
being deleted), `sync_terminated_pod` (give a stopped terminal or deleted pod's volumes
back: a deleted pod is reported terminated, which lets status-reporter delete its API
object, only once they are gone, as upstream's status manager waits for them) and
removing a pod nobody wants any more.

A critical pod that admission takes with pods to preempt (admission/preemption.py)
starts only once they are killed, one after the other, each as upstream's killPodNow:
reason `Preempting` (its Warning Event recorded first, the DisruptionTarget condition
set), waited for at most its grace period and a half (10 s at least; longer, an
`ExceededGracePeriod` Warning and the next one); each one killed is counted
(`on_preempted`, kubelet_preemptions by the resource it was preempted for).

Static pods start one at a time per full name (staticpods.py, upstream's
allowStaticPodStart): the new pod of an edited manifest waits, Pending, until the old
one's containers are stopped and removed; the old one's end wakes it.

Removal is destructive and so gated (STYLE rule 12): a runtime pod without a desired
entry is only killed once every configured pod source has delivered a full snapshot
to the bus. After a Redis restart or flush the sources table is empty, so nothing is
removed until pod-source has written everything back.

Every desired record is checked before the controller takes it (`check_desired`): the
`desired` table is an input like any other, and whatever wrote it (a pod-source of
another version, a bug, anyone with access to Redis) must not make this node join an
unchecked name into a host path or run another node's pod. A record whose
`spec.nodeName` names another node is ignored; one that fails the shared pod
validation (`klet.model.podvalidation`, the same rules pod-source applies) is refused
with a logged error naming the pod and the fields, and a `FailedValidation` Warning
Event when its identity is sound enough to attach one to. Either way the record counts
as not desired: a pod of that UID that is running is stopped like a removed one (with
the last valid spec it had), and every other pod carries on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from klet.bus import BusError, NodeBus
from klet.cri.types import SandboxState
from klet.model.node import NODE_SHUTDOWN, NODE_SHUTTING_DOWN
from klet.model.node import SHUTDOWN_POD_REASON as SHUTDOWN_KILL_REASON
from klet.model.pod import CONFIG_MIRROR, CONFIG_SEEN, CONFIG_SOURCE, is_static
from klet.model.podvalidation import pod_problems
from klet.model.records import DesiredPod, PodChange, SourceState, sources_ready
from klet.model.types import JSON, PodUID, pod_full_name
from klet.rpc.podcontrol import PodSummary
from klet.syncloop.admission.admit import EVICTED, PRESSURE_ORDER, AdmissionLedger, Verdict
from klet.syncloop.admission.preemption import (
    PREEMPTED_DISRUPTION,
    PREEMPTED_MESSAGE,
    PREEMPTING,
)
from klet.syncloop.eventrecorder import EventSink
from klet.syncloop.model import podspec
from klet.syncloop.model.runtimepod import RuntimePod
from klet.syncloop.pods.podstate import (
    WORKER_CREATE,
    KillRequest,
    PodSyncState,
    pod_worker_operation,
    working_pod_counts,
)
from klet.syncloop.pods.podworkers import BACKOFF_PERIOD_S, Outcome, PodWorkers
from klet.syncloop.pods.resizing import PodResizer
from klet.syncloop.pods.runtime import PodRuntime
from klet.syncloop.pods.staticpods import StaticPodGate
from klet.syncloop.pods.status import compute_pod_status
from klet.syncloop.pods.statuspub import StatusPublisher
from klet.syncloop.pods.syncpod import PodSyncer
from klet.syncloop.probing import probes
from klet.syncloop.probing.prober import ProbeManager
from klet.syncloop.probing.proberesults import NO_PROBES, ProbeResults

log = logging.getLogger(__name__)

PREEMPT_MIN_WAIT_S = 10  # upstream's killPodNow waits grace * 1.5, at least 10 s
EXCEEDED_GRACE = "Container runtime did not kill the pod within specified grace period."


FAILED_VALIDATION = "FailedValidation"  # upstream's event reason for a refused pod
MAX_PROBLEMS_SHOWN = 10
STATIC_RECHECK_S = 5.0
"""How soon a static pod waiting for its name syncs again without being woken (the
stop of the pod it waits for wakes it at once)."""


@dataclass(frozen=True)
class Refusal:
    """Why a desired record is not acted on."""

    reason: str  # "OtherNode" or FailedValidation
    message: str
    fields: tuple[str, ...] = ()
    eventable: bool = False  # the pod's identity is valid: an Event may name it


def check_desired(uid: str, rec: DesiredPod, *, node_name: str) -> Refusal | None:
    """Why the record `uid` of the `desired` table must not be acted on; None if it may.

    `node_name` "" skips the node check (unit tests of other concerns).
    """
    pod: Any = rec.pod
    spec = pod.get("spec") if isinstance(pod, Mapping) else None
    other = spec.get("nodeName") if isinstance(spec, Mapping) else None
    if node_name and isinstance(other, str) and other and other != node_name:
        return Refusal("OtherNode", f"spec.nodeName is {other[:253]!r}, not this node")
    problems = pod_problems(pod, require_uid=True)
    meta = pod.get("metadata") if isinstance(pod, Mapping) else None
    pod_uid = meta.get("uid") if isinstance(meta, Mapping) else None
    mismatch = pod_uid != uid or rec.uid != uid
    if not problems and not mismatch:
        return None
    texts = [str(p) for p in problems[:MAX_PROBLEMS_SHOWN]]
    if len(problems) > MAX_PROBLEMS_SHOWN:
        texts.append(f"and {len(problems) - MAX_PROBLEMS_SHOWN} more")
    if mismatch:
        texts.insert(0, f"metadata.uid: {str(pod_uid)[:80]!r} is not the table key {uid[:80]!r}")
    identity = ("metadata", "metadata.name", "metadata.namespace", "metadata.uid", "<root>")
    return Refusal(
        FAILED_VALIDATION,
        "; ".join(texts),
        fields=tuple(p.field for p in problems),
        eventable=not mismatch and not any(p.field in identity for p in problems),
    )


_LOCAL_ANNOTATIONS = frozenset({CONFIG_SOURCE, CONFIG_MIRROR, CONFIG_SEEN})


def _meaning(pod: JSON) -> tuple[Any, ...]:
    """What of a pod its worker acts on (pod-source's semantic fields, restated here):
    not its status, resourceVersion or the node-local bookkeeping annotations."""
    meta = podspec.meta(pod)
    annotations = {
        k: v for k, v in (meta.get("annotations") or {}).items() if k not in _LOCAL_ANNOTATIONS
    }
    return (
        pod.get("spec") or {},
        meta.get("labels") or {},
        meta.get("deletionTimestamp"),
        meta.get("deletionGracePeriodSeconds"),
        annotations,
    )


def needs_sync(old: JSON, new: JSON) -> bool:
    """Whether a new desired record of a pod calls for a sync at once: its spec, labels,
    annotations or deletion changed, or the conditions its readiness gates name
    (upstream's HandlePodReconcile syncs a status-only change only for
    NeedToReconcilePodReadiness). A status-only change is mostly this node's own status
    coming back from the apiserver (a RECONCILE); waking on it let every status patch
    start another attempt of a failing pod, past its back-off."""
    if _meaning(old) != _meaning(new):
        return True
    gates = {
        str(g.get("conditionType"))
        for g in (new.get("spec") or {}).get("readinessGates") or []
        if isinstance(g, Mapping)
    }
    if not gates:
        return False

    def gated(pod: JSON) -> list[Any]:
        conditions = (pod.get("status") or {}).get("conditions") or []
        return [c for c in conditions if isinstance(c, Mapping) and c.get("type") in gates]

    return gated(old) != gated(new)


class PressureSource(Protocol):
    """The node pressure conditions in force, for admission."""

    async def conditions(self) -> frozenset[str]: ...


class NodePressure:
    """Pressure conditions from the bus `node` table (the eviction service writes them):
    every condition some contribution holds "True", and `NodeShutdown` while a
    contribution says the node is shutting down. Read when a new pod is admitted; a
    Redis outage keeps the last answer."""

    def __init__(self, bus: NodeBus) -> None:
        self.bus = bus
        self._last: frozenset[str] = frozenset()
        self._down = False

    async def conditions(self) -> frozenset[str]:
        try:
            records = await self.bus.node.all()
        except BusError as err:
            if not self._down:
                log.warning(
                    "cannot read node conditions, admitting with the last known",
                    extra={"error": str(err)},
                )
                self._down = True
            return self._last
        self._down = False
        in_force = {
            r.type for r in records.values() if r.type in PRESSURE_ORDER and r.status == "True"
        }
        if any(
            r.type == "Ready" and r.status == "False" and r.message == NODE_SHUTTING_DOWN
            for r in records.values()
        ):
            in_force.add(NODE_SHUTDOWN)
        self._last = frozenset(in_force)
        return self._last


LastStatus = Callable[[str], Awaitable[JSON | None]]
"""The pod status this node last published (the bus `status` table survives restarts)."""


async def published_status(bus: NodeBus, uid: str) -> JSON | None:
    rec = await bus.status.get(uid)
    return rec.status if rec is not None else None


def active_deadline(pod: JSON, current: RuntimePod) -> float | None:
    """When the pod's activeDeadlineSeconds runs out (None: no deadline, or no sandbox yet).

    It counts from the pod's first sandbox, which survives a syncloop restart (an
    in-memory start time would not)."""
    first = min((s.created_at for s in current.sandboxes), default=None)
    return podspec.deadline_at(pod, None if first is None else first / 1e9)


class WorkerObserver(Protocol):
    """Told of each pod worker sync and each status computed (syncloop's metrics:
    kubelet_pod_worker_duration_seconds, the pod start durations)."""

    def pod_worker(self, operation: str, seconds: float) -> None: ...

    def pod_worker_creating(self, pod: JSON, now: float) -> None: ...

    def pod_restarted(self, *, static: bool) -> None: ...

    def orphaned_runtime_pod(self) -> None: ...

    def pod_status(self, uid: str, pod: JSON, status: JSON, now: float) -> None: ...

    def forget(self, uid: str) -> None: ...


class _NoObserver:
    def pod_worker(self, operation: str, seconds: float) -> None:
        return None

    def pod_worker_creating(self, pod: JSON, now: float) -> None:
        return None

    def pod_restarted(self, *, static: bool) -> None:
        return None

    def orphaned_runtime_pod(self) -> None:
        return None

    def pod_status(self, uid: str, pod: JSON, status: JSON, now: float) -> None:
        return None

    def forget(self, uid: str) -> None:
        return None


def anything_running(current: RuntimePod) -> bool:
    """The pod has a running container or a ready sandbox: there is something to stop."""
    return bool(current.running()) or any(s.state == SandboxState.READY for s in current.sandboxes)


class PodController:
    def __init__(
        self,
        *,
        bus: NodeBus,
        runtime: PodRuntime,
        syncer: PodSyncer,
        publisher: StatusPublisher,
        events: EventSink,
        host_ip: str,
        runtime_type: str = "containerd",
        clock: Callable[[], float] = time.time,
        prober: ProbeManager | None = None,
        admission: AdmissionLedger | None = None,
        pressure: PressureSource | None = None,
        last_status: LastStatus | None = None,
        on_rejected: Callable[[str], None] | None = None,
        on_preempted: Callable[[str], None] | None = None,
        node_name: str = "",
        observer: WorkerObserver | None = None,
        resizer: PodResizer | None = None,
        backoff_period_s: float = BACKOFF_PERIOD_S,
    ) -> None:
        self.bus = bus
        # In-place resize (InPlacePodVerticalScaling); None: pods run as their spec says.
        self.resizer = resizer
        self.observer: WorkerObserver = observer or _NoObserver()
        # Desired records naming another node are ignored; "" checks no node name.
        self.node_name = node_name
        self._refused: dict[str, tuple[str, str]] = {}  # uid -> (hash, message) logged
        self.last_status = last_status  # the status published before a restart
        self.runtime = runtime
        self.syncer = syncer
        self.publisher = publisher
        self.events = events  # the Events it records itself: validation, admission, eviction
        self.host_ip = host_ip
        self.runtime_type = runtime_type
        self.clock = clock
        self.prober = prober
        self.probes: ProbeResults = prober if prober is not None else NO_PROBES
        self.pods: dict[str, PodSyncState] = {}
        self.sources_ready = False
        self.runtime_uids: set[str] = set()
        # a sync that failed in the status is retried after backoff_period_s (podworkers)
        # A change of the pod (an update, a deletion, a kill) drops its kept runtime read:
        # the sync it wakes reads CRI; the others may take the read (runtimecache.py).
        self.workers = PodWorkers(
            self.sync_once,
            clock=clock,
            backoff_period_s=backoff_period_s,
            on_wake=runtime.invalidate,
        )
        # Every stream change gets a generation number, so a table read that began
        # before it (and so does not contain it) cannot undo it.
        self.generation = 0
        self._changed_at: dict[str, int] = {}
        # Admission (admission.py): None admits every pod (unit tests of other concerns).
        self.admission = admission
        self.pressure = pressure  # node pressure for admission; None: never under pressure
        # Told the reason of every admission rejection (kubelet_admission_rejections_total).
        self.on_rejected = on_rejected
        # Told the resource of every pod killed to admit a critical one (kubelet_preemptions).
        self.on_preempted = on_preempted
        self._desired_read = False  # the restart re-admission needs one full table read
        self._readmit_lock = asyncio.Lock()
        # Once after the first full read: every pod restored from the status table in
        # one read, and the probes of their running containers started (_carry_over).
        self._carried_over = False
        self._carry_lock = asyncio.Lock()
        # Static pods start one at a time per full name (staticpods.py).
        self.static = StaticPodGate()
        self._static_blocked: set[str] = set()  # logged as waiting for their turn

    @property
    def desired(self) -> dict[str, DesiredPod]:
        """The desired pods by UID."""
        return {uid: s.desired for uid, s in self.pods.items() if s.desired is not None}

    def _desired(self, uid: str) -> DesiredPod | None:
        state = self.pods.get(uid)
        return state.desired if state is not None else None

    # -- inputs ------------------------------------------------------------------------

    def apply_desired(
        self,
        table: Mapping[str, DesiredPod],
        sources: Mapping[str, SourceState],
        *,
        read_from: int,
    ) -> None:
        """A full read of the desired and sources tables, begun at generation `read_from`.

        Pods the stream changed after the read began are left as the stream set them.
        """
        self.sources_ready = sources_ready(sources)
        self._desired_read = True
        newer = {uid for uid, gen in self._changed_at.items() if gen > read_from}
        for uid, rec in table.items():
            old = self._desired(uid)
            if uid not in newer and (old is None or old.hash != rec.hash or old.pod != rec.pod):
                self.set_desired(uid, rec)
        if self.sources_ready:
            for uid in [u for u in self.desired if u not in table and u not in newer]:
                self._unset(uid)
        self._changed_at = {uid: gen for uid, gen in self._changed_at.items() if gen > read_from}
        self._refused = {uid: key for uid, key in self._refused.items() if uid in table}

    async def on_change(self, change: PodChange) -> None:
        """A `pods` stream entry: re-read that pod's desired entry."""
        await self.on_changes([change])

    async def on_changes(self, changes: Sequence[PodChange]) -> None:
        """A batch of `pods` stream entries, in stream order: the desired entries of
        their pods are re-read in one round trip (a burst of 110 new pods is one HMGET,
        not 110 reads one after the other before the last pod's worker is woken).

        The read comes after every entry of the batch was written, so it is at least as
        new as each of them; a pod named twice gets its latest record both times.
        """
        if not changes:
            return
        records = await self.bus.desired.get_many([c.uid for c in changes])
        sources_read = False
        for change in changes:
            rec = records.get(change.uid)
            self.generation += 1
            self._changed_at[change.uid] = self.generation
            if rec is not None:
                self.set_desired(change.uid, rec)
            elif change.op in ("REMOVE", "DELETE"):
                # A removal may be the first sign that the sources became ready; read
                # them now (once per batch) rather than making the kill wait for the
                # next table resync.
                if not sources_read:
                    self.sources_ready = sources_ready(await self.bus.sources.all())
                    sources_read = True
                self._unset(change.uid)

    def set_desired(self, uid: str, rec: DesiredPod) -> None:
        """The record `uid` of the `desired` table, as read: taken if it passes the checks."""
        refusal = check_desired(uid, rec, node_name=self.node_name)
        if refusal is not None:
            self._refuse(uid, rec, refusal)
            self._unset(uid)
            return
        if self._refused.pop(uid, None) is not None:
            log.info("desired pod accepted again", extra={"uid": uid})
        state = self.pods.setdefault(uid, PodSyncState())
        old = state.desired
        state.desired = rec
        state.last_pod = rec.pod
        if is_static(rec.pod):
            self.static.seen(pod_full_name(rec.pod), uid)
        if old is None or needs_sync(old.pod, rec.pod):
            self.workers.wake(uid)

    def _refuse(self, uid: str, rec: DesiredPod, refusal: Refusal) -> None:
        """Log (and, for an invalid pod, record an Event) once per record content."""
        key = (rec.hash, refusal.message)
        if self._refused.get(uid) == key:
            return
        self._refused[uid] = key
        pod: Any = rec.pod
        meta = pod.get("metadata") if isinstance(pod, Mapping) else None
        meta = meta if isinstance(meta, Mapping) else {}
        name = f"{str(meta.get('namespace', ''))[:63]}/{str(meta.get('name', ''))[:253]}"
        if refusal.reason == "OtherNode":
            log.error(
                "desired pod %s (uid %s) belongs to another node, ignored: %s",
                name,
                uid[:128],
                refusal.message,
                extra={"uid": uid[:128], "pod": name, "source": rec.source},
            )
            return
        log.error(
            "desired pod %s (uid %s) is invalid, not run: %s",
            name,
            uid[:128],
            refusal.message,
            extra={
                "uid": uid[:128],
                "pod": name,
                "source": rec.source,
                "fields": list(refusal.fields[:MAX_PROBLEMS_SHOWN]),
            },
        )
        if refusal.eventable:
            self.events.emit(
                rec.pod,
                "Warning",
                FAILED_VALIDATION,
                f"Error validating pod {name} from {rec.source}, ignoring: {refusal.message}",
            )

    def _unset(self, uid: str) -> None:
        state = self.pods.get(uid)
        if state is not None and state.desired is not None:
            state.desired = None
            log.info("pod no longer desired", extra={"uid": uid})
        self.workers.wake(uid)

    def on_runtime_change(self, uid: str) -> None:
        """PLEG saw the pod change in the runtime: a nudge, which waits for the back-off
        of a failed sync (the failed attempt's own traces must not repeat it at once)."""
        self.workers.nudge(uid)

    def known(self, uid: str) -> bool:
        return self._desired(uid) is not None or uid in self.runtime_uids

    async def reconcile_statuses(self) -> None:
        """Publish again what the status table lacks; drop the statuses of unknown pods."""
        await self.publisher.reconcile(self.known)

    # -- the pod worker body -----------------------------------------------------------

    async def sync_once(self, uid: str) -> Outcome:
        """The pod worker body: one sync of pod `uid`, chosen by where it is in its life
        (upstream's podWorkerLoop): removed, terminating, terminated or running; timed
        by its operation type (`podstate.pod_worker_operation`), failed or not."""
        state = self.pods.get(uid)
        desired = state.desired if state is not None else None
        operation = pod_worker_operation(state)
        if operation == WORKER_CREATE and desired is not None:
            self.observer.pod_worker_creating(desired.pod, self.clock())
        began = time.monotonic()
        cancelled = False
        try:
            return await self._sync_once(uid)
        except BaseException as err:
            cancelled = isinstance(err, asyncio.CancelledError)
            # It may have acted before it failed, and read nothing since.
            self.runtime.invalidate(uid)
            raise
        finally:
            if not cancelled:
                self.observer.pod_worker(operation, time.monotonic() - began)
            if state is not None:
                state.synced, state.synced_once = desired, True

    async def _sync_once(self, uid: str) -> Outcome:
        if not self._carried_over and self._desired_read:
            await self._carry_over()
        # The kept read when nothing dropped it since a relist confirmed it: a resync, a
        # back-off or a probe result of a pod where nothing changed asks CRI nothing.
        current = await self.runtime.get(uid, reuse=True)
        # Read the desired state only after the await: a resync may have landed while
        # CRI answered, and a decision to remove must never rest on a stale read.
        now = self.clock()
        state = self.pods.get(uid)
        if state is None or state.desired is None:
            return await self._remove(uid, state, current)
        if not self._carried_over and self._desired_read:
            # A sync PLEG began before the full read, which landed while CRI answered.
            await self._carry_over()
        pod = state.desired.pod
        if not state.restored:
            await self._restore_terminal(uid, state)
        deadline = active_deadline(pod, current)
        if deadline is not None and now >= deadline and state.terminal is None:
            log.info("pod exceeded activeDeadlineSeconds", extra={"uid": uid})
            state.terminal = podspec.DEADLINE_EXCEEDED
        deleting = bool(podspec.meta(pod).get("deletionTimestamp"))
        if self.admission is not None and not deleting and not state.terminating:
            verdict = await self._admit(self.admission, uid, pod)
            if verdict is None:
                return Outcome(wake_at=now + 1.0)
            if not verdict.admit:
                # upstream's rejectPod: a Warning Event with the bare message, and the
                # pod Failed with "Pod was rejected: ..." (a terminating pod).
                state.terminal = (verdict.reason, verdict.status_message)
                self.events.emit(pod, "Warning", verdict.reason, verdict.message)
        if not (deleting or state.terminating):
            if is_static(pod) and not self._static_may_start(uid, pod):
                # upstream's allowStaticPodStart: the pod of the same name it replaces
                # is still stopping. Its stop wakes this worker; the status says Pending.
                self._publish(uid, pod, self._pod_status(uid, pod, current, state.waiting))
                return Outcome(wake_at=now + STATIC_RECHECK_S)
            return await self.sync_pod(uid, state, pod, current, deadline)
        stopped = await self.sync_terminating_pod(
            uid, state, pod, current, deleting=deleting, now=now
        )
        if stopped and is_static(pod):
            self._static_stopped(uid, pod)
        if stopped and (state.terminal is not None or deleting) and not state.released:
            await self.sync_terminated_pod(uid, state)
            if deleting and state.released:
                # Only now may status-reporter delete the API object (upstream's
                # canBeDeleted): a claim's protection ends with its last pod, and a
                # volume still published when its PV goes is a driver's problem.
                previous = self.publisher.get(uid)
                if previous is not None:
                    self._publish(uid, pod, previous, terminated=True)
        return Outcome()

    async def sync_pod(
        self, uid: str, state: PodSyncState, pod: JSON, current: RuntimePod, deadline: float | None
    ) -> Outcome:
        """upstream SyncPod: publish the pod's status as the runtime shows it, bring the
        runtime to the spec and publish again; the outcome says when to sync again (a
        back-off ending, the active deadline).

        As upstream, the status goes out before the sync acts: a dead container shows
        terminated (and the pod not ready) at once, not only after its restart. The
        waiting reasons the last sync found stand in for the ones this sync finds."""
        if self.resizer is not None:  # from here on the pod is as allocated
            pod = self.resizer.before_sync(uid, pod, self._allocated_others)
        self._update_probes(pod, current, deleting=False)
        self._publish(uid, pod, self._pod_status(uid, pod, current, state.waiting))
        await self.syncer.update_qos(self._active_pods())
        result = await self.syncer.sync(pod, current, probes=self.probes)
        state.waiting = dict(result.waiting)
        if result.acted:
            current = await self.runtime.get(uid)
            self._update_probes(pod, current, deleting=False)
        if self.resizer is not None and await self.resizer.actuate(uid, pod, current):
            current = await self.runtime.get(uid)
        status = self._pod_status(uid, pod, current, result.waiting)
        self._publish(uid, pod, status)
        if status.get("phase") in ("Succeeded", "Failed") and not anything_running(current):
            # upstream's worker terminates a pod that completed by itself, and its
            # SyncTerminatingPod unprepares the pod's DRA claims: they go now, not at
            # the pod's deletion (a no-op for a pod holding none).
            await self.syncer.unprepare_claims(uid)
        if deadline is None:  # the sandbox may have been created by this very sync
            deadline = active_deadline(pod, current)
        wake = [t for t in (result.wake_at, deadline) if t is not None]
        if result.started:
            # Upstream's pod worker syncs again on PLEG's ContainerStarted event; klet
            # drops its own start events (runtimeevents.py), so after a sidecar's start,
            # which the main containers wait for, the worker goes on now. The status
            # above already shows what this sync started, so other starts need no sync.
            wake.append(self.clock())
        return Outcome(wake_at=min(wake) if wake else None, failed=result.failed)

    def _static_may_start(self, uid: str, pod: JSON) -> bool:
        full_name = pod_full_name(pod)
        allowed = self.static.allow(full_name, uid, wanted=self._static_wanted)
        if allowed:
            self._static_blocked.discard(uid)
        elif uid not in self._static_blocked:
            self._static_blocked.add(uid)
            log.info(
                "static pod waits for the pod of the same name to stop",
                extra={"uid": uid, "pod": full_name, "running": self.static.started.get(full_name)},
            )
        return allowed

    def _static_wanted(self, uid: str) -> bool:
        """A waiting static pod still counts: desired, not being stopped or deleted."""
        state = self.pods.get(uid)
        if state is None or state.desired is None or state.terminating:
            return False
        return not podspec.meta(state.desired.pod).get("deletionTimestamp")

    def _static_stopped(self, uid: str, pod: JSON) -> None:
        """Static pod `uid` has stopped or is gone: the next of its name may start."""
        for waiting in self.static.stopped(pod_full_name(pod), uid):
            self.workers.wake(waiting)

    def _previous(self, uid: str) -> JSON | None:
        """The status the next one is computed against: the last published by this
        process, else the one published before it started (so a restart changes no
        startTime or lastTransitionTime, and the statuses it republishes are the same)."""
        published = self.publisher.get(uid)
        if published is not None:
            return published
        state = self.pods.get(uid)
        return state.published_before if state is not None else None

    def _pod_status(
        self, uid: str, pod: JSON, current: RuntimePod, waiting: dict[str, tuple[str, str]]
    ) -> JSON:
        return compute_pod_status(
            pod,
            current,
            probes=self.probes,
            waiting=waiting,
            previous=self._previous(uid),
            now=self.clock(),
            runtime_type=self.runtime_type,
            host_ip=self.host_ip,
            resize=self.resizer.status(uid, pod) if self.resizer is not None else None,
        )

    def _allocated_others(self, uid: str) -> list[JSON]:
        """The active pods but `uid`, at their allocated resources (resize admission)."""
        resizer, ledger = self.resizer, self.admission
        return [
            resizer.allocated_pod(u, state.desired.pod)
            if resizer is not None
            else state.desired.pod
            for u, state in self.pods.items()
            if u != uid
            and state.desired is not None
            and state.terminal is None
            and (ledger is None or ledger.counts(u, status=self.publisher.get(u), terminal=False))
        ]

    async def sync_terminating_pod(
        self,
        uid: str,
        state: PodSyncState,
        pod: JSON,
        current: RuntimePod,
        *,
        deleting: bool,
        now: float,
    ) -> bool:
        """upstream SyncTerminatingPod: stop what still runs (with the kill request's, the
        deletion's or the pod's grace period), complete the kill request and publish the
        stopping pod's status. Returns whether the pod has stopped."""
        request = state.kill
        if request is not None and not request.announced:
            request.announced = True
            if request.reason == EVICTED and state.terminal is None:
                # upstream's eviction manager records the Warning before killing.
                self.events.emit(pod, "Warning", EVICTED, request.message)
                state.evicted = request.message
            elif request.reason == SHUTDOWN_KILL_REASON and state.terminal is None:
                # upstream's node shutdown manager marks its kills as disruptions too.
                state.evicted = request.message
            elif request.reason == PREEMPTING and state.terminal is None:
                # upstream's critical pod admission handler records the Warning first.
                self.events.emit(pod, "Warning", PREEMPTING, request.message)
                state.evicted = PREEMPTED_DISRUPTION
        if anything_running(current):
            if request is not None:
                grace = request.grace_s
            elif deleting:
                grace = podspec.deletion_grace_s(pod)
            else:
                grace = None
            await self.syncer.kill_pod(pod, current, grace_override=grace, remove=False)
            current = await self.runtime.get(uid)
        if request is not None:
            # A pod made terminal before (rejected, deadline, an earlier kill) keeps
            # its first reason: a repeated kill is idempotent.
            if state.terminal is None:
                state.terminal = (request.reason, request.message)
            state.kill = None
            request.finish()
        self._update_probes(pod, current, deleting=True)
        if self.resizer is not None:
            self.resizer.terminal(uid)
            pod = self.resizer.allocated_pod(uid, pod)
        status = compute_pod_status(
            pod,
            current,
            probes=self.probes,
            waiting={},
            previous=self._previous(uid),
            now=now,
            runtime_type=self.runtime_type,
            host_ip=self.host_ip,
            terminal=state.terminal,
            stopping=True,
            disruption=state.evicted,
            resize=self.resizer.status(uid, pod) if self.resizer is not None else None,
        )
        stopped = not anything_running(current)
        if stopped:
            # upstream: the claims go after the containers stopped and before the status
            # says so; a driver's failure fails this sync, which is retried.
            await self.syncer.unprepare_claims(uid)
        # A pod being deleted is done for the apiserver once its volumes are gone too.
        self._publish(uid, pod, status, terminated=stopped and (state.released or not deleting))
        return stopped

    async def sync_terminated_pod(self, uid: str, state: PodSyncState) -> None:
        """upstream SyncTerminatedPod: a pod that will not run again gives its volumes
        back (an evicted pod's emptyDir must not keep the disk pressure)."""
        if await self.syncer.release_volumes(uid):
            state.released = True

    def _publish(self, uid: str, pod: JSON, status: JSON, *, terminated: bool = False) -> None:
        self.observer.pod_status(uid, pod, status, self.clock())
        meta = podspec.meta(pod)
        namespace, name = meta.get("namespace", "default"), meta.get("name", "")
        self.publisher.set(uid, namespace, name, status, terminated=terminated)

    async def _restore_terminal(self, uid: str, state: PodSyncState) -> None:
        """After a restart, a pod this node made Failed (evicted, rejected, past its
        deadline, killed) stays so: its last published status on the bus says why. As
        upstream, a terminal pod is never started again. The same status gives the
        probe results its running containers start from (`state.carried`)."""
        if self.last_status is None:
            state.restored = True
            return
        try:
            status = await self.last_status(uid) or {}
        except BusError:
            return  # try again on the next sync
        self._restore(uid, state, status)

    async def _carry_over(self) -> None:
        """Once, before the first sync after the first full read of the desired pods:
        every desired pod the `status` table holds is restored (`_restore`) from one
        read of it instead of a read per pod, and the probes of the running containers its status
        shows start now (`ProbeManager.start_carried`), not at the pod's own first sync:
        a restarted syncloop syncs every pod at once, and a readiness that changed while
        it was away was seen only a probe's spread after the last of those syncs reached
        the pod (issue 42: 2 s of the soak's syncloop SIGKILL with 110 pods). A bus
        error leaves each pod to its own read at its sync."""
        async with self._carry_lock:
            if self._carried_over:
                return
            self._carried_over = True
            if self.last_status is None:
                return
            try:
                published = await self.bus.status.all()
            except BusError as err:
                log.warning("cannot read the published statuses", extra={"error": str(err)})
                return
            started = 0
            for uid, state in list(self.pods.items()):
                if state.desired is None:
                    continue
                if state.restored:  # a sync before the full read restored it already
                    status = state.published_before or {}
                else:
                    record = published.get(uid)
                    if record is None:
                        continue  # read at its sync, as before
                    status = record.status
                    self._restore(uid, state, status)
                pod = state.desired.pod
                if (
                    self.prober is not None
                    and status
                    and state.terminal is None
                    and not podspec.meta(pod).get("deletionTimestamp")
                ):
                    started += self.prober.start_carried(uid, pod, status)
            log.info("probes carried over the restart", extra={"containers": started})

    def _restore(self, uid: str, state: PodSyncState, status: JSON) -> None:
        """`_restore_terminal` with the status read."""
        state.restored = True
        state.carried = probes.carried_from_status(status)
        state.published_before = status or None
        reason = str(status.get("reason") or "")
        if status.get("phase") != "Failed" or not reason or state.terminal is not None:
            return
        message = str(status.get("message") or "")
        state.terminal = (reason, message)
        for cond in status.get("conditions") or []:
            if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True":
                state.evicted = str(cond.get("message") or message)
        log.info("pod stays terminal after restart", extra={"uid": uid, "reason": reason})

    async def _remove(self, uid: str, state: PodSyncState | None, current: RuntimePod) -> Outcome:
        """A pod no source wants: killed and removed once the sources are ready."""
        if current.empty:
            if self.sources_ready:  # its claims too (a sync that failed retries them)
                await self.syncer.unprepare_claims(uid)
            self._forget(uid)
            return Outcome(done=True)
        if not self.sources_ready:
            return Outcome(wake_at=self.clock() + 5)  # wait: the sources may still want it
        pod = state.last_pod if state is not None else None
        log.info(
            "killing pod that is not desired", extra={"uid": uid, "known_spec": pod is not None}
        )
        await self.syncer.kill_pod(pod, current, grace_override=None, remove=True)
        if pod is None:  # in the runtime, never desired in this process: an orphan
            self.observer.orphaned_runtime_pod()
        await self.syncer.unprepare_claims(uid)
        self._forget(uid)
        return Outcome(done=True)

    def working_pods(self) -> dict[tuple[str, str, str], int]:
        """The pods with a worker by (lifecycle, config, static), for upstream's
        kubelet_working_pods (podstate.working_pod_counts)."""
        uids = {*self.pods, *self.workers.uids()}
        return working_pod_counts(
            {u: (self.pods.get(u), (self.publisher.get(u) or {}).get("phase")) for u in uids}
        )

    def active_pods(self) -> list[JSON]:
        """The active pods (upstream's GetActivePods), for the PodResources API."""
        return self._active_pods()

    def all_pods(self) -> list[JSON]:
        """Every pod the sources gave, active or not (upstream's pod manager's pods)."""
        return [rec.pod for rec in self.desired.values()]

    def _active_pods(self) -> list[JSON]:
        """The pods that hold their resources (upstream's active pods): desired, not
        made terminal, and (with admission) admitted and not in a terminal phase."""
        ledger, resizer = self.admission, self.resizer
        return [
            resizer.allocated_pod(u, state.desired.pod)
            if resizer is not None
            else state.desired.pod
            for u, state in self.pods.items()
            if state.desired is not None
            and state.terminal is None
            and (ledger is None or ledger.counts(u, status=self.publisher.get(u), terminal=False))
        ]

    async def _admit(self, ledger: AdmissionLedger, uid: str, pod: JSON) -> Verdict | None:
        """The pod's admission verdict, decided now if it has none yet (once per pod);
        None while the first full read of the desired pods, which the re-admission
        after a restart needs, has not happened."""
        verdict = ledger.verdict(uid)
        if verdict is not None:
            return verdict
        if not ledger.restarted:
            if not self._desired_read:
                return None
            async with self._readmit_lock:
                if not ledger.restarted:
                    await self._readmit(ledger)
            verdict = ledger.verdict(uid)
            if verdict is not None:
                return verdict
        resizer = self.resizer
        others = [
            resizer.allocated_pod(u, state.desired.pod)
            if resizer is not None
            else state.desired.pod
            for u in ledger.admitted
            if u != uid
            and (state := self.pods.get(u)) is not None
            and state.desired is not None
            and ledger.counts(u, status=self.publisher.get(u), terminal=state.terminal is not None)
        ]
        pressure = await self.pressure.conditions() if self.pressure is not None else ()
        verdict = ledger.decide(uid, pod, others=others, pressure=pressure)
        if verdict.preempt:
            await self._preempt(uid, verdict)
        if not verdict.admit:
            log.info(
                "pod rejected",
                extra={"uid": uid, "reason": verdict.reason, "message": verdict.message},
            )
            self._rejected(verdict.reason)
        return verdict

    async def _readmit(self, ledger: AdmissionLedger) -> None:
        """At start: re-admit the desired pods the runtime still runs, before any new one."""
        uids = await self.runtime.pod_uids()
        desired = self.desired
        verdicts = ledger.readmit(
            {u: (r.pod, r.seen_at) for u, r in desired.items() if u in uids.running},
            idle=[u for u in uids.present - uids.running if u in desired],
        )
        rejected = {u: v.reason for u, v in verdicts.items() if not v.admit}
        for reason in rejected.values():
            self._rejected(reason)
        for u, v in verdicts.items():
            if v.preempt:
                await self._preempt(u, v)
        log.info(
            "re-admitted the running pods",
            extra={"admitted": len(verdicts) - len(rejected), "rejected": rejected},
        )

    async def _preempt(self, uid: str, verdict: Verdict) -> None:
        """Kill the pods admission preempts for the critical pod `uid` (module docstring)."""
        for victim in verdict.preempt:
            state = self.pods.get(victim)
            pod = state.desired.pod if state is not None and state.desired is not None else None
            spec: JSON = (pod or {}).get("spec") or {}
            grace = int(spec.get("terminationGracePeriodSeconds") or 0)
            log.info(
                "preempting pod to admit a critical pod",
                extra={"uid": victim, "for": uid, "signal": verdict.preemption_signal},
            )
            try:
                async with asyncio.timeout(max(grace + grace // 2, PREEMPT_MIN_WAIT_S)):
                    killed = await self.kill_pod(
                        PodUID(victim), None, PREEMPTING, PREEMPTED_MESSAGE
                    )
            except TimeoutError:
                if pod is not None:
                    self.events.emit(pod, "Warning", "ExceededGracePeriod", EXCEEDED_GRACE)
                log.error("preempted pod not killed in time", extra={"uid": victim})
                continue  # its kill goes on; upstream admits the critical pod anyway
            if killed and self.on_preempted is not None:
                self.on_preempted(verdict.preemption_signal)

    def _rejected(self, reason: str) -> None:
        if self.on_rejected is not None:
            self.on_rejected(reason)

    def _update_probes(self, pod: JSON, current: RuntimePod, *, deleting: bool) -> None:
        """Start probes for newly running containers, stop those of exited ones."""
        if self.prober is None:
            return
        sandbox = current.latest_sandbox()
        pod_ip = sandbox.ip if sandbox is not None else ""
        if not pod_ip and pod.get("spec", {}).get("hostNetwork"):
            pod_ip = self.host_ip  # a host-network pod is reached on the node's address
        state = self.pods.get(current.uid)
        carried = state.carried if state is not None else None
        self.prober.update(pod, current, pod_ip=pod_ip, deleting=deleting, carried=carried)

    def _forget(self, uid: str) -> None:
        """The pod is gone from the runtime and no source wants it: drop what is kept of it."""
        self.runtime.invalidate(uid)
        if self.prober is not None:
            self.prober.remove_pod(uid)
        self.observer.forget(uid)
        self.publisher.remove(uid)
        self.syncer.forget_pod(uid)
        if self.admission is not None:
            self.admission.forget(uid)
        if self.resizer is not None:
            self.resizer.forget(uid, self._allocated_others)
        state = self.pods.pop(uid, None)
        if state is None:
            return
        if state.last_pod is not None and is_static(state.last_pod):
            self._static_blocked.discard(uid)
            self._static_stopped(uid, state.last_pod)
        if state.kill is not None:
            state.kill.finish()
        if state.desired is not None:  # desired again while it was being removed: anew
            self.pods[uid] = PodSyncState(desired=state.desired, last_pod=state.last_pod)
            self.observer.pod_restarted(static=is_static(state.desired.pod))

    # -- PodControl backend ------------------------------------------------------------

    async def kill_pod(
        self, uid: PodUID, grace_period_s: int | None, reason: str, message: str
    ) -> bool:
        state = self.pods.get(uid)
        if (state is None or state.desired is None) and uid not in self.runtime_uids:
            return False
        if state is None:
            state = self.pods[uid] = PodSyncState()
        if state.kill is None:
            state.kill = KillRequest(grace_period_s, reason, message)
        request = state.kill
        self.workers.wake(uid)
        await asyncio.shield(request.done)
        return True

    def list_pods(self) -> list[PodSummary]:
        return [
            PodSummary(PodUID(uid), ns, name, str(status.get("phase", "")), status)
            for uid, ns, name, status in self.publisher.items()
        ]

    def get_pod(self, uid: PodUID) -> PodSummary | None:
        return next((p for p in self.list_pods() if p.uid == uid), None)
