"""PLEG: relist the runtime and wake the workers of pods that changed.

Each relist is two CRI calls (all sandboxes, all containers); a pod's fingerprint is
the set of (id, state) of its sandboxes and containers, and any difference wakes its
worker — including pods no source wants (orphans), whose workers decide whether they
may be removed. `healthy()` follows upstream: unhealthy when the last successful
relist is older than three minutes.

Without runtime events the relist runs every second (upstream's generic PLEG). While
an event subscription is open (`evented`, see runtimeevents.py) events wake workers
and the relist is a safety net every `evented_period_s` (20 s by default): it is what
notices a container removed behind our back (containerd publishes no task event for
that), an event lost between a stream's drop and its replacement, and a runtime that
never sends one. Upstream's evented PLEG relists every 300 s; 20 s bounds those cases
at the manifest poll period (fileCheckFrequency) for a cost of two CRI calls. `kick()`
asks for a full relist at once (after a re-subscription).

A pod worker's own read of its pod (PodRuntime.get: the pod's sandboxes and containers,
selected by label) refreshes that pod's fingerprint and owners through `observe`: what
a worker has seen (its own actions included) does not wake it again at the next relist,
and an event about a container it created is matched to its pod without a lookup. A
pod a worker found with nothing, or removed (`PodRuntime.forget`), after a relist began
stays so for that relist (ticks of the runtime cache order the two): in a mass removal
workers forget their pods while a relist is in flight, and its older view of those
pods woke a new worker for each one, only to read CRI and find it gone.

Each relist also tells the workers' kept reads (runtimecache.py) what it found: a read
whose pod still has the fingerprint it was read with is confirmed, so the pod's next
periodic resync takes it instead of asking CRI; one whose pod changed is dropped (the
change wakes the worker too). So an idle node's resync costs no CRI call beyond the
relists' two lists.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

from klet.cri import CRIError
from klet.cri import labels as L
from klet.cri.types import Container, ContainerState, Sandbox, SandboxState
from klet.model.types import ContainerID
from klet.obs import OnceLogger
from klet.syncloop.criprotocols import RuntimeReader
from klet.syncloop.pods.runtimecache import Fingerprint, RuntimeCache, fingerprints

log = logging.getLogger(__name__)

RELIST_THRESHOLD_S = 180.0
GENERIC_PERIOD_S = 1.0
"""Relist period without runtime events (upstream's genericPlegRelistPeriod)."""
EVENTED_PERIOD_S = 20.0
"""Default relist period while runtime events drive PLEG (klet's choice; see above)."""
RETRY_PERIOD_S = 1.0
"""At most this long between attempts while a full relist is owed and failing."""


def owners(
    objects: list[tuple[str, SandboxState | ContainerState, dict[str, str]]],
) -> dict[str, str]:
    """Sandbox or container ID → pod UID, for the objects that carry the label."""
    return {oid: labels[L.POD_UID] for oid, _state, labels in objects if labels.get(L.POD_UID)}


class Relister:
    def __init__(
        self,
        cri: RuntimeReader,
        on_change: Callable[[str], None],
        *,
        period_s: float = GENERIC_PERIOD_S,
        evented_period_s: float = EVENTED_PERIOD_S,
        retry_period_s: float = RETRY_PERIOD_S,
        clock: Callable[[], float] = time.monotonic,
        cache: RuntimeCache | None = None,
    ) -> None:
        self.cri = cri
        # The pod workers' kept reads (runtimecache.py): each relist confirms or drops them.
        self.cache = cache if cache is not None else RuntimeCache()
        self.on_change = on_change
        self.period_s = period_s
        self.evented_period_s = evented_period_s
        self.retry_period_s = retry_period_s
        self.evented = False  # set while a runtime event subscription is open
        self.clock = clock
        self.previous: dict[str, Fingerprint] = {}
        # pod UID -> the tick at which its worker found it with nothing (or removed all
        # of it), until a relist begun after that: an older relist's view of it is stale.
        self._emptied: dict[str, int] = {}
        self.owner: dict[str, str] = {}  # sandbox/container ID → pod UID, last seen
        self._kick = asyncio.Event()
        self.last_ok = clock()
        self._once = OnceLogger(log, level=logging.WARNING)
        self.last_duration_s = 0.0  # of the last successful relist (kubelet_pleg_relist_duration)

    def age(self) -> float:
        """Seconds since the last successful relist."""
        return self.clock() - self.last_ok

    def threshold_s(self) -> float:
        """How old the last successful relist may be while PLEG counts as healthy:
        upstream's three minutes, or twice a longer evented period (upstream's evented
        PLEG pairs its 300 s relist with a 600 s threshold)."""
        return max(RELIST_THRESHOLD_S, 2 * self.evented_period_s)

    def healthy(self) -> bool:
        return self.age() < self.threshold_s()

    def ready_sandboxes(self) -> int:
        """How many sandboxes of our pods were ready at the last relist."""
        return sum(
            1 for fp in self.previous.values() for _id, state in fp if state is SandboxState.READY
        )

    def running_containers(self) -> list[ContainerID]:
        """The containers of our pods running as PLEG last saw them (the last relist,
        and since then the workers' reads): what log rotation looks at, without a list
        call of its own."""
        return [
            ContainerID(oid)
            for fp in self.previous.values()
            for oid, state in fp
            if state is ContainerState.RUNNING
        ]

    def current_period(self) -> float:
        return self.evented_period_s if self.evented else self.period_s

    def kick(self) -> None:
        """Relist everything now (the run loop's next pass starts at once)."""
        self._kick.set()

    def owed(self) -> bool:
        """Whether a kicked full relist has not started yet."""
        return self._kick.is_set()

    def observe(
        self, uid: str, sandboxes: Sequence[Sandbox], containers: Sequence[Container]
    ) -> None:
        """Take what a label-selected read of pod `uid` found as its fingerprint and
        owners, without waking it: the reader is its worker."""
        sb: list[tuple[str, SandboxState, dict[str, str]]] = [
            (s.id, s.state, s.labels) for s in sandboxes
        ]
        ct: list[tuple[str, ContainerState, dict[str, str]]] = [
            (c.id, c.state, c.labels) for c in containers
        ]
        fp = fingerprints(sb, ct).get(uid)
        if fp is None:
            self.previous.pop(uid, None)
            self._emptied[uid] = self.cache.tick()
        else:
            self.previous[uid] = fp
            self._emptied.pop(uid, None)
        self.owner.update(owners([*sb, *ct]))

    async def relist_once(self) -> set[str]:
        started = self.clock()
        began = self.cache.tick()
        sandboxes = await self.cri.list_pod_sandboxes()
        containers = await self.cri.list_containers()
        sb: list[tuple[str, SandboxState, dict[str, str]]] = [
            (s.id, s.state, s.labels) for s in sandboxes
        ]
        ct: list[tuple[str, ContainerState, dict[str, str]]] = [
            (c.id, c.state, c.labels) for c in containers
        ]
        current = fingerprints(sb, ct)
        self.owner.clear()  # in place: pod workers add to it as they read (observe)
        self.owner.update(owners([*sb, *ct]))
        # A pod its worker found empty (or emptied) while these lists were in flight
        # stays empty: the lists are older. A worker that removed its pod and ended must
        # not be followed by a new one, woken by a relist that listed the pod before it
        # went, to read CRI and find it gone. (Anything made for the pod afterwards is
        # read by the worker that made it, or found by the next relist.)
        emptied = {uid for uid, tick in self._emptied.items() if tick > began}
        self._emptied = {uid: self._emptied[uid] for uid in emptied}
        changed = {
            uid
            for uid in current.keys() | self.previous.keys()
            if uid not in emptied and current.get(uid) != self.previous.get(uid)
        }
        self.previous = {uid: fp for uid, fp in current.items() if uid not in emptied}
        self.cache.relisted(began, current)
        self.last_ok = self.clock()
        self.last_duration_s = self.last_ok - started
        for uid in changed:
            self.on_change(uid)
        return set(current)

    async def run(self, on_uids: Callable[[set[str]], None]) -> None:
        """Relist every `current_period()`, and at once after `kick()`; a relist owed by
        a kick that fails is retried every `retry_period_s` until one succeeds."""
        while True:
            owed = self._kick.is_set()
            self._kick.clear()
            try:
                on_uids(await self.relist_once())
                self._once.clear("cri", "relist recovered")
            except CRIError as err:
                self._once.error("cri", "relist failed", cause=str(err), error=str(err))
                if owed:
                    await asyncio.sleep(min(self.current_period(), self.retry_period_s))
                    self._kick.set()
                    continue
            try:
                async with asyncio.timeout(self.current_period()):
                    await self._kick.wait()
            except TimeoutError:
                pass
