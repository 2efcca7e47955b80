"""Mirror pods: the object created for a static pod (annotation, Node owner reference,
no identity of its own, bound to the node), and the reconciliation table: create when
missing, replace when out of date or being deleted, delete orphans only once the
sources are ready, create nothing before the Node's UID is known."""

from __future__ import annotations

from klet.model.types import JSON
from klet.status_reporter.cluster.mirrors import mirror_actions, mirror_pod
from klet.testbed.fakes.status_reporter import make_static_pod

STATIC = make_static_pod("etcd", uid="hash-1")
FULL = ("default", "etcd-node1")


def mirror(hash_: str = "hash-1", *, uid: str = "m-1", deleting: bool = False) -> JSON:
    meta: JSON = {
        "name": "etcd-node1",
        "namespace": "default",
        "uid": uid,
        "annotations": {"kubernetes.io/config.mirror": hash_},
    }
    if deleting:
        meta["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    return {"metadata": meta, "spec": {"nodeName": "node1"}}


def test_mirror_pod() -> None:
    pod = mirror_pod({**STATIC, "status": {"phase": "Pending"}}, node_name="node1", node_uid="n-1")
    meta = pod["metadata"]
    assert "uid" not in meta and "resourceVersion" not in meta and "status" not in pod
    assert meta["annotations"]["kubernetes.io/config.mirror"] == "hash-1"
    assert meta["annotations"]["kubernetes.io/config.source"] == "file"  # copied, as upstream
    assert meta["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "node1", "uid": "n-1", "controller": True}
    ]
    assert pod["spec"]["nodeName"] == "node1"
    assert (pod["apiVersion"], pod["kind"]) == ("v1", "Pod")
    assert STATIC["metadata"]["uid"] == "hash-1"  # the input is not modified


def kinds(actions: list) -> list[tuple[str, str]]:  # type: ignore[type-arg]
    return [(a.kind, a.uid) for a in actions]


def test_create_when_missing() -> None:
    actions = mirror_actions(
        {FULL: STATIC}, {}, node_name="node1", node_uid="n-1", sources_ready=False
    )
    assert kinds(actions) == [("create", "")]
    assert actions[0].pod is not None


def test_nothing_when_up_to_date() -> None:
    assert (
        mirror_actions(
            {FULL: STATIC}, {FULL: mirror()}, node_name="node1", node_uid="n-1", sources_ready=True
        )
        == []
    )


def test_replace_when_out_of_date_or_being_deleted() -> None:
    for stale in (mirror("hash-0"), mirror(deleting=True)):
        actions = mirror_actions(
            {FULL: STATIC}, {FULL: stale}, node_name="node1", node_uid="n-1", sources_ready=False
        )
        assert kinds(actions) == [("delete", "m-1"), ("create", "")]


def test_no_create_without_node_uid() -> None:
    assert (
        mirror_actions({FULL: STATIC}, {}, node_name="node1", node_uid=None, sources_ready=True)
        == []
    )
    actions = mirror_actions(
        {FULL: STATIC}, {FULL: mirror("old")}, node_name="node1", node_uid=None, sources_ready=True
    )
    assert kinds(actions) == [("delete", "m-1")]


def test_orphans_deleted_only_when_sources_ready() -> None:
    orphan = {FULL: mirror()}
    assert mirror_actions({}, orphan, node_name="node1", node_uid="n-1", sources_ready=False) == []
    actions = mirror_actions({}, orphan, node_name="node1", node_uid="n-1", sources_ready=True)
    assert kinds(actions) == [("delete", "m-1")]
    assert actions[0].reason == "static pod is gone"
