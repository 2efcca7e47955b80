"""klet as the node of a control plane with kube-controller-manager and kube-scheduler
(``full_control_plane``), the cluster Helm installs and the conformance suite run on.

Covers: a new Node is tainted ``node.kubernetes.io/not-ready`` (the TaintNodesByCondition
admission plugin) and klet's loses that taint once it reports Ready (the node-lifecycle
controller), so it is schedulable; a new namespace gets its ``default``
ServiceAccount and ``kube-root-ca.crt`` (with the cluster CA) from the controllers; a
Deployment gets a ReplicaSet whose pod, with no ``nodeName``, is bound by kube-scheduler
to the klet node and Running there; a DaemonSet's pod lands on the node and runs;
deleting the namespace empties it: the pods are gone from the apiserver and their
containers from CRI, and the namespace itself is gone; after an apiserver restart the
controllers are still at work (a new namespace gets its ServiceAccount and ConfigMap).

And `make test`'s DRA smoke, on this node because it needs the same control plane and a
node would cost as much again to start: a pod with a ResourceClaimTemplate is scheduled
onto the node, its claim prepared by upstream's DRA test driver, the pod runs, and once
deleted the claim is unprepared (see its docstring for what stays in `make test-dra`).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from klet.cri import CRISettings, RuntimeClient
from klet.cri import labels as L
from klet.devstack import DevStack
from klet.syncloop.dra.state import ClaimCheckpoint
from klet.testbed.cluster import ControlPlane

from tests.harness.clusternode import cluster_node
from tests.harness.dra import DRATestDriver, dra_test_driver_binary, slice_devices, until
from tests.harness.dra_pods import (
    REQUEST,
    apply,
    claim_pod_objects,
    clean_up,
    deleted,
    listed_claims,
    pod_claim,
    running_pod,
)
from tests.harness.node import KletNode
from tests.harness.waiting import wait_for

NODE = "kletfull1"
IMAGE = "registry.klet.test/busybox:1.36"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
DRA_DRIVER = "smoke.dra.klet.test"


@pytest.fixture(scope="module")
def node(
    full_control_plane: ControlPlane, devstack: DevStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KletNode]:
    base = tmp_path_factory.mktemp("fullnode")
    with cluster_node(full_control_plane, devstack, base, name=NODE) as kletnode:
        yield kletnode


def kget(cp: ControlPlane, *args: str) -> Any:
    """`kubectl get -o json`; a failed kubectl (not there yet) raises CalledProcessError,
    which wait_for retries."""
    return json.loads(cp.kubectl("get", *args, "-o", "json", check=True).stdout)


def namespace_containers(stack: DevStack, namespace: str) -> dict[str, str]:
    """container id -> state for every container of pods in `namespace`, from CRI."""

    async def go() -> dict[str, str]:
        cri = RuntimeClient(CRISettings(runtime_endpoint=stack.runtime_endpoint, timeout_s=10))
        try:
            found = await cri.list_containers(label_selector={L.POD_NAMESPACE: namespace})
            return {c.id: c.state.value for c in found}
        finally:
            await cri.close()

    return asyncio.run(go())


def running_on_node(pod: dict[str, Any]) -> bool:
    statuses = pod["status"].get("containerStatuses") or []
    return (
        pod["spec"].get("nodeName") == NODE
        and pod["status"].get("phase") == "Running"
        and bool(statuses)
        and all(c.get("ready") for c in statuses)
    )


def owned_pods(cp: ControlPlane, namespace: str, kind: str) -> list[dict[str, Any]]:
    """The pods in `namespace` whose controller owner is a `kind`."""
    pods: list[dict[str, Any]] = kget(cp, "pods", "-n", namespace)["items"]
    return [
        p
        for p in pods
        if any(
            o.get("kind") == kind and o.get("controller")
            for o in p["metadata"].get("ownerReferences", [])
        )
    ]


def workloads(namespace: str) -> list[dict[str, Any]]:
    labels = {"app": "sleeper"}
    pod_spec = {
        "terminationGracePeriodSeconds": 2,
        "containers": [{"name": "main", "image": IMAGE, "command": ["sleep", "100000"]}],
    }
    return [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "sleeper", "namespace": namespace},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels}, "spec": pod_spec},
            },
        },
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "agent", "namespace": namespace},
            "spec": {
                "selector": {"matchLabels": {"app": "agent"}},
                "template": {"metadata": {"labels": {"app": "agent"}}, "spec": pod_spec},
            },
        },
    ]


def test_node_ready_loses_the_not_ready_taint(
    node: KletNode, full_control_plane: ControlPlane
) -> None:
    cp = full_control_plane
    # The premise: admission taints every new Node (a server-side dry run shows the
    # admitted object; a real one without conditions would lose the taint at once).
    ghost = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"ghost-{NODE}"}}
    r = cp.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(ghost))
    assert r.returncode == 0, r.stderr
    taints = json.loads(r.stdout)["spec"].get("taints", [])
    assert {"key": NOT_READY_TAINT, "effect": "NoSchedule"} in taints

    def schedulable() -> dict[str, Any] | None:
        obj: dict[str, Any] = kget(cp, "node", NODE)
        ready = any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in obj["status"].get("conditions", [])
        )
        taints = [t["key"] for t in obj["spec"].get("taints", [])]
        return obj if ready and NOT_READY_TAINT not in taints else None

    obj = wait_for(schedulable, timeout_s=30, what="Node Ready without the not-ready taint")
    assert not obj["spec"].get("unschedulable")
    assert int(obj["status"]["allocatable"]["pods"]) > 0


def test_namespace_workloads_scheduled_and_deletion_empties_it(
    node: KletNode, full_control_plane: ControlPlane, devstack: DevStack
) -> None:
    cp = full_control_plane
    ns = f"ctl-{uuid.uuid4().hex[:8]}"
    r = cp.kubectl("create", "namespace", ns)
    assert r.returncode == 0, r.stderr

    # What prepare_namespace does by hand on the plain plane, the controllers do here.
    wait_for(
        lambda: kget(cp, "serviceaccount", "default", "-n", ns),
        timeout_s=20,
        what="the default ServiceAccount",
    )
    ca = wait_for(
        lambda: kget(cp, "configmap", "kube-root-ca.crt", "-n", ns),
        timeout_s=20,
        what="kube-root-ca.crt",
    )
    assert ca["data"]["ca.crt"] == cp.ca.cert_pem.decode()

    cp.apply(workloads(ns))
    rs = wait_for(
        lambda: kget(cp, "replicasets", "-n", ns)["items"],
        timeout_s=30,
        what="the Deployment's ReplicaSet",
    )
    assert [o["kind"] for o in rs[0]["metadata"]["ownerReferences"]] == ["Deployment"]

    deployed = wait_for(
        lambda: [p for p in owned_pods(cp, ns, "ReplicaSet") if running_on_node(p)],
        timeout_s=60,
        what="the Deployment's pod Running on the klet node",
    )[0]
    # The template has no nodeName: kube-scheduler bound the pod, and said so.
    scheduled = [c for c in deployed["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert scheduled and scheduled[0]["status"] == "True"
    name = deployed["metadata"]["name"]
    events = kget(cp, "events", "-n", ns, f"--field-selector=involvedObject.name={name}")
    assert any(
        e["reason"] == "Scheduled" and e.get("reportingComponent") == "default-scheduler"
        for e in events["items"]
    ), events["items"]

    wait_for(
        lambda: [p for p in owned_pods(cp, ns, "DaemonSet") if running_on_node(p)],
        timeout_s=60,
        what="the DaemonSet's pod Running on the klet node",
    )
    assert len(namespace_containers(devstack, ns)) >= 2

    r = cp.kubectl("delete", "namespace", ns, "--wait=false")
    assert r.returncode == 0, r.stderr
    wait_for(
        lambda: "NotFound" in cp.kubectl("get", "namespace", ns).stderr,
        timeout_s=60,
        what="the namespace deleted (emptied by the namespace controller and klet)",
    )
    pods = kget(cp, "pods", "--all-namespaces", f"--field-selector=metadata.namespace={ns}")
    assert pods["items"] == []
    wait_for(
        lambda: not namespace_containers(devstack, ns),
        timeout_s=30,
        what="the namespace's containers removed from CRI",
    )


def test_controllers_ride_out_an_apiserver_restart(
    node: KletNode, full_control_plane: ControlPlane
) -> None:
    cp = full_control_plane
    cp.restart_apiserver(down_s=3)
    ns = f"ctl-{uuid.uuid4().hex[:8]}"
    try:
        # Only the controllers make these: they reconnected.
        cp.prepare_namespace(ns, timeout_s=60)
        assert cp.controllers_running
    finally:
        cp.kubectl("delete", "namespace", ns, "--wait=false", "--ignore-not-found")


def claim_specs(cdi_dir: Path, claim_uid: str) -> list[Path]:
    """The DRA test driver's CDI spec files naming the claim's request as a device."""
    name = f"claim-{claim_uid}-{REQUEST}"
    return [
        p
        for p in sorted(cdi_dir.glob("*.json"))
        if name in [d["name"] for d in json.loads(p.read_text()).get("devices", [])]
    ]


async def test_dra_smoke_a_claims_pod_is_prepared_runs_and_is_unprepared(
    node: KletNode, full_control_plane: ControlPlane, tmp_path: Path
) -> None:
    """`make test`'s DRA smoke (issue 40), on Debian's containerd 1.6 like every test here.

    Upstream's dra-test-driver (k8s.io/kubernetes v1.34.4's test/e2e/dra/test-driver,
    built by tools/dra/build.sh among tools/test.sh's background builds) registers
    through the node's `<root-dir>/plugins_registry/` and publishes the node's
    ResourceSlice. The pod's claim is made by the resourceclaim controller, allocated to
    a device of that slice and reserved for the pod by kube-scheduler's DRA plugin; klet
    reads it and calls NodePrepareResources before the sandbox (the driver writes its
    CDI spec for the claim's request; `dra_manager_state` lists the claim with the pod
    and the device); the pod is Running and the PodResources API lists the claim, with
    its CDI device ID, for the container naming it alone. Deleted, the pod leaves the
    apiserver only after NodeUnprepareResources (the CDI spec removed, the checkpoint
    empty).

    Only in `make test-dra` (tests/cluster/test_dra_pods.py on containerd v2 with CDI
    on): the device in the container. klet sends a claim's CDI device IDs in CRI's
    `CDI_devices` field alone, as upstream's kubelet does since 1.31 (no CDI
    annotations), and containerd 1.6 has no CDI and ignores the field, so the driver's
    environment never reaches the container here. Also there: the gone driver's
    ResourceSlice deleted 30 s later.
    """
    cp = full_control_plane
    cdi_dir = tmp_path / "cdi"
    driver = DRATestDriver.start(
        dra_test_driver_binary(),
        kubeconfig=cp.admin_kubeconfig,
        driver=DRA_DRIVER,
        node=NODE,
        root_dir=node.root_dir,
        cdi_dir=cdi_dir,
        log=tmp_path / "dra-test-driver.log",
    )
    suffix = uuid.uuid4().hex[:6]
    template, pod_name, ns = f"smoke-{suffix}", f"drasmoke-{suffix}", "default"
    try:
        devices = await until(lambda: slice_devices(cp, DRA_DRIVER, NODE), what="the slice")
        for obj in claim_pod_objects(
            DRA_DRIVER, template=template, pod=pod_name, namespace=ns, node=NODE, image=IMAGE,
            pull_policy="IfNotPresent",
        ):  # fmt: skip
            apply(cp, obj)
        pod = await running_pod(cp, node, pod_name, ns)
        pod_uid = pod["metadata"]["uid"]
        claim, result = pod_claim(cp, pod)
        claim_name, claim_uid = claim["metadata"]["name"], claim["metadata"]["uid"]
        assert (result["driver"], result["pool"]) == (DRA_DRIVER, NODE)
        assert result["device"] in devices
        assert [r["uid"] for r in claim["status"]["reservedFor"]] == [pod_uid]

        # NodePrepareResources answered: the driver wrote the request's CDI spec, and the
        # checkpoint holds the device it prepared, for this pod.
        assert claim_specs(cdi_dir, claim_uid), driver.text()[-2000:]
        [saved] = ClaimCheckpoint(node.root_dir).load()
        assert (saved.claim_name, saved.pod_uids) == (claim_name, frozenset({pod_uid}))
        assert [d.device_name for d in saved.driver_state[DRA_DRIVER]] == [result["device"]]
        cdi_id = f"{DRA_DRIVER}/test=claim-{claim_uid}-{REQUEST}"
        assert await listed_claims(node.root_dir, pod_name) == {
            "user": [(claim_name, ns, [(DRA_DRIVER, NODE, result["device"], [cdi_id])])],
            "other": [],
        }

        await deleted(cp, pod_name, ns)
        # klet reports the pod terminated only after NodeUnprepareResources.
        assert ClaimCheckpoint(node.root_dir).load() == []
        assert claim_specs(cdi_dir, claim_uid) == [], driver.text()[-2000:]
    finally:
        clean_up(cp, driver=DRA_DRIVER, template=template, pod=pod_name, namespace=ns)
        driver.stop()
