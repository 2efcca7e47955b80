"""Node registration and the node status loop (the manager around `nodestatus.py`).

Upstream's `registerWithAPIServer` and `syncNodeStatus`, restated:

- **Registration** (when registerNode): POST the initial Node; on AlreadyExists GET it,
  apply `reconcile_existing` (default labels, attach/detach annotation) with a PATCH if
  needed, and adopt it. Failures are retried (`klet.retry`) from 100 ms doubling to 7 s.
  With registerNode false the Node must exist already; the loop only updates it.
- **Status**: every nodeStatusUpdateFrequency (10 s, plus up to 4 % jitter) observe the
  node, GET the Node (first try from the apiserver's cache, as upstream), compute the
  status and PATCH `nodes/<name>/status` only when it changed (heartbeat times aside)
  or nodeStatusReportFrequency (5 min) passed since the last report. The first update
  follows registration at once. Between updates the services' condition contributions
  are read every second, and one whose status, reason or message changed (eviction's
  Ready False for a node shutting down, a pressure) brings the next update forward, as
  upstream's shutdown manager syncs the node status at once. One update is up to 5
  tries (nodeStatusUpdateRetry); a failed update is logged once until one succeeds.
- **Node deleted** under us: unlike upstream (which keeps failing until restarted) the
  Node is registered again; an operator who deletes a live node's object expects it to
  come back, and its Lease and mirror pods hang off the new UID.
- **Events**: "Starting" once the Node is first reported, then upstream's
  NodeReady/NodeNotReady/NodeHas... on every condition transition, published to the
  bus's `events` stream like any other service's events (a bus outage loses them, with
  a debug line; they are informational).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from klet.bus import BusError
from klet.kube import Conflict, KubeError, NotFound
from klet.model.flowcontrol import BackoffPolicy, jittered
from klet.model.records import EventRecord, NodeConditionRecord
from klet.model.types import JSON
from klet.obs import OnceLogger
from klet.retry import call_retrying
from klet.status_reporter.cluster import nodestatus
from klet.status_reporter.cluster.kubeapi import KubeApi
from klet.status_reporter.cluster.nodeid import NodeIdentity
from klet.status_reporter.cluster.nodestatus import NodeConfig, Observations

log = logging.getLogger(__name__)


class Observer(Protocol):
    async def observe(self) -> Observations: ...

    async def contributions(self) -> dict[str, NodeConditionRecord]:
        """The services' condition contributions now (the last read on a bus error)."""
        ...


class StartupRecorder(Protocol):
    """The node start-up moments (status_reporter.metrics.nodestartup.NodeStartup)."""

    def attempt(self, now: float) -> None: ...

    def registered_new(self, now: float) -> None: ...

    def ready(self, now: float) -> None: ...


class EventPublisher(Protocol):
    """The bus's `events` stream."""

    async def publish(self, record: EventRecord) -> str: ...


@dataclass(frozen=True)
class NodeStatusPolicy:
    """Timings of registration and the status loop (upstream defaults)."""

    update_frequency_s: float = 10.0
    """nodeStatusUpdateFrequency."""
    report_frequency_s: float = 300.0
    """nodeStatusReportFrequency: report at least this often even without a change."""
    jitter: float = 0.04
    retries: int = 5
    """Tries per status update (nodeStatusUpdateRetry)."""
    register: bool = True
    """registerNode."""
    register_backoff: BackoffPolicy = field(default_factory=lambda: BackoffPolicy(0.1, 7.0))
    contribution_poll_s: float = 1.0
    """How often the services' condition contributions are read between updates: a
    change (a node shutting down, memory pressure) is reported at once rather than at
    the next update, as upstream's shutdown manager syncs the node status at once."""


def _levels(records: dict[str, NodeConditionRecord]) -> dict[str, tuple[str, str, str]]:
    return {key: (r.status, r.reason, r.message) for key, r in records.items()}


def _ready(status: JSON) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def _uid(obj: JSON) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


class NodeStatusManager:
    """Registers the Node and keeps its status current."""

    def __init__(
        self,
        *,
        api: KubeApi,
        observer: Observer,
        identity: NodeIdentity,
        config: NodeConfig,
        policy: NodeStatusPolicy = NodeStatusPolicy(),
        events: EventPublisher | None = None,
        startup: StartupRecorder | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self._api = api
        self._observer = observer
        self._identity = identity
        self._cfg = config
        self._policy = policy
        self._events = events
        self._startup = startup
        self._clock = clock
        self._monotonic = monotonic
        self._rand = rand
        self._last_report: float | None = None
        self._started_event_sent = False
        self._once = OnceLogger(log, level=logging.WARNING)
        self.reports = 0
        """Successful status PATCHes (tests and metrics)."""

    @property
    def name(self) -> str:
        return self._identity.name

    # -- single steps -------------------------------------------------------------------

    async def register_once(self) -> bool:
        """Create or adopt the Node; returns whether it is registered now."""
        if self._startup is not None:
            self._startup.attempt(self._clock())
        obs = await self._observer.observe()
        node = nodestatus.initial_node(self._cfg, obs, now=self._clock())
        try:
            created = await self._api.create_node(node)
        except Conflict:
            return await self._adopt(node)
        except KubeError as err:
            self._once.error("register", "unable to register the node", error=str(err))
            return False
        self._once.clear("register")
        if self._startup is not None:
            self._startup.registered_new(self._clock())
        self._identity.set_uid(_uid(created))
        self._last_report = None
        log.info("node registered", extra={"node": self.name, "uid": self._identity.uid})
        # The created Node already carries its conditions: announce them now, as upstream
        # does while building the initial Node.
        await self._announce([], node["status"]["conditions"])
        return True

    async def _adopt(self, initial: JSON) -> bool:
        try:
            existing = await self._api.get_node(self.name)
            patch = nodestatus.reconcile_existing(initial, existing)
            if patch is not None:
                existing = await self._api.patch_node(self.name, patch)
        except KubeError as err:
            self._once.error("register", "unable to adopt the existing node", error=str(err))
            return False
        self._once.clear("register")
        self._identity.set_uid(_uid(existing))
        self._last_report = None
        log.info(
            "node already registered, adopted it",
            extra={"node": self.name, "uid": self._identity.uid, "reconciled": patch is not None},
        )
        return True

    async def sync_once(self) -> bool:
        """One status update (up to `retries` tries); returns whether it succeeded."""
        obs = await self._observer.observe()
        last_error: KubeError | None = None
        for attempt in range(max(1, self._policy.retries)):
            cached = attempt == 0
            try:
                node = await self._api.get_node(self.name, cached=cached)
            except NotFound as err:
                if cached:
                    continue  # the cache may lag a fresh registration; ask etcd
                return self._gone(err)
            except KubeError as err:
                last_error = err
                continue
            self._identity.set_uid(_uid(node))
            existing = node.get("status") or {}
            status = nodestatus.node_status(self._cfg, obs, existing=existing, now=self._clock())
            changed = nodestatus.status_changed(existing, status)
            if not nodestatus.needs_report(
                changed=changed,
                last_report=self._last_report,
                now=self._monotonic(),
                report_frequency=self._policy.report_frequency_s,
            ):
                self._once.clear("status", "node status updated again")
                return True
            try:
                await self._api.patch_node_status(self.name, nodestatus.status_patch(status))
            except NotFound as err:
                return self._gone(err)
            except KubeError as err:
                last_error = err
                continue
            self._last_report = self._monotonic()
            self.reports += 1
            if self._startup is not None and _ready(status):
                self._startup.ready(self._clock())
            self._once.clear("status", "node status updated again")
            await self._announce(existing.get("conditions") or [], status["conditions"])
            return True
        self._once.error(
            "status",
            "unable to update node status",
            error=str(last_error) if last_error is not None else "node not found",
        )
        return False

    def _gone(self, err: KubeError) -> bool:
        self._identity.forget()
        self._once.error("status", "the node object is gone", error=str(err))
        return False

    # -- the loop -------------------------------------------------------------------------

    async def run(self) -> None:
        """Register (if configured), then update the status until cancelled."""
        while True:
            if self._policy.register and not self._identity.registered.is_set():
                await call_retrying(
                    self._registered,
                    self._policy.register_backoff,
                    retry_result=lambda registered: not registered,
                )
            synced = await self._observer.contributions()
            await self.sync_once()
            if self._policy.register and not self._identity.registered.is_set():
                continue  # deleted under us: register again at once
            await self._until_next_update(
                jittered(self._policy.update_frequency_s, self._policy.jitter, rand=self._rand),
                synced,
            )

    async def _registered(self) -> bool:
        """Whether the Node is registered, registering it when it is not yet."""
        return self._identity.registered.is_set() or await self.register_once()

    async def _until_next_update(
        self, period_s: float, synced: dict[str, NodeConditionRecord]
    ) -> None:
        """Sleep `period_s`, or until a contribution's status, reason or message is no
        longer what the last update saw (its `at` alone changes with every pass)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + period_s
        while (left := deadline - loop.time()) > 0:
            await asyncio.sleep(min(self._policy.contribution_poll_s, left))
            now = await self._observer.contributions()
            if _levels(now) != _levels(synced):
                log.debug("a node condition contribution changed: updating now")
                return

    # -- events ---------------------------------------------------------------------------

    async def _announce(self, before: list[JSON], after: list[JSON]) -> None:
        if self._events is None:
            return
        reasons: list[tuple[str, str]] = []
        if not self._started_event_sent:
            reasons.append(("Starting", "Starting kubelet."))
            self._started_event_sent = True
        for type_, status in nodestatus.transitions(before, after):
            reason = nodestatus.TRANSITION_EVENTS.get((type_, status))
            if reason is not None:
                reasons.append((reason, f"Node {self.name} status is now: {reason}"))
        for reason, message in reasons:
            record = EventRecord(
                type="Normal",
                reason=reason,
                message=message,
                # Upstream's node reference uses the node name as UID.
                involved={"kind": "Node", "name": self.name, "uid": self.name},
                component="kubelet",
                at=self._clock(),
            )
            try:
                await self._events.publish(record)
            except BusError as err:
                log.debug("node event not published", extra={"reason": reason, "error": str(err)})
