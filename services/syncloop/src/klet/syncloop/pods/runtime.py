"""Reads one pod's state from CRI (by the pod-UID label) into a `RuntimePod`.

Exited containers never change again (but for the reason of an OOM kill, below), so
their ContainerStatus is cached by ID, together with the termination message read from
their message file or log (termination.py) the first time they are seen exited; running
ones are asked every time. This is the adapter the pod workers read through, one pod at
a time, so a worker sees the effect of its own actions at once instead of waiting for
the next relist.

containerd announces a task's exit (with its exit status and time) tens of milliseconds
before its CRI plugin records it: the plugin first has the shim delete the task. An
exit the runtime announced (`ExitNotices`, filled by the evented PLEG) therefore counts
for a container CRI still reports running, until CRI records it: the worker publishes
the death and starts the next instance at once. The exit reads as CRI will record it,
with the termination message read the same way (but a message to be taken from the log
waits for CRI: the log may not have its last lines).

An OOM kill the runtime announced makes the container's exit read `OOMKilled`, as CRI
records it too: containerd's CRI plugin marks a container OOM-killed when it handles
the OOM event, for good, but handles the events in the order they came, so an OOM event
that came after the exit leaves CRI reporting `Error` for a moment after the exit. The
exited status cached here takes the reason once the OOM is known, so a record read in
that moment does not stand.

A stop a worker makes itself needs none of that: StopContainer and StopPodSandbox are
synchronous in CRI (they return once the runtime recorded the stop, or fail), and the
worker reads its pod after them (upstream's SyncTerminatingPod reads the pod status once
after KillPod). The objects it stops are noted here (`expect_stop`) so the evented PLEG
follows their exit events without polling CRI to confirm them (issue 42: the
confirmation polls were 13-21 ContainerStatus calls per removed pod).

Every read is kept with its pod's fingerprint (runtimecache.py), and a sync that no
change caused asks for it (`get(uid, reuse=True)`): it is handed back without a CRI call
once a relist begun after it found the pod unchanged, until an event, a relist, the
worker's own action (`invalidate`) or a change of the pod drops it. The periodic resync
of an idle node so reads no pod from CRI, as upstream's workers read its PLEG cache.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from klet.cri import NotFound
from klet.cri import labels as L
from klet.cri.types import Container, ContainerState, ContainerStatusInfo, Sandbox, SandboxState
from klet.model.types import ContainerID
from klet.syncloop.containers import termination
from klet.syncloop.criprotocols import RuntimeReader
from klet.syncloop.model.runtimepod import RuntimePod, SandboxView, sort_newest_first
from klet.syncloop.pods.runtimecache import Fingerprint, RuntimeCache, fingerprints


@dataclass(frozen=True)
class RuntimeUIDs:
    present: frozenset[str]  # pods with any sandbox or container
    running: frozenset[str]  # pods with a ready sandbox or a running container


NOTICES_MAX = 1024
"""How many announced exits, and OOM kills, are kept at most."""

OOM_KILLED = "OOMKilled"


@dataclass(frozen=True)
class ExitNotice:
    exit_code: int
    finished_at: int  # Unix ns


class ExitNotices:
    """Exits the runtime announced that CRI may not have recorded yet, and the
    containers an OOM kill was announced in, by container ID (each bounded)."""

    def __init__(self, *, limit: int = NOTICES_MAX) -> None:
        self.limit = limit
        self._by_id: dict[str, ExitNotice] = {}
        self._oom: dict[str, None] = {}
        self._own: dict[str, None] = {}  # objects a worker stops itself
        self._removing: dict[str, None] = {}  # objects of pods a worker removes for good

    def add(self, object_id: str, exit_code: int, at: float) -> None:
        """`at` is the runtime's Unix time of the exit in seconds, 0 when unknown."""
        finished_at = int((at or time.time()) * 1e9)
        self._by_id[object_id] = ExitNotice(exit_code, finished_at)
        bound(self._by_id, self.limit)

    def oom_killed(self, object_id: str) -> None:
        """The runtime announced an OOM kill in this container (its exit may follow)."""
        self._oom[object_id] = None
        bound(self._oom, self.limit)

    def expect_stop(self, object_id: str) -> None:
        """A worker is about to stop (and maybe remove) this container or sandbox itself
        with a synchronous CRI call: its exit event needs no confirmation, its deletion
        event nothing at all."""
        self._own[object_id] = None
        bound(self._own, self.limit)

    def expect_removal(self, object_id: str) -> None:
        """A worker is about to stop and remove this object's pod for good, and forget
        it: the object's exit and deletion events concern nobody."""
        self._removing[object_id] = None
        bound(self._removing, self.limit)

    def stop_failed(self, object_id: str) -> None:
        """The worker's stop (or removal) failed: the object's exit, if it comes, is the
        runtime's news."""
        self._own.pop(object_id, None)
        self._removing.pop(object_id, None)

    def stopped_by_worker(self, object_id: str) -> bool:
        return object_id in self._own

    def removed_by_worker(self, object_id: str) -> bool:
        return object_id in self._removing

    def deleted(self, object_id: str) -> None:
        """The object is gone from the runtime: nothing more to expect of it."""
        self._own.pop(object_id, None)
        self._removing.pop(object_id, None)

    def discard(self, object_id: str) -> None:
        """CRI recorded the exit: its record stands from now on."""
        self._by_id.pop(object_id, None)

    def __contains__(self, object_id: str) -> bool:
        return object_id in self._by_id

    def apply(self, st: ContainerStatusInfo) -> ContainerStatusInfo:
        """`st` as CRI will record it: exited if the runtime announced its exit and CRI
        still runs it, and `OOMKilled` if it exited after an announced OOM kill. An
        announced exit does not count when the termination message is to come from
        the log: the runtime may still be copying the last lines into it, so that one
        waits for CRI's record."""
        if st.state == ContainerState.EXITED:
            if st.id in self._oom and st.reason != OOM_KILLED:
                return dataclasses.replace(st, reason=OOM_KILLED)
            return st
        notice = self._by_id.get(st.id)
        if notice is None or st.state != ContainerState.RUNNING:
            return st
        policy = st.annotations.get(L.TERMINATION_MESSAGE_POLICY, termination.DEFAULT_POLICY)
        if termination.should_read_logs(policy, notice.exit_code, ""):
            return st
        exited = dataclasses.replace(
            st,
            state=ContainerState.EXITED,
            exit_code=notice.exit_code,
            finished_at=max(notice.finished_at, st.started_at),
            reason=OOM_KILLED if st.id in self._oom else "",
            message="",
        )
        return termination.with_message(exited)


def bound(entries: dict[str, Any], limit: int) -> None:
    """Drop the oldest entries of an insertion-ordered dict beyond `limit`."""
    while len(entries) > limit:
        del entries[next(iter(entries))]


Observer = Callable[[str, Sequence[Sandbox], Sequence[Container]], None]
"""Told what each read of a pod listed (PLEG's `Relister.observe`)."""


class PodRuntime:
    def __init__(
        self,
        cri: RuntimeReader,
        exits: ExitNotices | None = None,
        observe: Observer | None = None,
        cache: RuntimeCache | None = None,
    ) -> None:
        self.cri = cri
        self.exits = exits if exits is not None else ExitNotices()
        self.observe = observe
        self._exited: dict[ContainerID, ContainerStatusInfo] = {}
        # Each read, kept until PLEG says it may be stale (runtimecache.py); the relister
        # confirms them (wiring hands it this cache).
        self.cache = cache if cache is not None else RuntimeCache()

    async def get(self, uid: str, *, reuse: bool = False) -> RuntimePod:
        """Pod `uid` as CRI has it now; with `reuse`, the kept last read instead when a
        relist has confirmed it since and nothing dropped it (runtimecache.py)."""
        if reuse:
            kept = self.cache.fresh(uid)
            if kept is not None:
                return kept
        began = self.cache.read_began(uid)
        pod: RuntimePod | None = None
        fingerprint: Fingerprint | None = None
        try:
            pod, fingerprint = await self._read(uid)
            return pod
        finally:
            self.cache.read_ended(uid, began, pod, fingerprint)

    def invalidate(self, uid: str) -> None:
        """The worker is about to act on pod `uid` (or forgets it): its kept read goes."""
        self.cache.invalidate(uid)

    async def _read(self, uid: str) -> tuple[RuntimePod, Fingerprint | None]:
        selector = {L.POD_UID: uid}
        listed_sandboxes = await self.cri.list_pod_sandboxes(label_selector=selector)
        listed_containers = await self.cri.list_containers(label_selector=selector)
        if self.observe is not None:
            self.observe(uid, listed_sandboxes, listed_containers)
        fingerprint = fingerprints(
            [(s.id, s.state, s.labels) for s in listed_sandboxes],
            [(c.id, c.state, c.labels) for c in listed_containers],
        ).get(uid)
        sandboxes = sorted(listed_sandboxes, key=lambda s: (s.created_at, s.attempt), reverse=True)
        views: list[SandboxView] = []
        for i, s in enumerate(sandboxes):
            ip: str = ""
            ips: tuple[str, ...] = ()
            if i == 0 and s.state == SandboxState.READY:
                try:
                    sandbox_status = await self.cri.pod_sandbox_status(s.id)
                    ip, ips = sandbox_status.ip, tuple(sandbox_status.additional_ips)
                except NotFound:
                    continue
            views.append(SandboxView(s.id, s.attempt, s.state, s.created_at, ip, tuple(ips)))
        statuses: list[ContainerStatusInfo] = []
        for c in listed_containers:
            st = self._exited.get(c.id)
            if st is None:
                try:
                    st = await self.cri.container_status(c.id)
                except NotFound:
                    continue
                if st.state == ContainerState.EXITED:
                    st = termination.with_message(st)
            if st.state == ContainerState.EXITED:
                # CRI's record, with the reason of an OOM kill announced since.
                st = self._exited[c.id] = self.exits.apply(st)
            else:
                st = self.exits.apply(st)
            statuses.append(st)
        pod = RuntimePod(uid=uid, sandboxes=tuple(views), containers=sort_newest_first(statuses))
        return pod, fingerprint

    async def pod_uids(self) -> RuntimeUIDs:
        """Every pod the runtime has, and those of them it runs (two list calls)."""
        sandboxes = await self.cri.list_pod_sandboxes()
        containers = await self.cri.list_containers()
        running = {
            s.labels.get(L.POD_UID, "") for s in sandboxes if s.state == SandboxState.READY
        } | {c.labels.get(L.POD_UID, "") for c in containers if c.state == ContainerState.RUNNING}
        present = {s.labels.get(L.POD_UID, "") for s in sandboxes} | {
            c.labels.get(L.POD_UID, "") for c in containers
        }
        return RuntimeUIDs(present=frozenset(present), running=frozenset(running))

    def forget(self, pod: RuntimePod) -> None:
        """The worker removed every sandbox and container of `pod`: drop their cached
        statuses, and tell PLEG the pod has nothing left (as a read would), so the next
        relist does not wake a worker to find that out."""
        for c in pod.containers:
            self._exited.pop(c.id, None)
        self.cache.invalidate(pod.uid)
        if self.observe is not None:
            self.observe(pod.uid, (), ())
