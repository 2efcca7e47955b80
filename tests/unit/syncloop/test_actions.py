"""compute_pod_actions: sandbox (re)creation, restart policies, spec-hash restarts,
unknown-state kills, crash-loop back-off and "nothing left to run → kill pod"."""

from __future__ import annotations

import pytest
from klet.cri.types import ContainerState as CS
from klet.cri.types import SandboxState
from klet.model.flowcontrol import Backoff
from klet.syncloop.pods.actions import compute_pod_actions, should_restart

from .helpers import ctr, pod, runtime, sandbox


def names(actions) -> list[str]:  # type: ignore[no-untyped-def]
    return [a.name for a in actions.to_start]


def test_new_pod_creates_sandbox_and_starts_all() -> None:
    p = pod("a", "b")
    a = compute_pod_actions(p, runtime([], []), Backoff(), now=1000)
    assert a.create_sandbox and a.sandbox_attempt == 0 and not a.kill_pod
    assert names(a) == ["a", "b"]


def test_steady_pod_does_nothing() -> None:
    p = pod("a")
    a = compute_pod_actions(p, runtime([sandbox()], [ctr(p, "a", CS.RUNNING)]), Backoff(), now=1000)
    assert not a.create_sandbox and not a.kill_pod and not a.to_start and not a.to_kill


@pytest.mark.parametrize("sb", [sandbox(SandboxState.NOTREADY), sandbox(ip="")])
def test_sandbox_changed_recreates_with_next_attempt(sb) -> None:  # type: ignore[no-untyped-def]
    p = pod("a")
    a = compute_pod_actions(
        p, runtime([sb], [ctr(p, "a", CS.EXITED, exit_code=1)]), Backoff(), now=1000
    )
    assert a.kill_pod and a.create_sandbox and a.sandbox_attempt == 1 and names(a) == ["a"]


def test_never_pod_with_dead_sandbox_is_not_recreated() -> None:
    p = pod("a", policy="Never")
    rt = runtime([sandbox(SandboxState.NOTREADY)], [ctr(p, "a", CS.EXITED, exit_code=0)])
    a = compute_pod_actions(p, rt, Backoff(), now=1000)
    assert not a.create_sandbox and not a.to_start


def test_onfailure_sandbox_recreation_skips_succeeded() -> None:
    p = pod("a", "b", policy="OnFailure")
    rt = runtime(
        [sandbox(SandboxState.NOTREADY)],
        [ctr(p, "a", CS.EXITED, exit_code=0), ctr(p, "b", CS.EXITED, exit_code=3)],
    )
    a = compute_pod_actions(p, rt, Backoff(), now=1000)
    assert a.create_sandbox and names(a) == ["b"]


def test_onfailure_all_succeeded_creates_nothing() -> None:
    p = pod("a", policy="OnFailure")
    rt = runtime([sandbox(SandboxState.NOTREADY)], [ctr(p, "a", CS.EXITED, exit_code=0)])
    a = compute_pod_actions(p, rt, Backoff(), now=1000)
    assert not a.create_sandbox and not a.to_start


@pytest.mark.parametrize(
    ("policy", "exit_code", "restart"),
    [
        ("Always", 0, True),
        ("Always", 1, True),
        ("OnFailure", 0, False),
        ("OnFailure", 1, True),
        ("Never", 0, False),
        ("Never", 1, False),
    ],
)
def test_restart_policy_table(policy: str, exit_code: int, restart: bool) -> None:
    p = pod("a", policy=policy)
    last = ctr(p, "a", CS.EXITED, exit_code=exit_code, finished_s=500)
    assert should_restart(last, policy) is restart
    a = compute_pod_actions(p, runtime([sandbox()], [last]), Backoff(), now=1000)
    assert names(a) == (["a"] if restart else [])
    assert a.kill_pod is (not restart)  # nothing running, nothing to start → kill pod


def test_spec_hash_change_restarts_even_under_never() -> None:
    p = pod("a", policy="Never")
    running = ctr(p, "a", CS.RUNNING, hash_="v1:0000000000000000")
    a = compute_pod_actions(p, runtime([sandbox()], [running]), Backoff(), now=1000)
    assert list(a.to_kill) == [running.id] and names(a) == ["a"]


def test_unknown_state_container_is_killed_then_started() -> None:
    p = pod("a")
    unknown = ctr(p, "a", CS.UNKNOWN)
    a = compute_pod_actions(p, runtime([sandbox()], [unknown]), Backoff(), now=1000)
    assert unknown.id in a.to_kill and names(a) == ["a"]


def test_crash_loop_backoff_waits_and_reports() -> None:
    p = pod("a")
    b = Backoff()
    from klet.syncloop.model import podspec

    key = podspec.backoff_key(p, p["spec"]["containers"][0])
    b.next(key, now=990)  # one restart already happened: the delay is now 10 s
    exited = ctr(p, "a", CS.EXITED, exit_code=1, finished_s=995, n=1)
    a = compute_pod_actions(p, runtime([sandbox()], [exited]), b, now=1000)
    assert not a.to_start and not a.kill_pod
    assert a.waiting["a"][0] == "CrashLoopBackOff" and "back-off 10s" in a.waiting["a"][1]
    assert a.wake_at == 1005
    later = compute_pod_actions(p, runtime([sandbox()], [exited]), b, now=1006)
    assert names(later) == ["a"] and later.to_start[0].backoff_key == key


def test_first_exit_restarts_immediately() -> None:
    p = pod("a")
    exited = ctr(p, "a", CS.EXITED, exit_code=1, finished_s=999)
    a = compute_pod_actions(p, runtime([sandbox()], [exited]), Backoff(), now=1000)
    assert names(a) == ["a"]
