"""Reads one pod's state from CRI (by the pod-UID label) into a `RuntimePod`.

Exited containers never change again, so their ContainerStatus is cached by ID, together
with the termination message read from their message file or log (termination.py) the
first time they are seen exited; running ones are asked every time. This is the adapter
the pod workers read through, one pod at a time, so a worker sees the effect of its own
actions at once instead of waiting for the next relist.
"""

from __future__ import annotations

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


class PodRuntime:
    def __init__(self, cri: RuntimeReader) -> None:
        self.cri = cri
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
