"""Upstream's DRA test driver (k8s.io/kubernetes test/e2e/dra/test-driver) for the DRA tests.

`dra_test_driver_binary()` builds it with tools/dra/build.sh (cached after the first
build). `DRATestDriver.start` runs its `kubelet-plugin` mode for one node against the
harness's apiserver: it publishes a ResourceSlice of fake devices for the node,
registers through the node's `<root-dir>/plugins_registry/` (its DRAPlugin socket in
`<root-dir>/plugins/<driver>/`) and writes a CDI spec per prepared claim request into
`cdi_dir`. `stop()` sends SIGTERM: the driver removes its sockets.

`CDIContainerd` is the DRA tier's container runtime: containerd v2 (tools/dra/
build-containerd.sh), whose CRI plugin applies CRI `CDI_devices` from the CDI specs in
`cdi_spec_dirs`; Debian's containerd 1.6, which every other tier runs, has no CDI. It is
the devstack `Containerd` (private root, state, sockets, CNI, registry hosts; the same
clean-up) with containerd v2's configuration format (version 3: the CRI plugin split
into `io.containerd.cri.v1.runtime` and `io.containerd.cri.v1.images`, the server's
streaming settings left in `io.containerd.grpc.v1.cri`) and NRI disabled (its default
socket is the host's /var/run/nri).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from klet.bus import NodeBus
from klet.csi import CSIClient, RegistrationClient
from klet.devstack.containerd import Containerd
from klet.devstack.images import (
    BUSYBOX_IMAGE,
    TEST_REGISTRY_HOST,
    build,
    standard_images,
    write_oci_archive,
)
from klet.model.dra import DRA_PLUGIN
from klet.rpc.dra import GrpcDRAPlugin
from klet.syncloop.dra.registration import DRADrivers, DriverInstance
from klet.syncloop.plugins.csidrivers import CSIRegistrar
from klet.syncloop.plugins.watcher import PluginWatcher
from klet.testbed.cluster import ControlPlane
from klet.testbed.fakes.bus import FakeBus

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[2]


def dra_test_driver_binary() -> Path:
    """The built driver (tools/dra/build.sh: about 15 s the first time, cached after)."""
    out = subprocess.run(
        ["bash", str(ROOT / "tools" / "dra" / "build.sh")],
        check=True,
        capture_output=True,
        text=True,
        timeout=900,
    )
    return Path(out.stdout.strip().splitlines()[-1])


def allocated_claim(
    cp: ControlPlane,
    name: str,
    namespace: str,
    driver: str,
    node: str,
    device: str,
    *,
    reserved_for: tuple[str, str] | None = None,
) -> str:
    """Create a ResourceClaim for one device of class `driver` and write its status
    allocating `device` of the driver's pool `node`, and reserved for the pod
    `reserved_for` (name, UID) when given (what the scheduler's DRA plugin would write);
    its UID."""
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "devices": {"requests": [{"name": "req-0", "exactly": {"deviceClassName": driver}}]}
        },
    }
    cp.kubectl("create", "-f", "-", input=json.dumps(claim), check=True)
    result = {"request": "req-0", "driver": driver, "pool": node, "device": device}
    status: dict[str, Any] = {"status": {"allocation": {"devices": {"results": [result]}}}}
    if reserved_for is not None:
        pod, uid = reserved_for
        status["status"]["reservedFor"] = [{"resource": "pods", "name": pod, "uid": uid}]
    cp.kubectl(
        "patch", "resourceclaim", name, "-n", namespace, "--subresource=status",
        "--type=merge", "-p", json.dumps(status), check=True,
    )  # fmt: skip
    got = cp.kubectl("get", "resourceclaim", name, "-n", namespace, "-o", "json", check=True)
    return str(json.loads(got.stdout)["metadata"]["uid"])


def slice_devices(cp: ControlPlane, driver: str, node: str) -> list[str] | None:
    """The device names of `driver`'s ResourceSlice for `node`; None before it exists."""
    res = cp.kubectl("get", "resourceslices", "-o", "json")
    if res.returncode != 0:
        return None
    for item in json.loads(res.stdout).get("items", []):
        spec = item.get("spec", {})
        if spec.get("driver") == driver and spec.get("nodeName") == node:
            return [d["name"] for d in spec.get("devices", [])]
    return None


@dataclass
class DRATestDriver:
    proc: subprocess.Popen[bytes]
    log: Path

    @classmethod
    def start(
        cls,
        binary: Path,
        *,
        kubeconfig: Path,
        driver: str,
        node: str,
        root_dir: Path,
        cdi_dir: Path,
        log: Path,
        num_devices: int = 2,
    ) -> DRATestDriver:
        # The driver makes only the parent of its socket directory (its deployments mount
        # the socket directory from the host with DirectoryOrCreate); the registry is the
        # watcher's.
        (root_dir / "plugins" / driver).mkdir(parents=True, exist_ok=True)
        (root_dir / "plugins_registry").mkdir(parents=True, exist_ok=True)
        argv = [
            str(binary),
            f"--kubeconfig={kubeconfig}",
            f"--drivername={driver}",
            "-v=6",  # 6: its gRPC server logs each request (upstream's GRPCVerbosity)
            "kubelet-plugin",
            f"--node-name={node}",
            f"--plugin-registration-path={root_dir / 'plugins_registry'}",
            f"--datadir={root_dir / 'plugins'}",
            f"--cdi-dir={cdi_dir}",
            f"--num-devices={num_devices}",
        ]
        with open(log, "wb") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        return cls(proc, log)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def text(self) -> str:
        return self.log.read_text(errors="replace")


def cdi_containerd_bin_dir() -> Path:
    """containerd v2 and its runc shim, built by tools/dra/build-containerd.sh (about
    7 min the first time on 2 cores, cached by version after)."""
    out = subprocess.run(
        ["bash", str(ROOT / "tools" / "dra" / "build-containerd.sh")],
        check=True,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    return Path(out.stdout.strip().splitlines()[-1])


class CDIContainerd(Containerd):
    """containerd v2 with CDI on, reading CDI specs from `cdi_spec_dirs` only (the
    devstack Containerd writes its version 3 configuration; this runs its binary)."""

    cdi_spec_dirs: tuple[Path, ...]  # always given here: never containerd 1.6's config

    def __init__(
        self, dir: Path, bin_dir: Path, *, cdi_spec_dirs: tuple[Path, ...], **kwargs: Any
    ) -> None:
        super().__init__(dir, cdi_spec_dirs=cdi_spec_dirs, **kwargs)
        self.binary = str(bin_dir / "containerd")

    @classmethod
    def for_registry_with_cdi(
        cls,
        dir: Path,
        registry_address: str,
        bin_dir: Path,
        *,
        cdi_spec_dirs: tuple[Path, ...],
    ) -> CDIContainerd:
        """Pulls `registry.klet.test/...` from the registry at `registry_address`, as
        `Containerd.for_registry`."""
        hosts = {TEST_REGISTRY_HOST: registry_address, registry_address: registry_address}
        return cls(dir, bin_dir, cdi_spec_dirs=cdi_spec_dirs, registry_host_map=hosts)


@contextlib.contextmanager
def started_cdi_containerd(run_dir: Path) -> Iterator[CDIContainerd]:
    """containerd v2 with CDI on, its specs read from `<run_dir>/cdi` alone, and the
    pause and busybox images imported (nothing is pulled); stopped afterwards."""
    cdi_dir = run_dir / "cdi"
    cdi_dir.mkdir()
    ctrd = CDIContainerd(run_dir / "ctrd", cdi_containerd_bin_dir(), cdi_spec_dirs=(cdi_dir,))
    ctrd.start()
    try:
        specs = {s.reference: s for s in standard_images().values()}
        archive = run_dir / "images.oci.tar"
        write_oci_archive([build(specs[ctrd.sandbox_image]), build(specs[BUSYBOX_IMAGE])], archive)
        ctrd.import_image(archive)
        yield ctrd
    finally:
        ctrd.stop()


class KubectlClaims:
    """ResourceClaims read from the harness's apiserver with kubectl: the DRA claim
    manager's ClaimSource in test_dra_cdi.py, which drives the manager without a node
    (a klet node reads them with dra/apiclaims.py: test_dra_pods.py)."""

    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp

    async def resource_claim(self, namespace: str, name: str) -> dict[str, Any]:
        res = await asyncio.to_thread(
            self.cp.kubectl, "get", "resourceclaim", name, "-n", namespace, "-o", "json"
        )
        if res.returncode != 0:
            raise LookupError(res.stderr.strip())
        claim: dict[str, Any] = json.loads(res.stdout)
        return claim


@contextlib.contextmanager
def node_object(cp: ControlPlane, name: str) -> Iterator[str]:
    """A Node named `name` in the apiserver (the owner of a driver's ResourceSlice)
    while the block runs."""
    manifest = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
    cp.kubectl("apply", "-f", "-", input=json.dumps(manifest), check=True)
    try:
        yield name
    finally:
        cp.kubectl("delete", "node", name, "--wait=false")


def _connect(instance: DriverInstance) -> GrpcDRAPlugin:
    return GrpcDRAPlugin(instance.endpoint, driver=instance.driver, service=instance.service)


@contextlib.asynccontextmanager
async def watched_drivers(root: Path) -> AsyncIterator[DRADrivers[GrpcDRAPlugin]]:
    """syncloop's registration path for DRA drivers on the root dir `root`: the plugin
    watcher polling `<root>/plugins_registry` every 0.1 s, its registrar handing
    `DRAPlugin` sockets to the DRADrivers yielded (the CSI table a fake, unused)."""
    drivers = DRADrivers(root_dir=root, connect=_connect)
    registrar = CSIRegistrar(
        NodeBus.of(FakeBus(), service="syncloop").csidrivers,
        registration=RegistrationClient,
        driver=CSIClient,
        handlers={DRA_PLUGIN: drivers},
    )
    watcher = PluginWatcher(root / "plugins_registry", registrar, interval_s=0.1)
    task = asyncio.create_task(watcher.run(), name="plugin-watcher")
    try:
        yield drivers
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def until(check: Callable[[], T | None], *, what: str, timeout_s: float = 60.0) -> T:
    """`check()` once it is truthy, polled every 0.2 s; AssertionError naming `what`
    after `timeout_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not (got := check()):
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.2)
    return got
