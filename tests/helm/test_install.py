"""`helm install` of helm/klet into a real cluster: klet's services run as pods on a
harness node and manage a node of their own.

The full control plane (kube-apiserver, kube-controller-manager, kube-scheduler) and a
klet node "host" (the harness's own, its services as processes on the dev stack's
containerd A). The `klet` and `klet-redis` images from tools/image are pushed to the
dev stack's registry. `helm install --wait` of the chart with a values file this test
writes: every workload on "host" (nodeSelector), syncloop a Deployment (so it can be
scaled), node.name `inner`, a `system:node:inner` kubeconfig Secret
(credentials.existingSecret), the apiserver's loopback URL, and every path and port of
a second private containerd B, its own root dir, run dir and ports
(tests/harness/innernode.py, which asserts no two nodes share any of them).

Then: each running container (read from /proc on the host: effective capabilities, no
new privileges, user, PID namespace, mount points and whether they are read-only) has
what the release's manifest gives it and nothing more, each service sees its own bus
password and no other, and Redis no service's (a reader's cri-proxy container none);
pod-source sees the static pod directory and nothing else of its parent directory;
status-reporter, eviction and image-gc see no runtime socket, only their own CRI proxy
socket, and status-reporter's lists containerd B's containers and is refused
CreateContainer (PERMISSION_DENIED naming it); the inner Node is Ready and renews its
Lease; `helm test` passes with its pod on
the inner node; a Deployment (no nodeName, a nodeSelector for `inner`) is scheduled and
runs there, writing into a hostPath that only the host has (not mounted into klet's
pods; type Directory where klet can read the host's root through /proc/1/root);
`kubectl rollout restart` of every klet workload, `kubectl scale` of syncloop to 2 and
deleting the pod of the lease holder (found through the leader slot file in the run
dir), and a `helm upgrade` that changes kubeletConfig (maxPods, seen in the Node's
capacity) each leave the inner node's containers (IDs and attempts, from containerd B
through CRI) and restart counts unchanged, and the Node Ready throughout (polled every
half second); `helm uninstall` leaves no object of the release in the cluster.

Client and serving certificates come from the harness's CA: the credentials Secret
holds the node's kubeconfig and the 10250 API's serving certificate and client CA
(kubeletConfig tlsCertFile, tlsPrivateKeyFile, authentication.x509.clientCAFile point
into it), without which the apiserver refuses klet's certificate for `kubectl logs`.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from klet.cri import CRISettings, RuntimeClient
from klet.cri import labels as L
from klet.devstack import BUSYBOX_IMAGE, TEST_REGISTRY_HOST, DevStack
from klet.model.layout import (
    EVICTION,
    GRPC_SERVERS,
    IMAGE_GC,
    SYNCLOOP,
    grpc_socket,
    leader_slot,
)
from klet.testbed.cluster import ControlPlane

from tests.harness.clusternode import cluster_node
from tests.harness.helmbin import helm_binary
from tests.harness.innernode import InnerHost, inner_host, separate
from tests.harness.node import KletNode
from tests.harness.nodewatch import NodeWatch
from tests.harness.procfs import status_field
from tests.harness.waiting import wait_for
from tools.image.__main__ import version

pytestmark = [pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "klet"
SERVICES = ("pod-source", "syncloop", "status-reporter", "eviction", "image-gc")
NAMESPACE = "klet-system"
RELEASE = "klet"
HOST = "host"
INNER = "inner"
SLEEPER = "trap 'exit 0' TERM; sleep 100000 & wait"
CREDENTIALS = "inner-credentials"
SECRET_DIR = "/etc/klet/credentials"
"""Where the chart mounts credentials.existingSecret."""
WORKLOAD = "sleepers"
"""The Deployment on the inner node whose containers no disruption may touch."""


def values(inner: InnerHost, plane: ControlPlane, *, max_pods: int) -> dict[str, Any]:
    on_host = {"kubernetes.io/hostname": HOST}
    return {
        "image": {"repository": f"{TEST_REGISTRY_HOST}/klet", "pullPolicy": "IfNotPresent"},
        "redis": {"image": {"repository": f"{TEST_REGISTRY_HOST}/klet-redis"}},
        "node": {"name": inner.name, "ip": "127.0.0.1"},
        # No kube-proxy in the test cluster: the apiserver's own address.
        "apiServer": {"url": plane.server},
        "credentials": {"existingSecret": CREDENTIALS, "key": "kubeconfig"},
        "kubeletConfig": {
            # The 10250 API's serving certificate, signed by the CA the apiserver checks
            # kubelets against (else `kubectl logs` fails verification), and the CA of
            # the apiserver's client certificate: files in the credentials Secret.
            "tlsCertFile": f"{SECRET_DIR}/kubelet.crt",
            "tlsPrivateKeyFile": f"{SECRET_DIR}/kubelet.key",
            "authentication": {"x509": {"clientCAFile": f"{SECRET_DIR}/ca.crt"}},
            "port": inner.port,
            "healthzPort": inner.healthz_port,
            "readOnlyPort": inner.read_only_port,
            "staticPodPath": str(inner.dir / "kubernetes" / "manifests"),
            "maxPods": max_pods,
        },
        "paths": {
            "rootDir": str(inner.root_dir),
            # status-reporter's serving key: a directory of the test's, not the host's
            # /var/lib/klet/pki (the chart's default).
            "certDir": str(inner.dir / "pki"),
            "podLogsDir": str(inner.logs_dir),
            "containerRuntimeEndpoint": inner.runtime_endpoint,
            "runtimeSocketDir": str(inner.socket_dir),
            "imageFsDir": str(inner.containerd.root),
            "runDir": str(inner.run_dir),
            "redisSocketDir": str(inner.redis_socket_dir),
            "busDir": str(inner.bus_dir),
        },
        "logFormat": "text",
        "serviceDefaults": {"nodeSelector": on_host},
        "services": {"syncloop": {"kind": "Deployment", "replicas": 1}},
        # The test pod reaches the apiserver on the host's loopback address.
        "tests": {"hostNetwork": True},
    }


def host_root_readable() -> bool:
    """Whether root may read PID 1's root (klet.hostfs), as klet's privileged hostPID
    pods then may: not on a VM whose PID 1 is non-dumpable (a firecracker init)."""
    try:
        os.stat("/proc/1/root")
    except OSError:
        return False
    return True


def sleepers(host_dir: Path, host_type: str) -> dict[str, Any]:
    """Two replicas on the inner node, each writing its name into a hostPath directory
    that is not mounted into klet's pods. With `host_type` Directory (the directory
    exists on the host only) syncloop must check it on the host, where containerd B
    mounts it from; DirectoryOrCreate passes either way (containerd makes a missing
    source directory), for hosts where klet cannot reach the host's root."""
    labels = {"app": WORKLOAD}
    command = f'echo up > "/data/$HOSTNAME"; {SLEEPER}'
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": WORKLOAD, "namespace": "default"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": INNER},
                    "terminationGracePeriodSeconds": 2,
                    "volumes": [
                        {
                            "name": "data",
                            "hostPath": {"path": str(host_dir), "type": host_type},
                        }
                    ],
                    "containers": [
                        {
                            "name": "main",
                            "image": BUSYBOX_IMAGE,
                            "command": ["sh", "-c", command],
                            "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                        }
                    ],
                },
            },
        },
    }


@dataclass
class Install:
    plane: ControlPlane
    host: KletNode
    inner: InnerHost
    helm_bin: Path
    home: Path
    values_file: Path
    watch: NodeWatch
    installed: bool = False

    def kubectl(self, *args: str, timeout_s: float = 60) -> str:
        res = self.plane.kubectl(*args, timeout_s=timeout_s)
        assert res.returncode == 0, f"kubectl {' '.join(args)}: {res.stderr}"
        return res.stdout

    def get(self, *args: str) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(self.kubectl("get", *args, "-o", "json"))
        return found

    def helm(self, *args: str, timeout_s: float = 420) -> str:
        env = {
            **os.environ,
            "KUBECONFIG": str(self.plane.admin_kubeconfig),
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_DATA_HOME": str(self.home / "data"),
        }
        res = subprocess.run(
            [str(self.helm_bin), *args, "--namespace", NAMESPACE],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        assert res.returncode == 0, f"helm {' '.join(args)}:\n{res.stdout}\n{res.stderr}"
        return res.stdout

    def write_values(self, *, max_pods: int) -> Path:
        self.values_file.write_text(
            json.dumps(values(self.inner, self.plane, max_pods=max_pods), indent=2)
        )
        return self.values_file

    def node(self) -> dict[str, Any]:
        return self.get("node", INNER)

    def node_ready(self) -> bool:
        conditions = self.node().get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def lease_renewed(self) -> str:
        return str(self.get("lease", INNER, "-n", "kube-node-lease")["spec"]["renewTime"])

    def pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.get("pods", "-n", namespace, "-l", selector)["items"]
        return items

    def workloads(self) -> list[str]:
        """kind/name of every workload of the release."""
        out = self.kubectl(
            "get",
            "daemonsets,deployments",
            "-n",
            NAMESPACE,
            "-l",
            f"app.kubernetes.io/instance={RELEASE}",
            "-o",
            "name",
        )
        return out.split()

    def rolled_out(self) -> None:
        for workload in self.workloads():
            self.kubectl(
                "rollout", "status", workload, "-n", NAMESPACE, "--timeout=240s", timeout_s=260
            )

    def sleepers_state(self) -> dict[str, tuple[str, int, str, int]]:
        """Pod/container -> (container ID, attempt, state) from containerd B, and the
        restart count the apiserver holds."""
        pods = self.pods("default", f"app={WORKLOAD}")
        restarts = {
            p["metadata"]["name"]: sum(
                c.get("restartCount", 0) for c in p["status"].get("containerStatuses", [])
            )
            for p in pods
        }
        assert all(p["spec"].get("nodeName") == INNER for p in pods), pods

        async def go() -> dict[str, tuple[str, int, str, int]]:
            cri = RuntimeClient(
                CRISettings(runtime_endpoint=self.inner.runtime_endpoint, timeout_s=10)
            )
            try:
                out = {}
                for c in await cri.list_containers():
                    pod = c.labels.get(L.POD_NAME, "")
                    if pod in restarts:
                        out[f"{pod}/{c.name}"] = (c.id, c.attempt, c.state.value, restarts[pod])
                return out
            finally:
                await cri.close()

        return asyncio.run(go())

    def sleepers_running(self) -> bool:
        pods = self.pods("default", f"app={WORKLOAD}")
        return len(pods) == 2 and all(
            p["status"].get("phase") == "Running"
            and all(c.get("ready") for c in p["status"].get("containerStatuses", []))
            for p in pods
        )

    def leader_pid(self, service: str) -> int | None:
        """The host PID of the service's lease holder, from its leader slot file in the
        run dir (the services run with hostPID); None when there is no live one."""
        slot = leader_slot(self.inner.run_dir, service)
        try:
            parts = slot.read_text().strip().split(":")
        except FileNotFoundError:
            return None
        if len(parts) != 3 or not parts[1].isdigit():
            return None
        pid = int(parts[1])
        return pid if Path(f"/proc/{pid}").exists() else None

    def logs(self) -> str:
        res = self.plane.kubectl(
            "logs",
            "-n",
            NAMESPACE,
            "-l",
            f"app.kubernetes.io/instance={RELEASE}",
            "--all-containers",
            "--prefix",
            "--tail=40",
            "--max-log-requests=20",
        )
        return res.stdout[-30000:] + res.stderr[-2000:]


def pids_of_pod(uid: str) -> list[int]:
    """The host PIDs of the processes in the pod's cgroups (its path names the UID)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cgroups = (proc / "cgroup").read_text()
        except OSError:
            continue
        if uid in cgroups or uid.replace("-", "_") in cgroups:
            found.append(int(proc.name))
    return found


def main_pid(pod: dict[str, Any], marker: str) -> int:
    """The PID of the pod's process whose command line holds `marker` (its main
    container's; the init containers have exited)."""
    for pid in pids_of_pod(pod["metadata"]["uid"]):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        # Redis rewrites its title: "redis-server *:0".
        if any(a == marker.encode() or a.startswith(f"{marker} ".encode()) for a in argv):
            return pid
    raise AssertionError(f"no process running {marker} in pod {pod['metadata']['name']}")


def mount_points(pid: int) -> dict[str, bool]:
    """Mount point -> writable, as process `pid` sees its mounts (the last mount on a
    path is the one in force)."""
    out = {}
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        fields = line.split()
        out[fields[4]] = "ro" not in fields[5].split(",")
    return out


CAPABILITIES = {"CHOWN": 0, "DAC_READ_SEARCH": 2}


def pod_of_pid(pid: int, pods: list[dict[str, Any]]) -> dict[str, Any]:
    """The pod whose cgroup holds `pid` (its cgroup path names the pod UID)."""
    cgroups = Path(f"/proc/{pid}/cgroup").read_text()
    for pod in pods:
        uid = pod["metadata"]["uid"]
        if uid in cgroups or uid.replace("-", "_") in cgroups:
            return pod
    raise AssertionError(f"no pod holds pid {pid}: {cgroups}")


def push_images(stack: DevStack, out: Path) -> None:
    """Build both images with tools/image and push them to the stack's registry, where
    both runtimes pull them as registry.klet.test/<name>:<version>."""
    res = subprocess.run(
        [sys.executable, "-m", "tools.image", "--out-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert res.returncode == 0, res.stderr[-3000:]
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


def uninstalled(d: Install) -> list[str]:
    """Every object of the release still in the cluster."""
    out = d.kubectl(
        "get",
        "all,configmaps,secrets,serviceaccounts,roles,rolebindings,clusterroles,"
        "clusterrolebindings",
        "--all-namespaces",
        "-l",
        f"app.kubernetes.io/instance={RELEASE}",
        "-o",
        "name",
    )
    return out.split()


@pytest.fixture(scope="module")
def install(
    tmp_path_factory: pytest.TempPathFactory,
    devstack: DevStack,
    full_control_plane: ControlPlane,
) -> Iterator[Install]:
    plane = full_control_plane
    tmp = tmp_path_factory.mktemp("helm")
    began = time.monotonic()
    helm_bin = helm_binary("v4")
    push_images(devstack, tmp / "image")
    print(f"images built and pushed in {time.monotonic() - began:.0f}s")
    with (
        cluster_node(plane, devstack, tmp / "host", name=HOST) as host,
        inner_host(devstack, name=INNER) as inner,
    ):
        separate(inner, host, devstack)
        (inner.dir / "kubernetes" / "manifests").mkdir(parents=True)
        # What a control-plane node keeps beside the manifests: pod-source must not see it.
        (inner.dir / "kubernetes" / "admin.conf").write_text("a stand-in for admin.conf\n")
        d = Install(
            plane,
            host,
            inner,
            helm_bin,
            tmp / "helm-home",
            tmp / "values.json",
            NodeWatch(plane, INNER),
        )
        plane.prepare_namespace(NAMESPACE)
        serving = plane.issue_kubelet_serving_cert(INNER, ["127.0.0.1"])
        files = {
            "kubeconfig": plane.node_kubeconfig(INNER),
            "kubelet.crt": serving.cert,
            "kubelet.key": serving.key,
            "ca.crt": plane.ca_file,
        }
        plane.apply(
            [
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": CREDENTIALS, "namespace": NAMESPACE},
                    "data": {
                        k: base64.b64encode(f.read_bytes()).decode() for k, f in files.items()
                    },
                }
            ]
        )
        try:
            d.helm(
                "install",
                RELEASE,
                str(CHART),
                "--values",
                str(d.write_values(max_pods=110)),
                "--wait",
                "--timeout=6m",
            )
            d.installed = True
            print(f"helm install --wait done after {time.monotonic() - began:.0f}s")
            d.watch.thread.start()
            yield d
        finally:
            d.watch.stopping.set()
            if d.installed:
                print(d.logs())
                d.kubectl("delete", "deployment", WORKLOAD, "-n", "default", "--ignore-not-found")
                d.helm("uninstall", RELEASE, "--wait", "--timeout=3m", timeout_s=240)
            plane.kubectl(
                "delete",
                "pods",
                "--all-namespaces",
                f"--field-selector=spec.nodeName={INNER}",
                "--grace-period=0",
                "--force",
            )
            plane.kubectl("delete", "node", INNER, "--ignore-not-found")
            plane.kubectl("delete", "namespace", NAMESPACE, "--wait=false")


def assert_untouched(d: Install, before: dict[str, tuple[str, int, str, int]], what: str) -> None:
    """The inner node's containers are the same (IDs, attempts, restart counts), its
    pods Running and ready, and the Node never left Ready."""
    wait_for(d.sleepers_running, timeout_s=60, what=f"{WORKLOAD} Running after {what}")
    assert d.sleepers_state() == before, what
    assert d.watch.ready_seen and not d.watch.flaps, f"Node inner left Ready: {d.watch.flaps}"


def test_each_container_has_only_what_it_uses(install: Install) -> None:
    """What the kernel says each running container has is what the release's manifest
    (which tests/helm/test_chart checks against the compose file's table) gives it: the
    effective capabilities (every one this host has for syncloop), no new privileges
    for the others, root (Redis: its own user), the host's PID namespace for syncloop
    alone, and each mount the manifest names, read-only where it says so. Each service
    reads its own bus password and sees no other; Redis sees its three bus files and no
    service's password. Each gRPC socket is seen only where it is served or called:
    image-gc's container cannot see syncloop's PodControl socket, eviction's can."""
    d = install
    manifest = [
        doc
        for doc in yaml.safe_load_all(d.helm("get", "manifest", RELEASE))
        if doc and doc["kind"] in ("DaemonSet", "Deployment")
    ]
    host_pid_ns = os.readlink("/proc/self/ns/pid")
    host_caps = int(status_field("self", "CapBnd"), 16)
    bus = d.inner.bus_dir
    assert {w["metadata"]["labels"]["app.kubernetes.io/component"] for w in manifest} == {
        *SERVICES,
        "redis",
    }
    for w, component, c, pod in running_containers(d, manifest):
        spec = w["spec"]["template"]["spec"]
        context = c["securityContext"]
        marker = {"redis": "redis-server", "cri-proxy": "cri-proxy"}.get(c["name"], component)
        pid = main_pid(pod, marker)
        what = f"{component}/{c['name']} ({pod['metadata']['name']}, pid {pid})"
        effective = int(status_field(pid, "CapEff"), 16)
        if context.get("privileged"):
            assert effective == host_caps, what
        else:
            added = context["capabilities"].get("add", [])
            assert effective == sum(1 << CAPABILITIES[a] for a in added), what
            assert status_field(pid, "NoNewPrivs") == "1", what
        uid = context.get("runAsUser", 0)
        assert status_field(pid, "Uid").split()[1] == str(uid), what
        shared = os.readlink(f"/proc/{pid}/ns/pid") == host_pid_ns
        assert shared is bool(spec.get("hostPID")), what
        seen = mount_points(pid)
        assert seen["/"] is not context.get("readOnlyRootFilesystem", False), what
        for m in c["volumeMounts"]:
            assert m["mountPath"] in seen, f"{what}: {m['mountPath']} not mounted"
            assert seen[m["mountPath"]] is not m.get("readOnly", False), (what, m)
        root = Path(f"/proc/{pid}/root")
        assert not (root / str(bus / "secrets").lstrip("/")).exists(), what
        if component == "pod-source":
            # The manifests directory alone, none of its parent's other files.
            kubernetes = root / str(d.inner.dir / "kubernetes").lstrip("/")
            assert [p.name for p in kubernetes.iterdir()] == ["manifests"], what
        if c["name"] == "cri-proxy":
            assert not (root / "etc/klet/bus/password").exists(), what
        elif component != "redis":
            own = (root / "etc/klet/bus/password").read_text()
            assert own == (bus / "secrets" / INNER / component).read_text(), what
            assert not [p for p in seen if p.startswith(str(bus))], what

    # Each gRPC socket in its server's pod and its callers' alone: eviction's container
    # sees syncloop's PodControl socket and image-gc's, image-gc's its own and not
    # syncloop's, pod-source's and status-reporter's none (the leaders serve them).
    run = d.inner.run_dir
    for service, servers in {
        "eviction": (SYNCLOOP, IMAGE_GC, EVICTION),
        "image-gc": (IMAGE_GC,),
        "pod-source": (),
        "status-reporter": (),
    }.items():
        for pod in d.pods(NAMESPACE, f"app.kubernetes.io/component={service}"):
            root = Path(f"/proc/{main_pid(pod, service)}/root")
            for server in GRPC_SERVERS:
                sock = root / str(grpc_socket(run, server)).lstrip("/")
                if server in servers:
                    wait_for(sock.is_socket, timeout_s=60, what=f"{service} sees {sock}")
                else:
                    assert not sock.exists(), f"{service} sees {server}'s gRPC socket"
                    assert not sock.parent.exists(), f"{service} sees {sock.parent}"


def running_containers(
    d: Install, manifest: list[dict[str, Any]]
) -> Iterator[tuple[dict[str, Any], str, dict[str, Any], dict[str, Any]]]:
    """(workload, component, container spec, pod) of every running container of the
    release's workloads: a reader's cri-proxy beside the service."""
    for w in manifest:
        component = w["metadata"]["labels"]["app.kubernetes.io/component"]
        for c in w["spec"]["template"]["spec"]["containers"]:
            for pod in d.pods(NAMESPACE, f"app.kubernetes.io/component={component}"):
                yield w, component, c, pod


# Run on the host against a socket seen through a container's /proc/<pid>/root: two raw
# calls (an empty request is a valid empty message of either), each one's status code.
CRI_PROBE = """
import sys, grpc
with grpc.insecure_channel("unix://" + sys.argv[1]) as channel:
    for method in ("ListContainers", "CreateContainer"):
        call = channel.unary_unary(f"/runtime.v1.RuntimeService/{method}")
        try:
            call(b"", timeout=20)
            print(method, "OK")
        except grpc.RpcError as err:
            print(method, err.code().name, err.details())
"""


def test_readers_reach_the_runtime_only_through_their_cri_proxy(install: Install) -> None:
    """In the running pods: status-reporter, eviction and image-gc see no runtime socket
    (the inner node's containerd B), only their own proxy socket in /run/klet-cri;
    status-reporter's, reached through its container's root, lists containerd B's
    containers and is refused CreateContainer with PERMISSION_DENIED naming it."""
    d = install
    runtime_socket = d.inner.runtime_endpoint.removeprefix("unix://").lstrip("/")
    for service in ("status-reporter", "eviction", "image-gc"):
        for pod in d.pods(NAMESPACE, f"app.kubernetes.io/component={service}"):
            root = Path(f"/proc/{main_pid(pod, service)}/root")
            assert not (root / runtime_socket).exists(), f"{service} sees the runtime socket"
            assert [p.name for p in (root / "run/klet-cri").iterdir()] == ["cri.sock"], service
    (pod,) = d.pods(NAMESPACE, "app.kubernetes.io/component=status-reporter")
    sock = Path(f"/proc/{main_pid(pod, 'status-reporter')}/root/run/klet-cri/cri.sock")
    probe = subprocess.run(
        [sys.executable, "-c", CRI_PROBE, str(sock)], capture_output=True, text=True, timeout=60
    )
    assert probe.returncode == 0, probe.stderr
    lines = probe.stdout.splitlines()
    assert lines[0] == "ListContainers OK", probe.stdout
    assert lines[1].startswith("CreateContainer PERMISSION_DENIED "), probe.stdout
    assert "/runtime.v1.RuntimeService/CreateContainer" in lines[1], probe.stdout


def test_inner_node_ready_with_lease_renewed(install: Install) -> None:
    d = install
    wait_for(d.node_ready, timeout_s=120, what="Node inner Ready")
    first = wait_for(d.lease_renewed, timeout_s=60, what="inner's Lease")
    wait_for(lambda: d.lease_renewed() != first, timeout_s=60, what="inner's Lease renewed")


def test_helm_test_passes_on_the_inner_node(install: Install) -> None:
    d = install
    wait_for(d.node_ready, timeout_s=120, what="Node inner Ready")
    out = d.helm("test", RELEASE, "--timeout=3m", "--logs", timeout_s=240)
    print(out)
    # Helm deletes a passed test's pod; the scheduler's Event says where it ran.
    events = d.get(
        "events",
        "-n",
        NAMESPACE,
        "--field-selector",
        f"reason=Scheduled,involvedObject.name={RELEASE}-test-node",
    )["items"]
    assert events, "no Scheduled Event of the test pod"
    assert all(f" to {INNER}" in e["message"] for e in events), [e["message"] for e in events]


def test_workloads_never_touch_the_inner_nodes_pods(install: Install) -> None:
    d = install
    wait_for(d.node_ready, timeout_s=120, what="Node inner Ready")
    host_dir = d.inner.dir / "hostdata"
    host_dir.mkdir()
    host_type = "Directory" if host_root_readable() else "DirectoryOrCreate"
    print(f"hostPath type {host_type}")
    d.plane.apply([sleepers(host_dir, host_type)])
    wait_for(d.sleepers_running, timeout_s=180, what=f"{WORKLOAD} Running on inner")
    names = {p["metadata"]["name"] for p in d.pods("default", f"app={WORKLOAD}")}
    wait_for(
        lambda: {f.name for f in host_dir.iterdir()} == names,
        timeout_s=30,
        what="each replica's file in the hostPath directory on the host",
    )
    before = d.sleepers_state()
    assert len(before) == 2, before
    assert all(state == "CONTAINER_RUNNING" for _, _, state, _ in before.values()), before

    began = time.monotonic()
    for workload in d.workloads():
        d.kubectl("rollout", "restart", workload, "-n", NAMESPACE)
    d.rolled_out()
    assert_untouched(d, before, "kubectl rollout restart of every workload")
    print(f"rollout restart: {time.monotonic() - began:.0f}s")

    began = time.monotonic()
    syncloop = f"deployment/{RELEASE}-syncloop"
    d.kubectl("scale", syncloop, "-n", NAMESPACE, "--replicas=2")
    d.kubectl("rollout", "status", syncloop, "-n", NAMESPACE, "--timeout=180s", timeout_s=200)
    selector = "app.kubernetes.io/component=syncloop"
    leader = wait_for(lambda: d.leader_pid("syncloop"), timeout_s=60, what="a syncloop leader")
    victim = pod_of_pid(leader, d.pods(NAMESPACE, selector))
    d.kubectl("delete", "pod", victim["metadata"]["name"], "-n", NAMESPACE, "--wait=false")
    wait_for(
        lambda: (pid := d.leader_pid("syncloop")) is not None and pid != leader,
        timeout_s=90,
        what="another syncloop replica holding the lease",
    )
    d.kubectl("rollout", "status", syncloop, "-n", NAMESPACE, "--timeout=180s", timeout_s=200)
    assert_untouched(d, before, "deleting the syncloop leader's pod with a standby running")
    d.kubectl("scale", syncloop, "-n", NAMESPACE, "--replicas=1")
    print(f"scale + leader pod deleted: {time.monotonic() - began:.0f}s")

    began = time.monotonic()
    d.helm(
        "upgrade",
        RELEASE,
        str(CHART),
        "--values",
        str(d.write_values(max_pods=90)),
        "--wait",
        "--timeout=5m",
    )
    wait_for(
        lambda: d.node()["status"]["capacity"].get("pods") == "90",
        timeout_s=90,
        what="the Node's pod capacity from the upgraded kubeletConfig",
    )
    assert_untouched(d, before, "helm upgrade changing kubeletConfig")
    print(f"helm upgrade: {time.monotonic() - began:.0f}s")


def test_uninstall_leaves_nothing_of_the_chart(install: Install) -> None:
    d = install
    print(d.logs())
    d.kubectl("delete", "deployment", WORKLOAD, "-n", "default", "--ignore-not-found")
    wait_for(
        lambda: not d.pods("default", f"app={WORKLOAD}"),
        timeout_s=120,
        what=f"{WORKLOAD}'s pods gone",
    )
    d.helm("uninstall", RELEASE, "--wait", "--timeout=3m", timeout_s=240)
    d.installed = False
    wait_for(lambda: not uninstalled(d), timeout_s=120, what="no object of the release left")
    assert not d.pods(NAMESPACE, f"app.kubernetes.io/instance={RELEASE}")
