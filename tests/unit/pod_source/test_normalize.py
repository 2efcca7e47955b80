"""Static-pod defaulting: the `<name>-<node>` name, the content-hash UID (stable for the
same content in any syntax, new for a change of content, path or node), the
`kubernetes.io/config.*` annotations, the file-source toleration and the API defaults."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from klet.model.pod import CONFIG_HASH, CONFIG_SOURCE
from klet.pod_source.normalize import (
    default_pull_policy,
    normalize_static_pod,
    static_pod_uid,
)

PATH = "/etc/kubernetes/manifests/web.yaml"
URL = "http://127.0.0.1:8000/pods"


def manifest(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web"},
        "spec": {"containers": [{"name": "app", "image": "nginx:1.25"}], **spec},
    }


def file_pod(doc: dict[str, Any], *, node: str = "node1", path: str = PATH) -> dict[str, Any]:
    return normalize_static_pod(doc, node_name=node, source="file", origin=path)


def test_name_gets_lowercased_node_suffix_and_default_namespace() -> None:
    pod = file_pod(manifest(), node="Node-A")
    assert pod["metadata"]["name"] == "web-node-a"
    assert pod["metadata"]["namespace"] == "default"
    assert pod["spec"]["nodeName"] == "Node-A"


def test_given_namespace_is_kept() -> None:
    doc = manifest()
    doc["metadata"]["namespace"] = "kube-system"
    assert file_pod(doc)["metadata"]["namespace"] == "kube-system"


def test_uid_is_stable_for_the_same_content() -> None:
    a, b = file_pod(manifest()), file_pod(copy.deepcopy(manifest()))
    assert a["metadata"]["uid"] == b["metadata"]["uid"]
    assert len(a["metadata"]["uid"]) == 32


def test_uid_ignores_key_order() -> None:
    doc = manifest()
    reordered = json.loads(json.dumps(doc, sort_keys=True))
    reordered = dict(reversed(list(reordered.items())))
    assert file_pod(doc)["metadata"]["uid"] == file_pod(reordered)["metadata"]["uid"]


@pytest.mark.parametrize(
    "other",
    [
        {"doc": manifest(restartPolicy="Never")},
        {"doc": manifest(), "path": "/etc/kubernetes/manifests/web2.yaml"},
        {"doc": manifest(), "node": "node2"},
    ],
    ids=["content", "path", "node"],
)
def test_uid_changes_with_content_path_or_node(other: dict[str, Any]) -> None:
    base = file_pod(manifest())["metadata"]["uid"]
    changed = file_pod(other["doc"], node=other.get("node", "node1"), path=other.get("path", PATH))[
        "metadata"
    ]["uid"]
    assert changed != base


def test_url_uid_does_not_depend_on_the_node() -> None:
    a = static_pod_uid(manifest(), node_name="node1", source="http", origin=URL)
    b = static_pod_uid(manifest(), node_name="node2", source="http", origin=URL)
    assert a == b
    assert a != static_pod_uid(manifest(), node_name="node1", source="file", origin=URL)


def test_explicit_uid_is_kept() -> None:
    doc = manifest()
    doc["metadata"]["uid"] = "my-uid"
    pod = file_pod(doc)
    assert pod["metadata"]["uid"] == "my-uid"
    assert pod["metadata"]["annotations"][CONFIG_HASH] == "my-uid"


@pytest.mark.parametrize(("source", "origin"), [("file", PATH), ("http", URL)])
def test_config_annotations(source: Any, origin: str) -> None:
    doc = manifest()
    doc["metadata"]["annotations"] = {"team": "web"}
    pod = normalize_static_pod(doc, node_name="node1", source=source, origin=origin)
    assert pod["metadata"]["annotations"] == {
        "team": "web",
        CONFIG_HASH: pod["metadata"]["uid"],
        CONFIG_SOURCE: source,
    }


def test_file_pods_tolerate_noexecute_once() -> None:
    pod = file_pod(manifest(tolerations=[{"key": "a", "operator": "Exists"}]))
    assert pod["spec"]["tolerations"] == [
        {"key": "a", "operator": "Exists"},
        {"operator": "Exists", "effect": "NoExecute"},
    ]
    again = file_pod(manifest(tolerations=[{"operator": "Exists", "effect": "NoExecute"}]))
    assert again["spec"]["tolerations"] == [{"operator": "Exists", "effect": "NoExecute"}]


def test_http_pods_get_no_toleration() -> None:
    pod = normalize_static_pod(manifest(), node_name="node1", source="http", origin=URL)
    assert "tolerations" not in pod["spec"]


def test_status_phase_pending() -> None:
    doc = manifest()
    doc["status"] = {"phase": "Running", "podIP": "10.0.0.1"}
    assert file_pod(doc)["status"] == {"phase": "Pending", "podIP": "10.0.0.1"}
    assert file_pod(manifest())["status"] == {"phase": "Pending"}


def test_api_defaults() -> None:
    doc = manifest()
    doc["spec"]["initContainers"] = [{"name": "init", "image": "busybox"}]
    doc["spec"]["containers"][0]["ports"] = [
        {"containerPort": 80},
        {"containerPort": 53, "protocol": "UDP"},
    ]
    spec = file_pod(doc)["spec"]
    assert spec["restartPolicy"] == "Always"
    assert spec["terminationGracePeriodSeconds"] == 30
    assert spec["dnsPolicy"] == "ClusterFirst"
    assert spec["enableServiceLinks"] is True
    for container in spec["initContainers"] + spec["containers"]:
        assert container["terminationMessagePath"] == "/dev/termination-log"
        assert container["terminationMessagePolicy"] == "File"
    assert spec["initContainers"][0]["imagePullPolicy"] == "Always"
    assert spec["containers"][0]["imagePullPolicy"] == "IfNotPresent"
    assert [p["protocol"] for p in spec["containers"][0]["ports"]] == ["TCP", "UDP"]


def test_explicit_values_win_over_defaults() -> None:
    doc = manifest(restartPolicy="Never", terminationGracePeriodSeconds=5, dnsPolicy="Default")
    doc["spec"]["containers"][0]["imagePullPolicy"] = "Never"
    spec = file_pod(doc)["spec"]
    assert (spec["restartPolicy"], spec["terminationGracePeriodSeconds"], spec["dnsPolicy"]) == (
        "Never",
        5,
        "Default",
    )
    assert spec["containers"][0]["imagePullPolicy"] == "Never"


def test_input_is_not_modified() -> None:
    doc = manifest()
    before = copy.deepcopy(doc)
    file_pod(doc)
    assert doc == before


@pytest.mark.parametrize(
    ("image", "policy"),
    [
        ("nginx", "Always"),
        ("nginx:latest", "Always"),
        ("nginx:1.25", "IfNotPresent"),
        ("registry:5000/nginx", "Always"),
        ("registry:5000/nginx:1.25", "IfNotPresent"),
        ("registry:5000/team/nginx:latest", "Always"),
        ("nginx@sha256:" + "a" * 64, "IfNotPresent"),
        ("nginx:latest@sha256:" + "a" * 64, "IfNotPresent"),
    ],
)
def test_default_pull_policy(image: str, policy: str) -> None:
    assert default_pull_policy(image) == policy
