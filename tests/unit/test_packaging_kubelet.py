"""The klet-kubelet package's unit and kubeadm's drop-in (packaging/kubelet): the command
line systemd gives /usr/bin/kubelet, with the files kubeadm init writes, is kubeadm's own
and passes the `kubelet` entry point's flag table (upstream's deprecation warnings, no
refusal); the operator's /etc/default/kubelet comes last; without kubeadm's files the unit
still expands; /usr/bin/kubelet runs klet's entry point from KLET_HOME; and the
KubeletConfiguration and kubeadm-flags.env that kubeadm v1.34.4 itself writes load in
every service."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from klet.cli.kubeletflags import translate
from klet.config import load_settings
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


# What kubeadm v1.34.4 (built from the module cache) wrote with `kubeadm init phase
# kubelet-start --dry-run` for an InitConfiguration naming node kadm1, criSocket
# unix:///run/containerd/containerd.sock and a KubeletConfiguration with cgroupDriver
# cgroupfs: /var/lib/kubelet/config.yaml and kubeadm-flags.env (in 1.34 the runtime
# endpoint is in the file, not a flag).
KUBEADM_CONFIG_YAML = """\
apiVersion: kubelet.config.k8s.io/v1beta1
authentication:
  anonymous:
    enabled: false
  webhook:
    cacheTTL: 0s
    enabled: true
  x509:
    clientCAFile: /etc/kubernetes/pki/ca.crt
authorization:
  mode: Webhook
  webhook:
    cacheAuthorizedTTL: 0s
    cacheUnauthorizedTTL: 0s
cgroupDriver: cgroupfs
clusterDNS:
- 10.96.0.10
clusterDomain: cluster.local
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
cpuManagerReconcilePeriod: 0s
crashLoopBackOff: {}
evictionPressureTransitionPeriod: 0s
fileCheckFrequency: 0s
healthzBindAddress: 127.0.0.1
healthzPort: 10248
httpCheckFrequency: 0s
imageMaximumGCAge: 0s
imageMinimumGCAge: 0s
kind: KubeletConfiguration
logging:
  flushFrequency: 0
  options:
    json:
      infoBufferSize: "0"
    text:
      infoBufferSize: "0"
  verbosity: 0
memorySwap: {}
nodeStatusReportFrequency: 0s
nodeStatusUpdateFrequency: 0s
rotateCertificates: true
runtimeRequestTimeout: 0s
shutdownGracePeriod: 0s
shutdownGracePeriodCriticalPods: 0s
staticPodPath: /etc/kubernetes/manifests
streamingConnectionIdleTimeout: 0s
syncFrequency: 0s
volumeStatsAggPeriod: 0s
"""
KUBEADM_INIT_FLAGS_ENV = (
    'KUBELET_KUBEADM_ARGS="--hostname-override=kadm1 '
    '--pod-infra-container-image=registry.k8s.io/pause:3.10.1"\n'
)


@pytest.mark.parametrize(
    "service", ["pod-source", "syncloop", "status-reporter", "eviction", "image-gc"]
)
def test_what_kubeadm_writes_loads_in_every_service(service: str, tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(KUBEADM_CONFIG_YAML)
    files = {"/var/lib/kubelet/kubeadm-flags.env": KUBEADM_INIT_FLAGS_ENV}
    argv = exec_start_argv([UNIT, DROP_IN], files.get)
    argv = [a.replace("/var/lib/kubelet/config.yaml", str(config)) for a in argv]
    plan = translate(argv[1:])
    assert plan.problems == []
    settings = load_settings(plan.argv, env={}, service=service)
    assert settings.klet.node_name == "kadm1"
    assert settings.klet.kubeconfig == Path("/etc/kubernetes/kubelet.conf")
    assert settings.kubelet.static_pod_path == "/etc/kubernetes/manifests"
    assert settings.kubelet.authentication.x509.client_ca_file == "/etc/kubernetes/pki/ca.crt"
    assert settings.kubelet.rotate_certificates is True
