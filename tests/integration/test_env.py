"""Environment variables seen from inside a real container: values, $(VAR) expansion in
env, command and args (with $$ escaping and undefined references kept), fieldRef and
resourceFieldRef; a host-network pod reads the node's address as its pod IP (status and
downward API agree). (A static pod whose env references a ConfigMap is refused by
pod-source: test_static_pod_api_references.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.harness.node import KletNode
from tests.harness.waiting import wait_for

POD = """
apiVersion: v1
kind: Pod
metadata:
  name: envtest
  labels: {app: envy}
spec:
  restartPolicy: Never
  containers:
    - name: main
      image: registry.klet.test/busybox:1.36
      command:
        - sh
        - -c
        - |
          echo GREETING=$GREETING; echo ARG=$1; echo LIT=$2; echo LABEL=$APP
          echo NAME=$NAME; echo IP=$IP; echo MEM=$MEM; echo UNDEF=$3
        - "--"
      args: ["$(GREETING)", "$$(GREETING)", "$(NOPE)"]
      resources:
        limits: {memory: 64Mi}
      env:
        - {name: WHO, value: world}
        - {name: GREETING, value: "hello $(WHO)"}
        - name: APP
          valueFrom: {fieldRef: {fieldPath: "metadata.labels['app']"}}
        - name: NAME
          valueFrom: {fieldRef: {fieldPath: metadata.name}}
        - name: IP
          valueFrom: {fieldRef: {fieldPath: status.podIP}}
        - name: MEM
          valueFrom: {resourceFieldRef: {resource: limits.memory, divisor: 1Mi}}
"""

HOST_NETWORK_POD = """
apiVersion: v1
kind: Pod
metadata: {name: hostnet}
spec:
  hostNetwork: true
  restartPolicy: Never
  containers:
    - name: main
      image: registry.klet.test/busybox:1.36
      command: ["sh", "-c", "echo POD_IP=${POD_IP:?}; echo POD_IPS=$POD_IPS; echo HOST_IP=$HOST_IP"]
      env:
        - name: POD_IP
          valueFrom: {fieldRef: {fieldPath: status.podIP}}
        - name: POD_IPS
          valueFrom: {fieldRef: {fieldPath: status.podIPs}}
        - name: HOST_IP
          valueFrom: {fieldRef: {fieldPath: status.hostIP}}
"""


def test_env_and_expansion_inside_the_container(node_factory: Any, manifests: Path) -> None:
    node: KletNode = node_factory(manifest_dir=manifests)
    node.start()
    (manifests / "env.yaml").write_text(POD)
    full = f"envtest-{node.node_name}"
    pod = wait_for(
        lambda: (p := node.pods().get(full)) and p["status"]["phase"] == "Succeeded" and p,
        timeout_s=20,
        what="envtest Succeeded",
    )
    log_file = next(node.logs_dir.glob(f"default_{full}_*")) / "main" / "0.log"
    lines = [line.split(" ", 3)[3] for line in log_file.read_text().splitlines()]
    assert lines == [
        "GREETING=hello world",
        "ARG=hello world",
        "LIT=$(GREETING)",
        "LABEL=envy",
        f"NAME={full}",
        f"IP={pod['status']['podIP']}",
        "MEM=64",
        "UNDEF=$(NOPE)",
    ]


def test_host_network_pod_ip_is_the_nodes(node_factory: Any, manifests: Path) -> None:
    node: KletNode = node_factory(manifest_dir=manifests)
    node.start()
    (manifests / "hostnet.yaml").write_text(HOST_NETWORK_POD)
    full = f"hostnet-{node.node_name}"
    done = ("Succeeded", "Failed")
    pod = wait_for(
        lambda: (p := node.pods().get(full)) and p["status"]["phase"] in done and p,
        timeout_s=20,
        what="hostnet finished",
    )
    status = pod["status"]
    log_file = next(node.logs_dir.glob(f"default_{full}_*")) / "main" / "0.log"
    lines = [line.split(" ", 3)[3] for line in log_file.read_text().splitlines()]
    assert status["phase"] == "Succeeded", lines
    host_ip = status["hostIP"]
    assert host_ip and status["podIP"] == host_ip
    assert status["podIPs"] == [{"ip": host_ip}]
    assert lines == [f"POD_IP={host_ip}", f"POD_IPS={host_ip}", f"HOST_IP={host_ip}"]
