"""Which apiserver pods the api source runs and how watch events change its set: mirror
pods, another node's pods and objects without identity are skipped, API pods are taken
as stored (no renaming, the apiserver's UID) minus managedFields, and a graceful
deletion keeps the pod with its deletion fields until the object is DELETED."""

from __future__ import annotations

from typing import Any

import pytest
from klet.model.pod import CONFIG_MIRROR
from klet.pod_source import apipods

NODE = "node1"


def api_pod(name: str = "web", *, uid: str | None = None, node: str = NODE, **meta: Any) -> Any:
    return {
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "uid": f"uid-{name}" if uid is None else uid,
            "resourceVersion": "7",
            "managedFields": [{"manager": "kubectl"}],
            **meta,
        },
        "spec": {"nodeName": node, "containers": [{"name": "app", "image": "nginx:1.25"}]},
        "status": {"phase": "Pending"},
    }


def test_list_keeps_our_pods_as_stored() -> None:
    pods, skipped = apipods.from_list([api_pod("a"), api_pod("b")], node_name=NODE)
    assert skipped == []
    assert set(pods) == {"uid-a", "uid-b"}
    a = pods["uid-a"]
    assert a["metadata"]["name"] == "a"  # no node suffix, unlike a static pod
    assert a["metadata"]["namespace"] == "team-a"
    assert a["metadata"]["resourceVersion"] == "7"
    assert "managedFields" not in a["metadata"]
    assert (a["apiVersion"], a["kind"]) == ("v1", "Pod")
    assert "restartPolicy" not in a["spec"]  # the apiserver defaulted it already (or not)


def test_input_is_not_modified() -> None:
    obj = api_pod()
    apipods.from_list([obj], node_name=NODE)
    assert "managedFields" in obj["metadata"] and "kind" not in obj


@pytest.mark.parametrize(
    ("obj", "reason"),
    [
        (api_pod(annotations={CONFIG_MIRROR: "abc"}), apipods.SKIP_MIRROR),
        (api_pod(node="node2"), "spec.nodeName is 'node2', not this node (node1)"),
        (api_pod(node=""), "spec.nodeName is '', not this node (node1)"),
        (api_pod(uid=""), "no metadata.uid"),
        ({"metadata": {"uid": "u", "name": "n", "namespace": "d"}}, "no spec"),
        ({"spec": {}}, "no metadata"),
        ("Pod", "not an object: str"),
    ],
)
def test_skipped(obj: Any, reason: str) -> None:
    assert apipods.skip_reason(obj, node_name=NODE) == reason
    pods, skipped = apipods.from_list([obj, api_pod("ok")], node_name=NODE)
    assert set(pods) == {"uid-ok"}
    assert [s.reason for s in skipped] == [reason]


def test_events_add_modify_delete() -> None:
    pods, _ = apipods.from_list([api_pod("a")], node_name=NODE)

    added, _ = apipods.apply_event(pods, "ADDED", api_pod("b"), node_name=NODE)
    assert added is not None and set(added) == {"uid-a", "uid-b"}

    changed = api_pod("a", labels={"v": "2"})
    modified, _ = apipods.apply_event(added, "MODIFIED", changed, node_name=NODE)
    assert modified is not None and modified["uid-a"]["metadata"]["labels"] == {"v": "2"}
    assert set(added) == {"uid-a", "uid-b"}  # the old set is left alone

    deleted, _ = apipods.apply_event(modified, "DELETED", api_pod("b"), node_name=NODE)
    assert deleted is not None and set(deleted) == {"uid-a"}


def test_events_that_change_nothing() -> None:
    pods, _ = apipods.from_list([api_pod("a")], node_name=NODE)
    assert apipods.apply_event(pods, "MODIFIED", api_pod("a"), node_name=NODE) == (None, None)
    assert apipods.apply_event(pods, "DELETED", api_pod("x"), node_name=NODE) == (None, None)
    assert apipods.apply_event(pods, "BOOKMARK", {"metadata": {}}, node_name=NODE) == (None, None)


def test_mirror_pod_event_is_skipped() -> None:
    mirror = api_pod("static-node1", annotations={CONFIG_MIRROR: "abc"})
    pods, skipped = apipods.apply_event({}, "ADDED", mirror, node_name=NODE)
    assert pods is None
    assert skipped is not None and skipped.reason == apipods.SKIP_MIRROR
    assert skipped.full_name == "team-a/static-node1"


def test_a_pod_that_stops_qualifying_leaves_the_set() -> None:
    pods, _ = apipods.from_list([api_pod("a")], node_name=NODE)
    moved, skipped = apipods.apply_event(pods, "MODIFIED", api_pod("a", node="n2"), node_name=NODE)
    assert moved == {} and skipped is not None


def test_graceful_deletion_stays_with_its_fields() -> None:
    pods, _ = apipods.from_list([api_pod("a")], node_name=NODE)
    deleting = api_pod("a", deletionTimestamp="2024-01-01T00:00:00Z", deletionGracePeriodSeconds=30)
    after, _ = apipods.apply_event(pods, "MODIFIED", deleting, node_name=NODE)
    assert after is not None
    meta = after["uid-a"]["metadata"]
    assert meta["deletionTimestamp"] == "2024-01-01T00:00:00Z"
    assert meta["deletionGracePeriodSeconds"] == 30
    gone, _ = apipods.apply_event(after, "DELETED", deleting, node_name=NODE)
    assert gone == {}


def test_resource_version() -> None:
    assert apipods.resource_version({"metadata": {"resourceVersion": "12"}}) == "12"
    assert apipods.resource_version({"metadata": {}}) is None
    assert apipods.resource_version(None) is None
