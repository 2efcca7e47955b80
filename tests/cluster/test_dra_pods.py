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

import re
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from klet.cri.client import CRISettings, RuntimeClient
from klet.devstack import DevStack
from klet.devstack.images import BUSYBOX_IMAGE
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
from tests.harness.dra_pods import (
    apply,
    claim_pod_objects,
    clean_up,
    deleted,
    listed_claims,
    pod_claim,
    running_pod,
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
        for obj in claim_pod_objects(
            DRIVER, template=template, pod=pod_name, namespace=NAMESPACE, node=NODE,
            image=BUSYBOX_IMAGE,
        ):  # fmt: skip
            apply(cp, obj)
        pod = await running_pod(cp, node, pod_name, NAMESPACE)
        pod_uid = pod["metadata"]["uid"]
        claim, result = pod_claim(cp, pod)
        claim_name = claim["metadata"]["name"]
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

        await deleted(cp, pod_name, NAMESPACE)
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
        clean_up(cp, driver=DRIVER, template=template, pod=pod_name, namespace=NAMESPACE)
        driver.stop()
