"""In-place resize decisions (pods/resize.py): amounts from quantities, allocation and
the allocated pod, the requested-resize metric labels, admission of a resize (accepted,
Infeasible for a static pod, beyond allocatable, or a Guaranteed pod's CPU under the
static CPU manager; Deferred when admission refuses),
the pending order, the actuation plan's order (pod cgroup grown before and shrunk after
the containers, decreases before increases, memory before CPU, RestartContainer), the
memory-limit-below-usage refusal, and the in-progress check."""

from __future__ import annotations

from typing import Any

import pytest
from klet.syncloop.pods.resize import (
    DEFERRED,
    INFEASIBLE,
    Amounts,
    PendingResize,
    PodCgroup,
    RequestedChange,
    SetPodCgroup,
    UpdateContainer,
    allocation_of,
    amounts,
    decide,
    in_progress,
    memory_decrease_problems,
    pending_order,
    plan,
    requested_changes,
    resize_requested,
    with_allocation,
)

MI = 1024 * 1024


def res(
    cpu: str | None = None,
    mem: str | None = None,
    *,
    lcpu: str | None = None,
    lmem: str | None = None,
) -> dict[str, Any]:
    """Requests (cpu, mem) and limits (lcpu, lmem)."""
    out: dict[str, Any] = {
        "requests": {k: v for k, v in (("cpu", cpu), ("memory", mem)) if v is not None}
    }
    limits = {k: v for k, v in (("cpu", lcpu), ("memory", lmem)) if v is not None}
    if limits:
        out["limits"] = limits
    return out


def pod(*containers: dict[str, Any], sidecars: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": list(containers)}
    inits = [*sidecars]
    if inits:
        spec["initContainers"] = inits
    return {"metadata": {"uid": "u1", "generation": 2}, "spec": spec}


def ctr(name: str, resources: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": "i", "resources": resources, **extra}


def test_amounts_round_like_quantities() -> None:
    a = amounts(res("100m", "64Mi", lcpu="1.5", lmem="128Mi"))
    assert a == Amounts(
        cpu_request=100, cpu_limit=1500, memory_request=64 * MI, memory_limit=128 * MI
    )
    assert amounts(None) == Amounts()
    assert amounts({"requests": {"cpu": "0.0001"}}).cpu_request == 1  # MilliValue rounds up


def test_allocation_covers_containers_and_sidecars_only() -> None:
    p = pod(
        ctr("main", res("100m")),
        sidecars=(ctr("proxy", res("50m"), restartPolicy="Always"),),
    )
    p["spec"]["initContainers"].append(ctr("setup", res("1")))
    assert set(allocation_of(p)) == {"main", "proxy"}


def test_with_allocation_substitutes_only_what_differs() -> None:
    p = pod(ctr("a", res("200m", "64Mi")), ctr("b", res("100m")))
    assert with_allocation(p, allocation_of(p)) is p
    assert not resize_requested(p, allocation_of(p))
    # Quantities compare by value: "0.1" is "100m".
    assert not resize_requested(p, {"a": res("200m", "64Mi"), "b": res("0.1")})
    allocated = with_allocation(p, {"a": res("100m", "64Mi")})
    assert allocated is not p and allocated["spec"]["containers"][0]["resources"] == res(
        "100m", "64Mi"
    )
    assert p["spec"]["containers"][0]["resources"] == res("200m", "64Mi")  # not mutated
    assert resize_requested(p, {"a": res("100m", "64Mi")})


def test_requested_changes_label_each_container_change() -> None:
    old = pod(ctr("a", res("100m", "64Mi", lmem="128Mi")), ctr("b", res("100m")))
    new = pod(ctr("a", res("200m", "32Mi")), ctr("b", res("100m", lcpu="1")))
    assert requested_changes(old, new) == [
        RequestedChange("memory", "requests", "decrease"),
        RequestedChange("memory", "limits", "remove"),
        RequestedChange("cpu", "requests", "increase"),
        RequestedChange("cpu", "limits", "add"),
    ]


ALLOCATABLE = {"cpu": 2000, "memory": 1024 * MI}


def admit_all(_: dict[str, Any]) -> tuple[bool, str]:
    return True, ""


def test_decide_accepts_a_fitting_resize() -> None:
    p = pod(ctr("a", res("500m", "64Mi")))
    verdict = decide(
        p, {"a": res("100m", "64Mi")}, static=False, allocatable=ALLOCATABLE, admit=admit_all
    )
    assert verdict.accept and not verdict.pending
    same = decide(p, allocation_of(p), static=False, allocatable=ALLOCATABLE, admit=admit_all)
    assert not same.accept and not same.pending


@pytest.mark.parametrize(
    ("resources", "static", "message", "metric"),
    [
        (res("500m"), True, "In-place resize of static-pods is not supported", "static_pod"),
        (
            res("3"),
            False,
            "Node didn't have enough capacity: cpu, requested: 3000, capacity: 2000",
            "insufficient_node_allocatable",
        ),
        (
            res("3", "2Gi"),
            False,
            f"Node didn't have enough capacity: memory, requested: {2048 * MI}, "
            f"capacity: {1024 * MI}",
            "insufficient_node_allocatable",
        ),
    ],
)
def test_decide_infeasible(
    resources: dict[str, Any], static: bool, message: str, metric: str
) -> None:
    verdict = decide(
        pod(ctr("a", resources)),
        {"a": res("100m")},
        static=static,
        allocatable=ALLOCATABLE,
        admit=admit_all,
    )
    assert (verdict.reason, verdict.message, verdict.metric_reason) == (INFEASIBLE, message, metric)


def test_decide_defers_what_admission_refuses_now() -> None:
    seen: list[dict[str, Any]] = []

    def refuse(p: dict[str, Any]) -> tuple[bool, str]:
        seen.append(p)
        return (
            False,
            "Node didn't have enough resource: cpu, requested: 1500, used: 1000, capacity: 2000",
        )

    p = pod(ctr("a", res("1500m")))
    verdict = decide(p, {"a": res("100m")}, static=False, allocatable=ALLOCATABLE, admit=refuse)
    assert verdict.reason == DEFERRED and verdict.message.startswith("Node didn't have enough")
    assert seen == [p]  # admission judges the desired pod


def test_pending_order_is_upstreams() -> None:
    pending = [
        PendingResize("late-low", True, 0, False, 30.0),
        PendingResize("early-low", True, 0, False, 10.0),
        PendingResize("guaranteed", True, 0, True, 50.0),
        PendingResize("high", True, 100, False, 60.0),
        PendingResize("shrinks", False, 0, False, 70.0),
        PendingResize("new", True, 0, False, None),
    ]
    assert pending_order(pending) == [
        "shrinks",
        "high",
        "guaranteed",
        "early-low",
        "late-low",
        "new",
    ]


def cg(shares: int, quota: int, memory: int) -> PodCgroup:
    return PodCgroup(cpu_shares=shares, cpu_quota=quota, memory_limit=memory)


def test_plan_grows_the_pod_cgroup_before_the_containers() -> None:
    allocated = pod(ctr("a", res("1", "128Mi", lcpu="1", lmem="128Mi")))
    before = Amounts(500, 500, 64 * MI, 64 * MI)
    p = plan(
        allocated,
        actuated={"a": before},
        running={"a": "cid"},
        pod_current=cg(512, 50000, 64 * MI),
        pod_new=cg(1024, 100000, 128 * MI),
    )
    assert p.restart == ()
    assert p.steps == (
        SetPodCgroup("memory", limit=True),
        UpdateContainer("a", "cid", Amounts(500, 500, 128 * MI, 128 * MI)),
        SetPodCgroup("cpu", limit=True),
        SetPodCgroup("cpu", limit=False),
        UpdateContainer("a", "cid", Amounts(1000, 1000, 128 * MI, 128 * MI)),
    )
    assert p.pod_memory_decrease is None and not p.decreasing_memory


def test_plan_shrinks_the_pod_cgroup_after_the_containers() -> None:
    allocated = pod(ctr("a", res("500m", "64Mi", lcpu="500m", lmem="64Mi")))
    p = plan(
        allocated,
        actuated={"a": Amounts(1000, 1000, 128 * MI, 128 * MI)},
        running={"a": "cid"},
        pod_current=cg(1024, 100000, 128 * MI),
        pod_new=cg(512, 50000, 64 * MI),
    )
    assert p.steps == (
        UpdateContainer("a", "cid", Amounts(1000, 1000, 64 * MI, 64 * MI)),
        SetPodCgroup("memory", limit=True),
        UpdateContainer("a", "cid", Amounts(500, 500, 64 * MI, 64 * MI)),
        SetPodCgroup("cpu", limit=False),
        SetPodCgroup("cpu", limit=True),
    )
    assert p.pod_memory_decrease == 64 * MI and p.decreasing_memory == {"a": 64 * MI}


def test_plan_puts_decreases_before_increases_and_skips_stopped_containers() -> None:
    allocated = pod(ctr("up", res("300m")), ctr("down", res("100m")), ctr("stopped", res("900m")))
    p = plan(
        allocated,
        actuated={"up": Amounts(cpu_request=200), "down": Amounts(cpu_request=200)},
        running={"up": "c1", "down": "c2"},
        pod_current=cg(409, -1, 0),
        pod_new=cg(409, -1, 0),
    )
    assert [s.name for s in p.steps if isinstance(s, UpdateContainer)] == ["down", "up"]
    assert not any(isinstance(s, SetPodCgroup) for s in p.steps)


def test_plan_restarts_for_restart_container_policy() -> None:
    allocated = pod(
        ctr(
            "a",
            res("100m", "128Mi", lmem="128Mi"),
            resizePolicy=[
                {"resourceName": "cpu", "restartPolicy": "NotRequired"},
                {"resourceName": "memory", "restartPolicy": "RestartContainer"},
            ],
        ),
        ctr("b", res("200m")),
    )
    p = plan(
        allocated,
        actuated={
            "a": Amounts(100, 0, 64 * MI, 64 * MI),
            "b": Amounts(cpu_request=100),
        },
        running={"a": "c1", "b": "c2"},
        pod_current=cg(204, -1, 64 * MI),
        pod_new=cg(307, -1, 128 * MI),
    )
    assert p.restart == ("a",)
    assert p.steps == (
        SetPodCgroup("memory", limit=True),
        SetPodCgroup("cpu", limit=False),
        UpdateContainer("b", "c2", Amounts(cpu_request=200)),
    )
    # A CPU-only change of the same container needs no restart.
    cpu_only = plan(
        allocated,
        actuated={"a": Amounts(50, 0, 128 * MI, 128 * MI), "b": Amounts(cpu_request=200)},
        running={"a": "c1", "b": "c2"},
        pod_current=cg(256, -1, 128 * MI),
        pod_new=cg(307, -1, 128 * MI),
    )
    assert cpu_only.restart == ()


def test_memory_decrease_below_usage_is_refused() -> None:
    allocated = pod(ctr("a", res("100m", "32Mi", lmem="32Mi")))
    p = plan(
        allocated,
        actuated={"a": Amounts(100, 0, 64 * MI, 64 * MI)},
        running={"a": "cid"},
        pod_current=cg(102, -1, 64 * MI),
        pod_new=cg(102, -1, 32 * MI),
    )
    assert memory_decrease_problems(p, pod_usage=10 * MI, container_usage={"a": 9 * MI}) is None
    assert memory_decrease_problems(p, pod_usage=40 * MI, container_usage={"a": 39 * MI}) == (
        "cannot decrease memory limits: ["
        f"attempting to set pod memory limit ({32 * MI}) below current usage ({40 * MI}), "
        f'attempting to set container "a" memory limit ({32 * MI}) below current usage '
        f"({39 * MI})]"
    )
    assert memory_decrease_problems(p, pod_usage=None, container_usage={"a": 1}) == (
        "cannot decrease memory limits: missing pod memory usage"
    )


def test_in_progress_while_a_running_container_differs() -> None:
    allocated = pod(ctr("a", res("200m")), ctr("b", res("100m")))
    done = {"a": Amounts(cpu_request=200), "b": Amounts(cpu_request=100)}
    assert not in_progress(allocated, actuated=done, running=["a", "b"])
    behind = {**done, "b": Amounts(cpu_request=50)}
    assert in_progress(allocated, actuated=behind, running=["a", "b"])
    assert not in_progress(allocated, actuated=behind, running=["a"])  # b is not running


def test_decide_cpu_resize_of_a_guaranteed_pod_is_infeasible_under_the_static_cpu_manager() -> None:
    guaranteed = pod(ctr("a", res("2", "64Mi", lcpu="2", lmem="64Mi")))
    allocated = {"a": res("1", "64Mi", lcpu="1", lmem="64Mi")}
    verdict = decide(
        guaranteed,
        allocated,
        static=False,
        allocatable=ALLOCATABLE,
        admit=admit_all,
        cpu_manager_static=True,
    )
    assert (verdict.reason, verdict.message, verdict.metric_reason) == (
        INFEASIBLE,
        'Resize is infeasible for Guaranteed Pods alongside CPU Manager policy "static"',
        "guaranteed_pod_cpu_manager_static_policy",
    )
    # without the static policy, or a memory-only resize, or a Burstable pod: as before
    kw: dict[str, Any] = {"static": False, "allocatable": ALLOCATABLE, "admit": admit_all}
    assert decide(guaranteed, allocated, **kw).accept
    memory_only = pod(ctr("a", res("1", "128Mi", lcpu="1", lmem="128Mi")))
    assert decide(memory_only, allocated, cpu_manager_static=True, **kw).accept
    burstable = pod(ctr("a", res("2", "64Mi")))
    assert decide(burstable, {"a": res("1", "64Mi")}, cpu_manager_static=True, **kw).accept
