"""tools/e2e/conformance.py's presets: which specs each selects, where it writes, and
what it asks of the run.

Covers: the node preset is `make conformance`'s selection, run in a PID and mount
namespace of its own (RESULTS.md says so); the storage preset's focus
takes the PersistentVolumes and PersistentVolumes-local specs and not the other
Describes that begin with the same word, and its skip drops the Serial, Slow,
Disruptive, Flaky, Feature and FeatureGate ones (the patterns are applied as ginkgo
applies them to the full spec text, with `re.search`); the storage run asks for the NFS
server image and a PID namespace of its own and writes to conformance/storage; that
namespace's mounts are shared (`unshare --propagation shared`); the storage-csi preset
takes the [Driver: csi-hostpath] and CSI Mock specs, pushes the CSI images and tells
the suite the node's root directory; the storage-csi-snapshots preset takes the
csi-hostpath specs tagged [Feature:VolumeSnapshotDataSource] (not the Windows, Serial
or CSI Mock ones) and is the one that asks for the snapshot CRDs and controller; an
image the harness cannot build is refused before anything is built; --node-address puts
the node's address on `lo` for the run alone; the dra preset takes the [DRA] specs of gates
1.34 has on (the kubelet's [Feature:DynamicResourceAllocation] ones and the Beta ones) and
not the Alpha, OffByDefault, Serial, Slow or Flaky ones, and is the one run on containerd
v2 with CDI; its CDI directory's tmpfs is mounted only in the run's own namespace and
unmounted after; RESULTS.md's hand-written tail survives a new render.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from klet.testbed.cluster import ControlPlane

from tools.e2e import conformance
from tools.e2e.conformance import FOCUS, PRESETS, SKIP
from tools.e2e.images import EXTRA_IMAGES, Sources, build_images
from tools.e2e.report import TITLE
from tools.e2e.suite import E2EImageError

SELECTED = [
    "[sig-storage] PersistentVolumes-local [Volume type: dir] One pod requesting one "
    "prebound PVC should be able to mount volume and read from pod1",
    "[sig-storage] PersistentVolumes-local Pod with node different from PV's NodeAffinity "
    "should fail scheduling due to different NodeSelector",
    "[sig-storage] PersistentVolumes NFS with Single PV - PVC pairs create a PV and a "
    "pre-bound PVC: test write access",
    "[sig-storage] PersistentVolumes CSI Conformance should run through the lifecycle of a "
    "PV and a PVC [Conformance]",
]
NOT_SELECTED = [
    # other Describes starting with the same word
    "[sig-storage] PersistentVolumes-expansion loopback local block volume should support "
    "online expansion on node",
    # tagged away
    "[sig-storage] PersistentVolumes-local Stress with local volumes [Serial] should be able "
    "to process many pods and reuse local volumes",
    "[sig-storage] PersistentVolumes-local [Volume type: gce-localssd-scsi-fs] [Serial] "
    "One pod requesting one prebound PVC should be able to mount volume and read from pod1",
    "[sig-storage] PersistentVolumes NFS when invoking the Recycle reclaim policy [Slow] x",
    "[sig-storage] PersistentVolumes-local [FeatureGate:Something] [Beta] x",
    "[sig-storage] PersistentVolumes [Feature:vsphere] x",
    "[sig-node] Pods should be submitted and removed [NodeConformance] [Conformance]",
]


def selected(preset: str, text: str) -> bool:
    p = PRESETS[preset]
    return bool(re.search(p.focus, text)) and not re.search(p.skip, text)


def test_node_preset_is_make_conformance() -> None:
    node = PRESETS["node"]
    assert (node.focus, node.skip, node.out, node.title) == (FOCUS, SKIP, "conformance", TITLE)
    assert not node.images and node.own_pid_namespace
    assert node.notes and "shared mount" in node.notes[0] and "10250" in node.notes[0]


def test_own_namespace_has_shared_mounts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The command own_pid_namespace execs: unshare with a PID and mount namespace whose
    mounts are shared, tini as PID 1, this module again with the same arguments."""
    execs: list[tuple[str, list[str]]] = []

    def execv(path: str, argv: list[str]) -> None:
        execs.append((path, argv))

    monkeypatch.setattr(conformance.os, "execv", execv)
    monkeypatch.setattr(conformance.os, "chdir", lambda _: None)
    monkeypatch.setattr(conformance.shutil, "which", lambda name: f"/sbin/{name}")
    monkeypatch.setenv(conformance.IN_OWN_NAMESPACE, "0")  # restored after the test
    conformance.own_pid_namespace(["--focus", "Mount propagation"])
    [(path, argv)] = execs
    assert argv[0] == path and path.endswith("unshare")
    options = argv[1 : argv.index("--")]
    assert {"--pid", "--fork", "--mount-proc", "--kill-child"} <= set(options)
    assert options[options.index("--propagation") + 1] == "shared"
    after = argv[argv.index("--") + 1 :]
    assert after[:4] == ["/sbin/tini", "-s", "-g", "--"]
    assert argv[-3:] == ["tools.e2e.conformance", "--focus", "Mount propagation"]
    assert conformance.os.environ[conformance.IN_OWN_NAMESPACE] == "1"


@pytest.mark.parametrize("text", SELECTED)
def test_storage_selects(text: str) -> None:
    assert selected("storage", text)


@pytest.mark.parametrize("text", NOT_SELECTED)
def test_storage_leaves_out(text: str) -> None:
    assert not selected("storage", text)


def test_storage_run() -> None:
    storage = PRESETS["storage"]
    assert storage.out == "conformance/storage"
    assert storage.own_pid_namespace
    assert set(storage.images) <= EXTRA_IMAGES.keys()
    assert "VolumeNFSServer" in storage.images
    assert storage.notes and "PID" in storage.notes[0]


CSI_SELECTED = [
    "[sig-storage] CSI Volumes [Driver: csi-hostpath] [Testpattern: Dynamic PV (block "
    "volmode)] volumes should store data",
    "[sig-storage] CSI Mock volume attach CSI attach test using mock driver should not "
    "require VolumeAttach for drivers without attachment",
]
CSI_NOT_SELECTED = [
    "[sig-storage] CSI Volumes [Driver: csi-hostpath] [Testpattern: Dynamic PV (default "
    "fs)] provisioning should provision storage with snapshot data source "
    "[Feature:VolumeSnapshotDataSource]",
    "[sig-storage] CSI Volumes [Driver: csi-hostpath] [Testpattern: Dynamic PV (default "
    "fs)] volumes should store data [Serial]",
    "[sig-storage] CSI Volumes [Driver: pd.csi.storage.gke.io] x",
    "[sig-storage] PersistentVolumes-local [Volume type: dir] x",
]


@pytest.mark.parametrize("text", CSI_SELECTED)
def test_storage_csi_selects(text: str) -> None:
    assert selected("storage-csi", text)


@pytest.mark.parametrize("text", CSI_NOT_SELECTED)
def test_storage_csi_leaves_out(text: str) -> None:
    assert not selected("storage-csi", text)


def test_storage_csi_run_pushes_the_csi_images_and_names_the_root_dir(tmp_path: Path) -> None:
    csi = PRESETS["storage-csi"]
    assert csi.csi_images and csi.own_pid_namespace and csi.out == "conformance/storage/csi"
    assert not PRESETS["storage"].csi_images and not PRESETS["node"].csi_images
    bins = conformance.Binaries(control_plane=tmp_path, e2e=tmp_path)
    run = conformance.SuiteRun(focus="x", skip="y", procs=1, timeout="1h")
    argv = conformance.suite_argv(
        bins, run, kubeconfig=tmp_path / "kc", out=tmp_path, root_dir=Path("/w/klet/root")
    )
    assert "--kubelet-root-dir=/w/klet/root" in argv
    plain = conformance.suite_argv(bins, run, kubeconfig=tmp_path / "kc", out=tmp_path)
    assert not any(a.startswith("--kubelet-root-dir") for a in plain)


SNAPSHOT_SELECTED = [
    "[sig-storage] CSI Volumes [Driver: csi-hostpath] [Testpattern: Dynamic Snapshot (delete "
    "policy)] snapshottable [Feature:VolumeSnapshotDataSource] volume snapshot controller  "
    "should check snapshot fields, check restore correctly works after modifying source data, "
    "check deletion (persistent)",
    "[sig-storage] CSI Volumes [Driver: csi-hostpath] [Testpattern: Dynamic PV (default "
    "fs)] provisioning should provision storage with snapshot data source "
    "[Feature:VolumeSnapshotDataSource]",
]
SNAPSHOT_NOT_SELECTED = [
    "[sig-storage] CSI Volumes [Driver: csi-hostpath] [Testpattern: Dynamic PV (ntfs)] "
    "[Feature:Windows] provisioning should provision storage with snapshot data source "
    "[Feature:VolumeSnapshotDataSource]",
    "[sig-storage] CSI Volumes [Driver: csi-hostpath] [Testpattern: Dynamic PV (default "
    "fs)] volumes should store data",
    "[sig-storage] CSI Mock volume snapshot CSI Volume Snapshots "
    "[Feature:VolumeSnapshotDataSource] volumesnapshotcontent and pvc in Bound state",
    "[sig-storage] CSI Volumes [Driver: csi-hostpath] [Testpattern: Dynamic Snapshot (delete "
    "policy)] snapshottable-stress [Feature:VolumeSnapshotDataSource] [Serial] x",
]


@pytest.mark.parametrize("text", SNAPSHOT_SELECTED)
def test_storage_csi_snapshots_selects(text: str) -> None:
    assert selected("storage-csi-snapshots", text)


@pytest.mark.parametrize("text", SNAPSHOT_NOT_SELECTED)
def test_storage_csi_snapshots_leaves_out(text: str) -> None:
    assert not selected("storage-csi-snapshots", text)


def test_only_the_snapshot_preset_installs_the_snapshot_crds_and_controller() -> None:
    snap = PRESETS["storage-csi-snapshots"]
    assert snap.snapshots and snap.csi_images and snap.own_pid_namespace
    assert snap.out == "conformance/storage/csi/snapshots"
    assert any("snapshot-controller" in note for note in snap.notes)
    assert [name for name, p in PRESETS.items() if p.snapshots] == ["storage-csi-snapshots"]


def test_unknown_extra_image_is_refused(tmp_path: Path) -> None:
    src = Sources(bin_dir=tmp_path, module_dir=tmp_path / "k8s.io/kubernetes@v1.34.4")
    with pytest.raises(E2EImageError, match="no builder for Nope"):
        build_images(src, cache=tmp_path, extra=("Nope",))


def test_klet_runs_as_kubelet(tmp_path: Path) -> None:
    """The node's interpreter: this one under the name `kubelet`, beside this virtual
    environment's pyvenv.cfg and packages (so `pidof kubelet` finds klet's processes)."""
    interpreter = conformance.kubelet_named_python(tmp_path / "py")
    assert interpreter.name == "kubelet"
    assert interpreter.resolve() == Path(sys.executable).resolve()
    if sys.prefix != sys.base_prefix:
        cfg = (tmp_path / "py" / "pyvenv.cfg").read_text()
        assert cfg == (Path(sys.prefix) / "pyvenv.cfg").read_text()
        assert (tmp_path / "py" / "lib").resolve() == (Path(sys.prefix) / "lib").resolve()
    # a second node directory's call leaves the first as it is
    assert conformance.kubelet_named_python(tmp_path / "py") == interpreter


def test_node_address_is_on_lo_for_the_run_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """--node-address: the address is added to `lo` before the node starts and removed
    after, also when the run fails; `ip` refusing the add is a SetupError naming the
    address and ip's answer, with nothing to remove."""
    calls: list[list[str]] = []
    answers = {"add": (0, "")}

    def run(argv: list[str], **_: object) -> conformance.subprocess.CompletedProcess[str]:
        calls.append(argv)
        code, err = answers.get(argv[2], (0, ""))
        return conformance.subprocess.CompletedProcess(argv, code, "", err)

    monkeypatch.setattr(conformance.subprocess, "run", run)
    with pytest.raises(RuntimeError, match="suite"):
        with conformance.loopback_address("198.18.0.9") as ip:
            assert ip == "198.18.0.9"
            assert calls == [["ip", "addr", "add", "198.18.0.9/32", "dev", "lo"]]
            raise RuntimeError("suite")
    assert calls[1] == ["ip", "addr", "del", "198.18.0.9/32", "dev", "lo"]

    calls.clear()
    answers["add"] = (2, "RTNETLINK answers: File exists\n")
    with pytest.raises(conformance.SetupError, match=r"--node-address 198.18.0.9: .*File exists"):
        with conformance.loopback_address("198.18.0.9"):
            pass
    assert len(calls) == 1


DRA_SELECTED = [
    "[sig-node] [DRA] control plane [ConformanceCandidate] supports simple pod referencing "
    "inline resource claim",
    "[sig-node] [DRA] control plane validate ResourceClaimTemplate and ResourceClaim for admin "
    "access [FeatureGate:DRAAdminAccess] [Beta]",
    "[sig-api-machinery] ResourceQuota should create a ResourceQuota and capture the life of a "
    "ResourceClaim [FeatureGate:DynamicResourceAllocation] [DRA]",
    "[sig-node] [DRA] kubelet [Feature:DynamicResourceAllocation] registers plugin",
    "[sig-node] [DRA] kubelet [Feature:DynamicResourceAllocation] [FeatureGate:DRAPrioritized"
    "List] [Beta] chooses the correct subrequest subject to constraints",
]
DRA_NOT_SELECTED = [
    "[sig-node] [DRA] kubelet [Feature:DynamicResourceAllocation] on single node supports "
    "extended resources together with ResourceClaim [Serial] [Flaky]",
    "[sig-node] [DRA] kubelet [Feature:DynamicResourceAllocation] sequential update with pods "
    "replacing each other [KubeletMinVersion:1.33] [Slow]",
    "[sig-node] [DRA] control plane with node-local resources [FeatureGate:DRAPartitionable"
    "Devices] [Alpha] [Feature:OffByDefault] x",
    "[sig-node] [DRA] control plane [Serial] x",
    "[sig-node] [DRA] [FeatureGate:DRADeviceTaints] [Alpha] x",
    "[sig-node] [DRA] kubelet [Feature:DynamicResourceAllocation] y [Feature:OffByDefault]",
    "[sig-node] Pods should be submitted and removed [NodeConformance] [Conformance]",
]


@pytest.mark.parametrize("text", DRA_SELECTED)
def test_dra_selects(text: str) -> None:
    assert selected("dra", text)


@pytest.mark.parametrize("text", DRA_NOT_SELECTED)
def test_dra_leaves_out(text: str) -> None:
    assert not selected("dra", text)


def test_only_the_dra_preset_runs_cdi_containerd_in_its_own_namespace() -> None:
    dra = PRESETS["dra"]
    assert dra.dra and dra.own_pid_namespace and dra.out == "conformance/dra"
    assert any("containerd v2" in note and "hostpathplugin" in note for note in dra.notes)
    assert [name for name, p in PRESETS.items() if p.dra] == ["dra"]


def test_private_tmpfs_only_in_the_runs_own_namespace(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The DRA run's CDI directory: a tmpfs mounted for the run and unmounted after (also
    when the run fails), refused outside the run's own mount namespace, and a mount that
    fails is a SetupError with mount's answer."""
    calls: list[list[str]] = []
    answers = {"mount": (0, "")}

    def run(argv: list[str], **_: object) -> conformance.subprocess.CompletedProcess[str]:
        calls.append(argv)
        code, err = answers.get(argv[0], (0, ""))
        return conformance.subprocess.CompletedProcess(argv, code, "", err)

    monkeypatch.setattr(conformance.subprocess, "run", run)
    monkeypatch.setenv(conformance.IN_OWN_NAMESPACE, "0")
    with pytest.raises(conformance.SetupError, match="own mount namespace"):
        with conformance.private_tmpfs(tmp_path / "cdi"):
            pass
    assert calls == []
    monkeypatch.setenv(conformance.IN_OWN_NAMESPACE, "1")
    with pytest.raises(RuntimeError, match="suite"):
        with conformance.private_tmpfs(tmp_path / "cdi") as path:
            assert path.is_dir()
            assert calls == [["mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", str(path)]]
            raise RuntimeError("suite")
    assert calls[-1] == ["umount", str(tmp_path / "cdi")]
    calls.clear()
    answers["mount"] = (32, "mount: permission denied\n")
    with pytest.raises(conformance.SetupError, match="permission denied"):
        with conformance.private_tmpfs(tmp_path / "cdi"):
            pass
    assert len(calls) == 1


def test_a_hand_written_tail_survives_rendering_again() -> None:
    """RESULTS.md's part from the kept-tail marker on (conformance/RESULTS.md's DRA
    summary) is put after a new render; without the marker, or without an old file, the
    render is written alone."""
    marker = conformance.KEPT_TAIL_MARKER
    old = f"# Old run\n\n1 passed\n\n{marker}\n\n## DRA\n\n20 passed\n"
    new = conformance.with_kept_tail("# New run\n\n2 passed\n", old)
    assert new == f"# New run\n\n2 passed\n\n{marker}\n\n## DRA\n\n20 passed\n"
    assert "Old run" not in new
    assert conformance.with_kept_tail("# New\n", "# Old\n") == "# New\n"
    assert conformance.with_kept_tail("# New\n", None) == "# New\n"


def test_dra_runs_serve_the_beta_dra_apis(tmp_path: Path) -> None:
    """The dra preset's apiserver serves resource.k8s.io v1beta1 and v1beta2 (what the
    'with v1beta1/v1beta2 API' specs create claims through) with --runtime-config; other
    presets' apiservers get no --runtime-config."""
    dra = PRESETS["dra"]
    assert dra.runtime_config == (
        "resource.k8s.io/v1beta1=true",
        "resource.k8s.io/v1beta2=true",
    )
    assert [name for name, p in PRESETS.items() if p.runtime_config] == ["dra"]
    plane = ControlPlane(tmp_path / "a", tmp_path, runtime_config=dra.runtime_config)
    flags = [a for a in plane._apiserver_argv() if a.startswith("--runtime-config")]
    assert flags == ["--runtime-config=resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true"]
    plain = ControlPlane(tmp_path / "b", tmp_path)
    assert not any(a.startswith("--runtime-config") for a in plain._apiserver_argv())


def test_the_nodes_registration_sockets_fit_a_unix_socket_path() -> None:
    """The node's root dir is short enough for the longest registration socket the [DRA]
    specs make (the rolling-update driver's `<driver>-<pod UID>-reg.sock`, with a
    five-digit namespace number) under a run's work directory (/tmp/klet-conf-XXXXXXXX):
    at most 107 bytes, a unix socket path's limit; the old `klet/root` did not fit."""
    work = Path("/tmp/klet-conf-12345678")
    name = "dra-12345.k8s.io-5f07e0d6-7993-4eaf-9d22-301c5f8c1586-reg.sock"
    socket = work / conformance.NODE_ROOT_DIR / "plugins_registry" / name
    assert len(str(socket)) <= 107
    assert len(str(work / conformance.KLET_DIR / "root" / "plugins_registry" / name)) > 107
