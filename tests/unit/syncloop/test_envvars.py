"""Environment variables and $(VAR) expansion as upstream: defined references expand,
undefined ones stay as written, $$ escapes, an unclosed reference is literal; env
entries see only the entries before them; fieldRef and resourceFieldRef sources
(labels/annotations by key, pod and host IPs, limits with divisors and node-capacity
fallback); ConfigMap/Secret sources are reported as unresolved."""

from __future__ import annotations

import pytest
from klet.syncloop.envvars import NodeFacts, container_env, expand, unresolved

ENV = {"A": "1", "B": "two", "EMPTY": ""}


@pytest.mark.parametrize(
    ("text", "out"),
    [
        ("$(A)", "1"),
        ("x$(A)y$(B)z", "x1ytwoz"),
        ("$(MISSING)", "$(MISSING)"),
        ("$$(A)", "$(A)"),
        ("$$$(A)", "$1"),
        ("$(A", "$(A"),
        ("cost $5", "cost $5"),
        ("$", "$"),
        ("$(EMPTY)-", "-"),
        ("$()", "$()"),
        ("", ""),
    ],
)
def test_expand(text: str, out: str) -> None:
    assert expand(text, ENV.get) == out


NODE = NodeFacts(host_ips=("192.168.1.5",), cpu_count=4, memory_bytes=8 * 1024**3)
POD = {
    "metadata": {
        "name": "web",
        "namespace": "prod",
        "uid": "u-1",
        "labels": {"app": "w"},
        "annotations": {"team": "core"},
    },
    "spec": {"nodeName": "n1", "serviceAccountName": "sa"},
}


def env_of(*variables: dict, resources: dict | None = None) -> dict[str, str]:  # type: ignore[type-arg]
    container = {"name": "c", "env": list(variables), "resources": resources or {}}
    return dict(container_env(POD, container, pod_ips=("10.1.0.7",), node=NODE))


def test_entries_see_only_earlier_entries() -> None:
    env = env_of(
        {"name": "X", "value": "$(Y)-x"},
        {"name": "Y", "value": "y"},
        {"name": "Z", "value": "$(Y)$(X)"},
    )
    assert env == {"X": "$(Y)-x", "Y": "y", "Z": "y$(Y)-x"}


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("metadata.name", "web"),
        ("metadata.namespace", "prod"),
        ("metadata.uid", "u-1"),
        ("metadata.labels['app']", "w"),
        ("metadata.annotations['team']", "core"),
        ("metadata.labels['nope']", ""),
        ("spec.nodeName", "n1"),
        ("spec.serviceAccountName", "sa"),
        ("status.podIP", "10.1.0.7"),
        ("status.podIPs", "10.1.0.7"),
        ("status.hostIP", "192.168.1.5"),
        ("status.hostIPs", "192.168.1.5"),
    ],
)
def test_field_refs(path: str, value: str) -> None:
    assert env_of({"name": "V", "valueFrom": {"fieldRef": {"fieldPath": path}}}) == {"V": value}


@pytest.mark.parametrize(
    ("resource", "divisor", "resources", "value"),
    [
        ("limits.cpu", None, {"limits": {"cpu": "500m"}}, "1"),
        ("limits.cpu", "1m", {"limits": {"cpu": "500m"}}, "500"),
        ("limits.memory", "1Mi", {"limits": {"memory": "128Mi"}}, "128"),
        ("requests.memory", None, {"limits": {"memory": "1Ki"}}, "1024"),
        ("limits.cpu", None, {}, "4"),
        ("limits.memory", "1Gi", {}, "8"),
    ],
)
def test_resource_field_refs(
    resource: str, divisor: str | None, resources: dict, value: str
) -> None:  # type: ignore[type-arg]
    ref: dict[str, str] = {"resource": resource}
    if divisor:
        ref["divisor"] = divisor
    assert env_of({"name": "R", "valueFrom": {"resourceFieldRef": ref}}, resources=resources) == {
        "R": value
    }


def test_configmap_and_secret_refs_are_reported_unresolved() -> None:
    container = {
        "name": "c",
        "env": [
            {"name": "C", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}},
            {"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
            {"name": "P", "value": "plain"},
        ],
        "envFrom": [{"configMapRef": {"name": "cm"}}],
    }
    assert dict(container_env(POD, container, pod_ips=(), node=NODE)) == {"P": "plain"}
    assert unresolved(container) == ["C", "S", "envFrom"]
