"""Decoding manifest bytes into pods: YAML or JSON to the same pod and UID, the size
limit enforced before parsing, parse and validation errors carrying their metric reason,
and URL bodies (a Pod, a PodList, an empty body, a list with one bad item)."""

from __future__ import annotations

import json

import pytest
from klet.pod_source.manifests import (
    ManifestError,
    decode_document,
    pod_from_file,
    pods_from_url_body,
)
from klet.pod_source.validation import MAX_MANIFEST_BYTES

YAML = b"""\
apiVersion: v1
kind: Pod
metadata:
  name: web
  creationTimestamp: 2024-01-01T00:00:00Z
spec:
  containers:
  - name: app
    image: nginx:1.25
"""

DOC = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "web", "creationTimestamp": "2024-01-01T00:00:00Z"},
    "spec": {"containers": [{"name": "app", "image": "nginx:1.25"}]},
}

URL = "http://127.0.0.1/pods"


def test_yaml_and_json_give_the_same_pod() -> None:
    a = pod_from_file(YAML, path="/m/web", node_name="n1")
    b = pod_from_file(json.dumps(DOC, indent=2).encode(), path="/m/web", node_name="n1")
    assert a == b
    assert a["metadata"]["creationTimestamp"] == "2024-01-01T00:00:00Z"  # not a datetime


def test_too_large_is_refused_before_parsing() -> None:
    data = b"{" * (MAX_MANIFEST_BYTES + 1)  # would be a parse error if it were parsed
    with pytest.raises(ManifestError) as err:
        decode_document(data)
    assert err.value.reason == "too_large"


@pytest.mark.parametrize(
    ("data", "reason", "text"),
    [
        (b"apiVersion: v1\nkind: [Pod\n", "parse", "invalid YAML"),
        (b'{"apiVersion": "v1",', "parse", "invalid JSON"),
        (b"a: 1\n---\nb: 2\n", "parse", "invalid YAML"),
        (b"\xff\xfe\x00", "parse", "not UTF-8"),
        (b"", "parse", "empty manifest"),
        (b"  \n", "parse", "empty manifest"),
        (b"1: one\n", "parse", "not a string"),
        (b'{"a": NaN}', "parse", "not a JSON number"),
        (b"[" * 100_000 + b"]" * 100_000, "parse", "nested too deeply"),
        (b"a: " + b"[" * 100_000, "parse", ""),
        (b"just text", "invalid", "<root>"),
        (YAML.replace(b"kind: Pod", b"kind: Service"), "invalid", "kind: 'Service'"),
        (YAML.replace(b"name: web", b"name: Web_1"), "invalid", "metadata.name"),
        (YAML.split(b"spec:")[0] + b"spec: {}\n", "invalid", "spec.containers"),
    ],
)
def test_file_errors(data: bytes, reason: str, text: str) -> None:
    with pytest.raises(ManifestError) as err:
        pod_from_file(data, path="/m/x", node_name="n1")
    assert err.value.reason == reason
    assert text in err.value.message


def test_url_body_single_pod() -> None:
    (pod,) = pods_from_url_body(YAML, url=URL, node_name="n1")
    assert pod["metadata"]["name"] == "web-n1"
    assert pod["metadata"]["annotations"]["kubernetes.io/config.source"] == "http"


def test_url_body_pod_list() -> None:
    other = json.loads(json.dumps(DOC))
    other["metadata"]["name"] = "db"
    body = json.dumps({"apiVersion": "v1", "kind": "PodList", "items": [DOC, other]}).encode()
    pods = pods_from_url_body(body, url=URL, node_name="n1")
    assert [p["metadata"]["name"] for p in pods] == ["web-n1", "db-n1"]


@pytest.mark.parametrize("body", [b"", b"\n", b'{"apiVersion": "v1", "kind": "PodList"}'])
def test_url_body_empty(body: bytes) -> None:
    assert pods_from_url_body(body, url=URL, node_name="n1") == []


def test_url_pod_list_with_one_bad_item_is_refused_whole() -> None:
    bad = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": {}}
    body = json.dumps({"apiVersion": "v1", "kind": "PodList", "items": [DOC, bad]}).encode()
    with pytest.raises(ManifestError) as err:
        pods_from_url_body(body, url=URL, node_name="n1")
    assert err.value.reason == "invalid"
    assert "items[1].spec.containers" in err.value.message
