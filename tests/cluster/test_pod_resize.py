"""In-place pod resize through a real apiserver and real containerd (the `resize`
subresource, as `kubectl patch --subresource resize` and VPA send it): CPU and memory up
and then down on a running pod with no restart (same container ID, the container's
cpu.cfs_quota_us and memory.limit_in_bytes read back), the status's resources,
allocatedResources and observedGeneration following; a resize beyond the node is
PodResizePending/Infeasible and changes nothing; a RestartContainer policy restarts the
container with the new limit; a syncloop SIGKILLed after a resize neither reverts nor
applies it again, and one made while syncloop is down is applied once it is back; a
memory limit below the container's usage is refused (PodResizeInProgress/Error)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from klet.cri import CRISettings, RuntimeClient
from klet.devstack import DevStack
from klet.model.types import ContainerID
from klet.testbed.cluster import ControlPlane
from kubernetes import client as kclient
from kubernetes import config as kconfig

from tests.harness.clusternode import cluster_node, wait_node_ready
from tests.harness.node import RELISTS, KletNode
from tests.harness.procfs import cgroup_v1_value
from tests.harness.waiting import wait_for

NODE = "kletresize1"
IMAGE = "registry.klet.test/busybox:1.36"
MI = 1024 * 1024


@pytest.fixture(scope="module")
def node(
    control_plane: ControlPlane, devstack: DevStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KletNode]:
    base = tmp_path_factory.mktemp("resizenode")
    with cluster_node(control_plane, devstack, base, name=NODE) as kletnode:
        yield kletnode


@pytest.fixture(scope="module")
def api(control_plane: ControlPlane) -> Iterator[kclient.CoreV1Api]:
    core = kclient.CoreV1Api(kconfig.new_client_from_config(str(control_plane.admin_kubeconfig)))
    try:
        yield core
    finally:
        core.api_client.close()


def get_pod(cp: ControlPlane, name: str) -> dict[str, Any] | None:
    r = cp.kubectl("get", "pod", name, "-o", "json")
    if r.returncode != 0:
        return None
    pod: dict[str, Any] = json.loads(r.stdout)
    return pod


def container_pid(devstack: DevStack, container_id: str) -> int:
    async def go() -> int:
        cri = RuntimeClient(CRISettings(runtime_endpoint=devstack.runtime_endpoint, timeout_s=10))
        try:
            return await cri.container_pid(ContainerID(container_id.split("://", 1)[-1]))
        finally:
            await cri.close()

    return asyncio.run(go())


def pod_manifest(name: str, **container: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": NODE,
            "terminationGracePeriodSeconds": 2,
            "containers": [
                {
                    "name": "main",
                    "image": IMAGE,
                    "command": ["sleep", "100000"],
                    "resources": {
                        "requests": {"cpu": "200m", "memory": "64Mi"},
                        "limits": {"cpu": "200m", "memory": "64Mi"},
                    },
                    **container,
                }
            ],
        },
    }


def running(cp: ControlPlane, name: str) -> dict[str, Any] | None:
    pod = get_pod(cp, name)
    status = (pod or {}).get("status") or {}
    cs = status.get("containerStatuses") or []
    return pod if status.get("phase") == "Running" and cs and cs[0].get("ready") else None


def resources(cpu: str, memory: str) -> dict[str, Any]:
    return {
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "resources": {
                        "requests": {"cpu": cpu, "memory": memory},
                        "limits": {"cpu": cpu, "memory": memory},
                    },
                }
            ]
        }
    }


def conditions(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in pod["status"].get("conditions") or []}


def test_resize_in_place_up_and_down(
    node: KletNode, control_plane: ControlPlane, devstack: DevStack, api: kclient.CoreV1Api
) -> None:
    cp = control_plane
    wait_node_ready(cp, NODE)
    r = cp.kubectl("create", "-f", "-", input=json.dumps(pod_manifest("rs")))
    assert r.returncode == 0, r.stderr
    first = wait_for(lambda: running(cp, "rs"), timeout_s=60, what="the pod Running")
    cid = first["status"]["containerStatuses"][0]["containerID"]
    pid = container_pid(devstack, cid)
    assert cgroup_v1_value(pid, "cpu", "cpu.cfs_quota_us") == 20000
    assert cgroup_v1_value(pid, "memory", "memory.limit_in_bytes") == 64 * MI

    for cpu, memory, quota, limit, generation in (
        ("400m", "128Mi", 40000, 128 * MI, 2),
        ("100m", "48Mi", 10000, 48 * MI, 3),
    ):
        api.patch_namespaced_pod_resize("rs", "default", resources(cpu, memory))

        def applied(
            quota: int = quota, limit: int = limit, generation: int = generation
        ) -> dict[str, Any] | None:
            pod = get_pod(cp, "rs")
            if pod is None or pod["status"].get("observedGeneration") != generation:
                return None
            conds = conditions(pod)
            if "PodResizeInProgress" in conds or "PodResizePending" in conds:
                return None
            if cgroup_v1_value(pid, "cpu", "cpu.cfs_quota_us") != quota:
                return None
            if cgroup_v1_value(pid, "memory", "memory.limit_in_bytes") != limit:
                return None
            return pod

        pod = wait_for(applied, timeout_s=30, what=f"the resize to {cpu}/{memory} applied")
        status = pod["status"]["containerStatuses"][0]
        assert status["containerID"] == cid and status["restartCount"] == 0
        assert status["allocatedResources"] == {"cpu": cpu, "memory": memory}
        assert status["resources"]["limits"] == {"cpu": cpu, "memory": memory}
        assert container_pid(devstack, cid) == pid


def test_infeasible_resize_is_pending(
    node: KletNode, control_plane: ControlPlane, api: kclient.CoreV1Api
) -> None:
    cp = control_plane
    wait_node_ready(cp, NODE)
    r = cp.kubectl("create", "-f", "-", input=json.dumps(pod_manifest("rs-big")))
    assert r.returncode == 0, r.stderr
    first = wait_for(lambda: running(cp, "rs-big"), timeout_s=60, what="the pod Running")
    api.patch_namespaced_pod_resize("rs-big", "default", resources("100000", "64Mi"))

    def pending() -> dict[str, Any] | None:
        pod = get_pod(cp, "rs-big")
        cond = conditions(pod or {"status": {}}).get("PodResizePending")
        return cond if cond is not None and cond.get("reason") == "Infeasible" else None

    cond = wait_for(pending, timeout_s=30, what="PodResizePending/Infeasible")
    assert cond["message"].startswith("Node didn't have enough capacity: cpu, requested: ")
    assert cond["observedGeneration"] == 2
    pod = get_pod(cp, "rs-big")
    assert pod is not None
    status = pod["status"]["containerStatuses"][0]
    assert status["allocatedResources"]["cpu"] == "200m"
    assert status["containerID"] == first["status"]["containerStatuses"][0]["containerID"]


def test_restart_container_policy(
    node: KletNode, control_plane: ControlPlane, devstack: DevStack, api: kclient.CoreV1Api
) -> None:
    cp = control_plane
    wait_node_ready(cp, NODE)
    manifest = pod_manifest(
        "rs-restart",
        resizePolicy=[
            {"resourceName": "cpu", "restartPolicy": "NotRequired"},
            {"resourceName": "memory", "restartPolicy": "RestartContainer"},
        ],
    )
    r = cp.kubectl("create", "-f", "-", input=json.dumps(manifest))
    assert r.returncode == 0, r.stderr
    first = wait_for(lambda: running(cp, "rs-restart"), timeout_s=60, what="the pod Running")
    cid = first["status"]["containerStatuses"][0]["containerID"]
    api.patch_namespaced_pod_resize("rs-restart", "default", resources("200m", "96Mi"))

    def restarted() -> dict[str, Any] | None:
        pod = running(cp, "rs-restart")
        if pod is None:
            return None
        status = pod["status"]["containerStatuses"][0]
        if status["containerID"] == cid or "PodResizeInProgress" in conditions(pod):
            return None
        return pod

    pod = wait_for(restarted, timeout_s=60, what="the container restarted at 96Mi")
    status = pod["status"]["containerStatuses"][0]
    assert status["restartCount"] == 1
    pid = container_pid(devstack, status["containerID"])
    assert cgroup_v1_value(pid, "memory", "memory.limit_in_bytes") == 96 * MI


def test_resize_survives_a_syncloop_sigkill(
    node: KletNode, control_plane: ControlPlane, devstack: DevStack, api: kclient.CoreV1Api
) -> None:
    """Applied, then syncloop SIGKILLed and restarted: the new process neither reverts
    nor applies again (no resize actuated, same container, same cgroup values). Then a
    resize made while syncloop is down is applied once it is back, in place."""
    cp = control_plane
    wait_node_ready(cp, NODE)
    r = cp.kubectl("create", "-f", "-", input=json.dumps(pod_manifest("rs-kill")))
    assert r.returncode == 0, r.stderr
    first = wait_for(lambda: running(cp, "rs-kill"), timeout_s=60, what="the pod Running")
    cid = first["status"]["containerStatuses"][0]["containerID"]
    pid = container_pid(devstack, cid)
    api.patch_namespaced_pod_resize("rs-kill", "default", resources("300m", "96Mi"))

    def at(quota: int, limit: int, generation: int) -> dict[str, Any] | None:
        pod = get_pod(cp, "rs-kill")
        if pod is None or pod["status"].get("observedGeneration") != generation:
            return None
        if "PodResizeInProgress" in conditions(pod):
            return None
        if cgroup_v1_value(pid, "cpu", "cpu.cfs_quota_us") != quota:
            return None
        return pod if cgroup_v1_value(pid, "memory", "memory.limit_in_bytes") == limit else None

    wait_for(lambda: at(30000, 96 * MI, 2), timeout_s=30, what="the first resize applied")

    node.kill("syncloop")
    node.start("syncloop")
    node.wait_passes("syncloop", RELISTS, 2, timeout_s=60)
    pod = wait_for(lambda: at(30000, 96 * MI, 2), timeout_s=30, what="the pod as it was")
    status = pod["status"]["containerStatuses"][0]
    assert status["containerID"] == cid and status["restartCount"] == 0
    assert status["allocatedResources"] == {"cpu": "300m", "memory": "96Mi"}
    assert node.metric("syncloop", "kubelet_pod_resize_duration_milliseconds_count") in (None, 0)

    node.kill("syncloop")
    api.patch_namespaced_pod_resize("rs-kill", "default", resources("250m", "80Mi"))
    node.start("syncloop")
    pod = wait_for(lambda: at(25000, 80 * MI, 3), timeout_s=60, what="the resize made meanwhile")
    status = pod["status"]["containerStatuses"][0]
    assert status["containerID"] == cid and status["restartCount"] == 0
    assert container_pid(devstack, cid) == pid
    assert (
        node.metric("syncloop", "kubelet_pod_resize_duration_milliseconds_count", success="true")
        == 1
    )


def test_memory_limit_below_usage_is_refused(
    node: KletNode, control_plane: ControlPlane, devstack: DevStack, api: kclient.CoreV1Api
) -> None:
    """A memory limit lowered below what the container uses (60 MiB in its /dev/shm)
    is not applied, as 1.34 refuses it: PodResizeInProgress with reason Error naming the
    usage, the cgroup keeps its limit, the container runs on; a limit above the usage
    then goes through."""
    cp = control_plane
    wait_node_ready(cp, NODE)
    manifest = pod_manifest(
        "rs-mem",
        command=["sh", "-c", "head -c 62914560 /dev/zero > /dev/shm/fill; exec sleep 100000"],
    )
    manifest["spec"]["containers"][0]["resources"] = {
        "requests": {"cpu": "200m", "memory": "128Mi"},
        "limits": {"cpu": "200m", "memory": "128Mi"},
    }
    r = cp.kubectl("create", "-f", "-", input=json.dumps(manifest))
    assert r.returncode == 0, r.stderr
    first = wait_for(lambda: running(cp, "rs-mem"), timeout_s=60, what="the pod Running")
    cid = first["status"]["containerStatuses"][0]["containerID"]
    pid = container_pid(devstack, cid)
    wait_for(
        lambda: cgroup_v1_value(pid, "memory", "memory.usage_in_bytes") > 60 * MI,
        timeout_s=30,
        what="the container using over 60 MiB",
    )
    api.patch_namespaced_pod_resize("rs-mem", "default", resources("200m", "48Mi"))

    def refused() -> dict[str, Any] | None:
        pod = get_pod(cp, "rs-mem")
        cond = conditions(pod or {"status": {}}).get("PodResizeInProgress")
        return cond if cond is not None and cond.get("reason") == "Error" else None

    cond = wait_for(refused, timeout_s=30, what="PodResizeInProgress/Error")
    assert cond["message"].startswith("cannot decrease memory limits: ")
    assert "below current usage" in cond["message"]
    assert cgroup_v1_value(pid, "memory", "memory.limit_in_bytes") == 128 * MI

    api.patch_namespaced_pod_resize("rs-mem", "default", resources("200m", "100Mi"))

    def applied() -> dict[str, Any] | None:
        pod = get_pod(cp, "rs-mem")
        if pod is None or "PodResizeInProgress" in conditions(pod):
            return None
        return pod if cgroup_v1_value(pid, "memory", "memory.limit_in_bytes") == 100 * MI else None

    pod = wait_for(applied, timeout_s=30, what="the 100Mi resize applied")
    status = pod["status"]["containerStatuses"][0]
    assert status["containerID"] == cid and status["restartCount"] == 0
