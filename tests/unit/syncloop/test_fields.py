"""Every field of a container in the Kubernetes API model is either implemented by klet
or listed as ignored with a reason; the rules do not overlap; `ignored_in` finds the
ignored fields a container sets and nothing else."""

from __future__ import annotations

from klet.syncloop import fields

from tools.container_fields import leaf_paths


def test_every_model_field_is_classified() -> None:
    unclassified = [p for p in leaf_paths() if fields.classify(p) is None]
    assert unclassified == [], "add these to klet.syncloop.fields SUPPORTED or IGNORED"


def test_rules_name_real_fields_and_do_not_overlap() -> None:
    paths = list(leaf_paths())
    rules = set(fields.SUPPORTED) | set(fields.IGNORED)
    assert not set(fields.SUPPORTED) & set(fields.IGNORED)
    stale = [r for r in rules if not any(p == r or p.startswith(r + ".") for p in paths)]
    assert stale == []


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
    assert fields.ignored_in(container) == ["volumeMounts", "livenessProbe.grpc.mode"]
    assert fields.ignored_in({"name": "a", "image": "x"}) == []
