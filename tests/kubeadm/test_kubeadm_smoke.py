"""kubeadm's smoke, the part of tests/kubeadm that `make test` runs (through
test_kubeadm_in_make_test.py, in a mount and network namespace of its own as `make
test-kubeadm` runs the rest): `kubeadm init` skipping the addon phases (kube-proxy's and
CoreDNS's images need builds of their own, minutes cold), a `kubeadm upgrade`-style
manifest edit, `kubeadm reset`.

Proven: init reports success, having seen etcd, kube-apiserver, kube-controller-manager
and kube-scheduler run as static pods by klet (the node set up as test_kubeadm_init.py's,
kubeadmnode.py). Then kube-scheduler's manifest is replaced as `kubeadm upgrade apply`
replaces it (upstream's upgradeComponent: the current manifest moved to a backup
directory, the new one, here with one more flag, moved into /etc/kubernetes/manifests),
and the waits kubeadm makes pass: the mirror pod's `kubernetes.io/config.hash` changes
and the component's pods are Running. The static pod restarted exactly once: the old
pod's container is no longer running, the new pod (its UID the new hash) has one
container, running with the new flag, and the mirror pod shows it with no restart. No
second restart follows: after the edit the test adds a second static pod and waits
until klet runs it (so klet has read the manifest directory and synced again since), and
the scheduler's mirror pod, hash, container and restart count are still the same. Last,
`kubeadm reset` (the kubelet stopped first, as systemd would) leaves no file in
/etc/kubernetes, /var/lib/kubelet or /var/lib/etcd, no mount under /var/lib/kubelet and
no container.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from klet.devstack import DevStack
from klet.syncloop.volumes.fs import mounts_under

from tests.harness.waiting import wait_for
from tests.integration.conftest import remove_node_pods
from tests.kubeadm.kubeadmnode import (
    NODE,
    Initialized,
    init,
    kubectl,
    reset_leaves_nothing,
    stop,
)
from tools.kubeadm.images import ADDON_PHASES

MANIFESTS = Path("/etc/kubernetes/manifests")
COMPONENT = "kube-scheduler"
HASH = "kubernetes.io/config.hash"
ADDED_FLAG = "--v=3"  # the upgrade's change of spec: one flag more
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
SETTLE_POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "settle", "namespace": "kube-system"},
    "spec": {
        "containers": [
            {
                "name": "main",
                "image": "registry.klet.test/busybox:1.36",
                "command": ["sh", "-c", "sleep 3600"],
            }
        ]
    },
}


def _mirror(binary: Path, name: str) -> dict[str, Any] | None:
    try:
        pod: dict[str, Any] = json.loads(
            kubectl(binary, "get", "pod", "-n", "kube-system", name, "-o", "json")
        )
    except AssertionError:
        return None
    return pod


def _running(pod: dict[str, Any] | None) -> bool:
    return pod is not None and pod.get("status", {}).get("phase") == "Running"


def _container(pod: dict[str, Any]) -> tuple[str, int, bool]:
    """The mirror pod's one container: (its ID without the runtime prefix, its restart
    count, whether it is running)."""
    [cs] = pod["status"]["containerStatuses"]
    return (
        cs.get("containerID", "").removeprefix("containerd://"),
        int(cs.get("restartCount", 0)),
        "running" in cs.get("state", {}),
    )


class Runtime:
    """The node's containers, read through containerd's own CLI (not through klet)."""

    def __init__(self, endpoint: str) -> None:
        self.ctr = ["ctr", "-a", endpoint.removeprefix("unix://"), "-n", "k8s.io"]

    def _lines(self, *args: str) -> list[str]:
        out = subprocess.run(
            [*self.ctr, *args], capture_output=True, text=True, check=True, timeout=30
        ).stdout
        return [line for line in out.splitlines() if line.strip()]

    def containers(self, **labels: str) -> set[str]:
        """The IDs of the containers (CRI's containers, not its sandboxes) carrying every
        label given (k=v)."""
        wanted = {"io.cri-containerd.kind": "container", **labels}
        filters = ",".join(f'labels."{k}"=={v}' for k, v in wanted.items())
        return set(self._lines("containers", "ls", "-q", filters))

    def running(self) -> set[str]:
        """The IDs of the containers whose task is running."""
        rows = [line.split() for line in self._lines("tasks", "ls")[1:]]
        return {row[0] for row in rows if row[-1] == "RUNNING"}


def upgrade_style_edit(component: str, work: Path) -> Path:
    """What `kubeadm upgrade apply` does to one component's manifest (upstream's
    upgradeComponent): the new manifest is written in a directory of its own, the current
    one moved to a backup directory, then the new one moved in (both renames on one file
    system, so klet never reads a half-written file). The backup's path."""
    current = MANIFESTS / f"{component}.yaml"
    manifest = yaml.safe_load(current.read_text())
    [container] = manifest["spec"]["containers"]
    assert ADDED_FLAG not in container["command"], container["command"]
    container["command"].append(ADDED_FLAG)
    upgraded = Path("/etc/kubernetes/tmp/kubeadm-upgraded-manifests-smoke")
    backup = Path("/etc/kubernetes/tmp/kubeadm-backup-manifests-smoke")
    upgraded.mkdir(parents=True)
    backup.mkdir(parents=True)
    (upgraded / current.name).write_text(yaml.safe_dump(manifest))
    os.rename(current, backup / current.name)
    os.rename(upgraded / current.name, current)
    (work / "upgraded.yaml").write_text(current.read_text())
    return backup / current.name


@pytest.mark.timeout(420)
def test_kubeadm_init_upgrade_edit_and_reset(node_host: Path, stack: DevStack) -> None:
    work = node_host / "work"
    work.mkdir()
    runtime = Runtime(stack.runtime_endpoint)
    up: Initialized | None = None
    try:
        # ECDSA keys: kubeadm's certs phase makes a dozen, and RSA-2048's cost a loaded
        # CI machine tens of seconds (the full test keeps kubeadm's default RSA)
        up = init(
            stack, work, skip_phases=ADDON_PHASES, addons=False, encryption_algorithm="ECDSA-P256"
        )
        k = up.kubectl
        node = json.loads(kubectl(k, "get", "node", NODE, "-o", "json"))
        assert "node-role.kubernetes.io/control-plane" in node["metadata"]["labels"]
        name = f"{COMPONENT}-{NODE}"
        wanted = [f"{c}-{NODE}" for c in CONTROL_PLANE]
        wait_for(
            lambda: all(_running(_mirror(k, n)) for n in wanted),
            timeout_s=120,
            what=f"the mirror pods {wanted} Running",
        )

        def scheduler_up() -> dict[str, Any] | None:
            pod = _mirror(k, name)
            return pod if _running(pod) and pod is not None and _container(pod)[2] else None

        before = wait_for(scheduler_up, timeout_s=60, what=f"{name}'s container running")
        old_hash = before["metadata"]["annotations"][HASH]
        old_id, _, _ = _container(before)
        assert old_id in runtime.running()

        # kubeadm upgrade apply: the manifests swapped, then its two waits
        backup = upgrade_style_edit(COMPONENT, work)
        assert backup.exists()

        def hash_changed() -> str | None:
            pod = _mirror(k, name)
            h = (pod or {}).get("metadata", {}).get("annotations", {}).get(HASH)
            return h if h is not None and h != old_hash else None

        new_hash = wait_for(hash_changed, timeout_s=120, what=f"{name}'s {HASH} changing")

        def component_running() -> list[dict[str, Any]] | None:
            listed = json.loads(
                kubectl(k, "get", "pods", "-n", "kube-system", "-l", f"component={COMPONENT}",
                        "-o", "json")
            )  # fmt: skip
            pods: list[dict[str, Any]] = listed["items"]
            ok = pods and all(_running(p) and _container(p)[2] for p in pods)
            return pods if ok else None

        [after] = wait_for(component_running, timeout_s=120, what=f"component={COMPONENT} Running")
        assert after["metadata"]["annotations"][HASH] == new_hash
        new_id, restarts, _ = _container(after)
        assert ADDED_FLAG in after["spec"]["containers"][0]["command"]
        # exactly one restart: the old container stopped, one container in the new pod
        assert new_id != old_id and restarts == 0
        running = runtime.running()
        assert old_id not in running
        assert new_id in running
        assert runtime.containers(**{"io.kubernetes.pod.uid": new_hash}) == {new_id}
        scheduler = {"io.kubernetes.container.name": COMPONENT}
        assert runtime.containers(**scheduler) & running == {new_id}

        # settle: klet has read the manifests and synced after the edit once the next
        # static pod runs; the scheduler has not been touched since
        (MANIFESTS / "settle.yaml").write_text(yaml.safe_dump(SETTLE_POD))
        wait_for(
            lambda: _running(_mirror(k, f"settle-{NODE}")),
            timeout_s=120,
            what="the static pod added after the edit Running",
        )
        settled = _mirror(k, name)
        assert settled is not None
        assert settled["metadata"]["uid"] == after["metadata"]["uid"]
        assert settled["metadata"]["annotations"][HASH] == new_hash
        assert _container(settled) == (new_id, 0, True)
        assert runtime.containers(**scheduler) & runtime.running() == {new_id}
        assert runtime.containers(**{"io.kubernetes.pod.uid": new_hash}) == {new_id}

        # kubeadm reset asks systemd to stop the kubelet: stopped first, as systemd would
        stop(up.kubelet)
        # the upgrade's backup and new-manifest directories are in /etc/kubernetes/tmp
        reset_leaves_nothing(up.kubeadm, stack.runtime_endpoint, cleanup_tmp_dir=True)
        assert runtime.containers() == set() and runtime.running() == set()
    finally:
        if up is not None:
            stop(up.kubelet)
        asyncio.run(remove_node_pods(stack.runtime_endpoint, NODE, uids=[]))
        for point in mounts_under(Path("/var/lib/kubelet")):
            subprocess.run(["umount", point], capture_output=True, check=False)
