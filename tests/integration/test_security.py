"""Security contexts on real containerd, observed from inside the running containers.

Through CRI ExecSync: `id` shows runAsUser / runAsGroup (container over pod) and the
supplemental groups with fsGroup; /proc/self/status shows capabilities added and
dropped, a privileged container's full bounding set, NoNewPrivs for
allowPrivilegeEscalation: false and `Seccomp: 2` for a RuntimeDefault profile; a
read-only root filesystem refuses a write. Pod level: hostNetwork / hostPID / hostIPC
put the container in this host's namespaces (and a plain pod in its own), a pod
sharing its process namespace lets one container see the other's process, and
namespaced sysctls are set inside. runAsNonRoot on the (root) busybox image leaves the
container waiting with CreateContainerConfigError and upstream's message in `/pods`.
This host has no AppArmor, so AppArmor profiles are covered by the unit tests only.
"""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path
from typing import Any

from klet.cri import CRISettings, RuntimeClient
from klet.model.types import ContainerID

from tests.harness.node import KletNode, container_status
from tests.harness.pods import running
from tests.harness.waiting import wait_for

IDS_AND_PRIVILEGES = """
apiVersion: v1
kind: Pod
metadata: {name: secctx}
spec:
  terminationGracePeriodSeconds: 1
  securityContext:
    runAsUser: 1000
    runAsGroup: 3000
    fsGroup: 2000
    supplementalGroups: [4000]
  containers:
    - name: ids
      image: registry.klet.test/busybox:1.36
      command: ["sleep", "100000"]
    - name: override
      image: registry.klet.test/busybox:1.36
      command: ["sleep", "100000"]
      securityContext: {runAsUser: 2000, runAsGroup: 2500}
    - name: caps
      image: registry.klet.test/busybox:1.36
      command: ["sleep", "100000"]
      securityContext:
        runAsUser: 0
        capabilities: {add: [NET_ADMIN], drop: [chown]}
    - name: plain
      image: registry.klet.test/busybox:1.36
      command: ["sleep", "100000"]
      securityContext: {runAsUser: 0}
    - name: locked
      image: registry.klet.test/busybox:1.36
      command: ["sleep", "100000"]
      securityContext:
        runAsUser: 0
        allowPrivilegeEscalation: false
        readOnlyRootFilesystem: true
        seccompProfile: {type: RuntimeDefault}
    - name: priv
      image: registry.klet.test/busybox:1.36
      command: ["sleep", "100000"]
      securityContext: {runAsUser: 0, privileged: true}
"""

HOST_NAMESPACES = """
apiVersion: v1
kind: Pod
metadata: {name: hostns}
spec:
  terminationGracePeriodSeconds: 1
  hostNetwork: true
  hostPID: true
  hostIPC: true
  containers:
    - name: main
      image: registry.klet.test/busybox:1.36
      command: ["sleep", "100000"]
"""

SHARED_AND_SYSCTLS = """
apiVersion: v1
kind: Pod
metadata: {name: shared}
spec:
  terminationGracePeriodSeconds: 1
  shareProcessNamespace: true
  securityContext:
    sysctls:
      - {name: kernel.shm_rmid_forced, value: "1"}
      - {name: net/ipv4/ip_unprivileged_port_start, value: "80"}
  containers:
    - name: first
      image: registry.klet.test/busybox:1.36
      command: ["sleep", "100017"]
    - name: second
      image: registry.klet.test/busybox:1.36
      command: ["sleep", "100000"]
"""

NON_ROOT = """
apiVersion: v1
kind: Pod
metadata: {name: nonroot}
spec:
  securityContext: {runAsNonRoot: true}
  containers:
    - name: main
      image: registry.klet.test/busybox:1.36
      command: ["sleep", "100000"]
    - name: numeric
      image: registry.klet.test/busybox:1.36
      command: ["sleep", "100000"]
      securityContext: {runAsUser: 1000}
"""


def exec_in(node: KletNode, pod: dict[str, Any], container: str, *cmd: str) -> str:
    """Run `cmd` in the container through CRI ExecSync; its stdout (fails on non-zero)."""
    cid = container_status(pod, container)["containerID"].split("://", 1)[1]

    async def go() -> tuple[int, bytes, bytes]:
        cri = RuntimeClient(CRISettings(runtime_endpoint=node.stack.runtime_endpoint, timeout_s=30))
        try:
            return await cri.exec_sync(ContainerID(cid), list(cmd), timeout_s=20)
        finally:
            await cri.close()

    code, out, err = asyncio.run(go())
    assert code == 0, f"{cmd} in {container}: exit {code}: {err.decode()}"
    return out.decode()


def status_field(status: str, name: str) -> str:
    match = re.search(rf"^{name}:\s*(\S+)$", status, re.M)
    assert match, f"{name} not in {status}"
    return match.group(1)


def caps(node: KletNode, pod: dict[str, Any], container: str, kind: str) -> int:
    return int(status_field(exec_in(node, pod, container, "cat", "/proc/self/status"), kind), 16)


def start(node: KletNode, manifests: Path, name: str, text: str) -> dict[str, Any]:
    (manifests / f"{name}.yaml").write_text(text)
    pod: dict[str, Any] = wait_for(
        lambda: running(node, name), timeout_s=60, what=f"{name} Running"
    )
    return pod


CAP_CHOWN, CAP_NET_ADMIN = 0, 12


def test_users_groups_capabilities_and_privileges(node_factory: Any, manifests: Path) -> None:
    node: KletNode = node_factory(manifest_dir=manifests)
    node.start()
    pod = start(node, manifests, "secctx", IDS_AND_PRIVILEGES)

    ids = exec_in(node, pod, "ids", "id")
    assert re.search(r"\buid=1000\b", ids) and re.search(r"\bgid=3000\b", ids), ids
    groups = {int(g) for g in re.findall(r"\d+", ids.split("groups=", 1)[1])}
    assert {2000, 4000} <= groups, ids  # fsGroup and supplementalGroups
    override = exec_in(node, pod, "override", "id")
    assert re.search(r"\buid=2000\b", override) and re.search(r"\bgid=2500\b", override)

    plain_eff = caps(node, pod, "plain", "CapEff")
    assert plain_eff >> CAP_CHOWN & 1 and not plain_eff >> CAP_NET_ADMIN & 1
    for kind in ("CapEff", "CapBnd"):
        value = caps(node, pod, "caps", kind)
        assert value >> CAP_NET_ADMIN & 1, f"{kind} {value:x} lacks NET_ADMIN"
        assert not value >> CAP_CHOWN & 1, f"{kind} {value:x} still has CHOWN"

    with open("/proc/self/status") as f:
        host_bounding = int(status_field(f.read(), "CapBnd"), 16)
    assert caps(node, pod, "priv", "CapBnd") == host_bounding
    assert caps(node, pod, "priv", "CapEff") == host_bounding

    locked = exec_in(node, pod, "locked", "cat", "/proc/self/status")
    plain = exec_in(node, pod, "plain", "cat", "/proc/self/status")
    assert status_field(locked, "NoNewPrivs") == "1"
    assert status_field(plain, "NoNewPrivs") == "0"
    assert status_field(locked, "Seccomp") == "2"  # RuntimeDefault: a filter
    assert status_field(plain, "Seccomp") == "0"  # Unconfined is upstream's default
    wrote = exec_in(node, pod, "locked", "sh", "-c", "touch /probe 2>&1; echo rc=$?")
    assert "Read-only file system" in wrote and "rc=0" not in wrote, wrote
    assert "rc=0" in exec_in(node, pod, "plain", "sh", "-c", "touch /probe; echo rc=$?")


def test_host_namespaces(node_factory: Any, manifests: Path) -> None:
    node: KletNode = node_factory(manifest_dir=manifests)
    node.start()
    pod = start(node, manifests, "hostns", HOST_NAMESPACES)
    contrast = start(
        node,
        manifests,
        "ownns",
        HOST_NAMESPACES.replace("hostns", "ownns").replace(": true", ": false"),
    )
    for ns in ("ipc", "net", "pid"):
        mine = os.readlink(f"/proc/self/ns/{ns}")
        assert exec_in(node, pod, "main", "readlink", f"/proc/self/ns/{ns}").strip() == mine
        assert exec_in(node, contrast, "main", "readlink", f"/proc/self/ns/{ns}").strip() != mine
    # hostPID: this test's own process is visible, under its own pid.
    cmdline = exec_in(node, pod, "main", "cat", f"/proc/{os.getpid()}/cmdline")
    assert "python" in cmdline, cmdline
    # hostNetwork: the host's interfaces are there.
    host_links = set(os.listdir("/sys/class/net"))
    assert set(exec_in(node, pod, "main", "ls", "/sys/class/net").split()) == host_links
    assert set(exec_in(node, contrast, "main", "ls", "/sys/class/net").split()) != host_links


def test_shared_process_namespace_and_sysctls(node_factory: Any, manifests: Path) -> None:
    node: KletNode = node_factory(manifest_dir=manifests)
    node.start()
    pod = start(node, manifests, "shared", SHARED_AND_SYSCTLS)
    seen = exec_in(node, pod, "second", "sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '")
    assert "sleep 100017" in seen, seen  # the other container's process
    assert exec_in(node, pod, "first", "cat", "/proc/sys/kernel/shm_rmid_forced").strip() == "1"
    port_start = exec_in(node, pod, "first", "cat", "/proc/sys/net/ipv4/ip_unprivileged_port_start")
    assert port_start.strip() == "80"


def test_run_as_non_root_refuses_the_root_image(node_factory: Any, manifests: Path) -> None:
    node: KletNode = node_factory(manifest_dir=manifests)
    node.start()
    (manifests / "nonroot.yaml").write_text(NON_ROOT)
    full = f"nonroot-{node.node_name}"

    def refused() -> dict[str, Any] | None:
        pod = node.pods()[full]
        main = container_status(pod, "main")
        numeric = container_status(pod, "numeric")
        waiting = main["state"].get("waiting", {})
        if waiting.get("reason") == "CreateContainerConfigError" and "running" in numeric["state"]:
            return pod
        return None

    pod = wait_for(refused, timeout_s=60, what="main refused, numeric running")
    uid = pod["metadata"]["uid"]
    assert container_status(pod, "main")["state"]["waiting"]["message"] == (
        "container has runAsNonRoot and image will run as root "
        f'(pod: "{full}_default({uid})", container: main)'
    )
    assert re.search(r"\buid=1000\b", exec_in(node, pod, "numeric", "id"))
