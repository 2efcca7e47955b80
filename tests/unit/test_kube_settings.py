"""The apiserver client's settings from the node's configuration (klet.kube.settings):
kubeAPIQPS as upstream's kubelet hands it to client-go, an explicit 0 included."""

from __future__ import annotations

from pathlib import Path

from klet.config.settings import load_settings
from klet.kube.settings import CLIENT_GO_DEFAULT_QPS, client_qps, kube_settings


def test_kube_api_qps_zero_is_client_gos_default_not_unlimited() -> None:
    assert client_qps(0) == CLIENT_GO_DEFAULT_QPS == 5.0
    assert client_qps(1) == 1.0
    assert client_qps(50) == 50.0


def test_the_settings_carry_the_configured_limits(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    base = ["--kubeconfig", str(kubeconfig), "--redis-url", "unix:///tmp/r.sock"]
    default = load_settings(base, env={}, service="syncloop", hostname="n1")
    zero = load_settings(
        [*base, "--kube-api-qps=0", "--kube-api-burst=7"], env={}, service="syncloop", hostname="n1"
    )
    got_default, got_zero = kube_settings(default), kube_settings(zero)
    assert got_default is not None and got_zero is not None
    assert (got_default.qps, got_default.burst) == (50.0, 100)
    assert (got_zero.qps, got_zero.burst) == (5.0, 7)
