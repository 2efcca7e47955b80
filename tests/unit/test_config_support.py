"""Fields klet accepts without acting on them: the table in klet.config.support agrees
with the code (tools/config_fields.py), defaults and the documented accepted values
load, and any other value of an unimplemented field is refused at start naming the file
and field, or the flag that set it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from klet.config import ConfigError, KubeletConfiguration, load_config_file, load_settings
from klet.config.kubelet import nested_class
from klet.config.support import ACCEPTED, UNIMPLEMENTED, all_paths, field_value

from tools.config_fields import check, unread_fields

HEADER = {"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration"}


def test_support_table_agrees_with_the_code() -> None:
    assert check() == []


def test_unread_fields_found() -> None:
    unread = set(unread_fields())
    assert {"rotateCertificates", "serverTLSBootstrap", "makeIPTablesUtilChains"} <= unread
    # methods named run_once are not the field
    assert "runOnce" in unread
    # fields this issue made klet act on are read now
    assert not {"podPidsLimit", "protectKernelDefaults"} & unread


def test_defaults_pass() -> None:
    from klet.config import validate

    assert validate(KubeletConfiguration()) == []
    for path, rule in UNIMPLEMENTED.items():
        value, default = field_value(KubeletConfiguration(), path)
        assert rule.accepts(value, default), path


def test_tables_do_not_overlap() -> None:
    assert not set(UNIMPLEMENTED) & set(ACCEPTED)
    assert set(UNIMPLEMENTED) | set(ACCEPTED) <= set(all_paths())


def _field(path: str) -> dataclasses.Field[Any]:
    cls: Any = KubeletConfiguration
    f: dataclasses.Field[Any] | None = None
    for part in path.split("."):
        f = {g.metadata["json"]: g for g in dataclasses.fields(cls)}[part]
        cls = nested_class(f) if f.metadata["kind"] == "nested" else None
    assert f is not None
    return f


def other_value(path: str) -> Any:
    """A well-typed value that is not the field's default (nor an accepted one)."""
    f = _field(path)
    kind = f.metadata["kind"]
    if path == "tracing":
        return {"endpoint": "localhost:4317"}
    if path == "singleProcessOOMKill":
        return False
    if path == "enforceNodeAllocatable":
        return ["pods", "kube-reserved"]
    return {
        "bool": not f.default,
        "int32": 7,
        "int64": 7,
        "str": "unimplemented-value",
        "duration": "7s",
        "str_list": ["x"],
        "str_map": {"a": "b"},
        "object_list": [{"a": 1}],
        "object": {"json": {"infoBufferSize": "1Mi"}},
    }[kind]


def _nest(path: str, value: Any) -> dict[str, Any]:
    head, _, rest = path.partition(".")
    return {head: _nest(rest, value) if rest else value}


@pytest.mark.parametrize("path", list(UNIMPLEMENTED))
def test_unimplemented_value_refused_naming_file_and_field(tmp_path: Path, path: str) -> None:
    file = tmp_path / "kubelet.json"
    file.write_text(json.dumps({**HEADER, **_nest(path, other_value(path))}))
    with pytest.raises(ConfigError) as info:
        load_config_file(file)
    assert any(p.startswith(f"{file}: {path}: ") for p in info.value.problems), info.value.problems


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({"rotateCertificates": True}, "rotateCertificates"),
        ({"serverTLSBootstrap": True}, "serverTLSBootstrap"),
        ({"imagePullCredentialsVerificationPolicy": "AlwaysVerify"}, None),
        ({"cgroupDriver": "systemd"}, "cgroupDriver"),
        ({"cpuManagerPolicy": "static"}, "cpuManagerPolicy"),
        ({"shutdownGracePeriod": "30s"}, "shutdownGracePeriod"),
        ({"runOnce": True}, "runOnce"),
    ],
)
def test_message(tmp_path: Path, body: dict[str, Any], path: str | None) -> None:
    file = tmp_path / "kubelet.json"
    file.write_text(json.dumps({**HEADER, **body}))
    with pytest.raises(ConfigError) as info:
        load_config_file(file)
    field = path or next(iter(body))
    assert [p for p in info.value.problems if "not implemented by klet" in p] == [
        f"{file}: {field}: not implemented by klet: {UNIMPLEMENTED[field].reason}"
    ]


@pytest.mark.parametrize(
    "body",
    [
        # accepted values that are not the default
        {"imagePullCredentialsVerificationPolicy": "NeverVerify"},
        {"cgroupRoot": "/"},
        {"memorySwap": {"swapBehavior": "NoSwap"}},
        {"singleProcessOOMKill": True},
        {"enforceNodeAllocatable": ["none"]},
        # what kubeadm writes
        {"logging": {"flushFrequency": 0, "options": {"json": {"infoBufferSize": "0"}}}},
        # ACCEPTED fields take any value
        {"makeIPTablesUtilChains": False, "failSwapOn": False, "hairpinMode": "none"},
        {"enableSystemLogHandler": False, "enableProfilingHandler": False},
    ],
)
def test_accepted_values_load(tmp_path: Path, body: dict[str, Any]) -> None:
    file = tmp_path / "kubelet.json"
    file.write_text(json.dumps({**HEADER, **body}))
    load_config_file(file)


@pytest.mark.parametrize(
    ("argv", "flag", "field"),
    [
        (["--cgroup-driver", "systemd"], "--cgroup-driver", "cgroupDriver"),
        (["--cgroup-root", "/custom"], "--cgroup-root", "cgroupRoot"),
        (
            ["--enforce-node-allocatable", "pods,system-reserved"],
            "--enforce-node-allocatable",
            "enforceNodeAllocatable",
        ),
    ],
)
def test_flags_refused_naming_the_flag(argv: list[str], flag: str, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(argv, env={}, service="syncloop", hostname="node-1")
    assert f"{flag}: {field}: not implemented by klet: {UNIMPLEMENTED[field].reason}" in (
        info.value.problems
    )


def test_flag_over_file_names_the_flag(tmp_path: Path) -> None:
    """A flag that restores the default wins over the file's unimplemented value."""
    file = tmp_path / "kubelet.json"
    file.write_text(json.dumps({**HEADER, "cgroupDriver": "systemd"}))
    settings = load_settings(
        ["--config", str(file), "--cgroup-driver", "cgroupfs"],
        env={},
        service="syncloop",
        hostname="node-1",
    )
    assert settings.kubelet.cgroup_driver == "cgroupfs"
