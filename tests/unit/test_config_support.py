"""Fields klet does not act on: the tables in klet.config.support agree with the code
(tools/config_fields.py: a field accepted and read by nothing, a NO_EFFECT entry whose
governing field or gate klet accepts, or a listed field some code reads is a failure),
defaults and the documented accepted values load, any other value of an unimplemented
field is refused at start naming the file and field, or the flag that set it, and a
default klet does not honour is a start-up WARNING of the service that would act on it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from klet.config import ConfigError, KubeletConfiguration, load_config_file, load_settings, support
from klet.config.kubelet import nested_class
from klet.config.support import (
    NO_EFFECT,
    NOT_HONOURED,
    UNIMPLEMENTED,
    NoEffect,
    all_paths,
    field_value,
    not_honoured,
)

from tools.config_fields import check, unread_fields

HEADER = {"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration"}


def test_support_table_agrees_with_the_code() -> None:
    assert check() == []


def test_unread_fields_found() -> None:
    unread = set(unread_fields())
    assert {"makeIPTablesUtilChains"} <= unread
    # methods named run_once are not the field
    assert "runOnce" in unread
    # fields this issue made klet act on are read now
    assert (
        not {
            "podPidsLimit",
            "protectKernelDefaults",
            "rotateCertificates",
            "serverTLSBootstrap",
        }
        & unread
    )


def test_defaults_pass() -> None:
    from klet.config import validate

    assert validate(KubeletConfiguration()) == []
    for path, rule in UNIMPLEMENTED.items():
        value, default = field_value(KubeletConfiguration(), path)
        assert rule.accepts(value, default), path


def test_tables_do_not_overlap() -> None:
    tables = [set(UNIMPLEMENTED), set(NO_EFFECT), set(NOT_HONOURED)]
    assert sum(len(t) for t in tables) == len(set().union(*tables))
    assert set().union(*tables) <= set(all_paths())


def test_a_field_accepted_and_read_by_nothing_fails_the_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        support, "NO_EFFECT", {k: v for k, v in NO_EFFECT.items() if k != "hairpinMode"}
    )
    assert check() == [
        "hairpinMode: accepted, but read by nothing: implement it, or list it in "
        "klet.config.support"
    ]


@pytest.mark.parametrize(
    ("unless", "why"),
    [
        ("maxPods", "klet does not refuse that field away from its default"),
        ("enforceNodeAllocatable", "klet does not refuse that field away from its default"),
        ("featureGates.EventedPLEG", "klet accepts that gate on"),
        ("featureGates.InPlacePodVerticalScaling", "klet accepts that gate on"),  # default on
        ("featureGates.NoSuchGate", "no such gate"),
    ],
)
def test_no_effect_must_be_tied_to_a_refused_field_or_gate(
    monkeypatch: pytest.MonkeyPatch, unless: str, why: str
) -> None:
    monkeypatch.setattr(
        support, "NO_EFFECT", {**NO_EFFECT, "hairpinMode": NoEffect("test", unless=unless)}
    )
    assert check() == [f"hairpinMode: has no effect unless {unless}, but {why}"]


def test_a_listed_field_that_code_reads_fails_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(support, "NO_EFFECT", {**NO_EFFECT, "maxPods": NoEffect("test")})
    assert check() == ["maxPods: listed as not acted on, but some code reads it now"]


@pytest.mark.parametrize(
    ("service", "standalone", "fields"),
    [
        (
            "status-reporter",
            False,
            ["enableProfilingHandler", "enableDebugFlagsHandler", "contentType"],
        ),
        (
            "status-reporter",
            True,
            ["enableProfilingHandler", "enableDebugFlagsHandler"],
        ),
        ("syncloop", True, ["makeIPTablesUtilChains"]),
        ("eviction", False, []),
    ],
)
def test_defaults_klet_does_not_honour_are_warned_by_their_service(
    service: str, standalone: bool, fields: list[str]
) -> None:
    warnings = not_honoured(KubeletConfiguration(), service=service, standalone=standalone)
    assert [w.split(":")[0] for w in warnings] == fields


def test_the_warning_names_the_field_and_what_silences_it() -> None:
    (warning,) = not_honoured(KubeletConfiguration(), service="syncloop", standalone=True)
    assert warning == (
        "makeIPTablesUtilChains: true (the default) asks for the KUBE-IPTABLES-HINT and "
        "KUBE-FIREWALL iptables chains, which klet does not implement; set "
        "makeIPTablesUtilChains: false to say so"
    )


def test_no_warning_once_the_file_says_what_klet_does() -> None:
    cfg = dataclasses.replace(
        KubeletConfiguration(),
        enable_system_log_handler=False,
        enable_profiling_handler=False,
        enable_debug_flags_handler=False,
        content_type="application/json",
        make_iptables_util_chains=False,
    )
    for service in ("status-reporter", "syncloop"):
        assert not_honoured(cfg, service=service, standalone=False) == []


def test_debugging_handlers_off_means_no_handler_warnings() -> None:
    cfg = dataclasses.replace(KubeletConfiguration(), enable_debugging_handlers=False)
    warnings = not_honoured(cfg, service="status-reporter", standalone=True)
    assert warnings == []
    cfg = dataclasses.replace(KubeletConfiguration(), enable_server=False)
    assert not_honoured(cfg, service="status-reporter", standalone=True) == []


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
        ({"imagePullCredentialsVerificationPolicy": "AlwaysVerify"}, None),
        ({"podsPerCore": 10}, "podsPerCore"),
        ({"podsPerCore": 10, "shutdownGracePeriod": "30s"}, "podsPerCore"),
        (
            {"cpuManagerPolicy": "static", "cpuManagerPolicyOptions": {"align-by-socket": "true"}},
            "cpuManagerPolicyOptions",
        ),
        ({"runOnce": True}, "runOnce"),
        ({"enableControllerAttachDetach": False}, "enableControllerAttachDetach"),
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
        {"cgroupRoot": "/klet-node-a"},
        {"memorySwap": {"swapBehavior": "NoSwap"}},
        {"singleProcessOOMKill": True},
        {"enforceNodeAllocatable": ["none"]},
        {
            "enforceNodeAllocatable": ["pods", "system-reserved", "kube-reserved-compressible"],
            "systemReservedCgroup": "/system.slice",
            "kubeReservedCgroup": "/kube",
        },
        {"rotateCertificates": True},
        {"cgroupDriver": "systemd"},
        {"shutdownGracePeriod": "30s", "shutdownGracePeriodCriticalPods": "10s"},
        {"shutdownGracePeriodByPodPriority": [{"priority": 0, "shutdownGracePeriodSeconds": 5}]},
        # what kubeadm writes
        {"logging": {"flushFrequency": 0, "options": {"json": {"infoBufferSize": "0"}}}},
        # fields without effect, and defaults klet does not honour, take any value
        {"makeIPTablesUtilChains": False, "failSwapOn": False, "hairpinMode": "none"},
        {"cpuManagerReconcilePeriod": "1m", "iptablesDropBit": 3, "contentType": "x/y"},
        {"enableSystemLogHandler": False, "enableProfilingHandler": False},
    ],
)
def test_accepted_values_load(tmp_path: Path, body: dict[str, Any]) -> None:
    file = tmp_path / "kubelet.json"
    file.write_text(json.dumps({**HEADER, **body}))
    load_config_file(file)


def test_flags_refused_naming_the_flag() -> None:
    """What klet does not implement of a field it reads, set by a flag: huge pages
    reserved on an enforced reserved cgroup."""
    argv = [
        "--enforce-node-allocatable",
        "pods,system-reserved",
        "--system-reserved-cgroup",
        "/system.slice",
        "--system-reserved",
        "hugepages-2Mi=4Mi",
    ]
    with pytest.raises(ConfigError) as info:
        load_settings(argv, env={}, service="syncloop", hostname="node-1")
    assert info.value.problems == [
        "--system-reserved: systemReserved.hugepages-2Mi: with enforceNodeAllocatable "
        "system-reserved: not implemented by klet: hugetlb limits on a reserved cgroup"
    ]


def test_flag_over_file_names_the_flag(tmp_path: Path) -> None:
    """A flag that restores the default wins over the file's refused value (here one
    without the cgroup it needs)."""
    file = tmp_path / "kubelet.json"
    file.write_text(json.dumps({**HEADER, "enforceNodeAllocatable": ["pods", "system-reserved"]}))
    settings = load_settings(
        ["--config", str(file), "--enforce-node-allocatable", "pods"],
        env={},
        service="syncloop",
        hostname="node-1",
    )
    assert settings.kubelet.enforce_node_allocatable == ("pods",)


@pytest.mark.parametrize(
    ("period", "field", "message"),
    [
        ({"priority": 0, "grace": 5}, "grace", "unknown field"),
        ({"priority": "high"}, "priority", "must be an integer, not 'high'"),
        ({"shutdownGracePeriodSeconds": -1}, "shutdownGracePeriodSeconds", "must not be negative"),
    ],
)
def test_shutdown_periods_by_priority_are_checked(
    tmp_path: Path, period: dict[str, Any], field: str, message: str
) -> None:
    file = tmp_path / "kubelet.json"
    file.write_text(json.dumps({**HEADER, "shutdownGracePeriodByPodPriority": [period]}))
    with pytest.raises(ConfigError) as info:
        load_config_file(file)
    assert f"{file}: shutdownGracePeriodByPodPriority[0].{field}: {message}" in info.value.problems


def test_node_side_attach_is_refused_saying_why(tmp_path: Path) -> None:
    """enableControllerAttachDetach: false asks the node to attach volumes itself, which
    klet does not do: refused at start, naming the field and the consequence."""
    file = tmp_path / "kubelet.json"
    file.write_text(json.dumps({**HEADER, "enableControllerAttachDetach": False}))
    with pytest.raises(ConfigError) as info:
        load_config_file(file)
    (problem,) = [p for p in info.value.problems if "enableControllerAttachDetach" in p]
    assert problem.startswith(f"{file}: enableControllerAttachDetach: not implemented by klet: ")
    assert "attach-detach controller" in problem
    assert "VolumeAttachment" in problem
    file.write_text(json.dumps({**HEADER, "enableControllerAttachDetach": True}))
    assert load_config_file(file).enable_controller_attach_detach is True
