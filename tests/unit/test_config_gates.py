"""Feature gates, in the file and on --feature-gates: a name the v1.34 kubelet does not know
is refused naming it, as upstream refuses it; so is a locked gate set away from its
default, and any gate klet does not act on set away from its upstream default. Gates at
their default and the gates klet honours load. The flag's gates merge over the file's
gate by gate, and each problem names the flag or the file that set the gate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from klet.config import ConfigError, load_config_file, load_settings
from klet.config import gates as gates_module
from klet.config.gatelist import GATES, KUBERNETES_VERSION
from klet.config.gates import HONOURED, enabled, gate_problems

HEADER = {"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration"}


def _file(tmp_path: Path, gates: dict[str, bool]) -> Path:
    file = tmp_path / "kubelet.json"
    file.write_text(json.dumps({**HEADER, "featureGates": gates}))
    return file


def _problems(tmp_path: Path, gates: dict[str, bool]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config_file(_file(tmp_path, gates))
    return info.value.problems


def test_an_unknown_gate_is_refused_naming_it(tmp_path: Path) -> None:
    problems = _problems(tmp_path, {"NoSuchGate": True, "EventedPLEG": False})
    assert problems == [
        f"{tmp_path / 'kubelet.json'}: featureGates.NoSuchGate: unrecognized feature gate: "
        f"NoSuchGate (klet knows the gates of the Kubernetes {KUBERNETES_VERSION} kubelet)"
    ]


def test_gate_names_are_case_sensitive(tmp_path: Path) -> None:
    (problem,) = _problems(tmp_path, {"eventedPLEG": True})
    assert "unrecognized feature gate: eventedPLEG" in problem


def test_a_locked_gate_away_from_its_default_is_refused(tmp_path: Path) -> None:
    assert GATES["NodeSwap"] == (True, "GA", True)
    (problem,) = _problems(tmp_path, {"NodeSwap": False})
    assert problem.endswith(
        f"featureGates.NodeSwap: cannot be set to false: the gate is locked to true in "
        f"Kubernetes {KUBERNETES_VERSION}"
    )


@pytest.mark.parametrize(
    ("name", "value"),
    [("MemoryQoS", True), ("PodLevelResources", False), ("AllAlpha", True)],
)
def test_a_gate_klet_does_not_act_on_is_refused_away_from_its_default(
    tmp_path: Path, name: str, value: bool
) -> None:
    default = GATES[name][0]
    assert value != default
    (problem,) = _problems(tmp_path, {name: value})
    assert problem.endswith(
        f"featureGates.{name}: not implemented by klet: klet does not act on this gate, "
        f"so only its default ({'true' if default else 'false'}) is accepted"
    )


def test_defaults_and_honoured_gates_load(tmp_path: Path) -> None:
    gates = {
        "MemoryQoS": False,
        "SidecarContainers": True,  # locked to true
        "InPlacePodVerticalScaling": False,  # klet holds it off (gates.DEFAULT_ON)
        "PodLevelResources": True,
        "EventedPLEG": True,  # honoured: either value
        "KubeletFineGrainedAuthz": False,
    }
    assert load_config_file(_file(tmp_path, gates)).feature_gates == gates


def test_every_default_loads() -> None:
    """klet's defaults: upstream's, except the gates whose feature klet lacks (off)."""
    defaults = {name: enabled({}, name) for name, spec in GATES.items() if spec[1] != "PRE-ALPHA"}
    assert gate_problems(defaults) == []


def test_a_gate_not_yet_available_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gates_module, "GATES", {"Future": (False, "PRE-ALPHA", False)})
    assert gate_problems({"Future": False}) == [
        ("featureGates.Future", f"not available in Kubernetes {KUBERNETES_VERSION}")
    ]


def test_honoured_gates_are_real_gates() -> None:
    assert set(HONOURED) <= set(GATES)


def test_the_gate_list_is_of_the_version_klet_reports() -> None:
    from klet.status_reporter.cluster.nodestatus import KUBELET_VERSION

    assert KUBELET_VERSION == f"{KUBERNETES_VERSION}-klet"


def _settings_problems(argv: list[str]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_settings(argv, env={}, service="syncloop", hostname="node-1")
    return info.value.problems


def test_the_flag_is_named_for_its_own_gates(tmp_path: Path) -> None:
    problems = _settings_problems(["--feature-gates", "NoSuchGate=true"])
    assert problems[0].startswith(
        "--feature-gates: featureGates.NoSuchGate: unrecognized feature gate: NoSuchGate"
    )


def test_the_flag_merges_over_the_file_gate_by_gate(tmp_path: Path) -> None:
    file = _file(tmp_path, {"EventedPLEG": False, "KubeletFineGrainedAuthz": False})
    settings = load_settings(
        ["--config", str(file), "--feature-gates", "EventedPLEG=true"],
        env={},
        service="syncloop",
        hostname="node-1",
    )
    assert settings.kubelet.feature_gates == {
        "EventedPLEG": True,
        "KubeletFineGrainedAuthz": False,
    }


def test_a_file_gate_is_blamed_on_the_file_beside_a_flag(tmp_path: Path) -> None:
    file = _file(tmp_path, {"MemoryQoS": True})
    problems = _settings_problems(["--config", str(file), "--feature-gates", "EventedPLEG=true"])
    assert [p.split(": ")[:2] for p in problems] == [[str(file), "featureGates.MemoryQoS"]]
