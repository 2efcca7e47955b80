"""The NFS volume plugin (volumes/nfs.py) on a fake mounter: the pure decisions (the
mount source with an IPv6 server bracketed, the options from readOnly and a PV's mount
options or beta annotation, sorted without duplicates as upstream's JoinMountOptions,
the missing server or path named); an inline volume mounted once at upstream's
directory and unmounted at tear-down; a failed mount's text in mount-utils' words, with
nothing left mounted and the pod only waiting; an NFS PV reached through its claim
(the claim reference's readOnly, the PV's mount options, the PV-named directory) and
torn down by the volume manager; the containers' read-only mount of an inline
read-only volume. The real mount cannot run on the test VM (its kernel has no NFS)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from klet.model.types import JSON
from klet.syncloop.environment.envvars import NodeFacts
from klet.syncloop.volumes import fs, mounts, nfs
from klet.syncloop.volumes.base import VolumeError
from klet.syncloop.volumes.csi import CSIVolumePlugin
from klet.syncloop.volumes.manager import VolumeManager
from klet.testbed.fakes.mounts import FakeMount, FakeMounter

from tests.unit.syncloop.test_csi_volumes import (
    CLAIM,
    Drivers,
    FakeDriver,
    Objects,
    a_pod,
    ctx,
)

# -- decisions ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("server", "expected"),
    [
        ("nfs.example.com", "nfs.example.com"),
        ("10.0.0.7", "10.0.0.7"),
        ("fd00::7", "[fd00::7]"),
        ("::1", "[::1]"),
        ("2001:db8::1:0:0:1", "[2001:db8::1:0:0:1]"),
        ("[fd00::7]", "[fd00::7]"),  # not an address as written: left as the user wrote it
    ],
)
def test_server_address(server: str, expected: str) -> None:
    assert nfs.server_address(server) == expected


@pytest.mark.parametrize(
    ("volume", "expected"),
    [
        ({"server": "srv", "path": "/exports"}, nfs.NfsMount("srv:/exports", ())),
        (
            {"server": "srv", "path": "/exports", "readOnly": True},
            nfs.NfsMount("srv:/exports", ("ro",)),
        ),
        ({"server": "srv", "path": "/", "readOnly": False}, nfs.NfsMount("srv:/", ())),
        ({"server": "fd00::7", "path": "/e"}, nfs.NfsMount("[fd00::7]:/e", ())),
    ],
)
def test_inline_mount(volume: JSON, expected: nfs.NfsMount) -> None:
    assert nfs.inline_mount({"name": "v", "nfs": volume}) == expected


def a_pv(**spec: Any) -> JSON:
    return {"metadata": {"name": "pv1"}, "spec": {"nfs": {"server": "srv", "path": "/e"}, **spec}}


@pytest.mark.parametrize(
    ("pv", "read_only", "options"),
    [
        (a_pv(), False, ()),
        (a_pv(), True, ("ro",)),
        # the PV's own readOnly is not what decides (upstream takes the claim reference's)
        (a_pv(nfs={"server": "srv", "path": "/e", "readOnly": True}), False, ()),
        (a_pv(mountOptions=["vers=4.1", "hard"]), False, ("hard", "vers=4.1")),
        (a_pv(mountOptions=["vers=4.1", "ro", ""]), True, ("ro", "vers=4.1")),
        (a_pv(mountOptions=["nfsvers=3", "nfsvers=3"]), False, ("nfsvers=3",)),
        (
            {
                "metadata": {
                    "name": "pv1",
                    "annotations": {nfs.MOUNT_OPTIONS_ANNOTATION: "vers=3,noac"},
                },
                "spec": {"nfs": {"server": "srv", "path": "/e"}, "mountOptions": ["vers=4"]},
            },
            True,
            ("noac", "ro", "vers=3"),
        ),
    ],
)
def test_pv_mount_options(pv: JSON, read_only: bool, options: tuple[str, ...]) -> None:
    assert nfs.pv_mount(pv, read_only=read_only) == nfs.NfsMount("srv:/e", options)


@pytest.mark.parametrize(
    ("source", "cause"),
    [
        ({"path": "/e"}, 'volume "v": nfs.server: the NFS server is not set'),
        ({"server": "srv"}, 'volume "v": nfs.path: the exported path is not set'),
        ({"server": "", "path": ""}, "nfs.server"),
    ],
)
def test_an_inline_volume_without_server_or_path_is_refused_naming_the_field(
    source: JSON, cause: str
) -> None:
    with pytest.raises(VolumeError, match=cause.replace(".", r"\.")):
        nfs.inline_mount({"name": "v", "nfs": source})


def test_a_pv_without_path_is_refused_naming_the_pv() -> None:
    with pytest.raises(VolumeError, match=r"PV pv1: spec\.nfs\.path: the exported path"):
        nfs.pv_mount(a_pv(nfs={"server": "srv"}), read_only=False)


def test_mount_arguments_and_failure_text_are_upstreams() -> None:
    args = fs.mount_args("srv:/e", Path("/p/v"), fs_type="nfs", options=("ro", "vers=4"))
    assert args == ("-t", "nfs", "-o", "ro,vers=4", "srv:/e", "/p/v")
    assert fs.mount_args("srv:/e", Path("/p/v"), fs_type="nfs") == ("-t", "nfs", "srv:/e", "/p/v")
    assert fs.mount_failed_text(args, 32, "mount.nfs: Connection timed out\n") == (
        "mount failed: exit status 32\nMounting command: mount\n"
        "Mounting arguments: -t nfs -o ro,vers=4 srv:/e /p/v\n"
        "Output: mount.nfs: Connection timed out\n"
    )


# -- the plugin on a fake mounter ------------------------------------------------------------

INLINE = {"name": "share", "nfs": {"server": "fd00::7", "path": "/exports/a", "readOnly": True}}


async def test_an_inline_volume_is_mounted_once_and_unmounted_at_tear_down(tmp_path: Path) -> None:
    mounter = FakeMounter()
    plugin = nfs.NfsPlugin(mounter)
    c = ctx(tmp_path, a_pod("u1", INLINE))
    target = tmp_path / "pods" / "u1" / "volumes" / "kubernetes.io~nfs" / "share"
    assert plugin.handles(INLINE) and not plugin.handles({"name": "x", "emptyDir": {}})
    assert await plugin.set_up(INLINE, c) == target
    assert mounter.table == {target: FakeMount("[fd00::7]:/exports/a", "nfs", ("ro",))}
    assert target.stat().st_mode & 0o777 == nfs.DIR_MODE
    assert await plugin.set_up(INLINE, c) == target  # the next sync: mounted already
    assert [call[0] for call in mounter.calls] == ["mount"]
    await plugin.tear_down(target)
    assert mounter.table == {}
    assert mounter.calls[-1] == ("unmount", str(target))
    assert not target.exists()


async def test_a_failed_mount_is_upstreams_text_and_leaves_nothing(tmp_path: Path) -> None:
    mounter = FakeMounter()
    plugin = nfs.NfsPlugin(mounter)
    c = ctx(tmp_path, a_pod("u1", INLINE))
    target = c.volume_dir(plugin, "share")
    text = fs.mount_failed_text(
        fs.mount_args("[fd00::7]:/exports/a", target, fs_type="nfs", options=("ro",)),
        32,
        "mount.nfs: Connection timed out",
    )
    mounter.fail_next = fs.MountError(text)
    mounter.mounted_despite_failure = True  # the helper left a mount: it is undone
    with pytest.raises(VolumeError) as caught:
        await plugin.set_up(INLINE, c)
    assert str(caught.value) == text
    assert "Mounting arguments: -t nfs -o ro [fd00::7]:/exports/a " + str(target) in text
    assert mounter.table == {}
    assert [call[0] for call in mounter.calls] == ["mount", "unmount"]
    assert not target.exists()
    # the next sync tries again, and the server answers now
    assert await plugin.set_up(INLINE, c) == target
    assert target in mounter.table


async def test_a_failed_unmount_keeps_the_directory_and_says_why(tmp_path: Path) -> None:
    mounter = FakeMounter()
    plugin = nfs.NfsPlugin(mounter)
    target = await plugin.set_up(INLINE, ctx(tmp_path, a_pod("u1", INLINE)))
    mounter.fail_next = fs.MountError("umount: target is busy")
    with pytest.raises(VolumeError, match=f"nfs volume {target} not unmounted: umount: target"):
        await plugin.tear_down(target)
    assert target.is_dir() and target in mounter.table


async def test_the_volume_manager_reports_a_failed_mount_and_keeps_the_pod(tmp_path: Path) -> None:
    """A server that is down: the volume's FailedMount cause, the other volumes ready."""
    mounter = FakeMounter()
    manager = VolumeManager([nfs.NfsPlugin(mounter)], root_dir=tmp_path, node=NodeFacts())
    pod = a_pod("u1", INLINE, {"name": "other", "nfs": {"server": "b", "path": "/"}})
    mounter.fail_next = fs.MountError("mount failed: exit status 32\nOutput: timed out")
    result = await manager.set_up(pod, pod_ip="")
    assert result.failures == {"share": "mount failed: exit status 32\nOutput: timed out"}
    assert set(result.paths) == {"other"}
    assert await manager.tear_down("u1") == []
    assert mounter.table == {}


def test_an_inline_read_only_volume_is_mounted_read_only_without_relabelling(
    tmp_path: Path,
) -> None:
    pod = a_pod("u1", INLINE)
    container = {"name": "c", "volumeMounts": [{"name": "share", "mountPath": "/data"}]}
    (mount,) = mounts.container_mounts(
        pod, container, volumes={"share": tmp_path}, env=(), subpaths=None
    )
    assert mount.readonly and not mount.selinux_relabel


# -- an NFS PV through its claim -------------------------------------------------------------


def nfs_claim(objects: Objects, **pv_spec: Any) -> None:
    objects.bind("data", "pv1")
    spec = objects.pvs["pv1"]["spec"]
    spec.pop("csi")
    spec["nfs"] = {"server": "10.0.0.9", "path": "/srv/pv1"}
    spec.update(pv_spec)


async def test_an_nfs_pv_is_mounted_through_its_claim_and_torn_down(tmp_path: Path) -> None:
    objects, mounter = Objects(), FakeMounter()
    nfs_claim(objects, mountOptions=["nfsvers=4.1"])
    nfs_plugin = nfs.NfsPlugin(mounter)
    csi = CSIVolumePlugin(
        root_dir=tmp_path,
        node_name="node1",
        drivers=Drivers(),
        connect=lambda endpoint, name: FakeDriver(),
        objects=objects,
        nfs_volumes=nfs_plugin,
    )
    manager = VolumeManager([nfs_plugin, csi], root_dir=tmp_path, node=NodeFacts(), objects=None)
    read_only = {"name": "data", "persistentVolumeClaim": {"claimName": "data", "readOnly": True}}
    result = await manager.set_up(a_pod("u1", read_only), pod_ip="")
    target = tmp_path / "pods" / "u1" / "volumes" / "kubernetes.io~nfs" / "pv1"
    assert result.failures == {} and result.paths == {"data": target}
    assert mounter.table == {target: FakeMount("10.0.0.9:/srv/pv1", "nfs", ("nfsvers=4.1", "ro"))}
    assert csi.plugin_name("u1", read_only) == "kubernetes.io/nfs"
    # a second pod's claim without readOnly: its own mount, read-write
    result = await manager.set_up(a_pod("u2", CLAIM), pod_ip="")
    target2 = tmp_path / "pods" / "u2" / "volumes" / "kubernetes.io~nfs" / "pv1"
    assert mounter.table[target2].options == ("nfsvers=4.1",)
    assert await manager.tear_down("u1") == []
    assert set(mounter.table) == {target2} and not target.exists()


async def test_a_block_mode_nfs_pv_is_refused(tmp_path: Path) -> None:
    objects = Objects()
    nfs_claim(objects, volumeMode="Block")
    csi = CSIVolumePlugin(
        root_dir=tmp_path,
        node_name="node1",
        drivers=Drivers(),
        connect=lambda endpoint, name: FakeDriver(),
        objects=objects,
        nfs_volumes=nfs.NfsPlugin(FakeMounter()),
    )
    with pytest.raises(VolumeError, match=r"CSI and local PVs only \(not for nfs PVs\)"):
        await csi.set_up(CLAIM, ctx(tmp_path, a_pod("u1", CLAIM)))
