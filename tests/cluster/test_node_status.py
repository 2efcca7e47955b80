"""status-reporter in cluster mode against a real kube-apiserver, a real Redis and the
devstack's real containerd. The service runs in-process with production wiring and
default timings (`app.main(deps)` as a task), authenticated by the node's own client
certificate (Node authorizer, NodeRestriction), so every write it makes is one a
kubelet may make.

Covers: the Node is registered Ready with capacity, allocatable, nodeInfo, addresses,
labels and taints; the Lease is created, owned by the Node and renewed; a status
written to the bus for an apiserver pod reaches the pod, and once the pod is being
deleted and syncloop reports it terminated the pod object is deleted; a static pod gets
a mirror pod with its status, a deleted mirror comes back, a removed static pod takes
its mirror with it; an EventRecord on the bus becomes an Event (repeats counted); with
the apiserver stopped until a Lease renewal and a status update have failed, the Lease
and node status resume within 20 s of its return.

The mirror pod test alone runs its status-reporter with the pod status manager resyncing
every 2 s instead of 10 (`mirror_node`): a mirror pod is created, recreated and deleted
at a resync (`cluster/podsync.py`; its resync loop is unit-tested with a short period in
tests/unit/status_reporter/cluster/test_podsync.py), so at the default the test waited
three resyncs, about 30 s, for nothing else it proves.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from klet.bus import Bus, NodeBus
from klet.config import load_settings
from klet.devstack import DevStack, RedisServer, free_port
from klet.model.records import (
    DesiredPod,
    EventRecord,
    NodeConditionRecord,
    PodStatusChange,
    PodStatusRecord,
    SourceState,
)
from klet.model.types import JSON, PodUID
from klet.status_reporter import app
from klet.status_reporter.cluster.managers import ClusterOverrides
from klet.status_reporter.cluster.nodestatus import KUBELET_VERSION
from klet.status_reporter.cluster.podsync import PodSyncPolicy
from klet.status_reporter.wiring import Deps, Overrides, build_deps
from klet.testbed.cluster import ControlPlane
from prometheus_client import CollectorRegistry

from tests.harness.clusternode import eventually, kubectl_json


@dataclass
class Node:
    name: str
    bus: NodeBus
    cp: ControlPlane
    deps: Deps


@asynccontextmanager
async def status_reporter(
    tmp: Path,
    *,
    node: str,
    redis: RedisServer,
    cp: ControlPlane,
    runtime_endpoint: str,
    pod_policy: PodSyncPolicy | None = None,
) -> AsyncIterator[Deps]:
    (tmp / "manifests").mkdir(exist_ok=True)
    argv = [
        *redis.service_flags(node, "status-reporter"),
        "--hostname-override", node,
        "--kubeconfig", str(cp.node_kubeconfig(node)),
        "--container-runtime-endpoint", runtime_endpoint,
        "--run-dir", str(tmp / "run"),
        "--root-dir", str(tmp / "root"),
        "--pod-manifest-path", str(tmp / "manifests"),
        "--service-port", str(free_port()),
        "--healthz-port", "0",
        "--node-ip", "127.0.0.1",
        "--node-labels", "klet.dev/test=yes",
    ]  # fmt: skip
    settings = load_settings(argv, env={}, service="status-reporter")
    cluster = None if pod_policy is None else ClusterOverrides(pod_policy=pod_policy)
    deps = build_deps(settings, overrides=Overrides(registry=CollectorRegistry(), cluster=cluster))
    task = asyncio.create_task(app.main(deps, handle_signals=False), name=f"sr-{node}")
    try:
        yield deps
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@asynccontextmanager
async def reporter_node(
    tmp_path: Path,
    redis_server: RedisServer,
    control_plane: ControlPlane,
    devstack: DevStack,
    pod_policy: PodSyncPolicy | None = None,
) -> AsyncIterator[Node]:
    """A new node's status-reporter (production wiring, `pod_policy` when given) with
    pod-source's sources ready; the Node deleted afterwards."""
    name = f"sr-{uuid.uuid4().hex[:8]}"
    bus = Bus.from_url(redis_server.url, name, auth=redis_server.admin, timeout_s=2.0)
    node_bus = NodeBus.of(bus, service="status-reporter")
    # What pod-source records once its sources delivered their first snapshot.
    for source in ("file", "api"):
        await node_bus.sources.put(source, SourceState(source=source, ready=True, at=time.time()))
    try:
        async with status_reporter(
            tmp_path,
            node=name,
            redis=redis_server,
            cp=control_plane,
            runtime_endpoint=devstack.runtime_endpoint,
            pod_policy=pod_policy,
        ) as deps:
            yield Node(name, node_bus, control_plane, deps)
    finally:
        await bus.close()
        await kubectl(control_plane, "delete", "node", name, "--wait=false", check=False)


@pytest.fixture
async def node(
    tmp_path: Path, redis_server: RedisServer, control_plane: ControlPlane, devstack: DevStack
) -> AsyncIterator[Node]:
    async with reporter_node(tmp_path, redis_server, control_plane, devstack) as n:
        yield n


@pytest.fixture
async def mirror_node(
    tmp_path: Path, redis_server: RedisServer, control_plane: ControlPlane, devstack: DevStack
) -> AsyncIterator[Node]:
    """`node` with the pod status manager resyncing every 2 s (see the module docstring)."""
    policy = PodSyncPolicy(resync_s=2.0)
    async with reporter_node(tmp_path, redis_server, control_plane, devstack, policy) as n:
        yield n


async def kubectl(cp: ControlPlane, *args: str, check: bool = True) -> str:
    res = await asyncio.to_thread(cp.kubectl, *args)
    if check:
        assert res.returncode == 0, f"kubectl {' '.join(args)}: {res.stderr}"
    return res.stdout


def conditions(node: JSON) -> dict[str, JSON]:
    return {c["type"]: c for c in node["status"].get("conditions") or []}


def parse_time(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


async def ready_node(n: Node, timeout_s: float = 15.0) -> JSON:
    async def check() -> JSON | None:
        obj = await kubectl_json(n.cp, "node", n.name)
        if obj and conditions(obj).get("Ready", {}).get("status") == "True":
            return obj
        return None

    return await eventually(check, what=f"node {n.name} Ready", timeout_s=timeout_s)


async def lease(n: Node) -> JSON | None:
    return await kubectl_json(n.cp, "lease", "-n", "kube-node-lease", n.name)


async def write_desired(n: Node, pod: JSON, source: Any) -> None:
    uid = PodUID(pod["metadata"]["uid"])
    await n.bus.desired.put(uid, DesiredPod(uid, pod, source, uid, time.time()))


async def report(n: Node, record: PodStatusRecord) -> None:
    """What syncloop does when a pod's status changes: table, then the wake-up."""
    async with n.bus.bus.transaction() as tx:
        tx.put(n.bus.status, record.uid, record)
        tx.publish(n.bus.podstatus, PodStatusChange(uid=record.uid, version=record.version))


def pod_status(phase: str, *, ip: str = "10.88.0.7") -> JSON:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {
        "phase": phase,
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "hostIP": "127.0.0.1",
        "startTime": now,
        "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
            {"type": "Ready", "status": "True" if phase == "Running" else "False",
             "lastTransitionTime": now},
        ],
        "containerStatuses": [
            {
                "name": "app",
                "image": "busybox",
                "imageID": "",
                "ready": phase == "Running",
                "restartCount": 0,
                "started": phase == "Running",
                "state": {"running": {"startedAt": now}}
                if phase == "Running"
                else {"terminated": {"exitCode": 0, "reason": "Completed"}},
            }
        ],
    }  # fmt: skip


def record_for(
    pod: JSON, version: int, status: JSON, *, terminated: bool = False
) -> PodStatusRecord:
    meta = pod["metadata"]
    return PodStatusRecord(
        uid=PodUID(meta["uid"]),
        namespace=meta["namespace"],
        name=meta["name"],
        version=version,
        epoch=1.0,
        status=status,
        updated_at=time.time(),
        terminated=terminated,
    )


async def create_api_pod(n: Node, name: str) -> JSON:
    """A pod an admin created and bound to the node; returned as pod-source stores it."""
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": n.name,
            "containers": [{"name": "app", "image": "busybox", "command": ["sleep", "3600"]}],
        },
    }
    res = await asyncio.to_thread(
        n.cp.kubectl, "create", "-o", "json", "-f", "-", input=json.dumps(body)
    )
    assert res.returncode == 0, res.stderr
    pod: JSON = json.loads(res.stdout)
    pod["metadata"].setdefault("annotations", {})["kubernetes.io/config.source"] = "api"
    return pod


def static_pod(n: Node, name: str) -> JSON:
    """A static pod as pod-source normalises a manifest (file source)."""
    uid = uuid.uuid4().hex
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{name}-{n.name}",
            "namespace": "default",
            "uid": uid,
            "annotations": {
                "kubernetes.io/config.hash": uid,
                "kubernetes.io/config.source": "file",
                "kubernetes.io/config.seen": "2025-01-01T00:00:00Z",
            },
        },
        "spec": {
            "nodeName": n.name,
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "enableServiceLinks": True,
            "tolerations": [{"operator": "Exists", "effect": "NoExecute"}],
            "containers": [
                {
                    "name": "app",
                    "image": "busybox",
                    "command": ["sleep", "3600"],
                    "imagePullPolicy": "Always",
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                }
            ],
        },
        "status": {"phase": "Pending"},
    }


# -- the Node and its Lease ---------------------------------------------------------------


async def test_node_registered_ready_with_its_status(node: Node) -> None:
    obj = await ready_node(node)
    meta, status = obj["metadata"], obj["status"]
    assert meta["labels"]["kubernetes.io/hostname"] == node.name
    assert meta["labels"]["kubernetes.io/os"] == "linux"
    assert meta["labels"]["klet.dev/test"] == "yes"
    assert meta["annotations"]["volumes.kubernetes.io/controller-managed-attach-detach"] == "true"
    for resources in (status["capacity"], status["allocatable"]):
        assert {"cpu", "memory", "pods", "ephemeral-storage"} <= set(resources)
    assert status["capacity"]["pods"] == "110"
    assert status["allocatable"]["memory"] != status["capacity"]["memory"]  # 100Mi held back
    info = status["nodeInfo"]
    assert info["kubeletVersion"] == KUBELET_VERSION
    assert info["containerRuntimeVersion"].startswith("containerd://")
    assert info["operatingSystem"] == "linux" and info["architecture"]
    assert info["bootID"] and info["kernelVersion"]
    assert status["addresses"] == [
        {"type": "InternalIP", "address": "127.0.0.1"},
        {"type": "Hostname", "address": node.name},
    ]
    assert status["daemonEndpoints"]["kubeletEndpoint"]["Port"] == 10250
    conds = conditions(obj)
    assert conds["Ready"]["reason"] == "KubeletReady"
    assert conds["MemoryPressure"]["reason"] == "KubeletHasSufficientMemory"
    assert conds["DiskPressure"]["status"] == conds["PIDPressure"]["status"] == "False"
    assert status["images"], "containerd's images are listed"


async def test_lease_created_owned_and_renewed(node: Node) -> None:
    obj = await ready_node(node)
    first = await eventually(lambda: lease(node), what="the Lease", timeout_s=15)
    assert first["spec"]["holderIdentity"] == node.name
    assert first["spec"]["leaseDurationSeconds"] == 40

    async def renewed_with_owner() -> JSON | None:
        current = await lease(node)
        if (
            current
            and current["spec"]["renewTime"] != first["spec"]["renewTime"]
            and current["metadata"].get("ownerReferences")
        ):
            return current
        return None

    later = await eventually(renewed_with_owner, what="a renewal", timeout_s=25)
    assert parse_time(later["spec"]["renewTime"]) > parse_time(first["spec"]["renewTime"])
    [owner] = later["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == (
        "Node",
        node.name,
        obj["metadata"]["uid"],
    )
    # Meanwhile the node status was computed every 10 s but, unchanged, sent only once:
    # the Lease is the heartbeat (nodeStatusReportFrequency is 5 min).
    assert node.deps.cluster is not None
    assert node.deps.cluster.node_status.reports == 1


# -- pods -----------------------------------------------------------------------------------


async def test_api_pod_status_reaches_the_apiserver_and_finished_pod_is_deleted(
    node: Node,
) -> None:
    await ready_node(node)
    pod = await create_api_pod(node, f"web-{node.name}")
    name = pod["metadata"]["name"]
    await write_desired(node, pod, "api")
    await report(node, record_for(pod, 1, pod_status("Running")))

    async def running() -> JSON | None:
        obj = await kubectl_json(node.cp, "pod", name)
        return obj if obj and obj["status"].get("phase") == "Running" else None

    obj = await eventually(running, what="the pod status", timeout_s=15)
    assert obj["status"]["podIP"] == "10.88.0.7"
    assert obj["status"]["containerStatuses"][0]["state"]["running"]

    # An admin deletes it; syncloop stops it and reports it terminated.
    await kubectl(node.cp, "delete", "pod", name, "--wait=false")
    await report(node, record_for(pod, 2, pod_status("Succeeded"), terminated=True))

    async def gone() -> bool:
        res = await asyncio.to_thread(node.cp.kubectl, "get", "pod", name)
        return res.returncode != 0 and "NotFound" in res.stderr

    await eventually(gone, what="the pod object deleted", timeout_s=20)


async def test_static_pod_is_mirrored(mirror_node: Node) -> None:
    node = mirror_node
    await ready_node(node)
    pod = static_pod(node, "etcd")
    name = pod["metadata"]["name"]
    await write_desired(node, pod, "file")
    await report(node, record_for(pod, 1, pod_status("Running", ip="127.0.0.1")))

    async def mirror(exclude_uid: str = "") -> JSON | None:
        obj = await kubectl_json(node.cp, "pod", name)
        if (
            obj
            and obj["metadata"]["uid"] != exclude_uid
            and not obj["metadata"].get("deletionTimestamp")
            and obj["status"].get("phase") == "Running"
        ):
            return obj
        return None

    first = await eventually(mirror, what="the mirror pod with its status", timeout_s=20)
    meta = first["metadata"]
    assert meta["annotations"]["kubernetes.io/config.mirror"] == pod["metadata"]["uid"]
    assert meta["ownerReferences"][0]["kind"] == "Node"
    assert meta["ownerReferences"][0]["name"] == node.name
    assert meta["uid"] != pod["metadata"]["uid"]

    await kubectl(node.cp, "delete", "pod", name, "--wait=false")
    second = await eventually(
        lambda: mirror(meta["uid"]), what="the mirror pod recreated", timeout_s=30
    )
    assert (
        second["metadata"]["annotations"]["kubernetes.io/config.mirror"] == pod["metadata"]["uid"]
    )

    await node.bus.desired.delete(pod["metadata"]["uid"])

    async def gone() -> bool:
        res = await asyncio.to_thread(node.cp.kubectl, "get", "pod", name)
        return res.returncode != 0 and "NotFound" in res.stderr

    await eventually(gone, what="the mirror pod deleted", timeout_s=30)


# -- events ---------------------------------------------------------------------------------


async def test_event_record_becomes_an_event(node: Node) -> None:
    await ready_node(node)
    pod = await create_api_pod(node, f"ev-{node.name}")
    await write_desired(node, pod, "api")
    record = EventRecord(
        type="Warning",
        reason="BackOff",
        message="Back-off restarting failed container app",
        involved={
            "kind": "Pod",
            "namespace": "default",
            "name": pod["metadata"]["name"],
            "uid": pod["metadata"]["uid"],
            "fieldPath": "spec.containers{app}",
        },
        component="kubelet",
        at=time.time(),
    )
    await node.bus.events.publish(record)
    await node.bus.events.publish(
        dataclasses.replace(record, at=record.at + 1)  # a repeat: counted
    )
    selector = f"involvedObject.name={pod['metadata']['name']},reason=BackOff"

    async def counted() -> JSON | None:
        listed = await kubectl_json(
            node.cp, "events", "-n", "default", "--field-selector", selector
        )
        items = (listed or {}).get("items") or []
        return items[0] if len(items) == 1 and items[0].get("count") == 2 else None

    event = await eventually(counted, what="the Event, counted twice", timeout_s=15)
    assert event["type"] == "Warning"
    assert event["source"] == {"component": "kubelet", "host": node.name}
    assert event["involvedObject"]["uid"] == pod["metadata"]["uid"]
    await kubectl(node.cp, "delete", "pod", pod["metadata"]["name"], "--grace-period=0", "--force")


# -- apiserver outage -----------------------------------------------------------------------


async def test_lease_and_status_resume_after_an_apiserver_outage(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    await ready_node(node)
    await eventually(lambda: lease(node), what="the Lease", timeout_s=15)

    await asyncio.to_thread(node.cp.stop_apiserver)
    try:
        # The outage lasts until status-reporter has failed both to renew the Lease and to
        # update the node status (each logged once per outage).
        async def both_failed() -> bool:
            messages = {r.getMessage() for r in caplog.records}
            return {"unable to update node status"} <= messages and any(
                m.startswith("failed to renew the node lease") for m in messages
            )

        await eventually(both_failed, what="a failed Lease renewal and status update", timeout_s=40)
        # A change made while the apiserver is away: the eviction service sees pressure.
        await node.bus.node.tables["eviction"].put(
            "MemoryPressure",
            NodeConditionRecord(type="MemoryPressure", status="True", at=time.time()),
        )
    finally:
        # Updates can land while start_apiserver still waits for readiness, so "after the
        # outage" is measured from when the restart began.
        restarting = time.time()
        await asyncio.to_thread(node.cp.start_apiserver)

    async def lease_renewed() -> JSON | None:
        current = await lease(node)
        if current and parse_time(current["spec"]["renewTime"]) >= restarting:
            return current
        return None

    async def pressure_reported() -> JSON | None:
        obj = await kubectl_json(node.cp, "node", node.name)
        if obj and conditions(obj).get("MemoryPressure", {}).get("status") == "True":
            return obj
        return None

    await eventually(lease_renewed, what="the Lease renewed after the outage", timeout_s=20)
    obj = await eventually(pressure_reported, what="the node status updated", timeout_s=20)
    assert conditions(obj)["Ready"]["status"] == "True"
    # lastHeartbeatTime has whole-second precision.
    assert parse_time(conditions(obj)["MemoryPressure"]["lastHeartbeatTime"]) >= int(restarting)
