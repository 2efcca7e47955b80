"""Every field of a container and of the pod spec in the Kubernetes API model is either
implemented by klet, listed as not the node's business, or listed as ignored with a
reason; the rules do not overlap and name real fields; the volume types klet sets up
exist in the API; `ignored_in` finds the ignored fields a container sets and nothing
else."""

from __future__ import annotations

import kubernetes.client as k8s
from klet.syncloop.containers import fields

from tools.container_fields import leaf_paths, pod_paths, volume_types


def test_every_model_field_is_classified() -> None:
    unclassified = [p for p in leaf_paths() if fields.classify(p) is None]
    assert unclassified == [], "add these to klet.syncloop.containers.fields SUPPORTED or IGNORED"


def test_rules_name_real_fields_and_do_not_overlap() -> None:
    paths = list(leaf_paths())
    rules = set(fields.SUPPORTED) | set(fields.IGNORED) | set(fields.REFUSED)
    tables = [set(fields.SUPPORTED), set(fields.IGNORED), set(fields.REFUSED)]
    assert all(not (a & b) for i, a in enumerate(tables) for b in tables[i + 1 :])
    stale = [r for r in rules if not any(p == r or p.startswith(r + ".") for p in paths)]
    assert stale == []


def test_every_pod_field_is_classified() -> None:
    unclassified = [p for p in pod_paths() if fields.classify_pod(p) is None]
    assert unclassified == [], "add these to klet.syncloop.containers.fields POD_* tables"


def test_pod_rules_name_real_fields_and_do_not_overlap() -> None:
    paths = [*pod_paths(), *leaf_paths(k8s.V1PodSpec)]
    tables = [
        set(fields.POD_SUPPORTED),
        set(fields.POD_IGNORED),
        set(fields.POD_NOT_FOR_THE_NODE),
        set(fields.POD_REFUSED),
    ]
    assert all(not (a & b) for i, a in enumerate(tables) for b in tables[i + 1 :])
    rules = set().union(*tables)
    stale = [r for r in rules if not any(p == r or p.startswith(r + ".") for p in paths)]
    assert stale == []


def test_supported_volume_types_exist_in_the_api() -> None:
    assert fields.VOLUME_TYPES <= set(volume_types())
    assert "iscsi" in set(volume_types()) - fields.VOLUME_TYPES


def test_longest_rule_wins() -> None:
    assert fields.classify("livenessProbe.exec.command") == "livenessProbe"
    assert fields.classify("livenessProbe.grpc.mode") == "livenessProbe.grpc.mode"
    assert fields.classify("securityContext.windowsOptions.hostProcess") == (
        "securityContext.windowsOptions"
    )
    assert fields.classify("noSuchField") is None


def test_ignored_in_reports_only_set_ignored_fields() -> None:
    container = {
        "name": "a",
        "image": "x",
        "volumeMounts": [{"name": "v", "mountPath": "/v"}],
        "resizePolicy": [],
        "lifecycle": {"preStop": {"tcpSocket": {"port": 80}}, "postStart": {"exec": {}}},
        "livenessProbe": {"grpc": {"port": 9, "mode": "x"}},
        "securityContext": {"runAsUser": 1, "windowsOptions": {"hostProcess": False}},
    }
    assert fields.ignored_in(container) == ["livenessProbe.grpc.mode"]
    assert fields.ignored_in({"name": "a", "image": "x"}) == []
