"""klet installed into a real cluster as pods, managing a node of its own.

The cluster harness's kube-apiserver and a klet node "host" (the harness's own, on the
dev stack's containerd A) run klet's five services and its Redis as pods bound to
"host": the `klet` and `klet-redis` images from tools/image, pushed to the dev stack's
registry; hostNetwork, hostPID, privileged, the root dir mounted with
`mountPropagation: Bidirectional`, the pod logs dir, the runtime's socket directory,
cgroups, the run dir, the bus secrets; the KubeletConfiguration in a ConfigMap and a
`system:node:inner` kubeconfig in a Secret. The klet they make up ("inner") runs on a
second private containerd B with its own root dir, run dir and ports
(tests/harness/innernode.py), and must register Node `inner`, become Ready, renew its
Lease and run a pod bound to it, pulling busybox from the registry.
"""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from klet.cri import CRISettings, RuntimeClient
from klet.devstack import BUSYBOX_IMAGE, TEST_REGISTRY_HOST, DevStack
from klet.devstack.cluster import ControlPlane

from tests.harness.clusternode import cluster_node
from tests.harness.innernode import InnerHost, inner_host, separate
from tests.harness.node import KletNode
from tests.harness.waiting import wait_for
from tools.image.__main__ import version

pytestmark = [pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("pod-source", "syncloop", "status-reporter", "eviction", "image-gc")
NAMESPACE = "klet-system"
HOST = "host"
INNER = "inner"
CONFIG_DIR = "/etc/klet"
KUBERNETES_DIR = "/etc/kubernetes"
SLEEPER = "trap 'exit 0' TERM; sleep 100000 & wait"


def kubelet_config(inner: InnerHost) -> str:
    return f"""apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
port: {inner.port}
healthzPort: {inner.healthz_port}
readOnlyPort: {inner.read_only_port}
"""


def host_path(name: str, path: Path | str, *, kind: str = "Directory") -> dict[str, Any]:
    return {"name": name, "hostPath": {"path": str(path), "type": kind}}


def same_path(name: str, path: Path | str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "mountPath": str(path), **extra}


def service_pod(service: str, inner: InnerHost, image: str) -> dict[str, Any]:
    """One klet service as a pod on the host node, for the inner node."""
    flags = [
        f"--config={CONFIG_DIR}/kubelet-config.yaml",
        f"--hostname-override={inner.name}",
        "--node-ip=$(NODE_IP)",
        f"--root-dir={inner.root_dir}",
        f"--cert-dir={inner.root_dir}/pki",
        f"--pod-logs-dir={inner.logs_dir}",
        f"--container-runtime-endpoint={inner.runtime_endpoint}",
        f"--kubeconfig={KUBERNETES_DIR}/kubelet.conf",
    ]
    env = {
        "KLET_RUN_DIR": str(inner.run_dir),
        "KLET_REDIS_URL": f"unix://{inner.redis_socket_dir}/redis.sock",
        "KLET_REDIS_USERNAME": f"klet-{service}@{inner.name}",
        "KLET_REDIS_PASSWORD_FILE": str(inner.bus_dir / "secrets" / inner.name / service),
        "KLET_LOG_FORMAT": "text",
        "KLET_SERVICE_PORT": "0",
        "KLET_SERVICE_PORT_FILE": "/tmp/klet-service-port.json",
    }
    probe = {
        "exec": {"command": ["klet", "healthcheck", service]},
        "periodSeconds": 10,
        "timeoutSeconds": 15,
        "failureThreshold": 3,
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": service,
            "namespace": NAMESPACE,
            "labels": {"app.kubernetes.io/name": "klet", "app.kubernetes.io/component": service},
        },
        "spec": {
            "nodeName": HOST,
            "hostNetwork": True,
            "hostPID": True,
            "dnsPolicy": "ClusterFirstWithHostNet",
            "terminationGracePeriodSeconds": 30,
            "containers": [
                {
                    "name": service,
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "args": ["run", service, *flags],
                    "env": [
                        *({"name": k, "value": v} for k, v in env.items()),
                        {
                            "name": "NODE_IP",
                            "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}},
                        },
                    ],
                    "securityContext": {"privileged": True},
                    "livenessProbe": {**probe, "initialDelaySeconds": 30},
                    "readinessProbe": probe,
                    "volumeMounts": [
                        same_path("config", CONFIG_DIR, readOnly=True),
                        same_path("kubeconfig", KUBERNETES_DIR, readOnly=True),
                        same_path("root", inner.root_dir, mountPropagation="Bidirectional"),
                        same_path("logs", inner.logs_dir),
                        same_path("runtime", inner.socket_dir),
                        same_path("run", inner.run_dir),
                        same_path("cgroup", "/sys/fs/cgroup"),
                        same_path("bus", inner.bus_dir / "secrets", readOnly=True),
                    ],
                }
            ],
            "volumes": [
                {"name": "config", "configMap": {"name": "inner-config"}},
                {"name": "kubeconfig", "secret": {"secretName": "inner-kubeconfig"}},
                host_path("root", inner.root_dir),
                host_path("logs", inner.logs_dir),
                host_path("runtime", inner.socket_dir),
                host_path("run", inner.run_dir),
                host_path("cgroup", "/sys/fs/cgroup"),
                host_path("bus", inner.bus_dir / "secrets"),
            ],
        },
    }


def redis_pod(inner: InnerHost, klet_image: str, redis_image: str) -> dict[str, Any]:
    """Redis on a unix socket only, its ACL file and passwords from `klet bus-acl`."""
    acl = inner.bus_dir / "users.acl"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "redis",
            "namespace": NAMESPACE,
            "labels": {"app.kubernetes.io/name": "klet", "app.kubernetes.io/component": "redis"},
        },
        "spec": {
            "nodeName": HOST,
            "automountServiceAccountToken": False,
            "initContainers": [
                {
                    "name": "bus-acl",
                    "image": klet_image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": [
                        "klet",
                        "bus-acl",
                        f"--node={inner.name}",
                        f"--secrets-dir={inner.bus_dir / 'secrets'}",
                        f"--acl-file={acl}",
                    ],
                    "volumeMounts": [same_path("bus", inner.bus_dir)],
                }
            ],
            "containers": [
                {
                    "name": "redis",
                    "image": redis_image,
                    "imagePullPolicy": "IfNotPresent",
                    "args": [
                        "--port",
                        "0",
                        "--unixsocket",
                        f"{inner.redis_socket_dir}/redis.sock",
                        "--unixsocketperm",
                        "600",
                        "--aclfile",
                        str(acl),
                        "--save",
                        "",
                        "--appendonly",
                        "no",
                    ],
                    "volumeMounts": [
                        same_path("socket", inner.redis_socket_dir),
                        same_path("bus", inner.bus_dir, readOnly=True),
                    ],
                }
            ],
            "volumes": [
                host_path("socket", inner.redis_socket_dir),
                host_path("bus", inner.bus_dir),
            ],
        },
    }


def busybox_pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": INNER,
            "terminationGracePeriodSeconds": 2,
            "containers": [
                {"name": "main", "image": BUSYBOX_IMAGE, "command": ["sh", "-c", SLEEPER]}
            ],
        },
    }


@dataclass
class Install:
    plane: ControlPlane
    host: KletNode
    inner: InnerHost

    def kubectl(self, *args: str, timeout_s: float = 60) -> str:
        res = self.plane.kubectl(*args, timeout_s=timeout_s)
        assert res.returncode == 0, f"kubectl {' '.join(args)}: {res.stderr}"
        return res.stdout

    def get(self, *args: str) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(self.kubectl("get", *args, "-o", "json"))
        return found

    def ready(self, kind: str, name: str, *, namespace: str = NAMESPACE) -> bool:
        obj = self.get(kind, name, "-n", namespace)
        conditions = obj.get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def node_ready(self, name: str) -> bool:
        node = self.get("node", name)
        conditions = node.get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def lease_renewed(self, name: str) -> str:
        lease = self.get("lease", name, "-n", "kube-node-lease")
        return str(lease["spec"]["renewTime"])

    def logs(self) -> str:
        out = []
        for component in ("redis", *SERVICES):
            res = self.plane.kubectl("logs", "-n", NAMESPACE, component, "--tail=60")
            out.append(f"--- {component}:\n{res.stdout[-6000:]}{res.stderr[-500:]}")
        return "\n".join(out)

    def inner_containers(self) -> dict[str, tuple[str, int, str]]:
        """Pod/container name -> (container ID, attempt, state) on containerd B."""

        async def go() -> dict[str, tuple[str, int, str]]:
            cri = RuntimeClient(
                CRISettings(runtime_endpoint=self.inner.runtime_endpoint, timeout_s=10)
            )
            try:
                return {
                    f"{c.labels.get('io.kubernetes.pod.name', '')}/{c.name}": (
                        c.id,
                        c.attempt,
                        c.state.value,
                    )
                    for c in await cri.list_containers()
                }
            finally:
                await cri.close()

        return asyncio.run(go())


def push_images(stack: DevStack, out: Path) -> tuple[str, str]:
    """Build both images with tools/image and push them to the stack's registry;
    their references as the runtimes pull them."""
    res = subprocess.run(
        [sys.executable, "-m", "tools.image", "--out-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    refs = []
    for name in ("klet", "klet-redis"):
        subprocess.run(
            [
                "skopeo",
                "copy",
                "--quiet",
                "--dest-tls-verify=false",
                f"oci-archive:{out / f'{name}-{version()}.oci.tar'}",
                f"docker://{stack.registry_address}/{name}:{version()}",
            ],
            check=True,
            capture_output=True,
            timeout=300,
        )
        refs.append(f"{TEST_REGISTRY_HOST}/{name}:{version()}")
    return refs[0], refs[1]


@pytest.fixture(scope="module")
def install(
    tmp_path_factory: pytest.TempPathFactory, devstack: DevStack, control_plane: ControlPlane
) -> Iterator[Install]:
    tmp = tmp_path_factory.mktemp("helm")
    began = time.monotonic()
    klet_image, redis_image = push_images(devstack, tmp / "image")
    print(f"images built and pushed in {time.monotonic() - began:.0f}s")
    with (
        cluster_node(control_plane, devstack, tmp / "host", name=HOST) as host,
        inner_host(devstack, name=INNER) as inner,
    ):
        separate(inner, host, devstack)
        d = Install(control_plane, host, inner)
        control_plane.prepare_namespace(NAMESPACE)
        kubeconfig = control_plane.node_kubeconfig(INNER).read_bytes()
        try:
            control_plane.apply(
                [
                    {
                        "apiVersion": "v1",
                        "kind": "ConfigMap",
                        "metadata": {"name": "inner-config", "namespace": NAMESPACE},
                        "data": {"kubelet-config.yaml": kubelet_config(inner)},
                    },
                    {
                        "apiVersion": "v1",
                        "kind": "Secret",
                        "metadata": {"name": "inner-kubeconfig", "namespace": NAMESPACE},
                        "data": {"kubelet.conf": base64.b64encode(kubeconfig).decode()},
                    },
                    redis_pod(inner, klet_image, redis_image),
                ]
            )
            wait_for(lambda: d.ready("pod", "redis"), timeout_s=180, what="Redis pod Ready")
            print(f"redis ready after {time.monotonic() - began:.0f}s")
            control_plane.apply([service_pod(s, inner, klet_image) for s in SERVICES])
            wait_for(
                lambda: all(d.ready("pod", s) for s in SERVICES),
                timeout_s=240,
                what="every service pod Ready",
            )
            print(f"services ready after {time.monotonic() - began:.0f}s")
            yield d
        finally:
            print(d.logs())
            d.kubectl("delete", "pods", "-n", NAMESPACE, "--all", "--wait=true", timeout_s=120)
            control_plane.kubectl(
                "delete",
                "pods",
                "--all-namespaces",
                f"--field-selector=spec.nodeName={INNER}",
                "--grace-period=0",
                "--force",
            )
            control_plane.kubectl("delete", "node", INNER, "--ignore-not-found")
            control_plane.kubectl("delete", "namespace", NAMESPACE, "--wait=false")


def test_inner_node_ready_with_lease_renewed(install: Install) -> None:
    d = install
    wait_for(lambda: d.node_ready(INNER), timeout_s=120, what="Node inner Ready")
    first = wait_for(lambda: d.lease_renewed(INNER), timeout_s=60, what="inner's Lease")
    wait_for(lambda: d.lease_renewed(INNER) != first, timeout_s=60, what="inner's Lease renewed")


def test_pod_bound_to_inner_runs_on_containerd_b(install: Install) -> None:
    d = install
    d.plane.apply([busybox_pod("on-inner")])
    try:
        wait_for(
            lambda: d.get("pod", "on-inner", "-n", "default")["status"].get("phase") == "Running",
            timeout_s=120,
            what="pod on-inner Running",
        )
        containers = d.inner_containers()
        assert containers["on-inner/main"][2] == "CONTAINER_RUNNING", containers
    finally:
        d.kubectl("delete", "pod", "on-inner", "-n", "default", "--wait=true", timeout_s=90)
