"""The `kubelet` entry point as systemd starts it from the klet-kubelet package: the unit
and kubeadm's drop-in (packaging/kubelet), expanded as systemd expands them with
kubeadm-flags.env as kubeadm writes it (this stack's containerd, its pause image) and
/etc/default/kubelet, run through /usr/bin/kubelet (the package's script) with a unix
datagram socket as NOTIFY_SOCKET and WatchdogSec=4s. A test drop-in points
KUBELET_CONFIG_ARGS at the test's configuration and empties KUBELET_KUBECONFIG_ARGS
(standalone: no apiserver here); everything else is the packaged files. The node sends
READY=1, runs a static pod, pings the watchdog, prints upstream's deprecation warnings,
and stops on SIGTERM with exit 0."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from klet.devstack import DevStack, free_port
from klet.devstack.images import PAUSE_IMAGE
from klet.syncloop.volumes.fs import mounts_under

from tests.harness.systemd_unit import exec_start_argv
from tests.harness.waiting import wait_for
from tests.integration.conftest import remove_node_pods

PKG = Path(__file__).resolve().parents[2] / "packaging" / "kubelet"
NODE = "kubeadmnode"
POD = """\
apiVersion: v1
kind: Pod
metadata:
  name: web
spec:
  containers:
    - name: main
      image: registry.klet.test/busybox:1.36
      command: ["sh", "-c", "sleep 3600"]
"""


def _recv(sock: socket.socket, timeout_s: float) -> list[str]:
    """The datagrams that arrive within `timeout_s`."""
    got = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            got.append(sock.recv(4096).decode())
        except TimeoutError:
            break
    return got


def test_the_packaged_unit_starts_klet_as_the_nodes_kubelet(
    devstack: DevStack, tmp_path: Path
) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "web.yaml").write_text(POD)
    ro_port = free_port()
    config = tmp_path / "config.yaml"
    config.write_text(
        json.dumps(
            {
                "apiVersion": "kubelet.config.k8s.io/v1beta1",
                "kind": "KubeletConfiguration",
                "staticPodPath": str(manifests),
                "fileCheckFrequency": "1s",
                "readOnlyPort": ro_port,
                "healthzPort": free_port(),
                "port": free_port(),
                "podLogsDir": str(tmp_path / "logs"),
            }
        )
    )
    test_drop_in = (
        "[Service]\n"
        'Environment="KUBELET_KUBECONFIG_ARGS="\n'
        f'Environment="KUBELET_CONFIG_ARGS=--config={config}"\n'
    )
    files = {
        "/var/lib/kubelet/kubeadm-flags.env": (
            f'KUBELET_KUBEADM_ARGS="--container-runtime-endpoint={devstack.runtime_endpoint} '
            f'--pod-infra-container-image={PAUSE_IMAGE}"\n'
        ),
        "/etc/default/kubelet": (
            f"KUBELET_EXTRA_ARGS=--hostname-override={NODE} --run-dir={tmp_path / 'run'} "
            f"--root-dir={tmp_path / 'root'} --cert-dir={tmp_path / 'pki'}\n"
        ),
    }
    argv = exec_start_argv(
        [
            (PKG / "kubelet.service").read_text(),
            (PKG / "10-kubeadm.conf").read_text(),
            test_drop_in,
        ],
        files.get,
    )
    assert argv[0] == "/usr/bin/kubelet"
    notify = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(notify))
    log = tmp_path / "kubelet.log"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("KLET_")},
        "KLET_HOME": sys.prefix,  # this environment stands in for /opt/klet
        "NOTIFY_SOCKET": str(notify),
        "WATCHDOG_USEC": "4000000",
    }
    with log.open("w") as out:
        proc = subprocess.Popen(
            [str(PKG / "kubelet"), *argv[1:]],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    try:
        ready = wait_for(
            lambda: "READY=1" in _recv(sock, 1.0) or proc.poll() is not None,
            timeout_s=120,
            what="READY=1 from the kubelet entry point",
        )
        assert ready and proc.poll() is None, log.read_text()[-3000:]

        def running() -> dict[str, Any] | None:
            with urllib.request.urlopen(f"http://127.0.0.1:{ro_port}/pods", timeout=2) as r:
                for pod in json.load(r)["items"] or []:
                    if pod["metadata"]["name"] == f"web-{NODE}":
                        statuses = pod.get("status", {}).get("containerStatuses") or []
                        if statuses and "running" in statuses[0].get("state", {}):
                            return pod  # type: ignore[no-any-return]
            return None

        wait_for(running, timeout_s=120, what="the static pod running")
        # WatchdogSec=4s: a ping every 2s while the services run
        assert "WATCHDOG=1" in _recv(sock, 5.0)
        text = log.read_text()
        assert "Flag --container-runtime-endpoint has been deprecated" in text
        assert "Flag --pod-infra-container-image has been deprecated" in text
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            code = proc.wait()
        sock.close()
        asyncio.run(remove_node_pods(devstack.runtime_endpoint, NODE))
        for point in mounts_under(tmp_path):
            subprocess.run(["umount", point], capture_output=True, check=False)
    assert code == 0, log.read_text()[-3000:]
