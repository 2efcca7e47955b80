"""A pod with a ResourceClaimTemplate runs on a klet node with its DRA device, and gives
it back when deleted (issue 40: DRA's pod path on the real stack).

The control plane is the harness's full one (kube-apiserver serving resource.k8s.io/v1,
kube-controller-manager with the resourceclaim controller, kube-scheduler with its
default DRA plugin); the node is klet's five services (tests/harness/clusternode.py)
over the DRA tier's containerd v2 with CDI on (tests/harness/dra.py's CDIContainerd,
its specs read from the run's CDI directory alone). Upstream's dra-test-driver
(kubelet-plugin mode) publishes a ResourceSlice of the node's devices and registers
through the node's `<root-dir>/plugins_registry/`. The test creates a DeviceClass of the
driver, a ResourceClaimTemplate asking for one device of it and a pod using the template
in one of its two containers: the controller makes the claim, the scheduler allocates
and reserves it and binds the pod; klet reads the claim, prepares it through the driver
before the sandbox (`dra_manager_state` lists the claim with the pod and the allocated
device) and runs the container with the claim's CDI device, whose environment (read
over CRI) holds the driver's `claim_<claim>_<request>=true`, which the other container
has not; the PodResources API (a client of the generated v1 stubs on the node's socket)
lists the claim, its driver, pool, device and CDI device for that container alone.
Deleting the pod: klet stops it, unprepares the claim (the checkpoint empty
again, the driver's CDI spec removed) and only then reports it terminated, so the
apiserver object goes. The driver stopped, syncloop deletes the node's ResourceSlice of
it once it stayed away 30 s (dra/slices.py). Only `make test-dra` (KLET_DRA_TESTS=1)
collects it.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from klet.cri.client import CRISettings, RuntimeClient
from klet.devstack import DevStack
from klet.devstack.images import BUSYBOX_IMAGE
from klet.model.podresources import SOCKET_DIR, SOCKET_NAME
from klet.rpc.gen.klet.podresources.v1 import api_pb2 as pb
from klet.rpc.gen.klet.podresources.v1 import api_pb2_grpc as pb_grpc
from klet.syncloop.dra.state import ClaimCheckpoint
from klet.testbed.cluster import ControlPlane

from tests.harness.clusternode import cluster_node, wait_node_ready
from tests.harness.dra import (
    CDIContainerd,
    DRATestDriver,
    dra_test_driver_binary,
    slice_devices,
    started_cdi_containerd,
    until,
)
from tests.harness.node import KletNode

NODE = "kletdrapod1"
DRIVER = "pods.dra.klet.test"
NAMESPACE = "default"


@pytest.fixture(scope="module")
def run_dir() -> Iterator[Path]:
    # containerd's and the driver's socket paths must stay under 108 bytes.
    dir = Path(tempfile.mkdtemp(prefix="kdrap-", dir="/tmp"))
    yield dir
    shutil.rmtree(dir, ignore_errors=True)


@pytest.fixture(scope="module")
def containerd(run_dir: Path) -> Iterator[CDIContainerd]:
    """containerd v2 with CDI on, its specs read from `<run_dir>/cdi` alone, and the
    pause and busybox images imported (the pod's image is never pulled)."""
    with started_cdi_containerd(run_dir) as ctrd:
        yield ctrd


@pytest.fixture(scope="module")
def node(
    full_control_plane: ControlPlane,
    devstack: DevStack,
    containerd: CDIContainerd,
    run_dir: Path,
) -> Iterator[KletNode]:
    """klet's services as node NODE, their runtime the CDI containerd (the later flag
    wins over the devstack's containerd)."""
    with cluster_node(
        full_control_plane,
        devstack,
        run_dir / "node",
        name=NODE,
        extra_flags=["--container-runtime-endpoint", containerd.endpoint],
    ) as kletnode:
        wait_node_ready(full_control_plane, NODE, timeout_s=90)
        yield kletnode


def kget(cp: ControlPlane, *args: str) -> Any:
    res = cp.kubectl("get", *args, "-o", "json")
    return json.loads(res.stdout) if res.returncode == 0 else None


def apply(cp: ControlPlane, obj: dict[str, Any]) -> None:
    cp.kubectl("apply", "-f", "-", input=json.dumps(obj), check=True)


def diagnosis(cp: ControlPlane, node: KletNode, pod_name: str) -> str:
    """What the apiserver and syncloop say about the pod, for a failure's message."""
    pod = kget(cp, "pod", pod_name, "-n", NAMESPACE) or {}
    events = cp.kubectl("get", "events", "-n", NAMESPACE, "-o", "wide").stdout
    claims = cp.kubectl("get", "resourceclaims", "-n", NAMESPACE, "-o", "yaml").stdout
    lines = [line for line in node.log("syncloop").splitlines() if "WARN" in line or "rror" in line]
    return (
        f"pod status {json.dumps(pod.get('status'))}\nspec.nodeName "
        f"{pod.get('spec', {}).get('nodeName')}\nevents:\n{events}\nclaims:\n{claims}\n"
        f"syncloop:\n" + "\n".join(lines[-30:])
    )


async def listed_claims(root_dir: Path, pod_name: str) -> dict[str, list[Any]]:
    """The PodResources API's List (klet's socket, the generated v1 client): each
    container of the pod with its dynamic resources."""
    socket = root_dir / SOCKET_DIR / SOCKET_NAME
    async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
        stub = pb_grpc.PodResourcesListerStub(channel)  # type: ignore[no-untyped-call]
        listed = await stub.List(pb.ListPodResourcesRequest(), timeout=10)
    [pod] = [p for p in listed.pod_resources if p.name == pod_name]
    return {
        c.name: [
            (
                d.claim_name,
                d.claim_namespace,
                [
                    (r.driver_name, r.pool_name, r.device_name, [x.name for x in r.cdi_devices])
                    for r in d.claim_resources
                ],
            )
            for d in c.dynamic_resources
        ]
        for c in pod.containers
    }


async def container_env(endpoint: str, pod_uid: str) -> dict[str, list[str]]:
    """Each running container of the pod: its environment, read with ExecSync."""
    runtime = RuntimeClient(CRISettings(runtime_endpoint=endpoint))
    try:
        envs: dict[str, list[str]] = {}
        for c in await runtime.list_containers(label_selector={"io.kubernetes.pod.uid": pod_uid}):
            code, out, err = await runtime.exec_sync(c.id, ["env"], timeout_s=30)
            assert code == 0, err
            envs[c.name] = out.decode().splitlines()
        return envs
    finally:
        await runtime.close()


async def test_a_template_claims_pod_runs_with_the_drivers_device_and_gives_it_back(
    full_control_plane: ControlPlane,
    node: KletNode,
    containerd: CDIContainerd,
    run_dir: Path,
) -> None:
    cp = full_control_plane
    cdi_dir = containerd.cdi_spec_dirs[0]
    driver = DRATestDriver.start(
        dra_test_driver_binary(),
        kubeconfig=cp.admin_kubeconfig,
        driver=DRIVER,
        node=NODE,
        root_dir=node.root_dir,
        cdi_dir=cdi_dir,
        log=run_dir / "dra-test-driver.log",
    )
    suffix = uuid.uuid4().hex[:6]
    template, pod_name = f"dev-{suffix}", f"drapod-{suffix}"
    try:
        devices = await until(lambda: slice_devices(cp, DRIVER, NODE), what="the ResourceSlice")
        apply(
            cp,
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": DRIVER},
                "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
            },
        )
        apply(
            cp,
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaimTemplate",
                "metadata": {"name": template, "namespace": NAMESPACE},
                "spec": {
                    "spec": {
                        "devices": {
                            "requests": [{"name": "req-0", "exactly": {"deviceClassName": DRIVER}}]
                        }
                    }
                },
            },
        )
        container = {
            "image": BUSYBOX_IMAGE,
            "imagePullPolicy": "Never",
            "command": ["sleep", "3600"],
        }
        apply(
            cp,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": pod_name, "namespace": NAMESPACE},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": NODE},
                    "hostNetwork": True,
                    "automountServiceAccountToken": False,
                    "terminationGracePeriodSeconds": 1,
                    "resourceClaims": [{"name": "dev", "resourceClaimTemplateName": template}],
                    "containers": [
                        {**container, "name": "user", "resources": {"claims": [{"name": "dev"}]}},
                        {**container, "name": "other"},
                    ],
                },
            },
        )

        def running() -> dict[str, Any] | None:
            pod = kget(cp, "pod", pod_name, "-n", NAMESPACE)
            return pod if pod and pod["status"].get("phase") == "Running" else None

        try:
            pod = await until(running, what=f"pod {pod_name} Running", timeout_s=120)
        except AssertionError as err:
            raise AssertionError(f"{err}: {diagnosis(cp, node, pod_name)}") from err
        pod_uid = pod["metadata"]["uid"]
        [claim_status] = pod["status"]["resourceClaimStatuses"]
        claim_name = claim_status["resourceClaimName"]
        claim = kget(cp, "resourceclaim", claim_name, "-n", NAMESPACE)
        [result] = claim["status"]["allocation"]["devices"]["results"]
        assert result["device"] in devices and result["pool"] == NODE
        assert [r["uid"] for r in claim["status"]["reservedFor"]] == [pod_uid]

        [saved] = ClaimCheckpoint(node.root_dir).load()
        assert (saved.claim_name, saved.pod_uids) == (claim_name, frozenset({pod_uid}))
        assert [d.device_name for d in saved.driver_state[DRIVER]] == [result["device"]]
        envs = await container_env(containerd.endpoint, pod_uid)
        variable = re.sub(r"[^a-zA-Z0-9]", "_", f"claim_{claim_name}_req-0") + "=true"
        assert variable in envs["user"], (envs["user"], driver.text()[-2000:])
        assert not [e for e in envs["other"] if e.startswith("claim_")], envs["other"]
        assert list(cdi_dir.glob("*.json")), "the driver wrote no CDI spec"
        dynamic = await listed_claims(node.root_dir, pod_name)
        assert dynamic["other"] == []
        [(name, namespace, [(drv, pool, device, cdi)])] = dynamic["user"]
        assert (name, namespace, drv, pool, device) == (
            claim_name,
            NAMESPACE,
            DRIVER,
            NODE,
            result["device"],
        )
        assert cdi == [f"{DRIVER}/test=claim-{claim['metadata']['uid']}-req-0"]

        cp.kubectl("delete", "pod", pod_name, "-n", NAMESPACE, "--wait=false", check=True)
        await until(
            lambda: kget(cp, "pod", pod_name, "-n", NAMESPACE) is None or None,
            what=f"pod {pod_name} gone from the apiserver",
            timeout_s=90,
        )
        # klet reports the pod terminated only after the unprepare: both are done now.
        assert ClaimCheckpoint(node.root_dir).load() == []
        assert list(cdi_dir.glob("*.json")) == [], driver.text()[-2000:]

        driver.stop()  # its last instance gone: syncloop deletes its slices 30 s later
        await until(
            lambda: slice_devices(cp, DRIVER, NODE) is None or None,
            what="the gone driver's ResourceSlice deleted",
            timeout_s=90,
        )
        wiped = [
            line
            for line in node.log("syncloop").splitlines()
            if "ResourceSlices of the node deleted" in line and DRIVER in line
        ]
        assert wiped, "syncloop did not delete the slices"
    finally:
        cp.kubectl("delete", "pod", pod_name, "-n", NAMESPACE, "--ignore-not-found",
                   "--grace-period=0", "--force")  # fmt: skip
        cp.kubectl("delete", "resourceclaimtemplate", template, "-n", NAMESPACE,
                   "--ignore-not-found")  # fmt: skip
        driver.stop()
