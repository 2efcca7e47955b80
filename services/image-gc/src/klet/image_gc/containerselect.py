"""What one container GC pass removes: pure decisions over the runtime's containers and sandboxes.

This is upstream's container GC (kuberuntime_gc.go with the policy of container_gc.go)
as functions of observations and time, so every rule has a table-driven test:

* A dead container (any state but RUNNING) created at least `min_age_s` ago is
  evictable. Evictable containers are grouped in eviction units, one per (pod UID,
  container name), newest first (higher attempt, then later creation).
* Every evictable container of a pod whose content may go (`pod_removable`: not desired
  by any source, nothing of it running any more, and not held by syncloop, which removes
  the pods it kills itself) is removed; with `evict_terminated`
  (node-level reclaim, upstream's DeleteAllUnusedContainers) also those of pods that have
  terminated (phase Succeeded or Failed) but are still desired.
* Each remaining unit keeps its newest `max_per_pod_container` containers; then, when the
  node holds more than `max_containers`, every unit is cut to an equal share
  (`max_containers // units`, at least one) and, if that is still too many, the oldest
  across all units go until `max_containers` are left. Negative limits mean no limit.
* A sandbox is active while it is READY or still holds a container (counting only the
  containers this pass keeps). Inactive sandboxes are removed, except the newest sandbox
  of a pod that is not removable.
* The pod log directories (`<namespace>_<name>_<uid>`) of removable pods are removed.

Unlike upstream, which enforces the per-container limits even before its sources are
ready, nothing at all is removed until every pod source has delivered its first full
snapshot: without it, a pod that merely has not been read back yet (a restarted Redis)
cannot be told from a deleted one, and the issue asks that nothing be removed then.
Objects without the pod UID label are not the agent's and are never touched.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from klet.config import KletSettings
from klet.cri import labels as L
from klet.cri.types import Container, ContainerState, Sandbox, SandboxState
from klet.model.layout import pod_log_dir_uid

NS_PER_S = 1_000_000_000


@dataclass(frozen=True)
class ContainerGCSettings:
    """Upstream's ContainerGCPolicy."""

    min_age_s: float = 0.0
    """--minimum-container-ttl-duration: a dead container younger than this stays (seconds)."""
    max_per_pod_container: int = 1
    """--maximum-dead-containers-per-container: dead instances kept per (pod, container
    name); negative = no limit."""
    max_containers: int = -1
    """--maximum-dead-containers: dead containers kept on the node; negative = no limit."""

    def __post_init__(self) -> None:
        if self.min_age_s < 0:
            raise ValueError(f"min_age_s: invalid minimum garbage collection age: {self.min_age_s}")

    @classmethod
    def of(cls, settings: KletSettings) -> ContainerGCSettings:
        """The policy the container GC flags configure."""
        return cls(
            min_age_s=settings.minimum_container_ttl_duration,
            max_per_pod_container=settings.maximum_dead_containers_per_container,
            max_containers=settings.maximum_dead_containers,
        )


@dataclass(frozen=True)
class GCPlan:
    """What one pass removes, in the order to remove it."""

    containers: tuple[Container, ...] = ()
    """Dead containers to remove, oldest first; those in UNKNOWN state are stopped first."""
    sandboxes: tuple[Sandbox, ...] = ()
    """Inactive sandboxes to stop and remove, oldest first."""
    removable_pods: frozenset[str] = frozenset()
    """UIDs of the pods (with runtime objects) whose content may go: not desired, not running."""

    @property
    def to_stop(self) -> tuple[Container, ...]:
        """The containers in unknown state: they may still run, so they are stopped first."""
        return tuple(c for c in self.containers if c.state == ContainerState.UNKNOWN)


def pod_uid(labels: dict[str, str]) -> str:
    return labels.get(L.POD_UID, "")


def _newest_first(c: Container) -> tuple[int, int]:
    return (-c.attempt, -c.created_at)


def live_pods(containers: Iterable[Container], sandboxes: Iterable[Sandbox]) -> set[str]:
    """UIDs of the pods that still run something: a READY sandbox or a RUNNING container."""
    live = {pod_uid(s.labels) for s in sandboxes if s.state == SandboxState.READY}
    live |= {pod_uid(c.labels) for c in containers if c.state == ContainerState.RUNNING}
    live.discard("")
    return live


def pod_removable(
    uid: str, *, desired: Collection[str], live: Collection[str], held: Collection[str] = ()
) -> bool:
    """Whether everything of the pod may go: no source wants it, it runs nothing, and
    syncloop no longer holds it.

    A pod that is not desired but still runs is being killed by syncloop; until that is
    done its dead containers only follow the ordinary limits. `held` names the pods
    syncloop still holds (their status row is on the bus: syncloop drops it when it
    forgets a pod, after removing its sandboxes itself): a removed pod whose sandbox has
    stopped but whose removal is under way stays syncloop's, as upstream's container GC
    leaves a pod alone until its pod worker has finished with it
    (ShouldPodContentBeRemoved). Without this, a pass landing in a mass teardown
    stopped and removed the same sandboxes as syncloop, and syncloop's own removals
    failed ("already in removing state") and were retried (issue 42)."""
    return bool(uid) and uid not in desired and uid not in live and uid not in held


def _cut(unit: list[Container], keep: int, removed: list[Container]) -> list[Container]:
    """Keep the newest `keep` of a unit (sorted newest first); the rest go to `removed`."""
    if len(unit) > keep:
        removed.extend(unit[keep:])
        return unit[:keep]
    return unit


def select_containers(
    containers: Sequence[Container],
    *,
    settings: ContainerGCSettings,
    removable: Collection[str],
    now_s: float,
) -> list[Container]:
    """The dead containers one pass removes, oldest first (see the module docstring)."""
    newest_allowed = (now_s - settings.min_age_s) * NS_PER_S
    units: dict[tuple[str, str], list[Container]] = defaultdict(list)
    for c in containers:
        uid = pod_uid(c.labels)
        if not uid or c.state == ContainerState.RUNNING or c.created_at > newest_allowed:
            continue
        units[(uid, c.name)].append(c)
    removed: list[Container] = []
    for key in list(units):
        units[key].sort(key=_newest_first)
        if key[0] in removable:
            removed.extend(units.pop(key))
    if settings.max_per_pod_container >= 0:
        for key, unit in units.items():
            units[key] = _cut(unit, settings.max_per_pod_container, removed)
    total = sum(len(u) for u in units.values())
    if settings.max_containers >= 0 and total > settings.max_containers:
        share = max(1, settings.max_containers // len(units))
        for key, unit in units.items():
            units[key] = _cut(unit, share, removed)
        left = sorted((c for u in units.values() for c in u), key=_newest_first)
        _cut(left, settings.max_containers, removed)
    return sorted(removed, key=lambda c: (c.created_at, c.attempt))


def select_sandboxes(
    sandboxes: Sequence[Sandbox],
    *,
    remaining: Iterable[Container],
    removable: Collection[str],
) -> list[Sandbox]:
    """The sandboxes one pass removes, oldest first: inactive ones (not READY, holding none
    of the `remaining` containers), except the newest sandbox of a pod that stays."""
    holding = {c.sandbox_id for c in remaining}
    by_pod: dict[str, list[Sandbox]] = defaultdict(list)
    for s in sandboxes:
        if pod_uid(s.labels):
            by_pod[pod_uid(s.labels)].append(s)
    out: list[Sandbox] = []
    for uid, group in by_pod.items():
        group.sort(key=lambda s: (-s.attempt, -s.created_at))
        candidates = group if uid in removable else group[1:]
        out += [s for s in candidates if s.state != SandboxState.READY and s.id not in holding]
    return sorted(out, key=lambda s: (s.created_at, s.attempt))


def plan(
    containers: Sequence[Container],
    sandboxes: Sequence[Sandbox],
    *,
    settings: ContainerGCSettings,
    desired: Collection[str],
    sources_ready: bool,
    now_s: float,
    terminated: Collection[str] = (),
    evict_terminated: bool = False,
    held: Collection[str] = (),
) -> GCPlan:
    """One container GC pass: the containers and sandboxes to remove and the removable pods.

    `desired` holds the UIDs of the pods some source wants; `terminated` those of
    desired pods that reached phase Succeeded or Failed, used only with
    `evict_terminated`; `held` those syncloop still holds (`pod_removable`).
    """
    if not sources_ready:
        return GCPlan()
    live = live_pods(containers, sandboxes)
    uids = {pod_uid(c.labels) for c in containers} | {pod_uid(s.labels) for s in sandboxes}
    removable = frozenset(
        u for u in uids if pod_removable(u, desired=desired, live=live, held=held)
    )
    evict_all = removable | (
        frozenset(u for u in terminated if u not in live) if evict_terminated else frozenset()
    )
    gone = select_containers(containers, settings=settings, removable=evict_all, now_s=now_s)
    gone_ids = {c.id for c in gone}
    remaining = [c for c in containers if c.id not in gone_ids]
    doomed = select_sandboxes(sandboxes, remaining=remaining, removable=evict_all)
    return GCPlan(containers=tuple(gone), sandboxes=tuple(doomed), removable_pods=removable)


def log_dirs_to_remove(
    names: Iterable[str],
    *,
    desired: Collection[str],
    live: Collection[str],
    sources_ready: bool,
    held: Collection[str] = (),
) -> list[str]:
    """The pod log directories (by name) of pods that are gone: not desired, running
    nothing, not held by syncloop.

    Only once every source is ready; names that are not `<ns>_<name>_<uid>` are left alone.
    """
    if not sources_ready:
        return []
    return sorted(
        n
        for n in names
        if (uid := pod_log_dir_uid(n)) and pod_removable(uid, desired=desired, live=live, held=held)
    )
