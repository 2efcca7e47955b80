"""Reads one pod's state from CRI (by the pod-UID label) into a `RuntimePod`.

Exited containers never change again, so their ContainerStatus is cached by ID, together
with the termination message read from their message file or log (termination.py) the
first time they are seen exited; running ones are asked every time. This is the adapter
the pod workers read through, one pod at a time, so a worker sees the effect of its own
actions at once instead of waiting for the next relist.

containerd announces a task's exit (with its exit status and time) tens of milliseconds
before its CRI plugin records it: the plugin first has the shim delete the task. An
exit the runtime announced (`ExitNotices`, filled by the evented PLEG) therefore counts
for a container CRI still reports running, until CRI records it: the worker publishes
the death and starts the next instance at once. The exit reads as CRI will record it:
`OOMKilled` after an OOM event, with the termination message read the same way (but a
message to be taken from the log waits for CRI: the log may not have its last lines).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from klet.cri import NotFound
from klet.cri import labels as L
from klet.cri.types import ContainerState, ContainerStatusInfo, SandboxState
from klet.model.types import ContainerID
from klet.syncloop.containers import termination
from klet.syncloop.pods.runtimepod import RuntimePod, SandboxView, sort_newest_first
from klet.syncloop.ports import RuntimeReader


@dataclass(frozen=True)
class RuntimeUIDs:
    present: frozenset[str]  # pods with any sandbox or container
    running: frozenset[str]  # pods with a ready sandbox or a running container


NOTICES_MAX = 1024
"""How many announced exits are kept at most (each lives until CRI records it)."""


@dataclass(frozen=True)
class ExitNotice:
    exit_code: int
    finished_at: int  # Unix ns
    oom: bool = False


class ExitNotices:
    """Exits the runtime announced that CRI may not have recorded yet, by container ID."""

    def __init__(self, *, limit: int = NOTICES_MAX) -> None:
        self.limit = limit
        self._by_id: dict[str, ExitNotice] = {}

    def add(self, object_id: str, exit_code: int, at: float, *, oom: bool = False) -> None:
        """`at` is the runtime's Unix time of the exit in seconds, 0 when unknown."""
        finished_at = int((at or time.time()) * 1e9)
        self._by_id[object_id] = ExitNotice(exit_code, finished_at, oom)
        while len(self._by_id) > self.limit:
            del self._by_id[next(iter(self._by_id))]

    def discard(self, object_id: str) -> None:
        self._by_id.pop(object_id, None)

    def __contains__(self, object_id: str) -> bool:
        return object_id in self._by_id

    def apply(self, st: ContainerStatusInfo) -> ContainerStatusInfo:
        """`st` as exited if the runtime announced its exit and CRI still runs it. Not
        when the termination message is to come from the log: the runtime may still
        be copying the last lines into it, so that one waits for CRI's record."""
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
            reason="OOMKilled" if notice.oom else "",
            message="",
        )
        return termination.with_message(exited)


class PodRuntime:
    def __init__(self, cri: RuntimeReader, exits: ExitNotices | None = None) -> None:
        self.cri = cri
        self.exits = exits if exits is not None else ExitNotices()
        self._exited: dict[ContainerID, ContainerStatusInfo] = {}

    async def get(self, uid: str) -> RuntimePod:
        selector = {L.POD_UID: uid}
        sandboxes = sorted(
            await self.cri.list_pod_sandboxes(label_selector=selector),
            key=lambda s: (s.created_at, s.attempt),
            reverse=True,
        )
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
        for c in await self.cri.list_containers(label_selector=selector):
            cached = self._exited.get(c.id)
            if cached is not None:
                statuses.append(cached)
                continue
            try:
                st = await self.cri.container_status(c.id)
            except NotFound:
                continue
            if st.state == ContainerState.EXITED:
                st = termination.with_message(st)
                self._exited[c.id] = st
            else:
                st = self.exits.apply(st)
            statuses.append(st)
        return RuntimePod(uid=uid, sandboxes=tuple(views), containers=sort_newest_first(statuses))

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
        for c in pod.containers:
            self._exited.pop(c.id, None)
