"""PLEG: relist the runtime every second and wake the workers of pods that changed.

containerd 1.6 has no GetContainerEvents, so relisting is the only source of runtime
events. Each relist is two CRI calls (all sandboxes, all containers); a pod's
fingerprint is the set of (id, state) of its sandboxes and containers, and any
difference wakes its worker — including pods no source wants (orphans), whose workers
decide whether they may be removed. `healthy()` follows upstream: unhealthy when the
last successful relist is older than three minutes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from klet.cri import CRIError
from klet.cri import labels as L
from klet.cri.types import ContainerState, SandboxState
from klet.obs import OnceLogger
from klet.syncloop.ports import RuntimeReader

log = logging.getLogger(__name__)

RELIST_THRESHOLD_S = 180.0

RuntimeState = SandboxState | ContainerState
Fingerprint = frozenset[tuple[str, RuntimeState]]


def fingerprints(
    sandboxes: list[tuple[str, SandboxState, dict[str, str]]],
    containers: list[tuple[str, ContainerState, dict[str, str]]],
) -> dict[str, Fingerprint]:
    """Group (id, state, labels) triples by pod UID label; unlabelled objects are not ours."""
    triples: list[tuple[str, RuntimeState, dict[str, str]]] = [*sandboxes, *containers]
    out: dict[str, set[tuple[str, RuntimeState]]] = {}
    for oid, state, labels in triples:
        uid = labels.get(L.POD_UID)
        if uid:
            out.setdefault(uid, set()).add((oid, state))
    return {uid: frozenset(v) for uid, v in out.items()}


class Relister:
    def __init__(
        self,
        cri: RuntimeReader,
        on_change: Callable[[str], None],
        *,
        period_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cri = cri
        self.on_change = on_change
        self.period_s = period_s
        self.clock = clock
        self.previous: dict[str, Fingerprint] = {}
        self.last_ok = clock()
        self._once = OnceLogger(log, level=logging.WARNING)
        self.last_duration_s = 0.0  # of the last successful relist (kubelet_pleg_relist_duration)

    def age(self) -> float:
        """Seconds since the last successful relist."""
        return self.clock() - self.last_ok

    def healthy(self) -> bool:
        return self.age() < RELIST_THRESHOLD_S

    def ready_sandboxes(self) -> int:
        """How many sandboxes of our pods were ready at the last relist."""
        return sum(
            1 for fp in self.previous.values() for _id, state in fp if state is SandboxState.READY
        )

    async def relist_once(self) -> set[str]:
        started = self.clock()
        sandboxes = await self.cri.list_pod_sandboxes()
        containers = await self.cri.list_containers()
        current = fingerprints(
            [(s.id, s.state, s.labels) for s in sandboxes],
            [(c.id, c.state, c.labels) for c in containers],
        )
        changed = {
            uid
            for uid in current.keys() | self.previous.keys()
            if current.get(uid) != self.previous.get(uid)
        }
        self.previous = current
        self.last_ok = self.clock()
        self.last_duration_s = self.last_ok - started
        for uid in changed:
            self.on_change(uid)
        return set(current)

    async def run(self, on_uids: Callable[[set[str]], None]) -> None:
        while True:
            try:
                on_uids(await self.relist_once())
                self._once.clear("cri", "relist recovered")
            except CRIError as err:
                self._once.error("cri", "relist failed", cause=str(err), error=str(err))
            await asyncio.sleep(self.period_s)
