"""Volume snapshots in the cluster tier: the snapshot.storage.k8s.io v1 CRDs and
snapshot-controller beside kube-controller-manager (issue 38 item 2).

Upstream's e2e suite does not install either: it expects the cluster to run them, as
kube-up's `cluster/addons/volumesnapshots` does (the CRDs, and snapshot-controller as a
StatefulSet in kube-system). The CRDs installed here are that addon's files in the
k8s.io/kubernetes module the control plane is built from (tools/cluster/go.mod's
version, in the Go module cache `make cluster-binaries` fills), so they are the ones the
release ships; they equal external-snapshotter's client/config/crd apart from the addon
manager's label. snapshot-controller is tools/csi's build (external-snapshotter v8.3.0,
the module csi-snapshotter v8.3.0 of the hostpath manifests comes from; the addon's
manifest names v8.1.0) run as a host process with the admin kubeconfig and the addon's
`--v=5`, as kube-controller-manager runs in `ControlPlane`.

`install_snapshot_crds(cp)` applies them and waits until each is Established (applying
again is a no-op, so tests sharing a control plane may each call it).
`SnapshotController.start(binary, cp, log)` runs the controller.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from klet.testbed.cluster import ControlPlane

from tests.harness.cluster_fixtures import kubernetes_version
from tests.harness.csi import stop_process

CRD_NAMES = (
    "volumesnapshotclasses.snapshot.storage.k8s.io",
    "volumesnapshotcontents.snapshot.storage.k8s.io",
    "volumesnapshots.snapshot.storage.k8s.io",
)


def crd_file(crd: str) -> str:
    """The addon's file name of CRD `crd` (group, then the plural)."""
    plural, _, group = crd.partition(".")
    return f"{group}_{plural}.yaml"


def snapshot_crd_dir() -> Path:
    """The addon's CRD directory in the module cache; AssertionError naming the path and
    how to fill it when it is absent."""
    cache = Path(os.environ.get("KLET_CACHE", "/var/cache/klet"))
    version = kubernetes_version()
    module = cache / "go" / "mod" / "k8s.io" / f"kubernetes@{version}"
    crds = module / "cluster" / "addons" / "volumesnapshots" / "crd"
    missing = [crd_file(name) for name in CRD_NAMES if not (crds / crd_file(name)).is_file()]
    assert not missing, (
        f"the volume snapshot CRDs ({', '.join(missing)}) are not in {crds}: that is "
        f"k8s.io/kubernetes {version}'s cluster/addons/volumesnapshots/crd in the Go module "
        "cache; `make cluster-binaries` downloads the module there (KLET_CACHE names the cache)"
    )
    return crds


def install_snapshot_crds(cp: ControlPlane, *, timeout_s: float = 60.0) -> None:
    """Apply the three CRDs and wait until the apiserver serves them."""
    crds = snapshot_crd_dir()
    for name in CRD_NAMES:
        cp.kubectl("apply", "-f", str(crds / crd_file(name)), check=True)
    cp.kubectl(
        "wait",
        "--for=condition=Established",
        f"--timeout={int(timeout_s)}s",
        *(f"crd/{name}" for name in CRD_NAMES),
        check=True,
    )


def served_versions(cp: ControlPlane, crd: str) -> list[str]:
    """The versions of CRD `crd` the apiserver serves."""
    obj = json.loads(cp.kubectl("get", "crd", crd, "-o", "json", check=True).stdout)
    return [v["name"] for v in obj["spec"]["versions"] if v.get("served")]


@dataclass
class SnapshotController:
    """A running snapshot-controller: it binds VolumeSnapshots to VolumeSnapshotContents
    and creates the contents that csi-snapshotter turns into CreateSnapshot calls."""

    proc: subprocess.Popen[bytes]
    log: Path

    @classmethod
    def start(cls, binary: Path, cp: ControlPlane, log: Path) -> SnapshotController:
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [str(binary), f"--kubeconfig={cp.admin_kubeconfig}", "--v=5"],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        return cls(proc=proc, log=log)

    def stop(self) -> None:
        stop_process(self.proc)
