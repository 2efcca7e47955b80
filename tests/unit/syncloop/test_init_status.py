"""compute_pod_status with init containers, sidecars and probe results: the
initContainerStatuses kubectl turns into `Init:N/M`, `Init:Error` and
`Init:CrashLoopBackOff`, PodInitializing waiting reasons, the Initialized condition,
phases as upstream's getPhase, and readiness and `started` from probe results."""

from __future__ import annotations

from typing import Any

from klet.cri.types import ContainerState as CS
from klet.syncloop.pods.status import compute_pod_status
from klet.syncloop.probing.proberesults import ProbeKind, StaticProbeResults

from .helpers import ctr, pod, runtime, sandbox

SIDECAR = {"name": "side", "restartPolicy": "Always"}


def status(p: dict[str, Any], *containers: Any, **kw: Any) -> dict[str, Any]:
    kw.setdefault("waiting", {})
    return compute_pod_status(
        p, runtime([sandbox()], list(containers)), previous=None, now=1000, **kw
    )


def cond(s: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in s["conditions"] if c["type"] == type_)


def state(entry: dict[str, Any]) -> str:
    (kind,) = entry["state"]
    return kind


def test_first_init_running_everything_else_pod_initializing() -> None:
    p = pod("a", inits=("i1", "i2"))
    s = status(p, ctr(p, "i1", CS.RUNNING))
    init = s["initContainerStatuses"]
    assert [state(e) for e in init] == ["running", "waiting"]
    assert init[1]["state"]["waiting"]["reason"] == "PodInitializing"
    assert s["containerStatuses"][0]["state"]["waiting"]["reason"] == "PodInitializing"
    assert not init[0]["ready"]
    assert s["phase"] == "Pending"
    initialized = cond(s, "Initialized")
    assert initialized["status"] == "False" and initialized["reason"] == "ContainersNotInitialized"
    assert initialized["message"] == "containers with incomplete status: [i1 i2]"


def test_completed_init_is_ready_and_terminated_completed() -> None:
    p = pod("a", inits=("i1",))
    s = status(p, ctr(p, "i1", CS.EXITED), ctr(p, "a", CS.RUNNING))
    (init,) = s["initContainerStatuses"]
    assert init["ready"] and init["state"]["terminated"]["reason"] == "Completed"
    assert s["phase"] == "Running" and cond(s, "Initialized")["status"] == "True"


def test_failed_init_in_back_off_shows_crash_loop_with_last_state() -> None:
    p = pod("a", inits=("i1",))
    s = status(
        p,
        ctr(p, "i1", CS.EXITED, exit_code=1, n=1),
        waiting={"i1": ("CrashLoopBackOff", "back-off 10s")},
    )
    (init,) = s["initContainerStatuses"]
    assert init["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert init["lastState"]["terminated"]["reason"] == "Error"
    assert init["restartCount"] == 1 and s["phase"] == "Pending"


def test_failed_init_under_never_fails_the_pod() -> None:
    p = pod("a", policy="Never", inits=("i1",))
    s = status(p, ctr(p, "i1", CS.EXITED, exit_code=3))
    assert s["phase"] == "Failed"
    assert s["initContainerStatuses"][0]["state"]["terminated"]["reason"] == "Error"
    assert s["containerStatuses"][0]["state"]["waiting"]["reason"] == "PodInitializing"


def test_succeeded_pod_with_init_containers() -> None:
    p = pod("a", policy="Never", inits=("i1",))
    s = status(p, ctr(p, "i1", CS.EXITED), ctr(p, "a", CS.EXITED))
    assert s["phase"] == "Succeeded"
    assert cond(s, "Initialized")["status"] == "True"
    assert cond(s, "Ready")["reason"] == "PodCompleted"


def test_sidecar_counts_for_readiness_and_initialization() -> None:
    p = pod("a", inits=({**SIDECAR, "readinessProbe": {"exec": {"command": ["true"]}}},))
    side, a = ctr(p, "side", CS.RUNNING), ctr(p, "a", CS.RUNNING)
    unready = status(p, side, a)
    assert unready["initContainerStatuses"][0]["started"]
    assert cond(unready, "Initialized")["status"] == "True"
    ready_cond = cond(unready, "ContainersReady")
    assert ready_cond["status"] == "False"
    assert ready_cond["message"] == "containers with unready status: [side]"
    ready = status(p, side, a, probes=StaticProbeResults({(ProbeKind.READINESS, side.id): True}))
    assert cond(ready, "Ready")["status"] == "True"


def test_sidecar_not_started_keeps_the_pod_pending() -> None:
    p = pod("a", inits=({**SIDECAR, "startupProbe": {"exec": {"command": ["true"]}}},))
    s = status(p, ctr(p, "side", CS.RUNNING))
    assert not s["initContainerStatuses"][0]["started"]
    assert s["phase"] == "Pending" and cond(s, "Initialized")["status"] == "False"


def test_readiness_probe_drives_ready() -> None:
    p = pod("a")
    p["spec"]["containers"][0]["readinessProbe"] = {"httpGet": {"port": 80}}
    a = ctr(p, "a", CS.RUNNING)
    assert not status(p, a)["containerStatuses"][0]["ready"]  # not probed yet
    failing = StaticProbeResults({(ProbeKind.READINESS, a.id): False})
    assert cond(status(p, a, probes=failing), "Ready")["status"] == "False"
    passing = StaticProbeResults({(ProbeKind.READINESS, a.id): True})
    s = status(p, a, probes=passing)
    assert s["containerStatuses"][0]["ready"] and cond(s, "Ready")["status"] == "True"


def test_startup_probe_drives_started_and_holds_readiness() -> None:
    p = pod("a")
    p["spec"]["containers"][0]["startupProbe"] = {"exec": {"command": ["true"]}}
    a = ctr(p, "a", CS.RUNNING)
    before = status(p, a)["containerStatuses"][0]
    assert not before["started"] and not before["ready"]
    after = status(p, a, probes=StaticProbeResults({(ProbeKind.STARTUP, a.id): True}))
    assert after["containerStatuses"][0]["started"] and after["containerStatuses"][0]["ready"]


def test_pod_without_init_containers_has_no_init_statuses() -> None:
    p = pod("a")
    s = status(p)
    assert "initContainerStatuses" not in s
    assert s["containerStatuses"][0]["state"]["waiting"]["reason"] == "ContainerCreating"
