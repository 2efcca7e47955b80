"""containerselect: which dead containers, sandboxes and pod log directories one container
GC pass removes — minimum age, the per-container and node-wide limits (equal share, then
oldest first), deleted and terminated pods, newest-sandbox keeping, unknown-state stops,
running containers never, and nothing at all before the sources are ready."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from klet.config import load_settings
from klet.cri import labels as L
from klet.cri.types import Container, ContainerState, Sandbox, SandboxState
from klet.image_gc.containerselect import (
    ContainerGCSettings,
    live_pods,
    log_dirs_to_remove,
    plan,
)
from klet.model.types import ContainerID, SandboxID

X, R, U, C = (
    ContainerState.EXITED,
    ContainerState.RUNNING,
    ContainerState.UNKNOWN,
    ContainerState.CREATED,
)
READY, NOTREADY = SandboxState.READY, SandboxState.NOTREADY
NOW = 10_000.0  # seconds


def ctr(
    uid: str, name: str, attempt: int, state: ContainerState, at: float, sb: int = 0
) -> Container:
    """Container `<uid>/<name>/<attempt>` created at `at` seconds, in sandbox `<uid>/sb<sb>`."""
    return Container(
        id=ContainerID(f"{uid}/{name}/{attempt}"),
        sandbox_id=SandboxID(f"{uid}/sb{sb}"),
        name=name,
        attempt=attempt,
        image="busybox",
        image_ref="sha256:1",
        state=state,
        created_at=int(at * 1e9),
        labels=L.container_labels(pod_name="p", namespace="ns", uid=uid, container=name)
        if uid
        else {},
    )


def sb(uid: str, attempt: int, state: SandboxState, at: float) -> Sandbox:
    return Sandbox(
        id=SandboxID(f"{uid}/sb{attempt}"),
        name="p",
        namespace="ns",
        uid=uid,
        attempt=attempt,
        state=state,
        created_at=int(at * 1e9),
        labels=L.sandbox_labels(name="p", namespace="ns", uid=uid, pod_labels={}) if uid else {},
    )


@dataclass
class Case:
    containers: list[Container]
    sandboxes: list[Sandbox]
    desired: set[str]
    removed: list[str]  # container IDs, in removal order
    sandboxes_removed: list[str] = field(default_factory=list)
    removable: set[str] = field(default_factory=set)
    settings: ContainerGCSettings = ContainerGCSettings()
    ready: bool = True
    terminated: set[str] = field(default_factory=set)
    evict_terminated: bool = False


CASES: dict[str, Case] = {
    "keeps the newest dead instance per container, removes older ones oldest first": Case(
        containers=[ctr("a", "c", i, X, 100 + i) for i in range(4)] + [ctr("a", "c", 4, R, 200)],
        sandboxes=[sb("a", 0, READY, 50)],
        desired={"a"},
        removed=["a/c/0", "a/c/1", "a/c/2"],
    ),
    "newest means the highest attempt, then the latest creation": Case(
        containers=[ctr("a", "c", 2, X, 100), ctr("a", "c", 1, X, 300), ctr("a", "d", 0, X, 50)],
        sandboxes=[sb("a", 0, READY, 10)],
        desired={"a"},
        removed=["a/c/1"],
    ),
    "units are per pod and container name": Case(
        containers=[ctr("a", "c", 0, X, 1), ctr("a", "d", 0, X, 2), ctr("b", "c", 0, X, 3)],
        sandboxes=[sb("a", 0, READY, 0), sb("b", 0, READY, 0)],
        desired={"a", "b"},
        removed=[],
    ),
    "a running container is never removed, even with no dead instance allowed": Case(
        containers=[ctr("a", "c", 0, R, 1), ctr("a", "c", 1, X, 2)],
        sandboxes=[sb("a", 0, READY, 0)],
        desired={"a"},
        removed=["a/c/1"],
        settings=ContainerGCSettings(max_per_pod_container=0),
    ),
    "created (never started) containers are dead too": Case(
        containers=[ctr("a", "c", 0, C, 1), ctr("a", "c", 1, X, 2)],
        sandboxes=[sb("a", 0, READY, 0)],
        desired={"a"},
        removed=["a/c/0"],
    ),
    "containers younger than the minimum age stay": Case(
        containers=[ctr("a", "c", i, X, NOW - 100 + 30 * i) for i in range(4)],
        sandboxes=[sb("a", 0, READY, 0)],
        desired={"a"},
        # 9900, 9930 are old enough; 9960 and 9990 are younger than 60 s: the old ones
        # form the unit, whose newest (9930) is kept.
        removed=["a/c/0"],
        settings=ContainerGCSettings(min_age_s=60),
    ),
    "a negative per-container limit keeps every dead instance": Case(
        containers=[ctr("a", "c", i, X, i) for i in range(5)],
        sandboxes=[sb("a", 0, READY, 0)],
        desired={"a"},
        removed=[],
        settings=ContainerGCSettings(max_per_pod_container=-1),
    ),
    "node limit: equal share per unit first": Case(
        containers=[ctr("a", "c", i, X, 10 + i) for i in range(3)]
        + [ctr("b", "c", i, X, 20 + i) for i in range(3)],
        sandboxes=[sb("a", 0, READY, 0), sb("b", 0, READY, 0)],
        desired={"a", "b"},
        removed=["a/c/0", "b/c/0"],
        settings=ContainerGCSettings(max_per_pod_container=-1, max_containers=4),
    ),
    "node limit below the number of units: one each, then the oldest overall": Case(
        containers=[ctr("a", "c", i, X, 10 + i) for i in range(2)]
        + [ctr("b", "c", i, X, 20 + i) for i in range(2)]
        + [ctr("d", "c", i, X, 30 + i) for i in range(2)],
        sandboxes=[sb(u, 0, READY, 0) for u in "abd"],
        desired={"a", "b", "d"},
        removed=["a/c/0", "a/c/1", "b/c/0", "d/c/0"],
        settings=ContainerGCSettings(max_per_pod_container=-1, max_containers=2),
    ),
    "node limit zero removes every dead container": Case(
        containers=[ctr("a", "c", 0, X, 1), ctr("a", "c", 1, R, 2)],
        sandboxes=[sb("a", 0, READY, 0)],
        desired={"a"},
        removed=["a/c/0"],
        settings=ContainerGCSettings(max_per_pod_container=-1, max_containers=0),
    ),
    "node limit not reached: per-container limit only": Case(
        containers=[ctr("a", "c", i, X, i) for i in range(3)],
        sandboxes=[sb("a", 0, READY, 0)],
        desired={"a"},
        removed=["a/c/0"],
        settings=ContainerGCSettings(max_per_pod_container=2, max_containers=10),
    ),
    "a deleted pod loses every dead container, its sandboxes and its log directory": Case(
        containers=[ctr("gone", "c", i, X, i) for i in range(3)],
        sandboxes=[sb("gone", 0, NOTREADY, 0), sb("gone", 1, NOTREADY, 5)],
        desired={"a"},
        removed=["gone/c/0", "gone/c/1", "gone/c/2"],
        sandboxes_removed=["gone/sb0", "gone/sb1"],
        removable={"gone"},
    ),
    "a deleted pod that still runs is being killed: ordinary limits only": Case(
        containers=[
            ctr("gone", "c", 0, X, 1),
            ctr("gone", "c", 1, X, 2),
            ctr("gone", "d", 0, R, 3),
        ],
        sandboxes=[sb("gone", 0, READY, 0)],
        desired=set(),
        removed=["gone/c/0"],
    ),
    "a deleted pod whose sandbox is still ready keeps it": Case(
        containers=[ctr("gone", "c", 0, X, 1)],
        sandboxes=[sb("gone", 0, READY, 0), sb("gone", 1, NOTREADY, 5)],
        desired=set(),
        removed=[],
    ),
    "a deleted pod's young dead container stays, and so does the sandbox holding it": Case(
        containers=[ctr("gone", "c", 0, X, NOW - 5)],
        sandboxes=[sb("gone", 0, NOTREADY, 0)],
        desired=set(),
        removed=[],
        removable={"gone"},
        settings=ContainerGCSettings(min_age_s=60),
    ),
    "nothing is removed before every source is ready": Case(
        containers=[ctr("gone", "c", i, X, i) for i in range(3)]
        + [ctr("a", "c", i, X, i) for i in range(3)],
        sandboxes=[sb("gone", 0, NOTREADY, 0), sb("a", 0, NOTREADY, 0), sb("a", 1, READY, 1)],
        desired=set(),
        removed=[],
        ready=False,
    ),
    "an unknown-state container counts as dead (and is stopped first)": Case(
        containers=[ctr("a", "c", 0, U, 1), ctr("a", "c", 1, X, 2)],
        sandboxes=[sb("a", 0, READY, 0)],
        desired={"a"},
        removed=["a/c/0"],
    ),
    "existing pod: the newest sandbox stays even when not ready, older empty ones go": Case(
        containers=[],
        sandboxes=[sb("a", 0, NOTREADY, 1), sb("a", 1, NOTREADY, 2), sb("a", 2, NOTREADY, 3)],
        desired={"a"},
        removed=[],
        sandboxes_removed=["a/sb0", "a/sb1"],
    ),
    "existing pod: an old sandbox still holding a kept container stays": Case(
        containers=[ctr("a", "c", 0, X, 2, sb=0), ctr("a", "c", 1, R, 6, sb=1)],
        sandboxes=[sb("a", 0, NOTREADY, 1), sb("a", 1, READY, 5)],
        desired={"a"},
        removed=[],
    ),
    "existing pod: an old sandbox emptied by this pass goes in the same pass": Case(
        containers=[ctr("a", "c", 0, X, 2, sb=0), ctr("a", "c", 1, X, 6, sb=1)],
        sandboxes=[sb("a", 0, NOTREADY, 1), sb("a", 1, READY, 5)],
        desired={"a"},
        removed=["a/c/0"],
        sandboxes_removed=["a/sb0"],
    ),
    "terminated pods are emptied only by node-level reclaim": Case(
        containers=[ctr("t", "c", 0, X, 1), ctr("t", "c", 1, X, 2)],
        sandboxes=[sb("t", 0, NOTREADY, 0)],
        desired={"t"},
        removed=["t/c/0"],
        terminated={"t"},
    ),
    "node-level reclaim empties terminated pods, sandboxes included": Case(
        containers=[ctr("t", "c", 0, X, 1), ctr("t", "c", 1, X, 2), ctr("a", "c", 0, X, 3)],
        sandboxes=[sb("t", 0, NOTREADY, 0), sb("a", 0, READY, 0)],
        desired={"t", "a"},
        removed=["t/c/0", "t/c/1"],
        sandboxes_removed=["t/sb0"],
        terminated={"t"},
        evict_terminated=True,
    ),
    "objects without the pod UID label are not ours": Case(
        containers=[ctr("", "c", 0, X, 1), ctr("", "c", 1, X, 2)],
        sandboxes=[sb("", 0, NOTREADY, 0), sb("", 1, NOTREADY, 1)],
        desired=set(),
        removed=[],
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=list(CASES))
def test_plan(case: Case) -> None:
    decision = plan(
        case.containers,
        case.sandboxes,
        settings=case.settings,
        desired=case.desired,
        sources_ready=case.ready,
        now_s=NOW,
        terminated=case.terminated,
        evict_terminated=case.evict_terminated,
    )
    assert [c.id for c in decision.containers] == case.removed
    assert [s.id for s in decision.sandboxes] == case.sandboxes_removed
    assert decision.removable_pods == case.removable
    assert all(c.state != R for c in decision.containers)
    assert [c.id for c in decision.to_stop] == [c.id for c in decision.containers if c.state == U]


def test_unknown_containers_are_to_be_stopped() -> None:
    decision = plan(
        [ctr("a", "c", 0, U, 1), ctr("a", "c", 1, X, 2)],
        [sb("a", 0, READY, 0)],
        settings=ContainerGCSettings(),
        desired={"a"},
        sources_ready=True,
        now_s=NOW,
    )
    assert [c.id for c in decision.to_stop] == ["a/c/0"]


@pytest.mark.parametrize(
    ("names", "desired", "live", "ready", "expected"),
    [
        (["ns_a_u1", "ns_b_u2"], {"u1"}, set(), True, ["ns_b_u2"]),
        (["ns_a_u1", "ns_b_u2"], {"u1"}, {"u2"}, True, []),  # still being killed
        (["ns_a_u1", "ns_b_u2"], set(), set(), False, []),  # sources not ready
        (["lost+found", "ns_b_u2"], set(), set(), True, ["ns_b_u2"]),  # not a pod's: kept
    ],
)
def test_log_dirs_to_remove(
    names: list[str], desired: set[str], live: set[str], ready: bool, expected: list[str]
) -> None:
    assert log_dirs_to_remove(names, desired=desired, live=live, sources_ready=ready) == expected


def test_live_pods_are_those_with_a_ready_sandbox_or_a_running_container() -> None:
    live = live_pods(
        [ctr("r", "c", 0, R, 1), ctr("x", "c", 0, X, 1), ctr("", "c", 0, R, 1)],
        [sb("s", 0, READY, 0), sb("n", 0, NOTREADY, 0)],
    )
    assert live == {"r", "s"}


def test_settings_come_from_the_upstream_flags_with_upstream_defaults() -> None:
    defaults = load_settings([], env={}, service="image-gc", hostname="n")
    assert ContainerGCSettings.of(defaults.klet) == ContainerGCSettings(
        min_age_s=0, max_per_pod_container=1, max_containers=-1
    )
    given = load_settings(
        [
            "--minimum-container-ttl-duration",
            "1m30s",
            "--maximum-dead-containers-per-container",
            "3",
            "--maximum-dead-containers=-1",
        ],
        env={},
        service="image-gc",
        hostname="n",
    )
    assert ContainerGCSettings.of(given.klet) == ContainerGCSettings(90, 3, -1)


def test_a_negative_minimum_age_is_refused() -> None:
    with pytest.raises(ValueError, match="min_age_s"):
        ContainerGCSettings(min_age_s=-1)


def test_a_removed_pod_syncloop_still_holds_is_left_to_it() -> None:
    """issue 42: a pod no source wants, whose sandbox syncloop has stopped and is now
    removing itself, stays syncloop's while its status row is on the bus (`held`);
    once syncloop forgets it, the pass removes what is left."""
    containers = [ctr("gone", "c", 0, X, 1)]
    sandboxes = [sb("gone", 0, NOTREADY, 0)]
    settings = ContainerGCSettings()
    held = plan(
        containers,
        sandboxes,
        settings=settings,
        desired=(),
        sources_ready=True,
        now_s=NOW,
        held={"gone"},
    )
    assert held.containers == () and held.sandboxes == () and held.removable_pods == frozenset()
    assert (
        log_dirs_to_remove(["ns_p_gone"], desired=(), live=(), sources_ready=True, held={"gone"})
        == []
    )
    free = plan(containers, sandboxes, settings=settings, desired=(), sources_ready=True, now_s=NOW)
    assert [c.id for c in free.containers] == ["gone/c/0"]
    assert [s.id for s in free.sandboxes] == ["gone/sb0"]
    assert free.removable_pods == frozenset({"gone"})
