"""`make conformance`: Kubernetes' [NodeConformance] e2e tests against a klet node;
`make conformance-storage`: the storage specs of PersistentVolumes and
PersistentVolumes-local against the same kind of node (`--preset storage`);
`make conformance-dra`: the [DRA] specs (`--preset dra`) against a node whose runtime is
containerd v2 with CDI on (tools/dra/build-containerd.sh; Debian's 1.6 has no CDI), the
DRA proxy pod's image from tools/dra/images.py.

Everything runs on this machine, privately, and is torn down afterwards:

1. the binaries: `tools/cluster/build.sh` (etcd, kube-apiserver, kube-controller-manager,
   kube-scheduler, kubectl) and `tools/e2e/build.sh` (e2e.test, ginkgo, agnhost, nnp),
   each a no-op once cached;
2. a dev stack (klet.devstack: Redis, a registry, containerd with the bridge CNI), and
   the suite's four images built offline and pushed to its registry under the mirror
   host its containerd maps (tools/e2e/images.py), with the KUBE_TEST_REPO_LIST file
   pointing the suite there;
3. a control plane with kube-controller-manager and kube-scheduler
   (`ControlPlane(controllers=True)`);
4. klet in cluster mode as node `klet-conformance`: `klet up` on the dev stack's
   containerd with the node's client certificate (Node authorizer, NodeRestriction), a
   serving certificate for its API from the cluster CA (the apiserver verifies it for
   exec, logs and port-forward), and the node address the suite assumes: a non-loopback
   address of this machine (tests/harness/nodeaddress: the default route's source
   address) as node IP, with the kubelet API on it at port 10250. With 127.0.0.1 the
   apiserver refuses its node proxy ("address not allowed") and a pod that calls
   `$NODE_IP:10250` (status.hostIP) reaches its own loopback; the KubeletFineGrainedAuthz
   specs call port 10250 itself. klet's processes are named `kubelet`
   (kubelet_named_python). Then a wait until the Node is Ready, has lost the not-ready
   taint and is labelled kubernetes.io/os=linux;
5. `e2e.test --provider=local` with the focus and skip of the issue (or the ones given),
   through the ginkgo CLI when `--procs` is above one, with ginkgo's JSON report;
6. the summary: `<out>/RESULTS.md` (tools/e2e/report.py), next to the suite's JUnit
   file and the logs of every component.

    python -m tools.e2e.conformance [--preset node|storage|dra|...] [--focus RE] [--skip RE]
                                    [--procs N] [--out DIR] [--node-address IP]
    python -m tools.e2e.conformance [--preset P] --render   # RESULTS.md again from the last run

A preset names the focus, the skip, the output directory and the extra images of one
selection; --focus, --skip and --out override its choices. --node-address runs the node
on an address put on `lo` for the run: the specs call the kubelet API at port 10250 of
the node's address, so two runs at once need two addresses.

The exit code is 0 when every selected spec passed, 1 when some failed, 2 when the
cluster could not be set up. KLET_KEEP_DEVSTACK=1 keeps the working directory.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from klet.devstack import TEST_REGISTRY_HOST, DevStack, ManagedProcess, free_port
from klet.devstack.procs import StartError, tail
from klet.testbed.cluster import KUBERNETES_SERVICE_IP, ControlPlane

from tests.harness.nodeaddress import host_address
from tests.harness.snapshots import SnapshotController, install_snapshot_crds
from tools.csi import images as csi_images
from tools.csi.images import CSIImageError
from tools.dra import images as dra_images
from tools.e2e.apiroute import RouteError, kubernetes_service
from tools.e2e.images import (
    build_binaries,
    build_csi_manifest_images,
    build_images,
    push_images,
)
from tools.e2e.report import TITLE, Results, RunInfo, parse_report, render_markdown
from tools.e2e.suite import repo_list_yaml

REPO = Path(__file__).resolve().parents[2]
CLUSTER_BUILD = REPO / "tools" / "cluster" / "build.sh"
E2E_BUILD = REPO / "tools" / "e2e" / "build.sh"
NODE_NAME = "klet-conformance"
FOCUS = r"\[NodeConformance\]"
SKIP = r"\[Slow\]|\[Serial\]|\[Disruptive\]|\[Flaky\]|\[Feature:.+\]"
# The storage selection: the Describes "PersistentVolumes" and "PersistentVolumes-local"
# (the space keeps out "PersistentVolumes-expansion" and the like), and FeatureGate tags
# besides the node skip. 46 specs in v1.34.4 (34 local, 12 PersistentVolumes).
STORAGE_FOCUS = r"\[sig-storage\] PersistentVolumes(-local)? "
STORAGE_SKIP = SKIP + r"|\[FeatureGate:.+\]"
# The CSI selection: the suite's csi-hostpath driver (test/e2e/storage/csi_volumes.go, 100
# runnable specs in v1.34.4) and CSI Mock (test/e2e/storage/csimock, 57), which deploy
# their drivers as pods from the manifests of the release (tools/csi images them).
STORAGE_CSI_FOCUS = r"\[sig-storage\] CSI Volumes \[Driver: csi-hostpath\]|\[sig-storage\] CSI Mock"
# The csi-hostpath specs of volume snapshots (snapshottable and provisioning from a
# snapshot: 21 in v1.34.4, 18 without the Windows ones), all tagged
# [Feature:VolumeSnapshotDataSource]: the storage skip but for that one Feature tag.
SNAPSHOT_FOCUS = r"\[Driver: csi-hostpath\].*\[Feature:VolumeSnapshotDataSource\]"
SNAPSHOT_SKIP = (
    r"\[Slow\]|\[Serial\]|\[Disruptive\]|\[Flaky\]|\[FeatureGate:.+\]|\[Feature:Windows\]"
)
# The [DRA] specs a default 1.34 cluster runs: all but the Serial, Slow, Disruptive and
# Flaky ones and those of gates 1.34 has off (tagged [Alpha], [Feature:OffByDefault]).
# [Feature:DynamicResourceAllocation] is kept: it names a job with DRA on, which 1.34 is
# by default (GA), and tags the kubelet's own specs ("[DRA] kubelet ..."); it and
# OffByDefault are the only Feature tags among v1.34.4's [DRA] specs. Kept too: the Beta
# gates 1.34 has on (DRAAdminAccess, DRAResourceClaimDeviceStatus, DRAPrioritizedList).
# 65 specs in v1.34.4 (of 78 [DRA]); the "on multiple nodes" ones skip themselves on one.
DRA_FOCUS = r"\[DRA\]"
DRA_SKIP = r"\[Slow\]|\[Serial\]|\[Disruptive\]|\[Flaky\]|\[Alpha\]|\[Feature:OffByDefault\]"
# Where the [DRA] specs' proxy pod writes CDI specs (a hostPath of
# dra-test-driver-proxy.yaml): the dra run's containerd reads them from there. A tmpfs of
# the run's own mount namespace, so nothing is left on the machine.
DRA_CDI_DIR = Path("/var/run/cdi")
DRA_CONTAINERD_BUILD = REPO / "tools" / "dra" / "build-containerd.sh"
# The DRA API versions 1.34's apiserver has but does not serve by default (v1 is GA):
# upstream's DRA e2e cluster (test/e2e/dra/kind.yaml) turns them on, and the specs "with
# v1beta1 API" and "with v1beta2 API" create their claims through them.
DRA_RUNTIME_CONFIG = ("resource.k8s.io/v1beta1=true", "resource.k8s.io/v1beta2=true")


@dataclass(frozen=True)
class Preset:
    """One named selection of the suite and where its results go."""

    focus: str
    skip: str
    out: str  # RESULTS.md's directory, relative to the repository
    title: str  # RESULTS.md's heading
    images: tuple[str, ...] = ()  # ImageIDs of manifest.go beyond the four every run has
    # Run everything in a PID and mount namespace of its own (see own_pid_namespace).
    own_pid_namespace: bool = False
    notes: tuple[str, ...] = ()  # lines RESULTS.md gives about how the run was made
    # Push the CSI components' images (tools/csi) for specs that deploy CSI drivers.
    csi_images: bool = False
    # The snapshot CRDs and snapshot-controller in the cluster (tests/harness/snapshots).
    snapshots: bool = False
    # The node on containerd v2 with CDI (tools/dra/build-containerd.sh) reading DRA_CDI_DIR,
    # and the [DRA] specs' proxy image (tools/dra/images.py).
    dra: bool = False
    # The apiserver's --runtime-config entries (API versions it does not serve by default).
    runtime_config: tuple[str, ...] = ()


# How every run is made (RESULTS.md says it): the node's "host" as the suite assumes it.
NODE_NOTES = (
    "The run is made in a PID and mount namespace of its own (tini as PID 1), whose root "
    "is a shared mount: the specs' hostexec pods run `nsenter --mount=/rootfs/proc/1/ns/mnt`, "
    "which the test machine's PID 1 (the VM's agent) refuses even to root on the host, and "
    "Bidirectional mount propagation needs the host path on a shared mount (this machine's "
    "own root is private). containerd and klet run in that namespace; the network is the "
    "machine's. The node's address is the machine's default-route address, its kubelet API "
    "on port 10250. klet's processes run under the name `kubelet` (the interpreter linked "
    "under that name), so specs that find the node agent with `pidof kubelet` find klet.",
)

PRESETS: dict[str, Preset] = {
    "node": Preset(
        focus=FOCUS,
        skip=SKIP,
        out="conformance",
        title=TITLE,
        own_pid_namespace=True,
        notes=NODE_NOTES,
    ),
    "storage": Preset(
        focus=STORAGE_FOCUS,
        skip=STORAGE_SKIP,
        out="conformance/storage",
        title="Kubernetes storage e2e results for klet "
        "(PersistentVolumes, PersistentVolumes-local)",
        images=("VolumeNFSServer",),
        own_pid_namespace=True,
        notes=NODE_NOTES,
    ),
    "storage-csi": Preset(
        focus=STORAGE_CSI_FOCUS,
        skip=STORAGE_SKIP,
        out="conformance/storage/csi",
        title="Kubernetes storage e2e results for klet ([Driver: csi-hostpath], CSI Mock)",
        own_pid_namespace=True,
        notes=(
            *NODE_NOTES,
            "The CSI drivers run as the suite deploys them (StatefulSets of the release's "
            "manifests, images built by tools/csi from the versions they name); the suite is "
            "told the node's root directory (`--kubelet-root-dir`), which it substitutes for "
            "/var/lib/kubelet in their host paths.",
        ),
        csi_images=True,
    ),
    "storage-csi-snapshots": Preset(
        focus=SNAPSHOT_FOCUS,
        skip=SNAPSHOT_SKIP,
        out="conformance/storage/csi/snapshots",
        title="Kubernetes storage e2e results for klet ([Driver: csi-hostpath] snapshots)",
        own_pid_namespace=True,
        notes=(
            *NODE_NOTES,
            "The CSI driver runs as the suite deploys it (the release's csi-hostpath "
            "StatefulSet with csi-snapshotter, images built by tools/csi). The cluster has "
            "the snapshot.storage.k8s.io v1 CRDs of the release's "
            "cluster/addons/volumesnapshots and snapshot-controller v8.3.0 run beside "
            "kube-controller-manager, as kube-up's addon provides them.",
        ),
        csi_images=True,
        snapshots=True,
    ),
    "dra": Preset(
        focus=DRA_FOCUS,
        skip=DRA_SKIP,
        out="conformance/dra",
        title="Kubernetes DRA e2e results for klet ([DRA])",
        own_pid_namespace=True,
        notes=(
            *NODE_NOTES,
            "The node's runtime is containerd v2 (tools/dra/build-containerd.sh) with CDI on, "
            "reading CDI specs from /var/run/cdi (a tmpfs of the run's mount namespace); "
            "Debian's containerd 1.6 has no CDI. The test driver's kubelet plugin runs "
            "inside e2e.test, as upstream's specs run it, through the proxy pod of "
            "dra-test-driver-proxy.yaml; that manifest names hostpathplugin v1.7.3, whose "
            "sources cannot be had here: its image carries tools/csi's hostpathplugin "
            "v1.16.1, whose proxy mode (-endpoint, -proxy-endpoint) is the one used "
            "(tools/dra/images.py).",
            "The apiserver serves resource.k8s.io v1beta1 and v1beta2 besides v1 "
            "(--runtime-config, as upstream's DRA e2e cluster, test/e2e/dra/kind.yaml): the "
            "specs 'with v1beta1 API' and 'with v1beta2 API' create their claims through them.",
        ),
        dra=True,
        runtime_config=DRA_RUNTIME_CONFIG,
    ),
}
# Set in the environment of the run that own_pid_namespace started, so it does not again.
IN_OWN_NAMESPACE = "KLET_CONFORMANCE_IN_PID_NS"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
# The kubelet API's port: the suite's specs that call the node from a pod use it as a
# constant (ports.KubeletPort), so the node must listen there.
KUBELET_PORT = 10250
OS_LABEL = "kubernetes.io/os"
KLET_DIR = "klet"  # the node's directory in the run's work directory
# The node's --root-dir, beside KLET_DIR with a name as short as can be: the plugin
# registration sockets in <root-dir>/plugins_registry/ are unix sockets, whose path is at
# most 107 bytes, and the [DRA] specs' rolling-update driver names its own
# `<driver>-<pod UID>-reg.sock` (62 bytes): under /tmp/klet-conf-XXXXXXXX/klet/root its
# proxy could not listen (112 bytes), with upstream's /var/lib/kubelet it is 96.
NODE_ROOT_DIR = "r"


class SetupError(RuntimeError):
    """The cluster the suite runs against could not be made."""


# Failures that are this machine's, not klet's: a pattern of the spec text -> why. They
# are still counted as failed; RESULTS.md gives the reason next to each.
KNOWN_DIFFERENCES: dict[str, str] = {
    r"PrivilegedPod .*should enable privileged commands": (
        "environment: the test VM's kernel has no dummy network device "
        "(`ip link add d1 type dummy` fails with 'Unknown device type' in any network "
        "namespace, outside klet too); the container is privileged and `ip` runs."
    ),
    r"(ConfigMap|Secrets) should be consumable via the environment": (
        "environment: the keys are `data-1`..., not shell identifiers, and the test prints "
        "them with `sh -c env`; the offline busybox image is Debian's busybox 1.35, whose "
        "ash drops such variables before running `env` (upstream's 1.37 image keeps them). "
        "klet passes them: they are in the container process's /proc/<pid>/environ."
    ),
    r"Pods should support retrieving logs from the container over websockets": (
        "timing under load (load average 40-90 on 2 cores during the run): the test reads "
        "the log once, without following, as soon as the container runs; the log was still "
        "empty because the container's shell had not yet written its line. It passed in the "
        "first full run; klet serves the log over the binary.k8s.io websocket."
    ),
    # make conformance-storage
    r"PersistentVolumes NFS ": (
        "environment: the test VM's kernel is built without NFS (CONFIG_NFS_FS, CONFIG_NFSD "
        "and CONFIG_SUNRPC unset, and no module support): the volume/nfs server pod runs, "
        'but its `mount -t nfsd nfsd /proc/fs/nfsd` fails with "unknown filesystem type '
        "'nfsd'\", so nothing serves the export, and the node could not mount one. klet does "
        'not mount `nfs` PVs either (FailedMount: volume type "nfs" is not supported); '
        "the one NFS spec that mounts nothing (a new PV turns Available) passes."
    ),
    # make conformance-dra
    r"\[DRA\] kubelet .*with v1beta[12] API": (
        "run set-up, fixed in 74a014a: the run's apiserver served resource.k8s.io v1 alone "
        "(1.34's default), and these specs create their claims through v1beta1 or v1beta2, "
        "which upstream's DRA e2e cluster serves (--runtime-config in test/e2e/dra/kind.yaml). "
        "--preset dra now serves both; the four 'with v1beta1/v1beta2 API' specs, run again "
        "alone at 74a014a, passed."
    ),
    r"\[DRA\] kubelet .*(rolling|failed) update": (
        "run set-up, fixed in d3d41de: the driver's rolling-update registration socket "
        "(<driver>-<pod UID>-reg.sock) under the node's root dir "
        "/tmp/klet-conf-XXXXXXXX/klet/root/plugins_registry/ was 112 bytes, beyond a unix "
        "socket path's 107, so the proxy in the driver's pod never listened and klet never "
        "saw the registration ('hosts where the plugin has not been registered yet'). The "
        "node's root dir is now <work>/r (96 bytes under /var/lib/kubelet upstream); both "
        "specs, run again alone at d3d41de, passed."
    ),
}


def log(message: str) -> None:
    print(f"conformance: {message}", file=sys.stderr, flush=True)


def run_build(script: Path) -> Path:
    """Run a build script (a no-op when cached); its bin directory (the last line)."""
    began = time.monotonic()
    res = subprocess.run(["bash", str(script)], stdout=subprocess.PIPE, text=True)
    if res.returncode != 0:
        raise SetupError(f"{script} exited {res.returncode}")
    log(f"{script.relative_to(REPO)}: {time.monotonic() - began:.0f} s")
    return Path(res.stdout.strip().splitlines()[-1])


@dataclass(frozen=True)
class Binaries:
    control_plane: Path  # etcd, kube-apiserver, ..., kubectl
    e2e: Path  # e2e.test, ginkgo, agnhost, nnp


def build_all() -> Binaries:
    return Binaries(control_plane=run_build(CLUSTER_BUILD), e2e=run_build(E2E_BUILD))


def version_of(argv: Sequence[str]) -> str:
    res = subprocess.run(list(argv), capture_output=True, text=True)
    return (res.stdout or res.stderr).strip().splitlines()[0] if res.returncode == 0 else "?"


def kubelet_named_python(dir: Path) -> Path:
    """This interpreter under the name `kubelet`, with this environment's packages: a
    symlink `<dir>/bin/kubelet` to the real interpreter beside the virtual environment's
    pyvenv.cfg and a link to its lib directory (a venv is found from the path the
    interpreter was started as, which a bare `exec -a` would lose).

    `klet up` and the services it starts (with sys.executable) then run as processes
    named `kubelet`, as a node agent installed as the kubelet is: specs that find the
    node agent by name (Mount propagation: `pidof kubelet`, then `nsenter -t <pid> -m`
    into its mount namespace) find klet's processes. Nothing else about them changes."""
    (dir / "bin").mkdir(parents=True, exist_ok=True)
    prefix = Path(sys.prefix)
    if prefix != Path(sys.base_prefix):  # a virtual environment
        shutil.copy(prefix / "pyvenv.cfg", dir / "pyvenv.cfg")
        for name in ("lib", "lib64"):
            if (prefix / name).exists() and not (dir / name).exists():
                (dir / name).symlink_to(prefix / name)
    interpreter = dir / "bin" / "kubelet"
    if not interpreter.exists():
        interpreter.symlink_to(Path(sys.executable).resolve())
    return interpreter


class KletProcess:
    """`klet up` as the cluster's node on the dev stack's containerd (its own Redis),
    its processes named `kubelet` (kubelet_named_python)."""

    def __init__(
        self,
        stack: DevStack,
        plane: ControlPlane,
        dir: Path,
        *,
        node: str,
        ip: str,
        root_dir: Path,
    ) -> None:
        self.kubelet_port = KUBELET_PORT
        argv = [
            str(kubelet_named_python(dir / "python")),
            "-m",
            "klet.cli.main",
            "up",
            "--run-dir",
            str(dir / "run"),
            "--root-dir",
            str(root_dir),
            "--pod-logs-dir",
            str(dir / "pod-logs"),
            "--cert-dir",
            str(dir / "pki"),
            "--container-runtime-endpoint",
            stack.runtime_endpoint,
            "--hostname-override",
            node,
            *plane.node_flags(node, ip),
            "--address",
            ip,
            "--port",
            str(self.kubelet_port),
            "--healthz-port",
            str(free_port()),
            "--read-only-port",
            "0",
            "--service-port",
            "0",
            "-v",
            "2",
        ]
        self.proc = ManagedProcess("klet", argv, dir=dir)

    def start(self) -> None:
        self.proc.start()

    def stop(self) -> None:
        self.proc.stop(timeout_s=60.0)

    @property
    def log_path(self) -> Path:
        return self.proc.log_path


def node_state(plane: ControlPlane, node: str) -> tuple[bool, str]:
    """Whether `node` is ready for the suite, and what is missing if not."""
    res = plane.kubectl("get", "node", node, "-o", "json")
    if res.returncode != 0:
        return False, "no Node object yet"
    obj: dict[str, Any] = json.loads(res.stdout)
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in obj.get("status", {}).get("conditions", [])
    )
    if not ready:
        return False, "not Ready"
    taints = [t.get("key") for t in obj.get("spec", {}).get("taints") or []]
    if taints:
        return False, f"tainted {taints}"
    if obj.get("metadata", {}).get("labels", {}).get(OS_LABEL) != "linux":
        return False, f"no {OS_LABEL}=linux label"
    return True, "ready"


def wait_for_node(plane: ControlPlane, klet: KletProcess, node: str, *, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    why = ""
    while time.monotonic() < deadline:
        if not klet.proc.alive:
            raise SetupError(f"klet up exited; last lines:\n{tail(klet.log_path)}")
        ok, why = node_state(plane, node)
        if ok:
            return
        time.sleep(1.0)
    raise SetupError(f"Node {node} not usable after {timeout_s:.0f}s: {why}")


@dataclass(frozen=True)
class SuiteRun:
    focus: str
    skip: str
    procs: int
    timeout: str  # ginkgo duration, e.g. 3h
    verbose: bool = True
    images: tuple[str, ...] = ()  # extra images of the suite to provide (Preset.images)
    csi_images: bool = False  # the CSI components' images too (Preset.csi_images)
    snapshots: bool = False  # the snapshot CRDs and controller (Preset.snapshots)
    dra: bool = False  # containerd v2 with CDI and the DRA proxy image (Preset.dra)
    runtime_config: tuple[str, ...] = ()  # the apiserver's (Preset.runtime_config)
    # The node's address when not the default route's (--node-address): put on `lo` for
    # the run, so a second run can have 10250 on an address of its own.
    node_address: str | None = None


def suite_argv(
    bins: Binaries, run: SuiteRun, *, kubeconfig: Path, out: Path, root_dir: Path | None = None
) -> list[str]:
    """The e2e.test command line: directly when serial, under the ginkgo CLI otherwise
    (only the CLI starts parallel processes and merges their reports). `root_dir`, the
    node's --root-dir, is what the storage specs put for /var/lib/kubelet in the host paths
    of the drivers they deploy (the suite's default when None)."""
    suite_flags = [
        "--provider=local",
        f"--kubeconfig={kubeconfig}",
        f"--report-dir={out}",
        *([f"--kubelet-root-dir={root_dir}"] if root_dir is not None else []),
        # The suite's own defaults, said out loud: no image pre-pulling (node e2e only),
        # no node count to wait for beyond ours.
        "--prepull-images=false",
        "--allowed-not-ready-nodes=0",
        "--node-os-distro=debian",
    ]
    ginkgo = {
        "focus": run.focus,
        "skip": run.skip,
        "timeout": run.timeout,
        # the CLI puts it under --output-dir itself (an absolute path would be nested)
        "json-report": "report.json" if run.procs > 1 else str(out / "report.json"),
        "no-color": "true",
    }
    if run.verbose:
        ginkgo["v"] = "true"
    if run.procs <= 1:
        return [
            str(bins.e2e / "e2e.test"),
            *suite_flags,
            *(f"--ginkgo.{k}={v}" for k, v in ginkgo.items()),
        ]
    return [
        str(bins.e2e / "ginkgo"),
        f"--procs={run.procs}",
        f"--output-dir={out}",
        *(f"--{k}={v}" for k, v in ginkgo.items()),
        str(bins.e2e / "e2e.test"),
        "--",
        *suite_flags,
    ]


@contextmanager
def cluster(
    bins: Binaries,
    work: Path,
    *,
    images: Sequence[str] = (),
    csi: bool = False,
    snapshots: bool = False,
    node_address: str | None = None,
    cdi_containerd: Path | None = None,
    runtime_config: tuple[str, ...] = (),
) -> Iterator[tuple[ControlPlane, Path]]:
    """The dev stack with the suite's images (and the `images` ImageIDs besides), the
    control plane and klet's Node, ready; yields the plane and the KUBE_TEST_REPO_LIST
    file. `cdi_containerd`: the node's runtime is that containerd v2 with CDI on, reading
    DRA_CDI_DIR (a tmpfs mounted for the run), with the [DRA] specs' proxy image."""
    cache = Path(os.environ.get("KLET_CACHE", "/var/cache/klet"))
    with ExitStack() as stack:
        began = time.monotonic()
        if cdi_containerd is not None:
            stack.enter_context(private_tmpfs(DRA_CDI_DIR))
            dev = DevStack(
                work / "stack",
                containerd_binary=str(cdi_containerd),
                cdi_spec_dirs=(DRA_CDI_DIR,),
            )
        else:
            dev = DevStack(work / "stack")
        stack.callback(dev.stop)
        dev.start()
        src = build_binaries(cache=cache)
        push_images(build_images(src, cache=cache, extra=images), dev.registry_address)
        built: dict[str, tuple[Path, str]] = {}
        if csi:
            built, module_dir = csi_images.build_binaries(cache=cache)
            plan = csi_images.plan(csi_images.read_manifests(module_dir), built)
            if plan.missing:
                raise SetupError(f"CSI images nothing here provides: {plan.missing}")
            made = csi_images.build_images(plan, cache=cache)
            csi_images.push_images(made, dev.registry_address)
            push_images(build_csi_manifest_images(src), dev.registry_address)
        if cdi_containerd is not None:
            wanted = dra_images.read_proxy_manifest(src.module_dir)
            proxy = dra_images.proxy_plan(wanted, dra_images.build_proxy_binary(cache=cache))
            made = csi_images.build_images(proxy, cache=cache)
            csi_images.push_images(made, dev.registry_address)
        repo_list = work / "repo-list.yaml"
        repo_list.write_text(repo_list_yaml(src.manifest(), TEST_REGISTRY_HOST))
        log(f"dev stack and images: {time.monotonic() - began:.0f} s")
        ip = stack.enter_context(
            host_address() if node_address is None else loopback_address(node_address)
        )
        check_port_free(ip, KUBELET_PORT)
        plane = ControlPlane(
            work / "cp", bins.control_plane, controllers=True, runtime_config=runtime_config
        )
        stack.callback(plane.stop)
        plane.start()
        if csi:  # the CSI sidecars reach the apiserver through the kubernetes Service
            assert dev.containerd is not None
            network = dev.containerd.network
            try:
                relay = stack.enter_context(
                    kubernetes_service(
                        subnet=network.subnet,
                        gateway=str(network.gateway),
                        service_ip=KUBERNETES_SERVICE_IP,
                        apiserver_port=plane.port,
                    )
                )
            except (RouteError, OSError) as err:
                raise SetupError(f"the kubernetes Service for the pods: {err}") from err
            log(
                f"pods of {network.subnet} reach the apiserver at {KUBERNETES_SERVICE_IP}:443 "
                f"(relay {relay[0]}:{relay[1]})"
            )
        if snapshots:
            if "snapshot-controller" not in built:
                raise SetupError("snapshots need the CSI components (Preset.csi_images)")
            try:
                install_snapshot_crds(plane)
            except (AssertionError, subprocess.CalledProcessError) as err:
                raise SetupError(f"the volume snapshot CRDs: {err}") from err
            controller = SnapshotController.start(
                built["snapshot-controller"][0], plane, work / "snapshot-controller.log"
            )
            stack.callback(controller.stop)
        klet = KletProcess(
            dev, plane, work / KLET_DIR, node=NODE_NAME, ip=ip, root_dir=work / NODE_ROOT_DIR
        )
        stack.callback(klet.stop)
        klet.start()
        wait_for_node(plane, klet, NODE_NAME, timeout_s=180)
        log(f"node {NODE_NAME} at {ip} ready: {time.monotonic() - began:.0f} s after start")
        yield plane, repo_list


@contextmanager
def private_tmpfs(path: Path) -> Iterator[Path]:
    """A tmpfs on `path` (made if missing) for the duration, unmounted after. Only in the
    run's own mount namespace (IN_OWN_NAMESPACE): there it is the run's alone, and gone
    with the namespace even if the unmount is never reached. SetupError otherwise, or when
    mount refuses."""
    if os.environ.get(IN_OWN_NAMESPACE) != "1":
        raise SetupError(f"a tmpfs on {path} needs the run's own mount namespace")
    path.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if res.returncode != 0:
        raise SetupError(f"mount tmpfs on {path}: {res.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], capture_output=True, check=False)


def loopback_address_argv(verb: str, address: str) -> list[str]:
    """`ip addr add|del` of `address` (a /32) on `lo`."""
    return ["ip", "addr", verb, f"{address}/32", "dev", "lo"]


@contextmanager
def loopback_address(address: str) -> Iterator[str]:
    """`address` put on `lo` for the duration (removed after): the node address of a run
    made while another run holds the default route's address at port 10250. The host
    delivers to it whatever interface a packet comes in on, so the pods reach it as
    status.hostIP and the apiserver proxies to it. SetupError when `ip` refuses (the
    address already in use, not an IPv4 address)."""
    res = subprocess.run(loopback_address_argv("add", address), capture_output=True, text=True)
    if res.returncode != 0:
        raise SetupError(f"--node-address {address}: ip addr add: {res.stderr.strip()}")
    try:
        yield address
    finally:
        subprocess.run(loopback_address_argv("del", address), capture_output=True, check=False)


def check_port_free(ip: str, port: int) -> None:
    """SetupError when `ip`:`port` cannot be listened on (another kubelet, another run)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((ip, port))
        except OSError as err:
            raise SetupError(
                f"the node's kubelet API needs {ip}:{port}, which the suite's specs call "
                f"by that port: {err}"
            ) from err


def collect_logs(work: Path, out: Path) -> None:
    """Copy the components' logs next to the report."""
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    for path in work.rglob("*.log"):
        if "pod-logs" in path.parts or path.stat().st_size > 512 * 1024 * 1024:
            continue
        shutil.copy2(path, logs / path.name)


@dataclass(frozen=True)
class Outcome:
    """A finished run: the results and the versions of what ran."""

    results: Results
    versions: dict[str, str]
    wall_seconds: float


def conform(run: SuiteRun, artifacts: Path) -> Outcome:
    """Build what is missing, start the cluster, run the suite with its report in
    `artifacts` (with e2e.log and the components' logs), tear everything down.
    SetupError when the cluster or the suite could not be run at all."""
    began = time.monotonic()
    # klet runs the code it imports at start: name that commit, not the one the checkout
    # has moved to by the end of a long run.
    klet_commit = git_describe()
    shutil.rmtree(artifacts, ignore_errors=True)
    artifacts.mkdir(parents=True)
    work = Path(tempfile.mkdtemp(prefix="klet-conf-", dir="/tmp"))
    try:
        bins = build_all()
        cdi_containerd = run_build(DRA_CONTAINERD_BUILD) / "containerd" if run.dra else None
        with cluster(
            bins,
            work,
            images=run.images,
            csi=run.csi_images,
            snapshots=run.snapshots,
            node_address=run.node_address,
            cdi_containerd=cdi_containerd,
            runtime_config=run.runtime_config,
        ) as (plane, repo_list):
            command = suite_argv(
                bins,
                run,
                kubeconfig=plane.admin_kubeconfig,
                out=artifacts,
                root_dir=work / NODE_ROOT_DIR,
            )
            log(f"running: {shlex.join(command)}")
            env = {**os.environ, "KUBE_TEST_REPO_LIST": str(repo_list)}
            with (artifacts / "e2e.log").open("wb") as sink:
                subprocess.run(command, env=env, stdout=sink, stderr=subprocess.STDOUT, cwd=work)
    except (StartError, OSError, CSIImageError) as err:
        raise SetupError(str(err)) from err
    finally:
        collect_logs(work, artifacts)
        if not os.environ.get("KLET_KEEP_DEVSTACK"):
            shutil.rmtree(work, ignore_errors=True)
    report = artifacts / "report.json"
    if not report.exists():
        raise SetupError(f"no report at {report}; see {artifacts / 'e2e.log'}")
    versions = {
        "e2e.test": version_of([str(bins.e2e / "e2e.test"), "--version"]),
        "kube-apiserver": version_of([str(bins.control_plane / "kube-apiserver"), "--version"]),
        "containerd": version_of([str(cdi_containerd or "containerd"), "--version"]),
        "klet": "commit " + klet_commit,
    }
    return Outcome(
        results=parse_report(json.loads(report.read_text())),
        versions=versions,
        wall_seconds=time.monotonic() - began,
    )


# A RESULTS.md's hand-written tail, kept when the run's part is written again: the
# summaries of other selections in conformance/RESULTS.md (the DRA heading) that a new
# `make conformance` or `--render` would otherwise drop.
KEPT_TAIL_MARKER = "<!-- kept when rendered again: summaries of other selections -->"


def with_kept_tail(rendered: str, old: str | None) -> str:
    """`rendered` followed by the part of `old` from KEPT_TAIL_MARKER on, if it has one."""
    if old is None or KEPT_TAIL_MARKER not in old:
        return rendered
    return rendered.rstrip("\n") + "\n\n" + old[old.index(KEPT_TAIL_MARKER) :]


def write_results(out: Path, info: RunInfo) -> int:
    """RESULTS.md in `out` from `out`/run/report.json and `info` (also kept as
    run/meta.json, so `--render` can write it again with newer known differences)."""
    artifacts = out / "run"
    results = parse_report(json.loads((artifacts / "report.json").read_text()))
    meta = {
        "command": info.command,
        "focus": info.focus,
        "skip": info.skip,
        "procs": info.procs,
        "wall_seconds": info.wall_seconds,
        "versions": dict(info.versions),
        "notes": list(info.notes),
        "title": info.title,
    }
    (artifacts / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    path = out / "RESULTS.md"
    old = path.read_text() if path.exists() else None
    path.write_text(with_kept_tail(render_markdown(results, info), old))
    log(
        f"{results.passed} passed, {results.failed} failed, {results.skipped} skipped; "
        f"{out / 'RESULTS.md'}"
    )
    return 0 if results.failed == 0 and not results.problems else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.e2e.conformance")
    parser.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default="node",
        help="the selection: node ([NodeConformance], conformance/), storage "
        "(PersistentVolumes and PersistentVolumes-local, conformance/storage/) or storage-csi "
        "([Driver: csi-hostpath] and CSI Mock, conformance/storage/csi/) or "
        "storage-csi-snapshots (csi-hostpath's snapshot specs with the snapshot CRDs and "
        "controller, conformance/storage/csi/snapshots/) or dra ([DRA] on containerd v2 "
        "with CDI, conformance/dra/); default node",
    )
    parser.add_argument("--focus", help=f"ginkgo focus (default the preset's; node: {FOCUS})")
    parser.add_argument("--skip", help=f"ginkgo skip (default the preset's; node: {SKIP})")
    parser.add_argument("--procs", type=int, default=1, help="parallel ginkgo processes")
    parser.add_argument("--timeout", default="3h", help="ginkgo's suite timeout (default 3h)")
    parser.add_argument(
        "--out",
        type=Path,
        help="where RESULTS.md goes (default the preset's: conformance/ or "
        "conformance/storage/); the JUnit, JSON report and logs go to its run/ subdirectory",
    )
    parser.add_argument(
        "--node-address",
        help="the node's IPv4 address, put on lo for the run (default the default route's "
        "source address): for a run beside another that holds that address's port 10250",
    )
    parser.add_argument("--quiet", action="store_true", help="without ginkgo -v")
    parser.add_argument(
        "--render",
        action="store_true",
        help="run nothing: write RESULTS.md again from the last run's report and meta.json",
    )
    args = parser.parse_args(argv)
    preset = PRESETS[args.preset]
    out: Path = (args.out or REPO / preset.out).resolve()
    if args.render:
        meta = json.loads((out / "run" / "meta.json").read_text())
        return write_results(out, RunInfo(**meta, known=KNOWN_DIFFERENCES))
    if preset.own_pid_namespace and os.environ.get(IN_OWN_NAMESPACE) != "1":
        try:
            own_pid_namespace(sys.argv[1:] if argv is None else argv)
        except SetupError as err:
            log(f"cluster set-up failed: {err}")
            return 2
    run = SuiteRun(
        focus=args.focus or preset.focus,
        skip=args.skip or preset.skip,
        procs=args.procs,
        timeout=args.timeout,
        verbose=not args.quiet,
        images=preset.images,
        csi_images=preset.csi_images,
        snapshots=preset.snapshots,
        dra=preset.dra,
        runtime_config=preset.runtime_config,
        node_address=args.node_address,
    )
    try:
        outcome = conform(run, out / "run")
    except SetupError as err:
        log(f"cluster set-up failed: {err}")
        return 2
    info = RunInfo(
        command="python -m tools.e2e.conformance" + (" " + shlex.join(argv) if argv else ""),
        focus=run.focus,
        skip=run.skip,
        procs=run.procs,
        wall_seconds=outcome.wall_seconds,
        versions=outcome.versions,
        known=KNOWN_DIFFERENCES,
        title=preset.title,
        notes=preset.notes,
    )
    return write_results(out, info)


def own_pid_namespace(argv: Sequence[str]) -> None:
    """Run this command again as PID 2 of a new PID and mount namespace (tini as its PID 1,
    reaping the shims that daemonize to it), whose mounts are shared; does not return.

    Specs (the storage ones, Mount propagation) reach the node through a "hostexec" pod:
    privileged, the host's `/` at /rootfs, and `nsenter --mount=/rootfs/proc/1/ns/mnt`
    for every command. On the test machines PID 1 is the VM's own agent, whose namespace
    files even root on the host cannot open (EACCES), so every such spec would fail
    before it begins. In a namespace of our own, /proc is remounted and /proc/1 is tini,
    in the mount namespace where containerd and klet run and mount: the node's "host" as
    the suite means it. The network and everything else stay the machine's.

    Its mounts are made shared (`--propagation shared`, the default being private), as
    on a systemd host: a `mountPropagation: Bidirectional` or `HostToContainer` volume
    needs its host path on a shared mount (runc refuses "is mounted on / but it is not a
    shared mount" otherwise; the Mount propagation spec's). The peer groups are new ones
    of the namespace: nothing mounted in it propagates to the machine's own mounts. When
    the run ends (or `unshare` is killed: --kill-child), the kernel kills whatever is
    left in the namespace and drops its mounts.
    """
    tini = shutil.which("tini") or shutil.which("tini-static")
    unshare = shutil.which("unshare")
    if not tini or not unshare:
        raise SetupError("own PID namespace: needs unshare (util-linux) and tini (make setup)")
    command = [
        unshare,
        "--pid",
        "--fork",
        "--mount-proc",
        "--propagation",
        "shared",
        "--kill-child",
        "--",
        tini,
        "-s",
        "-g",
        "--",
        sys.executable,
        "-m",
        "tools.e2e.conformance",
        *argv,
    ]
    log(f"in a PID namespace of its own: {shlex.join(command)}")
    os.environ[IN_OWN_NAMESPACE] = "1"
    sys.stdout.flush()
    os.chdir(REPO)
    os.execv(unshare, command)


def git_describe() -> str:
    res = subprocess.run(
        ["git", "-C", str(REPO), "describe", "--always", "--dirty"], capture_output=True, text=True
    )
    return res.stdout.strip() or "?"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
