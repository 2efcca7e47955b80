"""The pod status manager of cluster mode: pod statuses, mirror pods and final deletion.

A manager around the pure rules of `podstatus.py` and `mirrors.py`, reading the pod
view (`podcache.PodCache`: desired pods joined with syncloop's statuses) and writing
through `kubeapi.KubeApi`:

- **Statuses.** Whenever the view changes (a `podstatus` entry arrived, a reload ran)
  every pod's latest record is checked against what was last sent; a newer one is
  sent: GET the pod (UID check, conditions others own), PATCH `pods/<name>/status`
  (merge patch, full status, UID precondition). Before this process sent a pod
  anything (it just started or was elected), the pod as last listed stands for what was
  sent: a status the apiserver already holds costs no request, so a restart patches
  only what changed meanwhile. Apiserver pods are addressed by their
  own UID; a static pod's status goes to its mirror pod, and waits until one exists.
  NotFound means the pod was deleted: it is forgotten (a static pod's mirror is
  recreated instead). Conflict/Invalid (a UID precondition failed, a racing writer)
  leaves the pod unsent, so the next pass re-reads and retries.
- **Resync** every `resync_s` (10 s, upstream's status manager syncPeriod): LIST the
  node's pods (the apiserver's view: mirror pods, deletion timestamps), reconcile the
  mirror pods, then the status pass above. A mirror reported gone triggers an early
  resync (at most one per second).
- **Final deletion** of apiserver pods that are being deleted and that syncloop
  reports `terminated`, after their last status is on the server (`should_delete`).

One pass handles the pods one after the other, those whose readiness changed first,
and re-orders what it has left whenever the view changes meanwhile, so a readiness
flip that arrives during a pass over many changed pods goes next instead of after
them (`podstatus.send_order`); an `Unavailable` apiserver ends the pass and asks for a
resync after `min_resync_gap_s` (1 s), not the next `resync_s` (10 s), so statuses
reach an apiserver that is back within about a second (issue 42's soak: 0.04-2.7 s
after a 120 s outage, by where the 10 s resync fell); an outage costs one failed
request per second, not one per pod, and is logged once until a pass succeeds again.

Trade-off: pods are synced sequentially in one task rather than one worker per pod.
Every write is one or two small requests under the client's QPS limit, a node has at
most a few hundred pods, and a single task cannot reorder two versions of one pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from klet.bus import BusError
from klet.kube import Conflict, Invalid, KubeError, NotFound, Unavailable
from klet.model.pod import is_mirror, is_static
from klet.model.records import PodStatusRecord, SourceState, sources_ready
from klet.model.types import JSON, PodUID
from klet.obs import OnceLogger
from klet.status_reporter.cluster import mirrors, podstatus
from klet.status_reporter.cluster.kubeapi import KubeApi
from klet.status_reporter.cluster.nodeid import NodeIdentity
from klet.status_reporter.cluster.podstatus import Sent, full_name, uid_of

log = logging.getLogger(__name__)

FullName = tuple[str, str]


class PodView(Protocol):
    """The part of the pod view (`PodCache`) this manager reads."""

    def desired_pods(self) -> Mapping[PodUID, JSON]: ...

    def known_pod(self, uid: PodUID) -> JSON | None: ...

    def statuses(self) -> Mapping[PodUID, PodStatusRecord]: ...

    def subscribe(self, callback: Callable[[], None]) -> None: ...


class SourcesTable(Protocol):
    """The bus's `sources` table: which pod sources delivered a full snapshot."""

    async def all(self) -> dict[str, SourceState]: ...


@dataclass(frozen=True)
class PodSyncPolicy:
    resync_s: float = 10.0
    """Full resync period (upstream status manager syncPeriod)."""
    min_resync_gap_s: float = 1.0
    """An early resync (mirror gone) comes at most this often."""


class PodSyncManager:
    """Pod statuses, mirror pods and final deletions; see the module docstring."""

    def __init__(
        self,
        *,
        view: PodView,
        api: KubeApi,
        identity: NodeIdentity,
        sources: SourcesTable,
        policy: PodSyncPolicy = PodSyncPolicy(),
        monotonic: Callable[[], float] = time.monotonic,
        on_mirrors: Callable[[int], None] | None = None,
        on_synced: Callable[[float], None] | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._view = view
        self._on_mirrors = on_mirrors
        """Told how many mirror pods the apiserver holds for the node after each
        reconcile (upstream's kubelet_mirror_pods)."""
        self._on_synced = on_synced
        """Told, at each status the apiserver took, the seconds since the first change
        it carries was computed (upstream's kubelet_pod_status_sync_duration_seconds)."""
        self._wall = wall
        self._pending_since: dict[PodUID, float] = {}
        """When syncloop computed the oldest status change of a pod not yet sent."""
        self._api = api
        self._identity = identity
        self._sources = sources
        self._policy = policy
        self._monotonic = monotonic
        self._sent: dict[PodUID, Sent] = {}
        self._refused: dict[PodUID, tuple[float, int]] = {}
        self._gone: set[PodUID] = set()
        self._deleted: set[PodUID] = set()
        self._api_pods: dict[FullName, JSON] = {}
        self._listed = False
        self._resync_soon = False
        self._awaiting_node = False
        self._wake = asyncio.Event()
        self._changes = 0
        """How often the view changed: a pass re-orders what it has left when it moves."""
        self._view.subscribe(self._view_changed)
        self._once = OnceLogger(log, level=logging.WARNING)

    # -- queries ---------------------------------------------------------------------------

    def mirror_uid(self, uid: PodUID) -> str | None:
        """The mirror pod's UID of a static pod (None: not static, or no mirror yet)."""
        pod = self._view.known_pod(uid)
        if pod is None or not is_static(pod):
            return None
        mirror = self._api_pods.get(full_name(pod))
        return uid_of(mirror) if mirror is not None and is_mirror(mirror) else None

    def sent(self, uid: PodUID) -> Sent | None:
        return self._sent.get(uid)

    # -- steps -----------------------------------------------------------------------------

    async def resync(self) -> None:
        """LIST the node's pods, reconcile mirror pods, sync every status."""
        try:
            items = await self._api.list_node_pods(self._identity.name)
        except KubeError as err:
            self._once.error("list", "cannot list the node's pods", error=str(err))
            if isinstance(err, Unavailable):
                self._resync_soon = True
                return
        else:
            self._once.clear("list", "listing the node's pods again")
            self._api_pods = {full_name(p): p for p in items}
            self._listed = True
        try:
            await self.reconcile_mirrors()
        except Unavailable as err:
            self._once.error("api", "apiserver unavailable", error=str(err))
            self._resync_soon = True
            return
        await self.sync_statuses()

    async def sources_ready(self) -> bool:
        """Whether every configured pod source has delivered its first full snapshot
        (`klet.model.records.sources_ready`); an unreadable table is not ready."""
        try:
            states = await self._sources.all()
        except BusError:
            return False
        return sources_ready(states)

    async def reconcile_mirrors(self) -> None:
        """Create, replace and delete mirror pods. Raises Unavailable."""
        if not self._listed:
            return
        static = {full_name(p): p for p in list(self._view.desired_pods().values()) if is_static(p)}
        have = {full: p for full, p in self._api_pods.items() if is_mirror(p)}
        node_uid = self._identity.uid
        self._awaiting_node = node_uid is None and bool(static)
        actions = mirrors.mirror_actions(
            static,
            have,
            node_name=self._identity.name,
            node_uid=node_uid,
            sources_ready=await self.sources_ready() if set(have) - set(static) else False,
        )
        for action in actions:
            await self._mirror(action)
        if self._on_mirrors is not None:
            self._on_mirrors(sum(1 for p in self._api_pods.values() if is_mirror(p)))

    async def _mirror(self, action: mirrors.MirrorAction) -> None:
        full = (action.namespace, action.name)
        where = f"{action.namespace}/{action.name}"
        try:
            if action.kind == "delete":
                try:
                    await self._api.delete_pod(action.namespace, action.name, action.uid)
                except NotFound:
                    pass
                self._api_pods.pop(full, None)
                log.info("mirror pod deleted", extra={"pod": where, "reason": action.reason})
            else:
                assert action.pod is not None
                created = await self._api.create_pod(action.pod)
                self._api_pods[full] = created
                log.info("mirror pod created", extra={"pod": where, "uid": uid_of(created)})
            self._once.clear(("mirror", full))
        except Unavailable:
            raise
        except KubeError as err:
            self._once.error(
                ("mirror", full), f"cannot {action.kind} mirror pod", pod=where, error=str(err)
            )

    async def sync_statuses(self) -> None:
        """Send every status that changed, readiness changes first, and a readiness
        change that arrives during the pass before the pods still to visit
        (`podstatus.send_order`); delete what is finished."""
        statuses = self._view.statuses()
        visited: set[PodUID] = set()
        order: list[PodUID] = []
        seen = -1
        while True:
            if seen != self._changes:
                seen = self._changes
                order = [u for u in podstatus.send_order(statuses, self._sent) if u not in visited]
            if not order:
                break
            uid = order.pop(0)
            visited.add(uid)
            record = statuses.get(uid)
            if record is None:
                continue
            try:
                await self.sync_pod(uid, record)
            except Unavailable as err:
                self._once.error("api", "apiserver unavailable", error=str(err))
                self._resync_soon = True
                return
            except KubeError as err:
                self._once.error(("pod", uid), "pod status not synced", uid=uid, error=str(err))
            else:
                self._once.clear(("pod", uid))
        self._once.clear("api", "apiserver available again")
        live = set(statuses)
        for state in (self._sent, self._refused, self._pending_since):
            for uid in [u for u in state if u not in live]:
                del state[uid]
        self._gone &= live
        self._deleted &= live

    async def sync_pod(self, uid: PodUID, record: PodStatusRecord) -> None:
        """Send one pod's status if needed, then delete it if it is finished.

        Raises KubeError (Unavailable ends the caller's pass).
        """
        pod = self._view.known_pod(uid)
        if pod is None or uid in self._gone or uid in self._deleted:
            return
        full = full_name(pod)
        static = is_static(pod)
        if static:
            mirror = self._api_pods.get(full)
            if mirror is None or not is_mirror(mirror) or podstatus.being_deleted(mirror):
                return  # upstream: a static pod's status waits for its mirror
            target = uid_of(mirror)
        else:
            target = str(uid)
        if uid not in self._sent and self._already_there(full, target, record):
            # Nothing sent by this process yet, and the listed pod has it already.
            self._sent[uid] = Sent(record.epoch, record.version, record.status, target)
        if self._refused.get(uid) != (record.epoch, record.version):
            decision = podstatus.decide(
                record, self._sent.get(uid), pod.get("spec") or {}, target_uid=target
            )
            if decision.verdict == "same":
                self._sent[uid] = Sent(record.epoch, record.version, record.status, target)
            elif decision.verdict == "illegal":
                self._refused[uid] = (record.epoch, record.version)
                log.error(
                    "status refused",
                    extra={"pod": "/".join(full), "uid": uid, "reason": decision.reason},
                )
            elif decision.verdict == "send":
                self._pending_since.setdefault(uid, record.updated_at)
                await self._send(uid, record, full, target, static=static)
        if not static:
            for candidate in (self._api_pods.get(full), pod):
                if podstatus.should_delete(record, self._sent.get(uid), candidate):
                    await self._delete(uid, full)
                    break

    def _already_there(self, full: FullName, target: str, record: PodStatusRecord) -> bool:
        listed = self._api_pods.get(full)
        return (
            listed is not None
            and uid_of(listed) == target
            and podstatus.on_server(listed.get("status") or {}, record.status)
        )

    async def _send(
        self, uid: PodUID, record: PodStatusRecord, full: FullName, target: str, *, static: bool
    ) -> None:
        namespace, name = full
        try:
            api_pod = await self._api.get_pod(namespace, name)
        except NotFound:
            self._lost(uid, full, static=static)
            return
        if uid_of(api_pod) != target:
            self._api_pods[full] = api_pod
            if static:
                self._request_resync()  # the mirror was replaced under us
            else:
                log.info("pod was deleted and recreated, dropping its status", extra={"uid": uid})
                self._gone.add(uid)
                self._sent.pop(uid, None)
            return
        self._api_pods[full] = api_pod
        merged = podstatus.merge_status(api_pod.get("status") or {}, record.status)
        try:
            updated = await self._api.patch_pod_status(
                namespace, name, podstatus.status_patch(target, merged)
            )
        except NotFound:
            self._lost(uid, full, static=static)
            return
        except (Conflict, Invalid) as err:
            # A UID precondition or a racing writer: re-read on the next pass.
            self._once.error(("pod", uid), "pod status patch refused", uid=uid, error=str(err))
            return
        self._api_pods[full] = updated
        self._sent[uid] = Sent(record.epoch, record.version, record.status, target)
        since = self._pending_since.pop(uid, None)
        if since is not None and self._on_synced is not None:
            self._on_synced(max(0.0, self._wall() - since))
        log.debug(
            "pod status sent", extra={"pod": "/".join(full), "uid": uid, "version": record.version}
        )

    def _lost(self, uid: PodUID, full: FullName, *, static: bool) -> None:
        self._api_pods.pop(full, None)
        if static:
            self._request_resync()  # recreate the mirror
        else:
            log.info("pod is gone from the apiserver, forgetting it", extra={"uid": uid})
            self._gone.add(uid)
            self._sent.pop(uid, None)

    async def _delete(self, uid: PodUID, full: FullName) -> None:
        namespace, name = full
        try:
            await self._api.delete_pod(namespace, name, str(uid))
        except (NotFound, Conflict):
            pass  # already gone, or a successor with another UID that is not ours
        self._deleted.add(uid)
        if uid_of(self._api_pods.get(full)) == uid:
            self._api_pods.pop(full, None)
        log.info("pod deleted from the apiserver", extra={"pod": "/".join(full), "uid": uid})

    def _view_changed(self) -> None:
        self._changes += 1
        self._wake.set()

    def _request_resync(self) -> None:
        self._resync_soon = True
        self._wake.set()

    # -- the loop --------------------------------------------------------------------------

    async def run(self) -> None:
        """Sync on every view change, resync every resync_s, until cancelled."""
        gap = self._policy.min_resync_gap_s
        next_resync = 0.0
        last_resync = float("-inf")
        while True:
            self._wake.clear()
            if self._awaiting_node and self._identity.uid is not None:
                self._resync_soon = True  # the Node just registered: create the mirrors
            if self._resync_soon:
                next_resync = min(next_resync, last_resync + gap)
            now = self._monotonic()
            if now >= next_resync:
                self._resync_soon = False
                last_resync = now
                next_resync = now + self._policy.resync_s
                await self.resync()
            else:
                await self.sync_statuses()
            if self._resync_soon:
                next_resync = min(next_resync, last_resync + gap)
            timeout = max(0.0, next_resync - self._monotonic())
            if self._awaiting_node:
                timeout = min(timeout, gap)  # look for the Node's UID again soon
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation
            # that races with the event being set, and the task would never stop.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
