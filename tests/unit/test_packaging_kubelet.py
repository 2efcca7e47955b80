"""The klet-kubelet package's unit and kubeadm's drop-in (packaging/kubelet): the command
line systemd gives /usr/bin/kubelet, with the files kubeadm init writes, is kubeadm's own
and passes the `kubelet` entry point's flag table (upstream's deprecation warnings, no
refusal); the operator's /etc/default/kubelet comes last; without kubeadm's files the unit
still expands; and /usr/bin/kubelet runs klet's entry point from KLET_HOME."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from klet.cli.kubeletflags import translate
from klet.config.gates import KUBERNETES_VERSION

from tests.harness.systemd_unit import exec_start_argv

PKG = Path(__file__).resolve().parents[2] / "packaging" / "kubelet"
UNIT = (PKG / "kubelet.service").read_text()
DROP_IN = (PKG / "10-kubeadm.conf").read_text()
# kubeadm init v1.34 writes this (its --container-runtime-endpoint from the CRI socket it
# found, the pause image of its release)
KUBEADM_FLAGS_ENV = (
    'KUBELET_KUBEADM_ARGS="--container-runtime-endpoint=unix:///var/run/containerd/'
    'containerd.sock --pod-infra-container-image=registry.k8s.io/pause:3.10.1"\n'
)
KUBECONFIG_AND_CONFIG = [
    "--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf",
    "--kubeconfig=/etc/kubernetes/kubelet.conf",
    "--config=/var/lib/kubelet/config.yaml",
]


def test_kubeadms_drop_in_gives_kubeadms_command_line_and_it_passes() -> None:
    files = {"/var/lib/kubelet/kubeadm-flags.env": KUBEADM_FLAGS_ENV}
    argv = exec_start_argv([UNIT, DROP_IN], files.get)
    assert argv == [
        "/usr/bin/kubelet",
        *KUBECONFIG_AND_CONFIG,
        "--container-runtime-endpoint=unix:///var/run/containerd/containerd.sock",
        "--pod-infra-container-image=registry.k8s.io/pause:3.10.1",
    ]
    plan = translate(argv[1:])
    assert plan.problems == []
    assert plan.argv == argv[1:4] + [argv[4]]
    assert [w.split(",")[0] for w in plan.warnings] == [
        "Flag --container-runtime-endpoint has been deprecated",
        "Flag --pod-infra-container-image has been deprecated",
    ]


def test_the_operators_extra_args_come_last() -> None:
    files = {
        "/var/lib/kubelet/kubeadm-flags.env": KUBEADM_FLAGS_ENV,
        "/etc/default/kubelet": "KUBELET_EXTRA_ARGS=--node-ip=10.0.0.5 --max-pods=50\n",
    }
    argv = exec_start_argv([UNIT, DROP_IN], files.get)
    assert argv[-2:] == ["--node-ip=10.0.0.5", "--max-pods=50"]
    assert translate(argv[1:]).problems == []


def test_before_kubeadm_has_run_the_unit_still_expands() -> None:
    assert exec_start_argv([UNIT, DROP_IN], {}.get) == ["/usr/bin/kubelet", *KUBECONFIG_AND_CONFIG]
    assert exec_start_argv([UNIT], {}.get) == ["/usr/bin/kubelet"]
    assert "Restart=always" in UNIT and "RestartSec=10" in UNIT


def test_usr_bin_kubelet_runs_klets_entry_point() -> None:
    home = sys.prefix  # this environment stands in for /opt/klet
    out = subprocess.run(
        [str(PKG / "kubelet"), "--version"],
        env={**os.environ, "KLET_HOME": home},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout == f"Kubernetes {KUBERNETES_VERSION}-klet\n"
