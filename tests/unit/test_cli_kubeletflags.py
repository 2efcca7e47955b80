"""The `kubelet` entry point's flag table and translation (klet.cli.kubeletflags): every
flag of upstream's v1.34.4 kubelet (the generated klet.config.kubeletflaglist) has exactly
one state, an implemented one is klet's own flag of that name, kubeadm's command line
passes with upstream's deprecation warnings, a refused or unknown flag refuses the start
naming it, pflag's spellings split as pflag splits them; and the flags it brought into
klet's parser reach the configuration (--register-with-taints, --anonymous-auth,
--authorization-mode, --tls-cipher-suites, --cloud-provider)."""

from __future__ import annotations

from pathlib import Path

import pytest
from klet.cli.kubelet import main as kubelet_main
from klet.cli.kubelet import usage
from klet.cli.kubeletflags import STATES, Handled, Ignored, Implemented, Refused, translate
from klet.config import ConfigError, load_settings
from klet.config.flags import FLAGS
from klet.config.gates import KUBERNETES_VERSION
from klet.config.kubeletflaglist import FLAGS as UPSTREAM
from klet.config.kubeletflaglist import KUBERNETES_VERSION as FLAGLIST_VERSION

KLET_FLAGS = {spec.flag[2:]: spec for spec in FLAGS}
CONFIG_DEPRECATION = (
    "This parameter should be set via the config file specified by the Kubelet's --config "
    "flag. See https://kubernetes.io/docs/tasks/administer-cluster/kubelet-config-file/ for "
    "more information."
)
# kubeadm's drop-in, with kubeadm-flags.env as kubeadm init v1.34 writes it
KUBEADM_ARGV = [
    "--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf",
    "--kubeconfig=/etc/kubernetes/kubelet.conf",
    "--config=/var/lib/kubelet/config.yaml",
    "--container-runtime-endpoint=unix:///run/containerd/containerd.sock",
    "--pod-infra-container-image=registry.k8s.io/pause:3.10.1",
]


def test_every_upstream_flag_has_one_state_and_no_state_is_of_another_flag() -> None:
    assert FLAGLIST_VERSION == KUBERNETES_VERSION
    assert set(STATES) == set(UPSTREAM)
    assert len(UPSTREAM) == 148  # v1.34.4's kubelet, hidden and deprecated flags included


def test_an_implemented_flag_is_klets_own_flag_of_that_name() -> None:
    for name, state in STATES.items():
        if isinstance(state, Implemented):
            assert name in KLET_FLAGS, name
            upstream_bool = UPSTREAM[name].no_value == "true"
            assert KLET_FLAGS[name].optional_value == upstream_bool or name == "v", name
        else:
            assert name not in KLET_FLAGS, f"--{name} is klet's flag but not Implemented"


def test_ignored_flags_are_deprecated_upstream_and_each_state_says_why() -> None:
    for name, state in STATES.items():
        if isinstance(state, Ignored):
            assert UPSTREAM[name].deprecated, name
            assert state.reason
        if isinstance(state, Refused):
            assert len(state.reason) > 20, name
        if isinstance(state, Handled):
            assert name in ("help", "version")


def test_kubeadms_command_line_passes_with_upstreams_warnings() -> None:
    plan = translate(KUBEADM_ARGV)
    assert plan.problems == []
    assert plan.argv == KUBEADM_ARGV[:4]  # the pause image flag is dropped
    assert plan.warnings == [
        f"Flag --container-runtime-endpoint has been deprecated, {CONFIG_DEPRECATION}",
        "Flag --pod-infra-container-image has been deprecated, will be removed in 1.35. "
        "Image garbage collector will get sandbox image information from CRI.",
    ]


def test_pflag_spellings_split_as_pflag_splits_them() -> None:
    plan = translate(
        [
            "--node_ip",  # underscores are dashes; a string flag takes the next argument
            "10.0.0.5",
            "--fail-swap-on",  # a bool flag alone is true and takes nothing after it
            "--register-node=false",
            "-v",
            "4",
            "-v=5",
            "--redis-url=unix:///run/klet/redis/redis.sock",  # klet's own flags pass too
            "--storage-driver-db",  # ignored: its value is dropped with it
            "influx",
        ]
    )
    assert plan.problems == []
    assert plan.argv == [
        "--node-ip",
        "10.0.0.5",
        "--fail-swap-on",
        "--register-node=false",
        "--v",
        "4",
        "--v=5",
        "--redis-url=unix:///run/klet/redis/redis.sock",
    ]
    assert len(plan.warnings) == 3  # fail-swap-on, register-node, storage-driver-db


def test_refused_and_unknown_flags_are_named() -> None:
    plan = translate(
        ["--housekeeping-interval", "10s", "--lock-file=/var/run/lock", "--nope", "x", "-q"]
    )
    assert plan.problems == [
        "--housekeeping-interval: not implemented by klet: "
        + STATES["housekeeping-interval"].reason,  # type: ignore[union-attr]
        "--lock-file: not implemented by klet: " + STATES["lock-file"].reason,  # type: ignore[union-attr]
        "unknown flag: --nope",
        "unexpected argument 'x': the kubelet takes flags only",
        "unknown shorthand flag: 'q' in -q",
    ]
    assert translate(["--config"]).problems == ["flag needs an argument: --config"]


def test_help_and_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert kubelet_main(["--version"]) == 0
    # kubeadm's preflight reads `kubelet --version` with ^Kubernetes v<semver>$
    assert capsys.readouterr().out == f"Kubernetes {KUBERNETES_VERSION}-klet\n"
    assert translate(["--version=false"]).version is False
    assert kubelet_main(["-h"]) == 0
    out = capsys.readouterr().out
    assert out == usage() + "\n"
    assert "  --housekeeping-interval: klet has no cAdvisor" in out
    assert kubelet_main(["--nope"]) == 1
    assert capsys.readouterr().err == "kubelet: unknown flag: --nope\n"


def _settings(argv: list[str]) -> object:
    plan = translate(argv)
    assert plan.problems == []
    return load_settings(plan.argv, env={}, service="status-reporter", hostname="node-1")


def test_the_new_config_flags_reach_the_configuration(tmp_path: Path) -> None:
    settings = _settings(
        [
            "--register-with-taints=dedicated=infra:NoSchedule,gpu:NoExecute",
            "--anonymous-auth=false",
            "--authorization-mode=AlwaysAllow",
            "--authentication-token-webhook",
            "--cloud-provider=external",
            "--tls-cipher-suites=TLS_AES_128_GCM_SHA256,TLS_AES_256_GCM_SHA384",
        ]
    )
    kubelet = settings.kubelet  # type: ignore[attr-defined]
    assert kubelet.register_with_taints == (
        {"key": "dedicated", "value": "infra", "effect": "NoSchedule"},
        {"key": "gpu", "effect": "NoExecute"},
    )
    assert kubelet.authentication.anonymous.enabled is False
    assert kubelet.authentication.webhook.enabled is True
    assert kubelet.authorization.mode == "AlwaysAllow"
    assert settings.klet.cloud_provider == "external"  # type: ignore[attr-defined]
    # checked where 10250 is served (status-reporter's kubeletapi.tlsconfig)
    assert kubelet.tls_cipher_suites == ("TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384")


@pytest.mark.parametrize(
    ("argv", "flag", "message"),
    [
        (["--cloud-provider=aws"], "--cloud-provider", "built-in cloud providers are disabled"),
        (["--register-with-taints=a=b:Sometimes"], "--register-with-taints", "invalid taint"),
        (["--memory-manager-policy=Static"], "--memory-manager-policy", ""),
        # a hostile CPU list is refused, never expanded (klet.model.cpuset.MAX_CPU)
        (["--reserved-cpus=0-99999999999"], "--reserved-cpus", "above the largest CPU number"),
        (["--reserved-cpus=" + "9" * 5000], "--reserved-cpus", "above the largest CPU number"),
    ],
)
def test_a_value_klet_refuses_names_the_flag(argv: list[str], flag: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        _settings(argv)
    assert flag in str(err.value)
    assert message in str(err.value)
