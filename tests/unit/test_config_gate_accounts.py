"""Every feature gate on by default in the kubelet klet reports is accounted for: a
feature klet has (its module imports, its test exists), one it holds off and refuses to
turn on by name, one reachable only through a refused field, or another component's.
None loads as on while its feature is missing (issue 37's rule)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from klet.config.gates import (
    DEFAULT_ON,
    GATES,
    KUBERNETES_VERSION,
    Absent,
    Implemented,
    Inert,
    enabled,
    gate_problems,
)
from klet.config.support import UNIMPLEMENTED

TESTS = Path(__file__).resolve().parents[1]

ON_BY_DEFAULT = sorted(
    name
    for name, (default, stage, locked) in GATES.items()
    if default and not (locked and stage == "GA")
)


def test_every_gate_on_by_default_is_accounted_for() -> None:
    missing = [name for name in ON_BY_DEFAULT if name not in DEFAULT_ON]
    assert not missing, f"gates on by default in {KUBERNETES_VERSION} with no account: {missing}"
    stale = sorted(set(DEFAULT_ON) - set(ON_BY_DEFAULT))
    assert not stale, f"accounted for but not on by default: {stale}"


@pytest.mark.parametrize(
    "name", [n for n in ON_BY_DEFAULT if isinstance(DEFAULT_ON.get(n), Implemented)]
)
def test_an_implemented_gate_names_its_module_and_the_test_that_proves_it(name: str) -> None:
    account = DEFAULT_ON[name]
    assert isinstance(account, Implemented)
    importlib.import_module(account.module)
    path, _, function = account.test.partition("::")
    test_file = TESTS / path
    assert test_file.is_file(), account.test
    assert function and f"def {function}(" in test_file.read_text(), account.test
    assert enabled({}, name)
    assert gate_problems({name: True}) == []


@pytest.mark.parametrize(
    "name", [n for n in ON_BY_DEFAULT if isinstance(DEFAULT_ON.get(n), Absent)]
)
def test_an_absent_feature_is_off_in_klet_and_refused_on_by_name(name: str) -> None:
    assert not enabled({}, name)
    problems = gate_problems({name: True})
    assert len(problems) == 1
    path, message = problems[0]
    assert path == f"featureGates.{name}"
    assert "klet does not have this feature" in message and "holds the gate off" in message
    assert gate_problems({name: False}) == []


@pytest.mark.parametrize("name", [n for n in ON_BY_DEFAULT if isinstance(DEFAULT_ON.get(n), Inert)])
def test_an_inert_gate_is_reached_only_through_a_refused_field(name: str) -> None:
    account = DEFAULT_ON[name]
    assert isinstance(account, Inert)
    assert account.field in UNIMPLEMENTED, account.field


def test_in_place_resize_is_on_by_default_and_may_be_turned_off() -> None:
    """The gate klet once loaded as on while a resize was never applied: implemented
    now, on by default as upstream, and honoured off."""
    assert enabled({}, "InPlacePodVerticalScaling")
    assert gate_problems({"InPlacePodVerticalScaling": False}) == []
    assert gate_problems({"InPlacePodVerticalScaling": True}) == []
