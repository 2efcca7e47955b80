"""The PodConfig merge: ADD/UPDATE/DELETE/RECONCILE/REMOVE from successive snapshots,
what counts as a semantic change, duplicate names dropped (and reported once), sources
kept apart, first-seen time kept, readiness, and seeding from a previous run."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from klet.model.pod import CONFIG_SEEN, CONFIG_SOURCE
from klet.model.records import ChangeOp
from klet.model.timestamps import rfc3339_nano
from klet.model.types import PodUID
from klet.pod_source.podconfig import (
    Changes,
    MergedPod,
    PodConfigState,
    classify,
    merge_snapshot,
    seed,
)

T0, T1, T2 = 1_700_000_000.0, 1_700_000_060.0, 1_700_000_120.5


def pod(
    name: str = "web", uid: str | None = None, ns: str = "default", **extra: Any
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "metadata": {"name": name, "namespace": ns, "uid": uid or f"uid-{name}"},
        "spec": {"containers": [{"name": "app", "image": "nginx:1.25"}]},
        "status": {"phase": "Pending"},
    }
    for key, value in extra.items():
        section, _, field = key.partition("__")
        doc[section][field] = value
    return doc


def names(pods: tuple[MergedPod, ...]) -> list[str]:
    return [p.pod["metadata"]["name"] for p in pods]


def ops(changes: Changes) -> list[tuple[ChangeOp, str]]:
    return [(op, p.pod["metadata"]["name"]) for op, p in changes.ops()]


def test_first_snapshot_adds_and_marks_ready() -> None:
    state, changes = merge_snapshot(PodConfigState(), "file", [pod("a"), pod("b")], T0)
    assert changes.first
    assert ops(changes) == [("ADD", "a"), ("ADD", "b")]
    assert state.ready == {"file"}
    assert state.all_ready(["file"]) and not state.all_ready(["file", "http"])


def test_empty_first_snapshot_still_marks_ready() -> None:
    state, changes = merge_snapshot(PodConfigState(), "file", [], T0)
    assert changes.first and not changes.empty
    assert changes.ops() == []
    assert state.ready == {"file"}


def test_unchanged_snapshot_is_empty() -> None:
    state, _ = merge_snapshot(PodConfigState(), "file", [pod("a")], T0)
    _, changes = merge_snapshot(state, "file", [pod("a")], T1)
    assert changes.empty and not changes.first


def test_local_annotations_are_set() -> None:
    state, changes = merge_snapshot(PodConfigState(), "http", [pod("a")], T0)
    annotations = changes.adds[0].pod["metadata"]["annotations"]
    assert annotations[CONFIG_SOURCE] == "http"
    assert annotations[CONFIG_SEEN] == rfc3339_nano(T0) == "2023-11-14T22:13:20Z"
    assert changes.adds[0].seen_at == T0


@pytest.mark.parametrize(
    ("change", "op"),
    [
        ({"spec__restartPolicy": "Never"}, "UPDATE"),
        ({"metadata__labels": {"tier": "web"}}, "UPDATE"),
        ({"metadata__annotations": {"team": "a"}}, "UPDATE"),
        ({"metadata__deletionGracePeriodSeconds": 0}, "UPDATE"),
        ({"metadata__deletionTimestamp": "2024-01-01T00:00:00Z"}, "DELETE"),
        ({"status__phase": "Running"}, "RECONCILE"),
        ({"metadata__annotations": {CONFIG_SEEN: "x", CONFIG_SOURCE: "api"}}, None),
        ({"metadata__labels": {}}, None),  # no labels and empty labels are the same
        ({"metadata__resourceVersion": "42"}, None),
    ],
)
def test_classify(change: dict[str, Any], op: ChangeOp | None) -> None:
    assert classify(pod("a"), pod("a", **change)) == op


def test_update_keeps_first_seen_time() -> None:
    state, _ = merge_snapshot(PodConfigState(), "api", [pod("a")], T0)
    state, changes = merge_snapshot(state, "api", [pod("a", spec__restartPolicy="Never")], T1)
    assert ops(changes) == [("UPDATE", "a")]
    (updated,) = changes.updates
    assert updated.seen_at == T0
    assert updated.pod["metadata"]["annotations"][CONFIG_SEEN] == rfc3339_nano(T0)
    assert updated.pod["spec"]["restartPolicy"] == "Never"
    assert state.source_pods("api")[updated.uid] == updated


def test_reconcile_stores_the_new_status() -> None:
    state, _ = merge_snapshot(PodConfigState(), "api", [pod("a")], T0)
    state, changes = merge_snapshot(state, "api", [pod("a", status__phase="Running")], T1)
    assert ops(changes) == [("RECONCILE", "a")]
    assert state.source_pods("api")[changes.reconciles[0].uid].pod["status"]["phase"] == "Running"


def test_emit_order_and_remove() -> None:
    state, _ = merge_snapshot(
        PodConfigState(), "api", [pod("upd"), pod("del"), pod("rec"), pod("gone")], T0
    )
    state, changes = merge_snapshot(
        state,
        "api",
        [
            pod("rec", status__phase="Running"),
            pod("del", metadata__deletionTimestamp="2024-01-01T00:00:00Z"),
            pod("upd", metadata__labels={"v": "2"}),
            pod("new"),
        ],
        T1,
    )
    assert ops(changes) == [
        ("REMOVE", "gone"),
        ("ADD", "new"),
        ("UPDATE", "upd"),
        ("DELETE", "del"),
        ("RECONCILE", "rec"),
    ]
    assert set(state.source_pods("api")) == {"uid-upd", "uid-del", "uid-rec", "uid-new"}


def test_static_pod_edit_is_remove_plus_add() -> None:
    # A static pod's UID hashes its content, so an edit arrives under a new UID.
    state, _ = merge_snapshot(PodConfigState(), "file", [pod("web", uid="v1")], T0)
    _, changes = merge_snapshot(state, "file", [pod("web", uid="v2")], T1)
    assert [(op, p.uid) for op, p in changes.ops()] == [("REMOVE", "v1"), ("ADD", "v2")]
    assert changes.adds[0].seen_at == T1


def test_duplicate_name_keeps_the_first_and_is_reported_once() -> None:
    first, dup = pod("web", uid="u1"), pod("web", uid="u2")
    state, changes = merge_snapshot(PodConfigState(), "file", [first, dup], T0)
    assert [p.uid for p in changes.adds] == ["u1"]
    assert [(d.uid, d.full_name) for d in changes.dropped] == [("u2", "default/web")]
    assert "duplicate" in changes.dropped[0].reason
    state, changes = merge_snapshot(state, "file", [first, dup], T1)
    assert changes.empty and changes.dropped == ()
    # Fixed, then broken again: reported again.
    state, _ = merge_snapshot(state, "file", [first], T1)
    _, changes = merge_snapshot(state, "file", [first, dup], T2)
    assert [d.uid for d in changes.dropped] == ["u2"]


def test_same_name_in_other_namespace_is_not_a_duplicate() -> None:
    _, changes = merge_snapshot(
        PodConfigState(), "api", [pod("web", uid="u1"), pod("web", uid="u2", ns="other")], T0
    )
    assert [p.uid for p in changes.adds] == ["u1", "u2"] and changes.dropped == ()


def test_sources_are_isolated() -> None:
    state, _ = merge_snapshot(PodConfigState(), "file", [pod("f")], T0)
    state, changes = merge_snapshot(state, "http", [pod("h")], T1)
    assert ops(changes) == [("ADD", "h")]
    state, changes = merge_snapshot(state, "http", [], T2)
    assert ops(changes) == [("REMOVE", "h")]
    assert set(state.source_pods("file")) == {"uid-f"}
    assert set(state.ready_pods()) == {"uid-f"}


def test_same_name_in_two_sources_is_allowed_but_not_the_same_uid() -> None:
    state, _ = merge_snapshot(PodConfigState(), "file", [pod("web", uid="u1")], T0)
    state, changes = merge_snapshot(
        state, "http", [pod("web", uid="u2"), pod("other", uid="u1")], T1
    )
    assert [p.uid for p in changes.adds] == ["u2"]
    assert [d.uid for d in changes.dropped] == ["u1"]
    assert state.source_pods("file")[PodUID("u1")].pod["metadata"]["name"] == "web"


def test_input_pods_are_not_modified() -> None:
    snapshot = [pod("a")]
    before = copy.deepcopy(snapshot)
    merge_snapshot(PodConfigState(), "file", snapshot, T0)
    assert snapshot == before


def test_seed_diffs_the_first_snapshot_against_the_previous_run() -> None:
    previous, _ = merge_snapshot(PodConfigState(), "file", [pod("keep"), pod("gone")], T0)
    seeded = seed(PodConfigState(), previous.ready_pods().values())
    assert seeded.ready == frozenset()
    state, changes = merge_snapshot(seeded, "file", [pod("keep"), pod("new")], T1)
    assert changes.first
    assert ops(changes) == [("REMOVE", "gone"), ("ADD", "new")]
    assert state.source_pods("file")[PodUID("uid-keep")].seen_at == T0


def test_seed_does_not_touch_a_ready_source() -> None:
    state, _ = merge_snapshot(PodConfigState(), "file", [pod("a")], T0)
    stale = MergedPod(uid=PodUID("uid-x"), source="file", pod=pod("x"), seen_at=T0)
    assert seed(state, [stale]).source_pods("file").keys() == {"uid-a"}
