"""compute_pod_actions for init containers, sidecars and probe results: init containers
one at a time and in order, restart from the first on a new sandbox, failure under each
restart policy, sidecars kept running and gated by their startup probe, liveness and
startup failures of regular containers, and sidecars not keeping a finished pod alive."""

from __future__ import annotations

from typing import Any

import pytest
from klet.cri.types import ContainerState as CS
from klet.cri.types import SandboxState
from klet.model.flowcontrol import Backoff
from klet.model.types import ContainerID
from klet.syncloop.pods.actions import KILL_LIVENESS, KILL_STARTUP, PodActions, compute_pod_actions
from klet.syncloop.probing.proberesults import ProbeKind, StaticProbeResults

from .helpers import ctr, pod, runtime, sandbox

SIDECAR = {"name": "side", "restartPolicy": "Always"}
PROBED_SIDECAR = {
    "name": "side",
    "restartPolicy": "Always",
    "startupProbe": {"exec": {"command": ["true"]}},
}


def starts(a: PodActions) -> tuple[list[str], list[str]]:
    return [s.name for s in a.init_to_start], [s.name for s in a.to_start]


def act(p: dict[str, Any], *containers: Any, **kw: Any) -> PodActions:
    return compute_pod_actions(p, runtime([sandbox()], list(containers)), Backoff(), 1000, **kw)


def test_new_pod_starts_only_the_first_init_container() -> None:
    p = pod("a", inits=("i1", "i2"))
    a = compute_pod_actions(p, runtime([], []), Backoff(), now=1000)
    assert a.create_sandbox and a.purge_init
    assert starts(a) == (["i1"], [])


def test_running_init_container_is_waited_for() -> None:
    p = pod("a", inits=("i1", "i2"))
    a = act(p, ctr(p, "i1", CS.RUNNING))
    assert starts(a) == ([], []) and not a.kill_pod and not a.to_kill


def test_succeeded_init_container_starts_the_next() -> None:
    p = pod("a", inits=("i1", "i2"))
    assert starts(act(p, ctr(p, "i1", CS.EXITED))) == (["i2"], [])


def test_last_init_done_starts_regular_containers() -> None:
    p = pod("a", "b", inits=("i1", "i2"))
    a = act(p, ctr(p, "i1", CS.EXITED), ctr(p, "i2", CS.EXITED))
    assert starts(a) == ([], ["a", "b"])


def test_removed_earlier_init_containers_do_not_rerun() -> None:
    # Only the last init container is left in the runtime: it tells initialization is done.
    p = pod("a", inits=("i1", "i2"))
    assert starts(act(p, ctr(p, "i2", CS.EXITED))) == ([], ["a"])


def test_init_containers_gone_after_regular_ran_are_not_rerun() -> None:
    p = pod("a", inits=("i1", "i2"))
    a = act(p, ctr(p, "a", CS.RUNNING))
    assert starts(a) == ([], []) and not a.kill_pod


@pytest.mark.parametrize("policy", ["Always", "OnFailure"])
def test_failed_init_container_restarts_with_backoff(policy: str) -> None:
    p = pod("a", policy=policy, inits=("i1", "i2"))
    first = act(p, ctr(p, "i1", CS.EXITED, exit_code=1, finished_s=990))
    assert starts(first) == (["i1"], []) and not first.kill_pod

    backoff = Backoff()
    key = first.init_to_start[0].backoff_key
    assert key is not None
    backoff.next(key, 995)  # it was restarted once and failed again at 996
    rt = runtime([sandbox()], [ctr(p, "i1", CS.EXITED, n=1, exit_code=1, finished_s=996)])
    again = compute_pod_actions(p, rt, backoff, now=1000)
    assert starts(again) == ([], [])
    assert again.waiting["i1"][0] == "CrashLoopBackOff" and again.wake_at == 1006


def test_failed_init_container_under_never_kills_the_pod() -> None:
    p = pod("a", policy="Never", inits=("i1", "i2"))
    a = act(p, ctr(p, "i1", CS.EXITED, exit_code=2))
    assert a.kill_pod and starts(a) == ([], [])


def test_oom_killed_init_container_is_a_failure() -> None:
    p = pod("a", policy="Never", inits=("i1",))
    c = ctr(p, "i1", CS.EXITED, exit_code=0)
    oom = type(c)(**{**c.__dict__, "reason": "OOMKilled"})
    assert act(p, oom).kill_pod


def test_unknown_init_container_is_killed_then_started() -> None:
    p = pod("a", inits=("i1",))
    a = act(p, ctr(p, "i1", CS.UNKNOWN))
    assert list(a.to_kill) == [ContainerID("i1-0")] and starts(a) == (["i1"], [])


def test_new_sandbox_restarts_initialization_from_the_first() -> None:
    p = pod("a", inits=("i1", "i2"))
    rt = runtime(
        [sandbox(SandboxState.NOTREADY)],
        [ctr(p, "i1", CS.EXITED), ctr(p, "i2", CS.EXITED), ctr(p, "a", CS.EXITED, exit_code=1)],
    )
    a = compute_pod_actions(p, rt, Backoff(), now=1000)
    assert a.kill_pod and a.create_sandbox and a.purge_init and a.sandbox_attempt == 1
    assert starts(a) == (["i1"], [])


def test_sidecar_started_lets_the_next_init_container_run() -> None:
    p = pod("a", inits=(SIDECAR, "i2"))
    assert starts(act(p, ctr(p, "side", CS.RUNNING))) == (["i2"], [])


def test_sidecar_startup_probe_gates_the_next_init_container() -> None:
    p = pod("a", inits=(PROBED_SIDECAR, "i2"))
    side = ctr(p, "side", CS.RUNNING)
    assert starts(act(p, side)) == ([], [])  # not probed yet
    ok = StaticProbeResults({(ProbeKind.STARTUP, side.id): True})
    assert starts(act(p, side, probes=ok)) == (["i2"], [])
    failed = act(p, side, probes=StaticProbeResults({(ProbeKind.STARTUP, side.id): False}))
    assert failed.to_kill[side.id].reason == KILL_STARTUP
    assert starts(failed) == (["side"], [])


def test_sidecar_is_kept_running_and_restarted_after_initialization() -> None:
    p = pod("a", inits=(SIDECAR, "i2"))
    steady = act(p, ctr(p, "side", CS.RUNNING), ctr(p, "i2", CS.EXITED), ctr(p, "a", CS.RUNNING))
    assert starts(steady) == ([], []) and not steady.kill_pod
    crashed = act(
        p,
        ctr(p, "side", CS.EXITED, exit_code=1, finished_s=900),
        ctr(p, "i2", CS.EXITED),
        ctr(p, "a", CS.RUNNING),
    )
    assert starts(crashed) == (["side"], [])


def test_sidecar_liveness_failure_restarts_it() -> None:
    p = pod("a", inits=({**SIDECAR, "livenessProbe": {"tcpSocket": {"port": 1}}},))
    side = ctr(p, "side", CS.RUNNING)
    a = act(
        p,
        side,
        ctr(p, "a", CS.RUNNING),
        probes=StaticProbeResults({(ProbeKind.LIVENESS, side.id): False}),
    )
    assert a.to_kill[side.id].reason == KILL_LIVENESS and starts(a) == (["side"], [])


def test_sidecar_alone_does_not_keep_a_finished_pod() -> None:
    p = pod("a", policy="OnFailure", inits=(SIDECAR,))
    a = act(p, ctr(p, "side", CS.RUNNING), ctr(p, "a", CS.EXITED, exit_code=0))
    assert a.kill_pod and starts(a) == ([], [])


@pytest.mark.parametrize(
    ("policy", "restarted"), [("Always", True), ("OnFailure", True), ("Never", False)]
)
def test_liveness_failure_kills_and_restarts_per_policy(policy: str, restarted: bool) -> None:
    p = pod("a", policy=policy)
    p["spec"]["containers"][0]["livenessProbe"] = {
        "exec": {"command": ["false"]},
        "terminationGracePeriodSeconds": 5,
    }
    a_ = ctr(p, "a", CS.RUNNING)
    a = act(p, a_, probes=StaticProbeResults({(ProbeKind.LIVENESS, a_.id): False}))
    kill = a.to_kill[a_.id]
    assert kill.reason == KILL_LIVENESS and kill.grace_s == 5
    assert kill.message.startswith("Container a failed liveness probe")
    assert kill.message.endswith(", will be restarted") is restarted
    assert starts(a) == ([], ["a"] if restarted else [])
    assert a.kill_pod is not restarted  # nothing left under Never


def test_startup_failure_kills_and_restarts() -> None:
    p = pod("a")
    a_ = ctr(p, "a", CS.RUNNING)
    a = act(p, a_, probes=StaticProbeResults({(ProbeKind.STARTUP, a_.id): False}))
    assert a.to_kill[a_.id].message == "Container a failed startup probe, will be restarted"
    assert a.to_kill[a_.id].reason == KILL_STARTUP and starts(a) == ([], ["a"])


def test_passing_probes_keep_the_container() -> None:
    p = pod("a")
    a_ = ctr(p, "a", CS.RUNNING)
    ok = StaticProbeResults({(ProbeKind.LIVENESS, a_.id): True, (ProbeKind.STARTUP, a_.id): True})
    a = act(p, a_, probes=ok)
    assert not a.to_kill and starts(a) == ([], []) and not a.kill_pod
