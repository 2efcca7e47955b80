"""Pod status rules: upstream's container state transition check (restart policy,
OnFailure exit codes, sidecar init containers), the send decision (stale and repeated
versions, a new target object), the merge that keeps conditions the kubelet does not
own, the UID-preconditioned patch (observedGeneration kept, and a status that differs
only in it is not on the server yet), when a finished pod is deleted, and the order of a
pass (readiness changes since the last sent status first)."""

from __future__ import annotations

from typing import Any

import pytest
from klet.model.pod import config_source, is_mirror, is_static
from klet.model.types import JSON
from klet.status_reporter.cluster.podstatus import (
    Sent,
    decide,
    full_name,
    illegal_transition,
    merge_status,
    on_server,
    readiness_changed,
    send_order,
    should_delete,
    status_patch,
)
from klet.testbed.fakes.status_reporter import (
    make_api_pod,
    make_static_pod,
    pod_uid,
    status_record,
)


def running(name: str) -> JSON:
    return {"name": name, "state": {"running": {"startedAt": "t"}}}


def terminated(name: str, code: int) -> JSON:
    return {"name": name, "state": {"terminated": {"exitCode": code}}}


def waiting(name: str) -> JSON:
    return {"name": name, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}


def status(*containers: JSON, init: tuple[JSON, ...] = ()) -> JSON:
    out: JSON = {"phase": "Running", "containerStatuses": list(containers)}
    if init:
        out["initContainerStatuses"] = list(init)
    return out


SIDECAR_SPEC: JSON = {
    "restartPolicy": "Never",
    "initContainers": [{"name": "side", "restartPolicy": "Always"}, {"name": "setup"}],
}


@pytest.mark.parametrize(
    ("policy", "old", "new", "illegal"),
    [
        ("Always", status(terminated("a", 0)), status(running("a")), False),
        ("Never", status(terminated("a", 0)), status(running("a")), True),
        ("Never", status(terminated("a", 1)), status(waiting("a")), True),
        ("Never", status(running("a")), status(terminated("a", 0)), False),
        ("Never", status(terminated("a", 0)), status(terminated("a", 0)), False),
        ("OnFailure", status(terminated("a", 1)), status(running("a")), False),
        ("OnFailure", status(terminated("a", 0)), status(running("a")), True),
        ("Never", status(terminated("a", 0)), status(running("b")), False),
        ("Never", None, status(running("a")), False),
        (None, status(terminated("a", 0)), status(running("a")), False),  # default Always
    ],
)
def test_container_transitions(
    policy: str | None, old: JSON | None, new: JSON, illegal: bool
) -> None:
    spec: dict[str, Any] = {"restartPolicy": policy} if policy else {}
    reason = illegal_transition(old, new, spec)
    assert (reason is not None) is illegal
    if illegal:
        assert reason is not None and "attempted illegal transition" in reason


def test_init_containers_and_sidecars() -> None:
    old = status(init=(terminated("side", 0), terminated("setup", 0)))
    sidecar_restarts = status(init=(running("side"), terminated("setup", 0)))
    assert illegal_transition(old, sidecar_restarts, SIDECAR_SPEC) is None
    setup_restarts = status(init=(terminated("side", 0), running("setup")))
    assert illegal_transition(old, setup_restarts, SIDECAR_SPEC) is not None


POD = make_api_pod("web")


def sent(version: int, st: JSON, *, epoch: float = 1.0, target: str = "uid-web") -> Sent:
    return Sent(epoch, version, st, target)


@pytest.mark.parametrize(
    ("record_version", "record_epoch", "record_status", "last", "target", "verdict"),
    [
        (1, 1.0, {"phase": "Running"}, None, "uid-web", "send"),
        (2, 1.0, {"phase": "Succeeded"}, sent(1, {"phase": "Running"}), "uid-web", "send"),
        (1, 1.0, {"phase": "Running"}, sent(1, {"phase": "Running"}), "uid-web", "skip"),
        (1, 1.0, {"phase": "Failed"}, sent(2, {"phase": "Running"}), "uid-web", "skip"),
        (3, 1.0, {"phase": "Running"}, sent(2, {"phase": "Running"}), "uid-web", "same"),
        # A later epoch (a new syncloop leader) wins even with a lower version.
        (1, 2.0, {"phase": "Failed"}, sent(5, {"phase": "Running"}), "uid-web", "send"),
        # A new target object (mirror recreated) gets the status again.
        (1, 1.0, {"phase": "Running"}, sent(1, {"phase": "Running"}), "uid-new", "send"),
        (
            2,
            1.0,
            status(running("app")),
            sent(1, status(terminated("app", 0))),
            "uid-web",
            "illegal",
        ),
    ],
)
def test_decide(
    record_version: int,
    record_epoch: float,
    record_status: JSON,
    last: Sent | None,
    target: str,
    verdict: str,
) -> None:
    record = status_record(POD, version=record_version, epoch=record_epoch, status=record_status)
    spec = {"restartPolicy": "Never"}
    assert decide(record, last, spec, target_uid=target).verdict == verdict


def test_merge_keeps_conditions_the_kubelet_does_not_own() -> None:
    api = {
        "phase": "Pending",
        "conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "example.com/gate", "status": "True"},
            {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"},
            {"type": "Ready", "status": "True"},
        ],
        "hostIP": "10.0.0.1",
    }
    new = {
        "phase": "Running",
        "conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Ready", "status": "False"},
        ],
    }
    merged = merge_status(api, new)
    types = [c["type"] for c in merged["conditions"]]
    assert types == ["example.com/gate", "DisruptionTarget", "PodScheduled", "Ready"]
    assert merged["conditions"][-1]["status"] == "False"
    assert merged["phase"] == "Running"
    assert "hostIP" not in merged  # the new status is complete; the patch merges fields

    shared = merge_status(api, {"conditions": [{"type": "DisruptionTarget", "status": "False"}]})
    assert [c["status"] for c in shared["conditions"] if c["type"] == "DisruptionTarget"] == [
        "False"
    ]
    assert merge_status({}, {"phase": "Running"}) == {"phase": "Running"}


def test_status_patch_carries_uid() -> None:
    assert status_patch("u1", {"phase": "Running"}) == {
        "metadata": {"uid": "u1"},
        "status": {"phase": "Running"},
    }


def test_observed_generation_reaches_the_patch() -> None:
    """A generation bump changes only observedGeneration: the status is not on the
    server yet, and the patch carries the status's and each condition's."""
    api = {
        "phase": "Running",
        "observedGeneration": 1,
        "conditions": [{"type": "Ready", "status": "True", "observedGeneration": 1}],
    }
    new = {
        "phase": "Running",
        "observedGeneration": 2,
        "conditions": [{"type": "Ready", "status": "True", "observedGeneration": 2}],
    }
    assert not on_server(api, new)
    assert on_server(api, {**api})
    patch = status_patch("u1", merge_status(api, new))
    assert patch["status"]["observedGeneration"] == 2
    assert patch["status"]["conditions"] == [
        {"type": "Ready", "status": "True", "observedGeneration": 2}
    ]


def deleting(pod: JSON) -> JSON:
    out = {**pod, "metadata": {**pod["metadata"], "deletionTimestamp": "2025-01-01T00:00:00Z"}}
    return out


@pytest.mark.parametrize(
    ("terminated_", "api_pod", "last_version", "want"),
    [
        (True, deleting(POD), 2, True),
        (False, deleting(POD), 2, False),  # containers still running
        (True, POD, 2, False),  # not being deleted
        (True, deleting(POD), 1, False),  # final status not sent yet
        (True, deleting(POD), None, False),
        (True, None, 2, False),
        (True, deleting(make_api_pod("web") | {"metadata": {"uid": "other"}}), 2, False),
    ],
)
def test_should_delete(
    terminated_: bool, api_pod: JSON | None, last_version: int | None, want: bool
) -> None:
    record = status_record(POD, version=2, phase="Succeeded", terminated=terminated_)
    last = sent(last_version, record.status) if last_version is not None else None
    assert should_delete(record, last, api_pod) is want


def test_pod_kinds() -> None:
    static = make_static_pod("etcd")
    assert is_static(static) and config_source(static) == "file"
    assert not is_static(POD) and config_source(POD) == "api"
    assert config_source({"metadata": {}}) == "api"
    mirror = {"metadata": {"annotations": {"kubernetes.io/config.mirror": "h"}}}
    assert is_mirror(mirror) and not is_mirror(POD)
    assert full_name(static) == ("default", "etcd-node1")


def _ready(ready: bool, *, ip: str = "10.1.0.2") -> JSON:
    flag = "True" if ready else "False"
    return {
        "phase": "Running",
        "podIP": ip,
        "conditions": [
            {"type": "Ready", "status": flag},
            {"type": "Initialized", "status": "True"},
        ],
        "containerStatuses": [{"name": "main", "ready": ready, "state": {"running": {}}}],
    }


def test_readiness_changed_reads_the_conditions_and_the_containers() -> None:
    assert readiness_changed(_ready(False), _ready(True))
    assert not readiness_changed(_ready(True, ip="10.1.0.3"), _ready(True))
    assert not readiness_changed(_ready(True), None)  # nothing sent: no baseline
    container_only = _ready(True)
    container_only["containerStatuses"][0]["ready"] = False
    assert readiness_changed(container_only, _ready(True))


def test_send_order_puts_newer_readiness_changes_first() -> None:
    pods = {n: make_api_pod(n) for n in ("a", "b", "c", "d")}
    uid = {n: pod_uid(p) for n, p in pods.items()}
    sent = {uid[n]: Sent(1.0, 1, _ready(True), uid[n]) for n in ("a", "b", "c", "d")}
    records = {
        uid["a"]: status_record(pods["a"], version=2, status=_ready(True, ip="10.1.0.9")),
        uid["b"]: status_record(pods["b"], version=2, status=_ready(False)),
        uid["c"]: status_record(pods["c"], version=1, status=_ready(False)),  # already sent
        uid["d"]: status_record(pods["d"], version=2, status=_ready(False)),
    }
    assert send_order(records, sent) == [uid["b"], uid["d"], uid["a"], uid["c"]]
