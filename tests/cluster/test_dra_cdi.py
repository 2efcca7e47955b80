"""A container created through klet's CRI config path with a DRA claim's CDI device
runs with what the driver's CDI spec gives it (issue 40 item 5, the second layer).

The runtime is the DRA tier's containerd v2 (tools/dra/build-containerd.sh; started by
tests/harness/dra.py's CDIContainerd with CDI on and `cdi_spec_dirs` the run's CDI
directory alone), Debian's runc beneath it. The driver is upstream's dra-test-driver
(registered through syncloop's plugin watcher as in test_dra_driver.py), the claim
allocated to a device of its ResourceSlice and reserved for the pod. syncloop's
`ClaimManager` prepares the pod's claims: it reads the claim from the apiserver (through
kubectl here, which needs no node credentials; syncloop's own is dra/apiclaims.py,
proven with the whole pod path by test_dra_pods.py), checks it and calls
NodePrepareResources over klet.rpc.dra; `dra_manager_state` in the scratch root dir then
lists the claim with the pod and the device. The driver's CDI spec for the claim sets
`claim_<claim>_<request>=true`; the manager's `cdi_devices` gives the container its CDI
ID and `criconfig.container_config` puts it in CRI CDI_devices. The container's
environment, read back with ExecSync, holds the driver's variable, and a second
container of the same pod that does not name the claim has none. Unpreparing the pod
empties the checkpoint and the driver removes its CDI spec. Only `make test-dra`
(KLET_DRA_TESTS=1) collects it.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from klet.cri.client import CRISettings, RuntimeClient
from klet.devstack.images import BUSYBOX_IMAGE
from klet.rpc.dra import GrpcDRAPlugin
from klet.syncloop.containers import criconfig
from klet.syncloop.dra.manager import ClaimManager, ManagerDeps
from klet.syncloop.dra.registration import DRADrivers
from klet.syncloop.dra.state import ClaimCheckpoint
from klet.testbed.cluster import ControlPlane

from tests.harness.dra import (
    CDIContainerd,
    DRATestDriver,
    KubectlClaims,
    allocated_claim,
    dra_test_driver_binary,
    node_object,
    slice_devices,
    started_cdi_containerd,
    until,
    watched_drivers,
)

NODE = "kletcdi1"
DRIVER = "cdi.klet.test"
NAMESPACE = "default"


@pytest.fixture(scope="module")
def binary() -> Path:
    return dra_test_driver_binary()


@pytest.fixture(scope="module")
def node(control_plane: ControlPlane) -> Iterator[str]:
    with node_object(control_plane, NODE) as name:
        yield name


@pytest.fixture
def run_dir() -> Iterator[Path]:
    # containerd's socket path must stay under 108 bytes: pytest's tmp_path may not.
    dir = Path(tempfile.mkdtemp(prefix="kcdi-", dir="/tmp"))
    yield dir
    shutil.rmtree(dir, ignore_errors=True)


@pytest.fixture
def containerd(run_dir: Path) -> Iterator[CDIContainerd]:
    """containerd v2 with CDI on, its specs read from `<run_dir>/cdi` alone, and the
    pause and busybox images imported (no registry)."""
    with started_cdi_containerd(run_dir) as ctrd:
        yield ctrd


@pytest.fixture
async def watched(run_dir: Path) -> AsyncIterator[tuple[Path, DRADrivers[GrpcDRAPlugin]]]:
    root = run_dir / "root"
    async with watched_drivers(root) as drivers:
        yield root, drivers


async def test_a_container_with_the_claims_cdi_device_gets_the_drivers_env(
    control_plane: ControlPlane,
    node: str,
    binary: Path,
    containerd: CDIContainerd,
    watched: tuple[Path, DRADrivers[GrpcDRAPlugin]],
    run_dir: Path,
) -> None:
    root, drivers = watched
    driver = DRATestDriver.start(
        binary,
        kubeconfig=control_plane.admin_kubeconfig,
        driver=DRIVER,
        node=node,
        root_dir=root,
        cdi_dir=containerd.cdi_spec_dirs[0],
        log=run_dir / "dra-test-driver.log",
    )
    claim = f"claim-{uuid.uuid4().hex[:8]}"
    pod_uid = str(uuid.uuid4())
    runtime = RuntimeClient(CRISettings(runtime_endpoint=containerd.endpoint))
    checkpoint = ClaimCheckpoint(root)
    manager = ClaimManager(
        ManagerDeps(claims=KubectlClaims(control_plane), drivers=drivers, checkpoint=checkpoint)
    )
    try:
        await until(lambda: drivers.current(DRIVER), what="the driver registered")
        devices = await until(
            lambda: slice_devices(control_plane, DRIVER, NODE), what="the ResourceSlice"
        )
        uid = allocated_claim(
            control_plane, claim, NAMESPACE, DRIVER, NODE, devices[0], reserved_for=("cdi", pod_uid)
        )
        pod: dict[str, Any] = {
            "metadata": {"name": "cdi", "namespace": NAMESPACE, "uid": pod_uid},
            "spec": {
                "hostNetwork": True,
                "resourceClaims": [{"name": "dev", "resourceClaimName": claim}],
                "containers": [
                    {
                        "name": "user",
                        "image": BUSYBOX_IMAGE,
                        "command": ["sleep", "3600"],
                        "resources": {"claims": [{"name": "dev"}]},
                    },
                    {"name": "other", "image": BUSYBOX_IMAGE, "command": ["sleep", "3600"]},
                ],
            },
        }
        await manager.prepare(pod)
        [saved] = checkpoint.load()
        assert (saved.claim_uid, saved.pod_uids) == (uid, frozenset({pod_uid}))
        assert [d.device_name for d in saved.driver_state[DRIVER]] == [devices[0]]
        sandbox = criconfig.sandbox_config(
            pod, attempt=0, pod_logs_dir=str(run_dir / "logs"), cgroup_parent=""
        )
        sandbox_id = await runtime.run_pod_sandbox(sandbox)
        try:
            envs = {}
            for container in pod["spec"]["containers"]:
                cdi = manager.cdi_devices(pod, container)
                config = criconfig.container_config(
                    pod,
                    container,
                    instance=criconfig.Instance(
                        restart_count=0, image=BUSYBOX_IMAGE, dra_cdi_devices=cdi
                    ),
                    node=criconfig.NodeContext(),
                )
                cid = await runtime.create_container(sandbox_id, config, sandbox)
                await runtime.start_container(cid)
                code, out, err = await runtime.exec_sync(cid, ["env"], timeout_s=30)
                assert code == 0, err
                envs[container["name"]] = (cdi, out.decode().splitlines())
        finally:
            await runtime.stop_pod_sandbox(sandbox_id)
            await runtime.remove_pod_sandbox(sandbox_id)
        variable = re.sub(r"[^a-zA-Z0-9]", "_", f"claim_{claim}_req-0") + "=true"
        user_cdi, user_env = envs["user"]
        assert user_cdi == (f"{DRIVER}/test=claim-{uid}-req-0",)
        assert variable in user_env, (user_env, driver.text()[-2000:])
        other_cdi, other_env = envs["other"]
        assert other_cdi == ()
        assert not [e for e in other_env if e.startswith("claim_")], other_env
        await manager.unprepare(pod_uid)
        assert checkpoint.load() == []
        assert list(containerd.cdi_spec_dirs[0].glob("*.json")) == []
    finally:
        await runtime.close()
        driver.stop()
        control_plane.kubectl("delete", "resourceclaim", claim, "-n", NAMESPACE, "--wait=false")
