"""Evented PLEG: wake the worker of a pod as soon as the runtime says one of its
sandboxes or containers exited or was OOM-killed (`action_for` says which event calls
for what). Creations and starts are counted, not acted on: only syncloop's pod workers
create and start our pods' sandboxes and containers, and a worker reads its pod again
after acting, so those events only echo what it has seen. So are the deletions that
follow exits, and those of objects a worker stopped or removed itself. The exit of an
object a worker stopped itself (`ExitNotices.expect_stop`) is not confirmed through
CRI: CRI's stop calls are synchronous, so CRI has recorded it when the worker goes on.
It still wakes the worker, once the event comes: a kill in the middle of a sync (a
failed postStart hook, a resize that restarts the container) is followed by the sync
that starts the container again, as upstream's PLEG event is. The exits of a pod a
worker removes for good (`ExitNotices.expect_removal`) wake nobody: the worker forgets
the pod once it is removed, and a wake would only make a new worker find it gone.

The subscription (`klet.cri.containerevents.RuntimeEvents`) is CRI GetContainerEvents where the
runtime has it, else containerd's own task events. While it is open the relister runs
as a safety net at its long period (relisting.py); when it drops (the runtime
restarted) the relister goes back to relisting every second, the watcher re-subscribes
with back-off, and once the new stream is open it asks for one full relist at once, so
whatever happened while no stream was open is found. A runtime with neither API leaves
PLEG relisting every second, as upstream's generic PLEG does.

containerd publishes a task's exit before its CRI plugin has recorded it (the plugin
first has the shim delete the task: 15-40 ms on an idle node, seconds under load). An
exit with its status is therefore noted in `ExitNotices` (runtime.py), which makes the
pod adapter read the container as exited, and the worker is woken at once: it publishes
the death and restarts the container without waiting for CRI. The exit is then
confirmed through CRI (`ContainerStatus`, polled with short growing delays up to
`SettleSettings`), the notice dropped and the worker woken again, so the status
converges on what CRI recorded. An exit without a status (a deletion standing in for
an unseen exit) only wakes the worker once confirmed. An OOM kill is noted too (the
exit reads `OOMKilled`, before or after the exit came) and wakes the worker at once: it
may come after the exit was published as an `Error`. The woken worker's read of its pod
refreshes PLEG's fingerprint of it (relisting.py), so the next full relist does not wake
it again. Every event about one of our pods, whatever it calls for, drops that pod's kept
read (runtimecache.py), and so does each wake-up it causes: the next sync reads CRI.

Each event is handled in its own task so one slow confirmation does not hold up the
events behind it. An object is matched to its pod by the IDs the relist and the
workers' reads have seen, else looked up; events about objects that are not ours (no
pod UID label) are dropped, and the IDs are remembered (bounded) so they cost one lookup.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from klet.cri import CRIError, NotFound
from klet.cri import labels as L
from klet.cri.errors import EventsUnsupported
from klet.cri.types import (
    Container,
    ContainerState,
    EventKind,
    RuntimeEvent,
    Sandbox,
    SandboxState,
    Subscribed,
)
from klet.model.flowcontrol import BackoffPolicy
from klet.model.types import ContainerID, SandboxID
from klet.obs import OnceLogger
from klet.retry import call_retrying, delay_after
from klet.syncloop.criprotocols import RuntimeReader
from klet.syncloop.pods.relisting import Relister
from klet.syncloop.pods.runtime import ExitNotices, bound

log = logging.getLogger(__name__)

FOREIGN_CACHE = 1024
"""How many IDs of objects that are not ours (or whose exit was seen) are remembered."""


class EventSource(Protocol):
    """What the watcher subscribes through (`klet.cri.containerevents.RuntimeEvents`)."""

    def subscribe(self) -> AsyncIterator[RuntimeEvent | Subscribed]: ...


class EventObserver(Protocol):
    """Where the watcher reports (metrics.py's PlegMetrics)."""

    def subscribed(self, source: str) -> None: ...

    def unsubscribed(self, *, error: bool) -> None: ...

    def event(self, event: RuntimeEvent) -> None: ...


@dataclass(frozen=True)
class SettleSettings:
    """How an exit is confirmed through CRI before the worker is woken."""

    first_s: float = 0.002
    """First delay between ContainerStatus polls, seconds; grown by `growth` each time..."""
    growth: float = 1.25
    """...(the CRI plugin records an idle node's exit 15-30 ms after containerd's event:
    doubling from 2 ms polled at 14 and 30 ms and woke up to 16 ms late; growing by a
    quarter overshoots by at most a quarter, for a few more cheap polls)..."""
    step_max_s: float = 0.5
    """...up to this delay between polls, seconds."""
    max_s: float = 30.0
    """Give up after this many seconds in all and wake the worker anyway (the periodic
    relist catches what CRI records later). containerd's CRI plugin records an exit
    within milliseconds on an idle node but took seconds on this 2-core machine under a
    load average of 50: the bound is generous so the event path still wins there."""


SETTLE = SettleSettings()
RESUBSCRIBE_BACKOFF = BackoffPolicy(initial_s=0.1, max_s=5.0)
"""Delays between subscription attempts while the runtime is away."""


def settle_delays(s: SettleSettings) -> list[float]:
    """The delays between confirmation polls: `first_s` growing by `growth` up to
    `step_max_s`, adding up to at most `max_s`."""
    out: list[float] = []
    total, delay = 0.0, s.first_s
    while delay > 0 and total + delay <= s.max_s:
        out.append(delay)
        total += delay
        delay = min(delay * s.growth, s.step_max_s)
    return out


class Action(Enum):
    WAKE = "wake"  # wake the worker at once
    CONFIRM = "confirm"  # wake it once CRI shows the object stopped
    IGNORE = "ignore"


def action_for(
    kind: EventKind, *, exit_seen: bool, own_stop: bool = False, removing: bool = False
) -> Action:
    """What an event calls for. An exit waits for CRI (see the module doc). A delete
    follows the exit it belongs to and is ignored when that exit was seen, else it
    stands in for it. The exit of an object a worker is stopping itself (`own_stop`)
    wakes without a confirmation (its stop call is synchronous), and its delete is
    ignored (the worker removed it); both are ignored for an object of a pod the worker
    removes for good (`removing`). An OOM kill wakes at once: it is not an exit (the
    killed process may be a child and the container live on), but it changes the reason
    of an exit that may already have been published. Creations and starts echo a
    worker's own actions (see the module doc)."""
    if removing and kind in (EventKind.EXITED, EventKind.DELETED):
        return Action.IGNORE
    if own_stop and kind is EventKind.EXITED:
        return Action.WAKE
    if own_stop and kind is EventKind.DELETED:
        return Action.IGNORE
    if kind is EventKind.EXITED:
        return Action.CONFIRM
    if kind is EventKind.DELETED:
        return Action.IGNORE if exit_seen else Action.CONFIRM
    if kind is EventKind.OOM:
        return Action.WAKE
    return Action.IGNORE


class _NeverSubscribed(Exception):
    """A stream ended without error before it subscribed: retried like a failure."""


class EventWatcher:
    def __init__(
        self,
        source: EventSource,
        cri: RuntimeReader,
        relister: Relister,
        *,
        wake: Callable[[str], None],
        observer: EventObserver | None = None,
        backoff: BackoffPolicy = RESUBSCRIBE_BACKOFF,
        settle: SettleSettings = SETTLE,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        exits: ExitNotices | None = None,
    ) -> None:
        self.source = source
        self.cri = cri
        self.relister = relister
        self.wake = wake
        self.observer = observer
        self.backoff = backoff
        self.settle = settle
        self.sleep = sleep
        self.subscribed = False
        self.source_name = ""
        self._foreign: dict[str, None] = {}
        self._exits: dict[str, None] = {}  # objects whose exit was seen (bounded)
        self.notices = exits if exits is not None else ExitNotices()
        self._tasks: set[asyncio.Task[None]] = set()
        self._once = OnceLogger(log, level=logging.WARNING)

    async def run(self) -> None:
        """Follow the runtime's event streams until cancelled, re-subscribing through
        klet's retry policy: streams that end before they subscribe back off; one that
        subscribed starts the back-off over (its end waits the initial delay)."""
        try:
            after_failures = 0
            while True:
                await call_retrying(
                    self._follow,
                    self.backoff,
                    on=(CRIError, _NeverSubscribed),
                    sleep=self.sleep,
                    after_failures=after_failures,
                )
                await self.sleep(delay_after(self.backoff, 1))
                after_failures = 1
        finally:
            await self.stop()

    async def _follow(self) -> None:
        """One stream, to its end. Returns when it had subscribed; raises when it ended
        (or failed) before it did."""
        subscribed = False
        try:
            async for item in self.source.subscribe():
                if isinstance(item, Subscribed):
                    self._on_subscribed(item.source)
                    subscribed = True
                else:
                    self.dispatch(item)
        except EventsUnsupported as err:
            self._on_dropped(error=False)
            log.info(
                "the runtime serves no events: PLEG relists every %.0fs",
                self.relister.period_s,
                extra={"error": str(err)},
            )
            await asyncio.Event().wait()  # a root task must not return
        except CRIError as err:
            self._once.error(
                "stream", "runtime event stream failed", cause=err.code, error=str(err)
            )
            self._on_dropped(error=True)
            if not subscribed:
                raise
        if not subscribed:
            raise _NeverSubscribed

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _on_subscribed(self, source: str) -> None:
        self.subscribed = True
        self.source_name = source
        self.relister.evented = True
        self.relister.kick()  # catch up on whatever happened without a stream
        if self.observer is not None:
            self.observer.subscribed(source)
        if not self._once.clear("stream", "runtime event stream open again", source=source):
            log.info("subscribed to runtime events", extra={"source": source})

    def _on_dropped(self, *, error: bool) -> None:
        was = self.subscribed
        self.subscribed = False
        self.relister.evented = False
        if was:
            self.relister.kick()  # relist every second again, starting now
        if self.observer is not None:
            self.observer.unsubscribed(error=error)

    def dispatch(self, event: RuntimeEvent) -> None:
        """Handle one event in a task of its own (unless it calls for nothing)."""
        if self.observer is not None:
            self.observer.event(event)
        owner = event.pod_uid or self.relister.owner.get(event.object_id)
        if owner:
            # Whatever it calls for, the pod's kept read may be stale (runtimecache.py).
            self.relister.cache.invalidate(owner)
        action = action_for(
            event.kind,
            exit_seen=event.object_id in self._exits,
            own_stop=self.notices.stopped_by_worker(event.object_id),
            removing=self.notices.removed_by_worker(event.object_id),
        )
        if event.kind is EventKind.EXITED:
            _remember(self._exits, event.object_id)
        elif event.kind is EventKind.OOM:
            self.notices.oom_killed(event.object_id)
        elif event.kind is EventKind.DELETED:
            self._exits.pop(event.object_id, None)
            self.notices.deleted(event.object_id)
        if action is Action.IGNORE:
            return
        task = asyncio.create_task(
            self.handle(event, confirm=action is Action.CONFIRM),
            name=f"pleg-event-{event.object_id[:12]}",
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def handle(self, event: RuntimeEvent, *, confirm: bool) -> None:
        try:
            uid = event.pod_uid or self.relister.owner.get(event.object_id)
            if uid is None:
                uid = await self._lookup(event.object_id)
            if uid is None:
                return
            if confirm:
                if event.kind is EventKind.EXITED and event.exit_status is not None:
                    self.notices.add(event.object_id, event.exit_status, event.at)
                    self._changed(uid)
                try:
                    await self._confirm_stopped(event.object_id)
                finally:
                    self.notices.discard(event.object_id)
            self._changed(uid)
        except CRIError as err:
            # The periodic relist finds whatever this event was about.
            log.debug("runtime event not followed up", extra={"error": str(err)})

    def _changed(self, uid: str) -> None:
        """What a read of pod `uid` returns has changed (an exit noted or confirmed, an
        OOM kill): its kept read goes (a read begun since the event is not covered by
        the drop at its dispatch) and its worker is woken."""
        self.relister.cache.invalidate(uid)
        self.wake(uid)

    async def _lookup(self, object_id: str) -> str | None:
        """The pod UID of a container or sandbox the last relist did not know."""
        if object_id in self._foreign:
            return None
        # Lists filtered by ID answer "none" where a status call would fail NotFound
        # (and count as a failed runtime operation): the event does not say which it is.
        found: list[Container] | list[Sandbox] = await self.cri.list_containers(
            container_id=ContainerID(object_id)
        ) or await self.cri.list_pod_sandboxes(sandbox_id=SandboxID(object_id))
        uid = next((o.labels.get(L.POD_UID) for o in found if o.id == object_id), None)
        if uid:
            self.relister.owner[object_id] = uid
            return uid
        _remember(self._foreign, object_id)
        return None

    async def _confirm_stopped(self, object_id: str) -> None:
        """Wait until CRI no longer reports the object running (bounded; see module doc)."""
        polls = 0
        for delay in [0.0, *settle_delays(self.settle)]:
            if delay:
                await self.sleep(delay)
            polls += 1
            if not await self._running(object_id):
                log.debug("exit confirmed through CRI", extra={"id": object_id, "polls": polls})
                return
        log.info("exit not confirmed through CRI in time", extra={"id": object_id})

    async def _running(self, object_id: str) -> bool:
        try:
            state = (await self.cri.container_status(ContainerID(object_id))).state
            return state is ContainerState.RUNNING
        except NotFound:
            pass
        try:
            sandbox = await self.cri.pod_sandbox_status(SandboxID(object_id))
            return sandbox.state is SandboxState.READY
        except NotFound:
            return False


def _remember(ids: dict[str, None], object_id: str) -> None:
    """Add to a bounded, insertion-ordered set of IDs."""
    ids[object_id] = None
    bound(ids, FOREIGN_CACHE)
