"""The pure rules of the pod view: status ordering by (epoch, version), the reload merge,
the union listing rule, and the exact PodList shape the read-only API returns."""

from __future__ import annotations

import pytest
from klet.model.records import PodStatusRecord
from klet.model.types import PodUID
from klet.status_reporter.pods import listing
from klet.testbed.fakes.status_reporter import make_pod, status_record

POD = make_pod("web")
UID = PodUID("uid-web")


def rec(version: int, epoch: float = 1.0, phase: str = "Running") -> PodStatusRecord:
    return status_record(POD, version=version, epoch=epoch, phase=phase)


@pytest.mark.parametrize(
    ("incoming", "current", "wins"),
    [
        (rec(1), None, True),  # first status of a pod
        (rec(2), rec(1), True),  # newer version, same epoch
        (rec(1), rec(2), False),  # older version, same epoch: a stale write
        (rec(2), rec(2), False),  # re-delivery: nothing to replace
        (rec(1, epoch=2.0), rec(9, epoch=1.0), True),  # new writer restarted its count
        (rec(9, epoch=1.0), rec(1, epoch=2.0), False),  # late write of an old writer
    ],
)
def test_supersedes_orders_by_epoch_then_version(
    incoming: PodStatusRecord, current: PodStatusRecord | None, wins: bool
) -> None:
    assert listing.supersedes(incoming, current) is wins


def test_merge_statuses_keeps_newer_drops_missing_and_respects_keep() -> None:
    a, b, c = PodUID("a"), PodUID("b"), PodUID("c")
    current = {a: rec(5), b: rec(1), c: rec(3)}
    snapshot = {a: rec(4), b: rec(2)}  # a is older than what we hold, c was removed
    merged = listing.merge_statuses(current, snapshot)
    assert merged == {a: rec(5), b: rec(2)}

    # c was refreshed from the stream after the snapshot was read: its entry stays;
    # b was refreshed and found gone: the snapshot's copy must not bring it back.
    assert listing.merge_statuses({a: rec(5), c: rec(3)}, snapshot, keep=frozenset({b, c})) == {
        a: rec(5),
        c: rec(3),
    }


@pytest.mark.parametrize(
    ("in_desired", "phase", "listed"),
    [
        (True, None, True),  # desired, syncloop has not reported yet
        (True, "Running", True),
        (True, "Succeeded", True),  # still desired: listed whatever its phase
        (False, "Running", True),  # removed but still running: listed until terminal
        (False, "Pending", True),
        (False, "", True),  # no phase: cannot tell, keep listing
        (False, "Succeeded", False),
        (False, "Failed", False),
        (False, None, False),  # neither desired nor reported: not ours
    ],
)
def test_union_rule(in_desired: bool, phase: str | None, listed: bool) -> None:
    desired = {UID: POD} if in_desired else {}
    statuses = {} if phase is None else {UID: rec(1, phase=phase)}
    assert (UID in listing.listed_uids(desired, statuses)) is listed


def test_pod_list_shape_and_status_replacement() -> None:
    web = make_pod("web")
    web_with_stale_status = {**web, "status": {"phase": "Unknown"}}
    api = make_pod("api", namespace="prod")
    db = make_pod("db")
    running = {"phase": "Running", "podIP": "10.0.0.5"}
    statuses = {
        PodUID("uid-web"): status_record(web, version=3, status=running),
        PodUID("uid-db"): status_record(db, version=1, phase="Running"),
    }
    out = listing.pod_list(
        desired={PodUID("uid-web"): web_with_stale_status, PodUID("uid-api"): api},
        departed={PodUID("uid-db"): db},
        statuses=statuses,
    )
    assert set(out) == {"kind", "apiVersion", "metadata", "items"}
    assert (out["kind"], out["apiVersion"], out["metadata"]) == ("PodList", "v1", {})
    names = [(i["metadata"]["namespace"], i["metadata"]["name"]) for i in out["items"]]
    assert names == [("default", "db"), ("default", "web"), ("prod", "api")]
    by_name = {i["metadata"]["name"]: i for i in out["items"]}
    assert by_name["web"]["status"] == running
    assert by_name["web"]["spec"] == web["spec"]
    assert by_name["api"]["status"] == {"phase": "Pending"}
    assert by_name["db"]["spec"] == db["spec"]  # departed spec is still shown
    assert "status" not in web_with_stale_status["status"]  # inputs are not mutated
    assert web_with_stale_status["status"] == {"phase": "Unknown"}


def test_pod_list_builds_a_skeleton_for_a_status_without_spec() -> None:
    record = status_record(make_pod("gone", namespace="kube-system"), version=2)
    out = listing.pod_list(desired={}, departed={}, statuses={record.uid: record})
    assert out["items"] == [
        {
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": {"name": "gone", "namespace": "kube-system", "uid": "uid-gone"},
            "spec": {},
            "status": {"phase": "Running"},
        }
    ]
