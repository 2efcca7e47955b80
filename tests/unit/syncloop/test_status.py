"""compute_pod_status: phase per restart policy, container states and lastState,
CrashLoopBackOff waiting, conditions with kept transition times, terminal override, and
a host-network pod reporting the node IP, readiness gates holding Ready (upstream's
ReadinessGatesNotReady reason and messages) while ContainersReady is True, and
observedGeneration on the status and each condition (PodObservedGenerationTracking)."""

from __future__ import annotations

import pytest
from klet.cri.types import ContainerState as CS
from klet.syncloop.pods.status import compute_pod_status, pod_phase

from .helpers import ctr, pod, runtime, sandbox


def test_running_pod() -> None:
    p = pod("a", "b")
    st = compute_pod_status(
        p,
        runtime([sandbox()], [ctr(p, "a", CS.RUNNING), ctr(p, "b", CS.RUNNING)]),
        waiting={},
        previous=None,
        now=1000,
    )
    assert st["phase"] == "Running" and st["podIP"] == "10.1.0.2"
    assert st["containerStatuses"] and all(c["ready"] for c in st["containerStatuses"])
    cond = {c["type"]: c["status"] for c in st["conditions"]}
    assert cond == {
        "PodReadyToStartContainers": "True",
        "Initialized": "True",
        "Ready": "True",
        "ContainersReady": "True",
        "PodScheduled": "True",
    }
    assert st["qosClass"] == "BestEffort"
    assert st["containerStatuses"][0]["containerID"] == "containerd://a-0"


def test_pending_before_containers_exist() -> None:
    p = pod("a")
    st = compute_pod_status(p, runtime([], []), waiting={}, previous=None, now=1000)
    assert st["phase"] == "Pending"
    assert st["containerStatuses"][0]["state"] == {"waiting": {"reason": "ContainerCreating"}}


def test_crashloop_shows_waiting_and_last_state() -> None:
    p = pod("a")
    exited = ctr(p, "a", CS.EXITED, exit_code=2, finished_s=990, n=3)
    st = compute_pod_status(
        p,
        runtime([sandbox()], [exited]),
        waiting={"a": ("CrashLoopBackOff", "back-off 40s ...")},
        previous=None,
        now=1000,
    )
    cs = st["containerStatuses"][0]
    assert cs["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert cs["lastState"]["terminated"]["exitCode"] == 2
    assert cs["lastState"]["terminated"]["reason"] == "Error"
    assert cs["restartCount"] == 3
    assert st["phase"] == "Running"  # restartPolicy Always: a restarting container keeps Running


def test_last_state_of_running_restarted_container() -> None:
    p = pod("a")
    st = compute_pod_status(
        p,
        runtime(
            [sandbox()],
            [ctr(p, "a", CS.EXITED, exit_code=1, n=0, finished_s=50), ctr(p, "a", CS.RUNNING, n=1)],
        ),
        waiting={},
        previous=None,
        now=1000,
    )
    cs = st["containerStatuses"][0]
    assert "running" in cs["state"] and cs["lastState"]["terminated"]["exitCode"] == 1
    assert cs["restartCount"] == 1


@pytest.mark.parametrize(
    ("policy", "codes", "phase"),
    [
        ("Never", [0, 0], "Succeeded"),
        ("Never", [0, 1], "Failed"),
        ("OnFailure", [0, 0], "Succeeded"),
        ("OnFailure", [0, 1], "Running"),
        ("Always", [0, 0], "Running"),
    ],
)
def test_phase_of_finished_pods(policy: str, codes: list[int], phase: str) -> None:
    p = pod("a", "b", policy=policy)
    statuses = [{"state": {"terminated": {"exitCode": c}}} for c in codes]
    assert pod_phase(p, statuses) == phase


def test_transition_time_kept_when_status_unchanged() -> None:
    p = pod("a")
    rt = runtime([sandbox()], [ctr(p, "a", CS.RUNNING)])
    first = compute_pod_status(p, rt, waiting={}, previous=None, now=1000)
    second = compute_pod_status(p, rt, waiting={}, previous=first, now=2000)
    assert first["conditions"] == second["conditions"]
    assert second["startTime"] == first["startTime"]


def test_terminal_override() -> None:
    p = pod("a")
    st = compute_pod_status(
        p,
        runtime([sandbox()], [ctr(p, "a", CS.EXITED, exit_code=137)]),
        waiting={},
        previous=None,
        now=1000,
        terminal=("Evicted", "low on memory"),
    )
    assert (
        st["phase"] == "Failed" and st["reason"] == "Evicted" and st["message"] == "low on memory"
    )


@pytest.mark.parametrize(("codes", "phase"), [([0, 0], "Succeeded"), ([0, 143], "Failed")])
def test_stopping_pod_gets_a_final_phase(codes: list[int], phase: str) -> None:
    p = pod("a", "b")  # restartPolicy Always: without `stopping` this would stay Running
    rt = runtime(
        [sandbox()],
        [ctr(p, "a", CS.EXITED, exit_code=codes[0]), ctr(p, "b", CS.EXITED, exit_code=codes[1])],
    )
    assert compute_pod_status(p, rt, waiting={}, previous=None, now=1000)["phase"] == "Running"
    assert (
        compute_pod_status(p, rt, waiting={}, previous=None, now=1000, stopping=True)["phase"]
        == phase
    )


def test_pod_ip_kept_after_the_sandbox_stops() -> None:
    p = pod("a", policy="Never")
    rt = runtime([sandbox()], [ctr(p, "a", CS.RUNNING)])
    first = compute_pod_status(p, rt, waiting={}, previous=None, now=1000)
    from klet.cri.types import SandboxState

    stopped = runtime(
        [sandbox(SandboxState.NOTREADY, ip="")], [ctr(p, "a", CS.EXITED, exit_code=0)]
    )
    later = compute_pod_status(p, stopped, waiting={}, previous=first, now=2000)
    assert later["phase"] == "Succeeded" and later["podIP"] == "10.1.0.2"


def test_host_network_pod_reports_the_node_ip() -> None:
    p = pod("a", hostNetwork=True)
    s = compute_pod_status(
        p, runtime([sandbox(ip="")], []), waiting={}, previous=None, now=1000, host_ip="10.9.8.7"
    )
    assert s["podIP"] == "10.9.8.7" and s["podIPs"] == [{"ip": "10.9.8.7"}]


def _gated(*conditions: tuple[str, str]) -> dict:  # type: ignore[type-arg]
    p = pod("a")
    p["spec"]["readinessGates"] = [
        {"conditionType": "k8s.io/test-condition1"},
        {"conditionType": "k8s.io/test-condition2"},
    ]
    p["status"] = {"conditions": [{"type": t, "status": s} for t, s in conditions]}
    return p


@pytest.mark.parametrize(
    ("conditions", "ready", "message"),
    [
        (
            (),
            "False",
            'corresponding condition of pod readiness gate "k8s.io/test-condition1" does not '
            'exist., corresponding condition of pod readiness gate "k8s.io/test-condition2" '
            "does not exist.",
        ),
        (
            (("k8s.io/test-condition1", "True"), ("k8s.io/test-condition2", "False")),
            "False",
            'the status of pod readiness gate "k8s.io/test-condition2" is not "True", but False',
        ),
        ((("k8s.io/test-condition1", "True"), ("k8s.io/test-condition2", "True")), "True", None),
    ],
)
def test_readiness_gates_hold_ready(
    conditions: tuple[tuple[str, str], ...], ready: str, message: str | None
) -> None:
    p = _gated(*conditions)
    st = compute_pod_status(
        p, runtime([sandbox()], [ctr(p, "a", CS.RUNNING)]), waiting={}, previous=None, now=1000
    )
    cond = {c["type"]: c for c in st["conditions"]}
    assert cond["ContainersReady"]["status"] == "True"
    assert cond["Ready"]["status"] == ready
    assert cond["Ready"].get("message") == message
    if ready == "False":
        assert cond["Ready"]["reason"] == "ReadinessGatesNotReady"


def test_unready_containers_come_before_readiness_gates() -> None:
    p = _gated()
    st = compute_pod_status(p, runtime([], []), waiting={}, previous=None, now=1000)
    ready = next(c for c in st["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "ContainersNotReady"
    assert ready["message"] == "containers with unready status: [a]"


def _with_generation(generation: int | None) -> dict:  # type: ignore[type-arg]
    p = pod("a")
    if generation is not None:
        p["metadata"]["generation"] = generation
    return p


def test_observed_generation_follows_the_pod_generation() -> None:
    p = _with_generation(3)
    rt = runtime([sandbox()], [ctr(p, "a", CS.RUNNING)])
    first = compute_pod_status(p, rt, waiting={}, previous=None, now=1000)
    assert first["observedGeneration"] == 3
    assert {c["type"]: c["observedGeneration"] for c in first["conditions"]} == {
        "PodReadyToStartContainers": 3,
        "Initialized": 3,
        "Ready": 3,
        "ContainersReady": 3,
        "PodScheduled": 3,
    }
    # A spec change bumps the generation: every condition says so, and their
    # transition times stay (their status did not change).
    p["metadata"]["generation"] = 4
    second = compute_pod_status(p, rt, waiting={}, previous=first, now=2000)
    assert second["observedGeneration"] == 4
    assert all(c["observedGeneration"] == 4 for c in second["conditions"])
    assert [c["lastTransitionTime"] for c in second["conditions"]] == [
        c["lastTransitionTime"] for c in first["conditions"]
    ]


def test_observed_generation_never_goes_back() -> None:
    p = _with_generation(5)
    rt = runtime([sandbox()], [ctr(p, "a", CS.RUNNING)])
    first = compute_pod_status(p, rt, waiting={}, previous=None, now=1000)
    older = _with_generation(4)
    again = compute_pod_status(older, rt, waiting={}, previous=first, now=2000)
    assert again["observedGeneration"] == 5


def test_a_pod_without_generation_reports_none() -> None:
    """A static pod never went through the apiserver: no generation, and upstream's
    omitempty leaves both fields out (its mirror pod gets none from the node)."""
    p = _with_generation(None)
    st = compute_pod_status(
        p, runtime([sandbox()], [ctr(p, "a", CS.RUNNING)]), waiting={}, previous=None, now=1000
    )
    assert "observedGeneration" not in st
    assert not any("observedGeneration" in c for c in st["conditions"])


def test_disruption_target_keeps_the_generation_it_was_made_at() -> None:
    p = _with_generation(2)
    rt = runtime([sandbox()], [ctr(p, "a", CS.EXITED, exit_code=137)])
    evicted = compute_pod_status(
        p, rt, waiting={}, previous=None, now=1000, stopping=True, disruption="low on memory"
    )
    target = next(c for c in evicted["conditions"] if c["type"] == "DisruptionTarget")
    assert target["observedGeneration"] == 2
    p["metadata"]["generation"] = 3
    later = compute_pod_status(
        p, rt, waiting={}, previous=evicted, now=2000, stopping=True, disruption="low on memory"
    )
    by_type = {c["type"]: c for c in later["conditions"]}
    assert by_type["DisruptionTarget"]["observedGeneration"] == 2
    assert by_type["Ready"]["observedGeneration"] == 3
    assert later["observedGeneration"] == 3
