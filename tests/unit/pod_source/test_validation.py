"""Manifest validation: each rule reports a problem naming the offending field, and a
valid pod (including init containers and ports) yields none."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from klet.pod_source.validation import Problem, is_dns1123_label, is_dns1123_subdomain, validate_pod

NODE = "node1"


def pod(**changes: Any) -> dict[str, Any]:
    """A valid pod; `changes` maps a dotted path to a new value (None deletes)."""
    doc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web", "namespace": "kube-system", "labels": {"app": "web"}},
        "spec": {
            "restartPolicy": "Always",
            "initContainers": [{"name": "init", "image": "busybox:1.36"}],
            "containers": [
                {
                    "name": "app",
                    "image": "nginx:1.25",
                    "ports": [{"containerPort": 80, "hostPort": 8080, "protocol": "TCP"}],
                }
            ],
        },
    }
    for path, value in changes.items():
        target: Any = doc
        keys = path.split(".")
        for key in keys[:-1]:
            target = target[int(key)] if isinstance(target, list) else target[key]
        last: Any = int(keys[-1]) if isinstance(target, list) else keys[-1]
        if value is None:
            del target[last]
        else:
            target[last] = copy.deepcopy(value)
    return doc


def fields(problems: list[Problem]) -> list[str]:
    return [p.field for p in problems]


def test_valid_pod_has_no_problems() -> None:
    assert validate_pod(pod(), node_name=NODE) == []


def test_namespace_may_be_omitted_or_empty() -> None:
    assert validate_pod(pod(**{"metadata.namespace": None}), node_name=NODE) == []
    assert validate_pod(pod(**{"metadata.namespace": ""}), node_name=NODE) == []


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"apiVersion": "apps/v1"}, "apiVersion"),
        ({"apiVersion": None}, "apiVersion"),
        ({"kind": "Service"}, "kind"),
        ({"metadata": "web"}, "metadata"),
        ({"metadata.name": None}, "metadata.name"),
        ({"metadata.name": ""}, "metadata.name"),
        ({"metadata.name": "Web_Server"}, "metadata.name"),
        ({"metadata.name": "-web"}, "metadata.name"),
        ({"metadata.name": "a" * 254}, "metadata.name"),
        ({"metadata.name": "a" * 250}, "metadata.name"),  # too long once "-node1" is added
        ({"metadata.namespace": "Kube_System"}, "metadata.namespace"),
        ({"metadata.namespace": "a.b"}, "metadata.namespace"),
        ({"metadata.namespace": "n" * 64}, "metadata.namespace"),
        ({"metadata.labels": {"app": 3}}, "metadata.labels[app]"),
        ({"spec": None}, "spec"),
        ({"spec.containers": None}, "spec.containers"),
        ({"spec.containers": []}, "spec.containers"),
        ({"spec.containers": "nginx"}, "spec.containers"),
        ({"spec.containers.0": "nginx"}, "spec.containers[0]"),
        ({"spec.containers.0.name": None}, "spec.containers[0].name"),
        ({"spec.containers.0.name": "App"}, "spec.containers[0].name"),
        ({"spec.containers.0.name": "a" * 64}, "spec.containers[0].name"),
        ({"spec.containers.0.name": "init"}, "spec.containers[0].name"),  # dup of the init one
        ({"spec.containers.0.image": ""}, "spec.containers[0].image"),
        ({"spec.containers.0.image": None}, "spec.containers[0].image"),
        ({"spec.containers.0.image": "  "}, "spec.containers[0].image"),
        ({"spec.initContainers.0.image": None}, "spec.initContainers[0].image"),
        ({"spec.restartPolicy": "Sometimes"}, "spec.restartPolicy"),
        ({"spec.terminationGracePeriodSeconds": -1}, "spec.terminationGracePeriodSeconds"),
        ({"spec.containers.0.ports": {"http": 80}}, "spec.containers[0].ports"),
        (
            {"spec.containers.0.ports.0.containerPort": 0},
            "spec.containers[0].ports[0].containerPort",
        ),
        (
            {"spec.containers.0.ports.0.containerPort": 65536},
            "spec.containers[0].ports[0].containerPort",
        ),
        (
            {"spec.containers.0.ports.0.containerPort": "80"},
            "spec.containers[0].ports[0].containerPort",
        ),
        (
            {"spec.containers.0.ports.0.containerPort": None},
            "spec.containers[0].ports[0].containerPort",
        ),
        ({"spec.containers.0.ports.0.hostPort": -1}, "spec.containers[0].ports[0].hostPort"),
        ({"spec.containers.0.ports.0.hostPort": 70000}, "spec.containers[0].ports[0].hostPort"),
        ({"spec.containers.0.ports.0.protocol": "HTTP"}, "spec.containers[0].ports[0].protocol"),
    ],
)
def test_each_rule_names_its_field(changes: dict[str, Any], field: str) -> None:
    assert fields(validate_pod(pod(**changes), node_name=NODE)) == [field]


def test_every_problem_is_reported_at_once() -> None:
    doc = pod(
        kind="Service",
        **{"metadata.name": "Bad", "spec.containers.0.image": "", "spec.restartPolicy": "x"},
    )
    assert fields(validate_pod(doc, node_name=NODE)) == [
        "kind",
        "metadata.name",
        "spec.restartPolicy",
        "spec.containers[0].image",
    ]


@pytest.mark.parametrize("doc", [None, "a string", ["a", "list"], 42])
def test_non_object_document(doc: object) -> None:
    assert fields(validate_pod(doc, node_name=NODE)) == ["<root>"]


def test_problem_text_names_field_and_value() -> None:
    (problem,) = validate_pod(pod(**{"metadata.name": "Web_Server"}), node_name=NODE)
    assert str(problem).startswith("metadata.name: 'Web_Server' is not a DNS-1123 subdomain")


@pytest.mark.parametrize(
    ("value", "label", "subdomain"),
    [
        ("web", True, True),
        ("web-1", True, True),
        ("1web", True, True),
        ("web.example", False, True),
        ("Web", False, False),
        ("web-", False, False),
        ("", False, False),
        ("a" * 63, True, True),
        ("a" * 64, False, True),
        (".".join(["a" * 63] * 4), False, False),  # 255 characters
    ],
)
def test_dns1123(value: str, label: bool, subdomain: bool) -> None:
    assert is_dns1123_label(value) is label
    assert is_dns1123_subdomain(value) is subdomain
