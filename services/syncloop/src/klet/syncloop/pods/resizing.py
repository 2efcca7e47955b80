"""The in-place resize manager (InPlacePodVerticalScaling): the I/O shell around
pods/resize.py's decisions, as upstream's allocation manager and kuberuntime's resize
actions are around theirs.

The pod controller calls it at four points of a pod's sync: `before_sync` (record the
allocation of a new pod; admit, defer or refuse a requested resize; answer the pod as
allocated, which is what the syncer creates containers and the pod cgroup from),
`actuate` after the syncer (apply what was allocated and not yet applied to the running
containers, in upstream's order), `status` (the resize conditions and each container's
allocated and applied resources for the pod status) and `forget`.

Pending resizes are evaluated together in upstream's priority order
(`resize.pending_order`) each time one pod asks, a pod goes, or a pending pod syncs
(every syncFrequency at least: upstream's 3-minute retry timer is subsumed by it); a
resize accepted for another pod wakes that pod's worker.

Trade-offs: `kubelet_pod_infeasible_resizes_total` counts a decision when it changes
(upstream counts every evaluation, which here would be every sync); the pod's memory
usage for a limit decrease is read from its cgroup with the cgroupfs driver only (with
the systemd driver a decrease of the pod's memory limit waits with "missing pod memory
usage").
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from klet.cri.errors import CRIError
from klet.cri.types import ContainerState, ContainerStatsInfo, LinuxResources
from klet.model.pod import is_mirror, is_static
from klet.model.timestamps import rfc3339
from klet.model.types import JSON, ContainerID
from klet.syncloop.containers.podcgroups import PodCgroups
from klet.syncloop.eventrecorder import EventSink
from klet.syncloop.model import podspec
from klet.syncloop.model import resources as resmodel
from klet.syncloop.model.runtimepod import RuntimePod
from klet.syncloop.pods import resize
from klet.syncloop.pods.allocation import Checkpoint
from klet.syncloop.pods.status import ResizeView

log = logging.getLogger(__name__)

RESIZE_COMPLETED = "ResizeCompleted"


class ContainerUpdater(Protocol):
    async def update_container_resources(
        self, container_id: ContainerID, resources: LinuxResources
    ) -> None: ...

    async def container_stats(self, container_id: ContainerID) -> ContainerStatsInfo: ...


class ResizeObserver(Protocol):
    def requested(self, change: resize.RequestedChange) -> None: ...
    def infeasible(self, reason_detail: str) -> None: ...
    def deferred_accepted(self, trigger: str) -> None: ...
    def duration(self, seconds: float, *, success: bool) -> None: ...
    def counts(self, pending: Mapping[str, int], in_progress: int) -> None: ...


KillContainer = Callable[[JSON, JSON, ContainerID], Awaitable[None]]
"""Stop a running container (preStop, then StopContainer with the pod's grace)."""


def _with_resource(previous: JSON, source: JSON, resource: str) -> JSON:
    """`previous` (a container's resources as last applied) with `resource`'s request
    and limit taken from `source` (as allocated), the spec's own quantity strings kept."""
    out: JSON = json.loads(json.dumps(previous or {}))
    for part in ("requests", "limits"):
        values = dict(out.get(part) or {})
        given = (source or {}).get(part) or {}
        if resource in given:
            values[resource] = given[resource]
        else:
            values.pop(resource, None)
        if values:
            out[part] = values
        else:
            out.pop(part, None)
    return out


def _pod_cgroup(res: resmodel.PodResources) -> resize.PodCgroup:
    return resize.PodCgroup(
        cpu_shares=res.cpu_shares,
        cpu_quota=res.cpu_quota if res.cpu_quota is not None else -1,
        memory_limit=res.memory_limit_bytes or 0,
    )


class PodResizer:
    def __init__(
        self,
        *,
        allocated: Checkpoint,
        actuated: Checkpoint,
        cri: ContainerUpdater,
        cgroups: PodCgroups | None,
        cgroup_root: str,
        node_limits: Callable[[], resmodel.NodeLimits],
        allocatable: Callable[[], Mapping[str, int]],
        admit: Callable[[JSON, list[JSON]], tuple[bool, str]],
        events: EventSink,
        observer: ResizeObserver,
        kill: KillContainer,
        wake: Callable[[str], None],
        cgroup_fs_root: Path | None = Path("/sys/fs/cgroup"),
        clock: Callable[[], float] = time.time,
        cpu_manager_static: bool = False,
    ) -> None:
        self.allocated = allocated
        self.cpu_manager_static = cpu_manager_static
        """cpuManagerPolicy static: a Guaranteed pod's CPU resize is infeasible."""
        self.actuated = actuated
        self.cri = cri
        self.cgroups = cgroups
        self.cgroup_root = cgroup_root
        self.node_limits = node_limits
        self.allocatable = allocatable
        self.admit = admit
        self.events = events
        self.observer = observer
        self.kill = kill
        self.wake = wake
        self.cgroup_fs_root = cgroup_fs_root
        self.clock = clock
        self.conditions: dict[str, dict[str, JSON]] = {}
        self.pending: dict[str, JSON] = {}  # uid -> the desired pod waiting
        self.desired: dict[str, JSON] = {}  # uid -> the last desired pod seen

    # -- allocation ---------------------------------------------------------------

    @staticmethod
    def resizable(pod: JSON) -> bool:
        return not (is_static(pod) or is_mirror(pod))

    def allocated_pod(self, uid: str, pod: JSON) -> JSON:
        """The pod with its allocated resources (the spec's when none is recorded)."""
        return resize.with_allocation(pod, self.allocated.get(uid))

    def before_sync(
        self,
        uid: str,
        pod: JSON,
        others: Callable[[str], list[JSON]],
        *,
        trigger: str = "pod_updated",
    ) -> JSON:
        """Record a new pod's allocation, evaluate a requested resize, and return the
        pod as allocated. `others(uid)` gives the other active pods, allocated."""
        before = self.desired.get(uid)
        self.desired[uid] = pod
        if not self.resizable(pod):
            return pod
        if self.allocated.get(uid) is None:
            self.allocated.put(uid, resize.allocation_of(pod))
            return pod
        if before is not None and before is not pod:
            for change in resize.requested_changes(before, pod):
                self.observer.requested(change)
        if resize.resize_requested(pod, self.allocated.get(uid)):
            self.pending[uid] = pod
        else:
            self.pending.pop(uid, None)
            self._clear(uid, resize.RESIZE_PENDING)
        if self.pending:
            self.retry(others, trigger=trigger)
        return self.allocated_pod(uid, pod)

    def retry(self, others: Callable[[str], list[JSON]], *, trigger: str) -> None:
        """Evaluate every pending resize in upstream's order; wake the pods whose
        resize was accepted (their worker applies it)."""
        order = resize.pending_order(
            [
                resize.PendingResize(
                    uid=uid,
                    increases_requests=resize.increases_requests(self.allocated_pod(uid, p), p),
                    priority=int((p.get("spec") or {}).get("priority") or 0),
                    guaranteed=podspec.qos_class(p) == "Guaranteed",
                    pending_since=self._pending_since(uid),
                )
                for uid, p in self.pending.items()
            ]
        )
        node = self.allocatable()

        def admit_for(u: str) -> resize.AdmitCheck:
            return lambda p: self.admit(p, others(u))

        for uid in order:
            pod = self.pending[uid]
            was_deferred = self._reason(uid, resize.RESIZE_PENDING) == resize.DEFERRED
            verdict = resize.decide(
                pod,
                self.allocated.get(uid),
                static=False,
                allocatable=node,
                admit=admit_for(uid),
                cpu_manager_static=self.cpu_manager_static,
            )
            if verdict.accept:
                self.allocated.put(uid, resize.allocation_of(pod))
                del self.pending[uid]
                self._clear(uid, resize.RESIZE_PENDING)
                self._set(uid, resize.RESIZE_IN_PROGRESS, "", "", pod, keep_generation=False)
                if was_deferred:
                    self.observer.deferred_accepted(trigger)
                log.info("pod resize allocated", extra={"uid": uid})
                self.wake(uid)
            elif verdict.pending:
                if self._reason(uid, resize.RESIZE_PENDING) != verdict.reason or (
                    self.conditions.get(uid, {}).get(resize.RESIZE_PENDING, {}).get("message")
                    != verdict.message
                ):
                    if verdict.metric_reason:
                        self.observer.infeasible(verdict.metric_reason)
                    self.wake(uid)  # its status shows the new condition
                self._set(uid, resize.RESIZE_PENDING, verdict.reason, verdict.message, pod)
                if verdict.reason == resize.INFEASIBLE:
                    del self.pending[uid]  # retried only when the spec changes
            else:
                del self.pending[uid]
        self._count()

    # -- actuation ----------------------------------------------------------------

    def _running(self, pod: JSON, current: RuntimePod) -> dict[str, ContainerID]:
        out: dict[str, ContainerID] = {}
        for c in resize.resizable_containers(pod):
            instances = current.instances(str(c["name"]))
            if instances and instances[0].state == ContainerState.RUNNING:
                out[str(c["name"])] = instances[0].id
        return out

    def _record_started(
        self, uid: str, pod: JSON, running: Mapping[str, ContainerID]
    ) -> dict[str, JSON]:
        """The actuated record, with each running container not recorded yet taken as
        started from `pod` (the syncer creates containers from the allocated pod)."""
        record = {k: dict(v) for k, v in (self.actuated.get(uid) or {}).items()}
        specs = {str(c["name"]): c for c in resize.resizable_containers(pod)}
        changed = False
        for name, cid in running.items():
            if (record.get(name) or {}).get("id") != cid:
                record[name] = {"id": cid, "resources": specs[name].get("resources") or {}}
                changed = True
        if changed:
            self.actuated.put(uid, record)
        return record

    async def actuate(self, uid: str, pod: JSON, current: RuntimePod) -> bool:
        """Apply the allocated resources not yet applied to the running containers;
        whether anything was done (the caller reads the runtime again)."""
        if not self.resizable(pod):
            return False
        running = self._running(pod, current)
        record = self._record_started(uid, pod, running)
        applied = {n: resize.amounts((record.get(n) or {}).get("resources")) for n in running}
        if not resize.in_progress(pod, actuated=applied, running=list(running)):
            self._finished(uid, pod)
            return False
        self._set(uid, resize.RESIZE_IN_PROGRESS, "", "", pod, keep_generation=True)
        node = self.node_limits()
        applied_pod = resize.with_allocation(
            pod, {n: (record.get(n) or {}).get("resources") or {} for n in running}
        )
        current_res = resmodel.pod_resources(applied_pod, node)
        new_res = resmodel.pod_resources(pod, node)
        work = resize.plan(
            pod,
            actuated=applied,
            running=running,
            pod_current=_pod_cgroup(current_res),
            pod_new=_pod_cgroup(new_res),
        )
        problem = await self._memory_check(pod, work, running)
        if problem is not None:
            self._set(
                uid, resize.RESIZE_IN_PROGRESS, resize.ERROR, problem, pod, keep_generation=True
            )
            return False
        began, ok = time.monotonic(), False
        specs = {str(c["name"]): c for c in resize.resizable_containers(pod)}
        try:
            for name in work.restart:
                log.info(
                    "restarting container for its resize policy",
                    extra={"uid": uid, "container": name},
                )
                await self.kill(pod, specs[name], running[name])
                record.pop(name, None)
                self.actuated.put(uid, record)
            parent = podspec.pod_cgroup_parent(pod, self.cgroup_root)
            for step in work.steps:
                if isinstance(step, resize.SetPodCgroup):
                    current_res = _merge(current_res, new_res, step)
                    if self.cgroups is not None:
                        _, problems = await self.cgroups.ensure(parent, current_res)
                        if problems:
                            raise ResizeError("; ".join(problems))
                else:
                    spec = dict(specs[step.name])
                    before = (record.get(step.name) or {}).get("resources") or {}
                    changed = [
                        r
                        for r in resize.RESOURCES
                        if step.resources.value(r, limit=True)
                        != resize.amounts(before).value(r, limit=True)
                        or step.resources.value(r, limit=False)
                        != resize.amounts(before).value(r, limit=False)
                    ]
                    res = before
                    for r in changed:
                        res = _with_resource(res, spec.get("resources") or {}, r)
                    spec["resources"] = res
                    linux = resmodel.container_resources(pod, spec, node)
                    await self.cri.update_container_resources(ContainerID(step.container_id), linux)
                    record[step.name] = {"id": step.container_id, "resources": spec["resources"]}
                    self.actuated.put(uid, record)
            ok = True
        except (CRIError, ResizeError, OSError) as err:
            message = f"resize of pod {podspec.meta(pod).get('name')} failed: {err}"
            log.warning("pod resize failed", extra={"uid": uid, "error": str(err)})
            self._set(
                uid, resize.RESIZE_IN_PROGRESS, resize.ERROR, message, pod, keep_generation=True
            )
        finally:
            self.observer.duration(time.monotonic() - began, success=ok)
        if ok and not work.restart:
            self._finished(uid, pod)
        return True

    async def _memory_check(
        self, pod: JSON, work: resize.ResizePlan, running: Mapping[str, ContainerID]
    ) -> str | None:
        if not work.decreasing_memory and work.pod_memory_decrease is None:
            return None
        pod_usage = self._pod_memory_usage(pod) if work.pod_memory_decrease is not None else 0
        usage: dict[str, int | None] = {}
        for name in work.decreasing_memory:
            try:
                stats = await self.cri.container_stats(running[name])
                usage[name] = stats.memory_usage_bytes
            except CRIError:  # counted as missing
                usage[name] = None
        return resize.memory_decrease_problems(work, pod_usage=pod_usage, container_usage=usage)

    def _pod_memory_usage(self, pod: JSON) -> int | None:
        if self.cgroup_fs_root is None:
            return None
        parent = podspec.pod_cgroup_parent(pod, self.cgroup_root).lstrip("/")
        for path in (
            self.cgroup_fs_root / "memory" / parent / "memory.usage_in_bytes",
            self.cgroup_fs_root / parent / "memory.current",
        ):
            try:
                return int(path.read_text().strip())
            except (OSError, ValueError):
                continue
        return None

    def _finished(self, uid: str, pod: JSON) -> None:
        if self._clear(uid, resize.RESIZE_IN_PROGRESS):
            self.events.emit(pod, "Normal", RESIZE_COMPLETED, _completed_message(pod))
            self._count()

    # -- status -------------------------------------------------------------------

    def status(self, uid: str, pod: JSON) -> ResizeView:
        if not self.resizable(pod):
            return ResizeView()
        record = self.actuated.get(uid) or {}
        return ResizeView(
            conditions=tuple(
                {k: v for k, v in c.items() if not k.startswith("_")}
                for c in self.conditions.get(uid, {}).values()
            ),
            actuated={n: r.get("resources") or {} for n, r in record.items()},
        )

    def forget(self, uid: str, others: Callable[[str], list[JSON]]) -> None:
        """The pod is gone: its allocation frees resources for the pending resizes."""
        self.allocated.remove(uid)
        self.actuated.remove(uid)
        self.conditions.pop(uid, None)
        self.pending.pop(uid, None)
        self.desired.pop(uid, None)
        if self.pending:
            self.retry(others, trigger="pods_removed")
        self._count()

    def terminal(self, uid: str) -> None:
        """A pod that will not run again shows no resize conditions (upstream)."""
        self.conditions.pop(uid, None)
        self.pending.pop(uid, None)

    # -- conditions -----------------------------------------------------------------

    def _reason(self, uid: str, kind: str) -> str | None:
        cond = self.conditions.get(uid, {}).get(kind)
        return None if cond is None else str(cond.get("reason", ""))

    def _pending_since(self, uid: str) -> float | None:
        cond = self.conditions.get(uid, {}).get(resize.RESIZE_PENDING)
        return None if cond is None else float(cond.get("_since", 0.0))

    def _set(
        self,
        uid: str,
        kind: str,
        reason: str,
        message: str,
        pod: JSON,
        *,
        keep_generation: bool = False,
    ) -> None:
        conds = self.conditions.setdefault(uid, {})
        previous = conds.get(kind)
        if (
            previous is not None
            and previous.get("reason", "") == reason
            and previous.get("message", "") == message
            and (keep_generation or previous.get("observedGeneration") == _gen(pod))
        ):
            return
        generation = (
            int(previous.get("observedGeneration") or 0)
            if keep_generation and previous is not None
            else _gen(pod)
        )
        cond = resize.resize_condition(
            kind,
            reason=reason,
            message=message,
            generation=generation,
            previous=previous,
            now=rfc3339(self.clock()),
        )
        cond["_since"] = (
            previous.get("_since")
            if previous is not None
            and cond["lastTransitionTime"] == previous.get("lastTransitionTime")
            else self.clock()
        )
        conds[kind] = cond
        self._count()

    def _clear(self, uid: str, kind: str) -> bool:
        conds = self.conditions.get(uid)
        if conds is None or kind not in conds:
            return False
        del conds[kind]
        return True

    def _count(self) -> None:
        pending: dict[str, int] = {}
        in_progress = 0
        for conds in self.conditions.values():
            p = conds.get(resize.RESIZE_PENDING)
            if p is not None:
                key = str(p.get("reason", "")).lower()
                pending[key] = pending.get(key, 0) + 1
            if resize.RESIZE_IN_PROGRESS in conds:
                in_progress += 1
        self.observer.counts(pending, in_progress)


class ResizeError(Exception):
    """A step of a resize failed."""


def _gen(pod: JSON) -> int:
    value = podspec.meta(pod).get("generation")
    return value if isinstance(value, int) and value > 0 else 0


def _merge(
    current: resmodel.PodResources, new: resmodel.PodResources, step: resize.SetPodCgroup
) -> resmodel.PodResources:
    if step.resource == "memory":
        return replace(
            current, memory_limit_bytes=new.memory_limit_bytes or current.memory_limit_bytes
        )
    if step.limit:
        return replace(
            current,
            cpu_quota=new.cpu_quota if new.cpu_quota is not None else current.cpu_quota,
            cpu_period=new.cpu_period if new.cpu_period is not None else current.cpu_period,
        )
    return replace(current, cpu_shares=new.cpu_shares)


def _completed_message(pod: JSON) -> str:
    """upstream podResizeCompletionMsg: the containers' resources as applied."""
    details = [
        {"name": c.get("name"), "resources": c.get("resources") or {}}
        for c in resize.resizable_containers(pod)
    ]
    return "Pod resize completed: " + json.dumps({"containers": details}, separators=(",", ":"))
