"""The claim and CSI volume logic on fakes of its own interfaces (the driver's node
service, the API reads, the driver table): a claim resolved to its PV or refused with
the cause; stage once per volume then publish per pod, with upstream's paths and
vol_data.json; the attach wait; unpublish per pod and unstage with the last user; a
new plugin (a restarted syncloop) tearing down what the old one set up; the sweep of a
staging no pod uses; inline volumes and the CSIDriver's lifecycle modes; raw block
(volumeMode Block) CSI volumes in upstream's csi_block.go layout (staged, published to a
file per pod, linked from the pod's volumeDevices, unpublished and unstaged, swept;
read-only ones refused); a ReadWriteOncePod volume refused to a second pod while
another holds it; online expansion and the claim's resize statuses, decided per node
(two plugins, two nodes, reading and patching one claim: a ReadWriteMany volume expanded
on each node's mount, the claim written once), the FailedPrecondition stop, the resize
Events on the pod and the claim; the helpers (access modes, fsGroup policy, ownership,
names).
The real drivers: tests/cluster/test_csi_volumes.py and test_csi_block.py."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
from klet.bus import BusUnavailable
from klet.cri.types import Device
from klet.csi import CSIError, DriverUnavailable, Volume
from klet.model.records import CSIDriverRecord
from klet.model.types import JSON
from klet.syncloop.environment.envvars import NodeFacts
from klet.syncloop.volumes import claims, fs, hostpath, localdevice, mounts
from klet.syncloop.volumes.base import Block, VolumeContext, VolumeError
from klet.syncloop.volumes.csi import (
    RWOP_IN_USE,
    CSIVolumePlugin,
    applies_fs_group,
    attachment_name,
    csi_access_mode,
    inline_handle,
    rwop_held_elsewhere,
    set_ownership,
    staging_path,
)

DRIVER = "drv.klet.test"
NODE = "node1"


class FakeDriver:
    def __init__(self, caps: frozenset[str] = frozenset({"STAGE_UNSTAGE_VOLUME"})) -> None:
        self.caps = caps
        self.calls: list[tuple[str, Any]] = []
        self.expanded: list[Volume] = []  # what each NodeExpandVolume was given
        self.fail: CSIError | None = None
        self.expand_fail: CSIError | None = None  # what NodeExpandVolume answers

    async def node_capabilities(self) -> frozenset[str]:
        if self.fail:
            raise self.fail
        return self.caps

    async def stage(self, volume: Volume, *, staging_path: str) -> None:
        self.calls.append(("stage", (volume, staging_path)))

    async def unstage(self, volume_id: str, *, staging_path: str) -> None:
        self.calls.append(("unstage", (volume_id, staging_path)))

    async def publish(
        self, volume: Volume, *, target_path: str, staging_path: str = "", read_only: bool = False
    ) -> None:
        if self.fail:
            raise self.fail
        self.calls.append(("publish", (volume, target_path, staging_path, read_only)))
        if volume.capability.block:  # a driver makes the device at a file (hostpath: a bind)
            os.close(os.open(target_path, os.O_CREAT | os.O_WRONLY, 0o600))
        else:
            os.makedirs(target_path, exist_ok=True)

    async def unpublish(self, volume_id: str, *, target_path: str) -> None:
        self.calls.append(("unpublish", (volume_id, target_path)))
        with contextlib.suppress(FileNotFoundError):  # idempotent, as CSI asks of a driver
            try:
                os.rmdir(target_path)
            except NotADirectoryError:
                os.unlink(target_path)

    async def expand(
        self, volume: Volume, *, volume_path: str, staging_path: str = "", required_bytes: int
    ) -> int:
        self.calls.append(("expand", (volume.volume_id, volume_path, required_bytes)))
        self.expanded.append(volume)
        if self.expand_fail:
            raise self.expand_fail
        return required_bytes

    async def close(self) -> None:
        return None

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]


class Drivers:
    def __init__(self) -> None:
        self.records = {
            DRIVER: CSIDriverRecord(
                name=DRIVER,
                endpoint="/run/drv.sock",
                registration="/reg.sock",
                node_id="n1",
                max_volumes=0,
                topology={},
                versions="1.0.0",
                registered_at=1.0,
            )
        }

    async def get(self, key: str) -> CSIDriverRecord | None:
        return self.records.get(key)


class Objects:
    def __init__(self) -> None:
        self.pvcs: dict[tuple[str, str], JSON] = {}
        self.pvs: dict[str, JSON] = {}
        self.csidrivers: dict[str, JSON] = {DRIVER: {"spec": {"attachRequired": False}}}
        self.attachments: dict[str, JSON] = {}
        self.secrets: dict[tuple[str, str], JSON] = {}
        self.patches: list[tuple[tuple[str, str], JSON]] = []
        self.attached: list[JSON] = []
        self.in_use: list[str] = []

    async def get_pvc(self, namespace: str, name: str) -> JSON | None:
        return self.pvcs.get((namespace, name))

    async def get_pv(self, name: str) -> JSON | None:
        return self.pvs.get(name)

    async def get_csi_driver(self, name: str) -> JSON | None:
        return self.csidrivers.get(name)

    async def get_volume_attachment(self, name: str) -> JSON | None:
        return self.attachments.get(name)

    async def get_node(self, name: str) -> JSON | None:
        if name != NODE:
            return None
        return {"status": {"volumesAttached": self.attached, "volumesInUse": self.in_use}}

    async def get_secret(self, namespace: str, name: str) -> JSON | None:
        return self.secrets.get((namespace, name))

    async def patch_pvc_status(self, namespace: str, name: str, patch: JSON) -> JSON | None:
        self.patches.append(((namespace, name), patch))
        return None

    def bind(self, claim: str, pv: str, *, handle: str = "vol-1", **csi: Any) -> None:
        self.pvcs[("ns", claim)] = {
            "metadata": {"name": claim, "namespace": "ns", "uid": f"uid-{claim}"},
            "spec": {"volumeName": pv},
            "status": {"phase": "Bound"},
        }
        self.pvs[pv] = {
            "metadata": {"name": pv},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "claimRef": {"uid": f"uid-{claim}"},
                "csi": {"driver": DRIVER, "volumeHandle": handle, **csi},
            },
        }


def a_pod(uid: str, *volumes: JSON, fs_group: int | None = None) -> JSON:
    spec: JSON = {"volumes": list(volumes)}
    if fs_group is not None:
        spec["securityContext"] = {"fsGroup": fs_group}
    return {"metadata": {"name": f"pod-{uid}", "namespace": "ns", "uid": uid}, "spec": spec}


def ctx(root: Path, pod: JSON) -> VolumeContext:
    return VolumeContext(
        pod=pod,
        pod_dir=root / "pods" / pod["metadata"]["uid"],
        objects=None,
        tokens=None,
        node=NodeFacts(),
        pod_ip="",
    )


def plugin(
    root: Path,
    driver: FakeDriver,
    objects: Objects,
    *,
    node: str = NODE,
    events: Recorded | None = None,
) -> CSIVolumePlugin:
    """The CSI plugin of `node`, its one driver `driver`, its Events (if any) to `events`."""
    return CSIVolumePlugin(
        root_dir=root,
        node_name=node,
        drivers=Drivers(),
        connect=lambda endpoint, name: driver,
        objects=objects,
        events=events,
    )


CLAIM = {"name": "data", "persistentVolumeClaim": {"claimName": "data"}}

# -- claims -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "cause"),
    [
        (lambda o: o.pvcs.clear(), 'persistentvolumeclaims "data" not found'),
        (
            lambda o: o.pvcs[("ns", "data")]["status"].update(phase="Pending"),
            "the PVC is not bound (phase 'Pending'",
        ),
        (
            lambda o: o.pvcs[("ns", "data")]["metadata"].update(deletionTimestamp="x"),
            "the PVC is being deleted",
        ),
        (lambda o: o.pvs.clear(), 'persistentvolumes "pv1" not found'),
        (
            lambda o: o.pvs["pv1"]["spec"]["claimRef"].update(uid="other"),
            "PV pv1 is bound to claim UID other, not to this claim (uid-data)",
        ),
        (
            lambda o: o.pvs["pv1"]["spec"].update(volumeMode="Sideways"),
            "PV pv1 has volumeMode 'Sideways'",
        ),
    ],
)
async def test_a_claim_the_pod_cannot_use_yet_says_why(change: Any, cause: str) -> None:
    objects = Objects()
    objects.bind("data", "pv1")
    change(objects)
    with pytest.raises(VolumeError) as err:
        await claims.resolve(CLAIM, a_pod("u1"), objects)
    assert str(err.value).startswith("error processing PVC ns/data: ")
    assert cause in str(err.value)


async def test_an_ephemeral_volumes_claim_must_belong_to_the_pod() -> None:
    objects = Objects()
    objects.bind("pod-u1-scratch", "pv1")
    volume = {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {}}}
    with pytest.raises(VolumeError, match="the pod is not its owner"):
        await claims.resolve(volume, a_pod("u1"), objects)
    objects.pvcs[("ns", "pod-u1-scratch")]["metadata"]["ownerReferences"] = [
        {"uid": "u1", "controller": True}
    ]
    got = await claims.resolve(volume, a_pod("u1"), objects)
    assert got.pv_name == "pv1"


# -- set-up and tear-down -----------------------------------------------------------------


async def test_a_volume_is_staged_once_and_published_per_pod(tmp_path: Path) -> None:
    driver, objects = FakeDriver(), Objects()
    objects.bind("data", "pv1", volumeAttributes={"k": "v"})
    p = plugin(tmp_path, driver, objects)
    one, two = a_pod("u1", CLAIM), a_pod("u2", CLAIM)
    path1 = await p.set_up(CLAIM, ctx(tmp_path, one))
    path2 = await p.set_up(CLAIM, ctx(tmp_path, two))
    await p.set_up(CLAIM, ctx(tmp_path, one))  # a later sync: nothing to do
    staging = staging_path(tmp_path, DRIVER, "vol-1")
    digest = hashlib.sha256(b"vol-1").hexdigest()
    assert staging == tmp_path / f"plugins/kubernetes.io/csi/{DRIVER}/{digest}/globalmount"
    assert path1 == tmp_path / "pods/u1/volumes/kubernetes.io~csi/pv1/mount"
    assert driver.names() == ["stage", "publish", "publish"]
    volume, target, staged, read_only = driver.calls[1][1]
    assert (target, staged, read_only) == (str(path1), str(staging), False)
    assert volume.volume_context == {"k": "v"}
    assert volume.capability.access_mode == "SINGLE_NODE_WRITER"
    data = json.loads((path1.parent / "vol_data.json").read_text())
    assert data["volumeHandle"] == "vol-1" and data["specVolID"] == "pv1"
    assert data["stagingTargetPath"] == str(staging)

    assert p.plugin_name("u1", CLAIM) == f"kubernetes.io/csi:{DRIVER}"
    assert p.plugin_name("u3", CLAIM) is None  # not resolved for that pod
    await p.tear_down(path1.parent)
    assert driver.names()[-1] == "unpublish"  # another pod still uses it
    assert staging.is_dir()
    await p.tear_down(path2.parent)
    assert driver.names()[-2:] == ["unpublish", "unstage"]
    assert not staging.parent.exists()
    assert not path2.parent.exists()


async def test_tear_down_removes_the_unmounted_directories_without_the_mount_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 42's count: after the driver's unpublish and unstage, the publish and the
    staging directory (an emptied `mount`/`globalmount` and klet's vol_data.json) go by
    rmdir and unlink: no read of the mount table (one each before)."""
    reads: list[int] = []
    monkeypatch.setattr(fs, "read_mountinfo", lambda: reads.append(1) or "")
    driver, objects = FakeDriver(), Objects()
    objects.bind("data", "pv1")
    p = plugin(tmp_path, driver, objects)
    path = await p.set_up(CLAIM, ctx(tmp_path, a_pod("u1", CLAIM)))
    staging = staging_path(tmp_path, DRIVER, "vol-1")
    await p.tear_down(path.parent)
    assert driver.names() == ["stage", "publish", "unpublish", "unstage"]
    assert not path.parent.exists() and not staging.parent.exists()
    assert reads == []


async def test_a_mount_the_driver_left_is_removed_the_careful_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A target still mounted after NodeUnpublishVolume (rmdir refuses it): the tear-down
    unmounts it from the mount table before deleting, and never deletes through it."""
    mounted: list[str] = []
    unmounted: list[str] = []

    def table() -> str:
        return "".join(f"40 22 0:40 / {m} rw - tmpfs tmpfs rw\n" for m in mounted)

    async def unmount(path: Path) -> None:
        unmounted.append(str(path))
        mounted.remove(str(path))
        (path / "on-the-mount").unlink()  # what the mount held goes with it

    monkeypatch.setattr(fs, "read_mountinfo", table)
    monkeypatch.setattr(fs, "unmount", unmount)
    driver, objects = FakeDriver(), Objects()
    objects.bind("data", "pv1")
    p = plugin(tmp_path, driver, objects)
    path = await p.set_up(CLAIM, ctx(tmp_path, a_pod("u1", CLAIM)))
    (path / "on-the-mount").write_text("data")  # rmdir of the target fails: not empty
    mounted.append(str(path))

    async def unpublish_leaving_the_mount(volume_id: str, *, target_path: str) -> None:
        driver.calls.append(("unpublish", (volume_id, target_path)))

    monkeypatch.setattr(driver, "unpublish", unpublish_leaving_the_mount)
    await p.tear_down(path.parent)
    assert unmounted == [str(path)]
    assert not path.parent.exists()


async def test_a_restarted_syncloop_tears_down_what_its_predecessor_set_up(
    tmp_path: Path,
) -> None:
    driver, objects = FakeDriver(), Objects()
    objects.bind("data", "pv1")
    path = await plugin(tmp_path, driver, objects).set_up(CLAIM, ctx(tmp_path, a_pod("u1", CLAIM)))
    fresh = plugin(tmp_path, driver, objects)
    await fresh.tear_down(path.parent)
    assert driver.names() == ["stage", "publish", "unpublish", "unstage"]


async def test_the_sweep_unstages_a_staging_no_pod_uses(tmp_path: Path) -> None:
    driver, objects = FakeDriver(), Objects()
    objects.bind("data", "pv1")
    p = plugin(tmp_path, driver, objects)
    path = await p.set_up(CLAIM, ctx(tmp_path, a_pod("u1", CLAIM)))
    await p.sweep()
    assert "unstage" not in driver.names()  # in use
    # A crash after the pod's volume went and before the unstage:
    (path.parent / "vol_data.json").unlink()
    os.rmdir(path)
    os.rmdir(path.parent)
    await p.sweep()
    assert driver.names()[-1] == "unstage"
    assert list((tmp_path / "plugins/kubernetes.io/csi" / DRIVER).iterdir()) == []


async def test_tear_down_unstages_the_path_of_driver_and_handle_not_the_one_on_disk(
    tmp_path: Path,
) -> None:
    driver, objects = FakeDriver(), Objects()
    objects.bind("data", "pv1")
    p = plugin(tmp_path, driver, objects)
    path = await p.set_up(CLAIM, ctx(tmp_path, a_pod("u1", CLAIM)))
    assert isinstance(path, Path)
    # vol_data.json rewritten to name another directory as the staging path
    victim = tmp_path / "victim"
    (victim / "globalmount").mkdir(parents=True)
    (victim / "keep").write_text("precious")
    data_file = path.parent / "vol_data.json"
    data = json.loads(data_file.read_text())
    data["stagingTargetPath"] = str(victim / "globalmount")
    data_file.write_text(json.dumps(data))
    await p.tear_down(path.parent)
    staging = staging_path(tmp_path, DRIVER, "vol-1")
    assert driver.calls[-1] == ("unstage", ("vol-1", str(staging)))
    assert (victim / "keep").read_text() == "precious"
    assert not staging.parent.exists()


@pytest.mark.parametrize("name", ["../../..", "a/b", "..", "-drv", "x" * 64, "drv_1", ""])
def test_a_driver_name_that_is_no_valid_name_never_makes_a_path(tmp_path: Path, name: str) -> None:
    with pytest.raises(VolumeError, match="is not usable in a path"):
        staging_path(tmp_path, name, "vol-1")


async def test_a_vol_data_json_naming_a_bad_driver_unstages_nothing(tmp_path: Path) -> None:
    driver, objects = FakeDriver(), Objects()
    objects.bind("data", "pv1")
    p = plugin(tmp_path, driver, objects)
    path = await p.set_up(CLAIM, ctx(tmp_path, a_pod("u1", CLAIM)))
    assert isinstance(path, Path)
    data_file = path.parent / "vol_data.json"
    data = json.loads(data_file.read_text())
    data["driverName"] = "../../../../victim"
    data_file.write_text(json.dumps(data))
    with pytest.raises(VolumeError, match="is not usable in a path"):
        await p.tear_down(path.parent)
    assert driver.names() == ["stage", "publish"]  # nothing unpublished or unstaged
    assert data_file.exists()


async def test_the_sweep_leaves_a_staging_whose_data_names_another_volume(tmp_path: Path) -> None:
    driver, objects = FakeDriver(), Objects()
    objects.bind("data", "pv1")
    p = plugin(tmp_path, driver, objects)
    path = await p.set_up(CLAIM, ctx(tmp_path, a_pod("u1", CLAIM)))
    assert isinstance(path, Path)
    await p.tear_down(path.parent)
    staging = staging_path(tmp_path, DRIVER, "vol-2")
    staging.mkdir(parents=True)
    (staging.parent / "vol_data.json").write_text(
        json.dumps({"driverName": DRIVER, "volumeHandle": "vol-1"})  # not vol-2's directory
    )
    calls = len(driver.calls)
    await p.sweep()
    assert len(driver.calls) == calls
    assert staging.is_dir()


async def test_a_driver_without_stage_unstage_is_only_published(tmp_path: Path) -> None:
    driver, objects = FakeDriver(caps=frozenset()), Objects()
    objects.bind("data", "pv1")
    p = plugin(tmp_path, driver, objects)
    path = await p.set_up(CLAIM, ctx(tmp_path, a_pod("u1", CLAIM)))
    await p.tear_down(path.parent)
    assert driver.names() == ["publish", "unpublish"]


async def test_attach_is_waited_for_when_the_csidriver_requires_it(tmp_path: Path) -> None:
    driver, objects = FakeDriver(), Objects()
    objects.bind("data", "pv1")
    objects.csidrivers[DRIVER] = {"spec": {"attachRequired": True}}
    p = plugin(tmp_path, driver, objects)
    name = attachment_name("vol-1", DRIVER, NODE)
    unique = f"kubernetes.io/csi/{DRIVER}^vol-1"
    with pytest.raises(VolumeError, match=r"not been added to the list of VolumesInUse"):
        await p.set_up(CLAIM, ctx(tmp_path, a_pod("u1", CLAIM)))
    # what puts it in volumesInUse is on disk before anything is mounted
    data_file = tmp_path / "pods/u1/volumes/kubernetes.io~csi/pv1/vol_data.json"
    assert json.loads(data_file.read_text())["attachmentID"] == name
    assert driver.names() == []
    objects.in_use = [unique]
    with pytest.raises(VolumeError, match=r"not in the Node's status.volumesAttached"):
        await p.set_up(CLAIM, ctx(tmp_path, a_pod("u1", CLAIM)))
    objects.attached = [{"name": f"kubernetes.io/csi/{DRIVER}^vol-1", "devicePath": ""}]
    with pytest.raises(VolumeError, match=f"VolumeAttachment {name} does not exist yet"):
        await p.set_up(CLAIM, ctx(tmp_path, a_pod("u1", CLAIM)))
    objects.attachments[name] = {
        "status": {"attached": False, "attachError": {"message": "no such disk"}}
    }
    with pytest.raises(VolumeError, match="is not attached yet: no such disk"):
        await p.set_up(CLAIM, ctx(tmp_path, a_pod("u1", CLAIM)))
    objects.attachments[name] = {
        "status": {"attached": True, "attachmentMetadata": {"device": "/dev/xvdb"}}
    }
    await p.set_up(CLAIM, ctx(tmp_path, a_pod("u1", CLAIM)))
    assert driver.calls[-1][1][0].publish_context == {"device": "/dev/xvdb"}
    staged = next(c[1][0] for c in driver.calls if c[0] == "stage")
    assert staged.publish_context == {"device": "/dev/xvdb"}


async def test_no_csidriver_object_means_attach_required(tmp_path: Path) -> None:
    objects = Objects()
    objects.bind("data", "pv1")
    del objects.csidrivers[DRIVER]
    driver = FakeDriver()
    p = plugin(tmp_path, driver, objects)
    with pytest.raises(VolumeError, match="VolumesInUse"):
        await p.set_up(CLAIM, ctx(tmp_path, a_pod("u1", CLAIM)))
    # the pod goes before its volume was attached: torn down as any other (the
    # unpublish of a target never published is a no-op for a CSI driver), nothing left
    volume_dir = tmp_path / "pods/u1/volumes/kubernetes.io~csi/pv1"
    await p.tear_down(volume_dir)
    assert driver.names() == ["unpublish"]
    assert not volume_dir.exists()


async def test_driver_problems_name_the_driver(tmp_path: Path) -> None:
    driver, objects = FakeDriver(), Objects()
    objects.bind("data", "pv1", driver="gone.klet.test")
    p = plugin(tmp_path, driver, objects)
    with pytest.raises(VolumeError) as err:
        await p.set_up(CLAIM, ctx(tmp_path, a_pod("u1", CLAIM)))
    assert str(err.value) == (
        "driver name gone.klet.test not found in the list of registered CSI drivers"
    )
    objects.bind("data", "pv1")
    driver.fail = DriverUnavailable("NodeGetCapabilities: UNAVAILABLE: refused", code="UNAVAILABLE")
    with pytest.raises(VolumeError, match=f"driver {DRIVER}: NodeGetCapabilities: UNAVAILABLE"):
        await p.set_up(CLAIM, ctx(tmp_path, a_pod("u1", CLAIM)))


async def test_a_bus_outage_fails_the_volume_not_the_worker(tmp_path: Path) -> None:
    class DownDrivers:
        async def get(self, key: str) -> CSIDriverRecord | None:
            raise BusUnavailable("redis down")

    objects = Objects()
    objects.bind("data", "pv1")
    p = CSIVolumePlugin(
        root_dir=tmp_path,
        node_name=NODE,
        drivers=DownDrivers(),
        connect=lambda endpoint, name: FakeDriver(),
        objects=objects,
    )
    with pytest.raises(VolumeError, match="registered CSI drivers could not be read: redis down"):
        await p.set_up(CLAIM, ctx(tmp_path, a_pod("u1", CLAIM)))


async def test_a_secret_ref_that_is_missing_fails_the_volume(tmp_path: Path) -> None:
    objects = Objects()
    objects.bind("data", "pv1", nodePublishSecretRef={"namespace": "sec", "name": "creds"})
    p = plugin(tmp_path, FakeDriver(), objects)
    with pytest.raises(VolumeError, match='NodePublishSecretRef sec/creds failed: secrets "creds"'):
        await p.set_up(CLAIM, ctx(tmp_path, a_pod("u1", CLAIM)))
    objects.secrets[("sec", "creds")] = {"data": {"user": "YWRtaW4="}}
    driver = FakeDriver()
    await plugin(tmp_path, driver, objects).set_up(CLAIM, ctx(tmp_path, a_pod("u1", CLAIM)))
    assert driver.calls[-1][1][0].secrets == {"user": "admin"}


async def test_pod_info_and_read_only(tmp_path: Path) -> None:
    driver, objects = FakeDriver(), Objects()
    objects.bind("data", "pv1")
    objects.csidrivers[DRIVER] = {"spec": {"attachRequired": False, "podInfoOnMount": True}}
    volume = {"name": "data", "persistentVolumeClaim": {"claimName": "data", "readOnly": True}}
    await plugin(tmp_path, driver, objects).set_up(volume, ctx(tmp_path, a_pod("u1", volume)))
    published, _, _, read_only = driver.calls[-1][1]
    assert read_only
    assert published.volume_context == {
        "csi.storage.k8s.io/pod.name": "pod-u1",
        "csi.storage.k8s.io/pod.namespace": "ns",
        "csi.storage.k8s.io/pod.uid": "u1",
        "csi.storage.k8s.io/serviceAccount.name": "default",
        "csi.storage.k8s.io/ephemeral": "false",
    }


async def test_token_requests_hand_the_driver_service_account_tokens(tmp_path: Path) -> None:
    class Tokens:
        def __init__(self) -> None:
            self.asked: list[tuple[str, str, int]] = []

        async def token(
            self, pod: JSON, *, service_account: str, audience: str, expiration_s: int
        ) -> tuple[str, float]:
            self.asked.append((service_account, audience, expiration_s))
            return f"token-for-{audience}", 3600.0

    driver, objects, tokens = FakeDriver(), Objects(), Tokens()
    objects.bind("data", "pv1")
    objects.csidrivers[DRIVER] = {
        "spec": {
            "attachRequired": False,
            "tokenRequests": [{"audience": "vault"}, {"audience": "", "expirationSeconds": 600}],
        }
    }
    p = CSIVolumePlugin(
        root_dir=tmp_path,
        node_name=NODE,
        drivers=Drivers(),
        connect=lambda endpoint, name: driver,
        objects=objects,
        tokens=tokens,
    )
    pod = a_pod("u1", CLAIM)
    pod["spec"]["serviceAccountName"] = "app"
    await p.set_up(CLAIM, ctx(tmp_path, pod))
    assert tokens.asked == [("app", "vault", 3600), ("app", "", 600)]
    published = driver.calls[-1][1][0]
    assert json.loads(published.volume_context["csi.storage.k8s.io/serviceAccount.tokens"]) == {
        "vault": {"token": "token-for-vault", "expirationTimestamp": "1970-01-01T01:00:00Z"},
        "": {"token": "token-for-", "expirationTimestamp": "1970-01-01T01:00:00Z"},
    }
    no_issuer = plugin(tmp_path, FakeDriver(), objects)
    with pytest.raises(VolumeError, match="asks for service-account tokens; none can be issued"):
        await no_issuer.set_up(CLAIM, ctx(tmp_path, a_pod("u2", CLAIM)))


async def test_inline_volumes_need_the_ephemeral_lifecycle_mode(tmp_path: Path) -> None:
    driver, objects = FakeDriver(), Objects()
    volume = {"name": "scratch", "csi": {"driver": DRIVER, "volumeAttributes": {"size": "1"}}}
    p = plugin(tmp_path, driver, objects)
    with pytest.raises(VolumeError, match=r'"Ephemeral" not supported by driver .* \[\'Persistent'):
        await p.set_up(volume, ctx(tmp_path, a_pod("u1", volume)))
    objects.csidrivers[DRIVER]["spec"]["volumeLifecycleModes"] = ["Ephemeral"]
    path = await p.set_up(volume, ctx(tmp_path, a_pod("u1", volume)))
    assert path == tmp_path / "pods/u1/volumes/kubernetes.io~csi/scratch/mount"
    assert driver.names() == ["publish"]  # never staged
    published = driver.calls[0][1][0]
    assert published.volume_id == inline_handle("u1", "scratch")
    assert published.volume_context == {"size": "1"}
    await p.tear_down(path.parent)
    assert driver.names() == ["publish", "unpublish"]
    del objects.csidrivers[DRIVER]
    with pytest.raises(VolumeError, match='CSIDriver "drv.klet.test" not found'):
        await p.set_up(volume, ctx(tmp_path, a_pod("u2", volume)))


async def test_standalone_refuses_claims_and_csi(tmp_path: Path) -> None:
    p = CSIVolumePlugin(
        root_dir=tmp_path,
        node_name=NODE,
        drivers=Drivers(),
        connect=lambda endpoint, name: FakeDriver(),
        objects=None,
    )
    with pytest.raises(VolumeError, match="persistentVolumeClaim volumes need the apiserver"):
        await p.set_up(CLAIM, ctx(tmp_path, a_pod("u1", CLAIM)))


async def test_local_and_host_path_pvs_are_the_nodes_paths(tmp_path: Path) -> None:
    objects = Objects()
    objects.bind("data", "pv1")
    disk = tmp_path / "disk"
    disk.mkdir()
    objects.pvs["pv1"]["spec"].pop("csi")
    objects.pvs["pv1"]["spec"]["local"] = {"path": str(disk)}
    p = plugin(tmp_path, FakeDriver(), objects)
    assert await p.set_up(CLAIM, ctx(tmp_path, a_pod("u1", CLAIM))) == disk
    objects.pvs["pv1"]["spec"]["local"] = {"path": str(tmp_path / "missing")}
    with pytest.raises(VolumeError, match="PV pv1: hostPath .*missing doesn't exist"):
        await p.set_up(CLAIM, ctx(tmp_path, a_pod("u1", CLAIM)))
    objects.pvs["pv1"]["spec"].pop("local")
    objects.pvs["pv1"]["spec"]["hostPath"] = {
        "path": str(tmp_path / "new"),
        "type": "DirectoryOrCreate",
    }
    assert await p.set_up(CLAIM, ctx(tmp_path, a_pod("u1", CLAIM))) == tmp_path / "new"
    objects.pvs["pv1"]["spec"].pop("hostPath")
    objects.pvs["pv1"]["spec"]["iscsi"] = {"targetPortal": "x", "iqn": "y", "lun": 0}
    with pytest.raises(VolumeError, match='PV pv1: volume type "iscsi" is not supported by klet'):
        await p.set_up(CLAIM, ctx(tmp_path, a_pod("u1", CLAIM)))


async def test_a_block_csi_volume_is_staged_published_to_a_file_and_linked(
    tmp_path: Path,
) -> None:
    """Upstream's csi_block.go layout: staging/<pv>, publish/<pv>/<uid>, the pod's link."""
    driver, objects = FakeDriver(), Objects()
    objects.bind("data", "pv1", volumeAttributes={"k": "v"})
    objects.pvs["pv1"]["spec"]["volumeMode"] = "Block"
    p = plugin(tmp_path, driver, objects)
    one, two = a_pod("u1", CLAIM), a_pod("u2", CLAIM)
    got1 = await p.set_up(CLAIM, ctx(tmp_path, one))
    got2 = await p.set_up(CLAIM, ctx(tmp_path, two))
    assert await p.set_up(CLAIM, ctx(tmp_path, one)) == got1  # a later sync: nothing to do
    devices = tmp_path / "plugins/kubernetes.io/csi/volumeDevices"
    link1 = tmp_path / "pods/u1/volumeDevices/kubernetes.io~csi/pv1"
    assert got1 == Block(link1)
    assert got2 == Block(tmp_path / "pods/u2/volumeDevices/kubernetes.io~csi/pv1")
    assert os.readlink(link1) == str(devices / "publish/pv1/u1")
    assert link1.resolve().is_file()  # what the driver published
    assert driver.names() == ["stage", "publish", "publish"]
    stage_volume, staged_at = driver.calls[0][1]
    assert staged_at == str(devices / "staging/pv1")
    assert stage_volume.capability.block and not stage_volume.capability.fs_type
    volume, target, staging, read_only = driver.calls[1][1]
    assert (target, staging, read_only) == (str(devices / "publish/pv1/u1"), staged_at, False)
    assert volume.capability.block and volume.volume_context == {"k": "v"}
    assert volume.capability.access_mode == "SINGLE_NODE_WRITER"
    # The pod's record, where the volume stats and volumesInUse find every CSI volume.
    record = tmp_path / "pods/u1/volumes/kubernetes.io~csi/pv1"
    data = json.loads((record / "vol_data.json").read_text())
    assert data["volumeMode"] == "Block" and data["stagingTargetPath"] == staged_at
    assert data["kletClaimName"] == "data" and data["volumeHandle"] == "vol-1"
    assert json.loads((devices / "pv1/data/vol_data.json").read_text())["driverName"] == DRIVER

    await p.tear_down(record)
    assert driver.calls[-1] == ("unpublish", ("vol-1", str(devices / "publish/pv1/u1")))
    assert not link1.is_symlink() and not record.exists()
    assert (devices / "staging/pv1").is_dir()  # the other pod still uses it
    # A restarted syncloop (a new plugin) tears the other pod's down and unstages.
    fresh = plugin(tmp_path, driver, objects)
    await fresh.tear_down(tmp_path / "pods/u2/volumes/kubernetes.io~csi/pv1")
    assert driver.names()[-2:] == ["unpublish", "unstage"]
    assert driver.calls[-1][1] == ("vol-1", staged_at)
    assert sorted(p.name for p in devices.iterdir()) == ["publish", "staging"]
    assert list((devices / "publish").iterdir()) == list((devices / "staging").iterdir()) == []


async def test_a_grown_block_csi_volume_is_expanded_at_its_publish_file(tmp_path: Path) -> None:
    driver = FakeDriver(caps=frozenset({"STAGE_UNSTAGE_VOLUME", "EXPAND_VOLUME"}))
    objects = Objects()
    objects.bind("data", "pv1")
    objects.pvs["pv1"]["spec"]["volumeMode"] = "Block"
    objects.pvs["pv1"]["spec"]["capacity"] = {"storage": "2Gi"}
    objects.pvcs[("ns", "data")]["status"].update(
        capacity={"storage": "1Gi"}, allocatedResourceStatuses={"storage": "NodeResizePending"}
    )
    p = plugin(tmp_path, driver, objects)
    await p.set_up(CLAIM, ctx(tmp_path, a_pod("u1", CLAIM)))
    target = str(tmp_path / "plugins/kubernetes.io/csi/volumeDevices/publish/pv1/u1")
    assert driver.calls[-1] == ("expand", ("vol-1", target, 2 << 30))
    [(_, marked), (claim, patch)] = objects.patches
    assert marked["status"] == {"allocatedResourceStatuses": {"storage": "NodeResizeInProgress"}}
    assert claim == ("ns", "data") and patch["status"]["capacity"] == {"storage": "2Gi"}


async def test_a_block_csi_volume_left_staged_by_a_crash_is_swept(tmp_path: Path) -> None:
    driver, objects = FakeDriver(), Objects()
    objects.bind("data", "pv1")
    objects.pvs["pv1"]["spec"]["volumeMode"] = "Block"
    p = plugin(tmp_path, driver, objects)
    await p.set_up(CLAIM, ctx(tmp_path, a_pod("u1", CLAIM)))
    await p.sweep()
    assert "unstage" not in driver.names()  # in use
    # A crash after the pod's volume went and before the unstage:
    record = tmp_path / "pods/u1/volumes/kubernetes.io~csi/pv1"
    (record / "vol_data.json").unlink()
    record.rmdir()
    devices = tmp_path / "plugins/kubernetes.io/csi/volumeDevices"
    (devices / "publish/pv1/u1").unlink()
    await p.sweep()
    assert driver.calls[-1] == ("unstage", ("vol-1", str(devices / "staging/pv1")))
    assert not (devices / "pv1").exists() and not (devices / "staging/pv1").exists()


async def test_a_block_csi_volume_without_stage_unstage_is_only_published(
    tmp_path: Path,
) -> None:
    driver, objects = FakeDriver(caps=frozenset()), Objects()
    objects.bind("data", "pv1")
    objects.pvs["pv1"]["spec"]["volumeMode"] = "Block"
    p = plugin(tmp_path, driver, objects)
    await p.set_up(CLAIM, ctx(tmp_path, a_pod("u1", CLAIM)))
    assert driver.names() == ["publish"] and driver.calls[0][1][2] == ""
    await p.tear_down(tmp_path / "pods/u1/volumes/kubernetes.io~csi/pv1")
    assert driver.names() == ["publish", "unpublish"]
    assert list((tmp_path / "plugins/kubernetes.io/csi/volumeDevices").rglob("*")) == [
        tmp_path / "plugins/kubernetes.io/csi/volumeDevices/publish"
    ]


@pytest.mark.parametrize("where", ["claim", "pv"])
async def test_a_read_only_block_csi_volume_is_published_read_only_and_mapped_r(
    tmp_path: Path, where: str
) -> None:
    """Upstream's makeBlockVolumes gives a read-only volume's device cgroup permission
    "r" (not "mrw"), and csi_block.go publishes it with readonly set."""
    driver, objects = FakeDriver(), Objects()
    objects.bind("data", "pv1", readOnly=where == "pv")
    objects.pvs["pv1"]["spec"]["volumeMode"] = "Block"
    claim = {"name": "data", "persistentVolumeClaim": {"claimName": "data"}}
    if where == "claim":
        claim["persistentVolumeClaim"]["readOnly"] = True
    p = plugin(tmp_path, driver, objects)
    got = await p.set_up(claim, ctx(tmp_path, a_pod("u1", claim)))
    link = tmp_path / "pods/u1/volumeDevices/kubernetes.io~csi/pv1"
    assert got == Block(link, read_only=True)
    assert driver.names() == ["stage", "publish"]
    _, target, _, read_only = driver.calls[1][1]
    assert read_only is True and target.endswith("publish/pv1/u1")
    container = {"name": "db", "volumeDevices": [{"name": "data", "devicePath": "/dev/xvda"}]}
    assert mounts.container_devices(container, devices={"data": got}, volumes={}) == (
        Device(container_path="/dev/xvda", host_path=str(link), permissions="r"),
    )


async def test_a_read_only_claim_of_a_local_block_pv_is_read_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checked: list[tuple[str, str]] = []
    monkeypatch.setattr(
        hostpath, "check_type", lambda path, *, path_type: checked.append((path, path_type))
    )
    objects = Objects()
    objects.bind("data", "pv1")
    objects.pvs["pv1"]["spec"].pop("csi")
    objects.pvs["pv1"]["spec"]["volumeMode"] = "Block"
    objects.pvs["pv1"]["spec"]["local"] = {"path": "/dev/xvdb"}
    claim = {"name": "data", "persistentVolumeClaim": {"claimName": "data", "readOnly": True}}
    p = plugin(tmp_path, FakeDriver(), objects)
    assert await p.set_up(claim, ctx(tmp_path, a_pod("u1", claim))) == Block(
        Path("/dev/xvdb"), read_only=True
    )
    assert await p.set_up(CLAIM, ctx(tmp_path, a_pod("u2", CLAIM))) == Block(Path("/dev/xvdb"))
    assert checked == [("/dev/xvdb", "BlockDevice")] * 2


async def test_a_block_attachable_csi_volume_waits_for_its_attachment(tmp_path: Path) -> None:
    driver, objects = FakeDriver(), Objects()
    objects.csidrivers[DRIVER] = {"spec": {"attachRequired": True}}
    objects.bind("data", "pv1")
    objects.pvs["pv1"]["spec"]["volumeMode"] = "Block"
    p = plugin(tmp_path, driver, objects)
    with pytest.raises(VolumeError, match="VolumesInUse"):
        await p.set_up(CLAIM, ctx(tmp_path, a_pod("u1", CLAIM)))
    # the record that puts it in volumesInUse is there before anything is staged
    assert (tmp_path / "pods/u1/volumes/kubernetes.io~csi/pv1/vol_data.json").is_file()
    assert driver.calls == []
    unique = f"kubernetes.io/csi/{DRIVER}^vol-1"
    objects.in_use = [unique]
    objects.attached = [{"name": unique, "devicePath": ""}]
    name = attachment_name("vol-1", DRIVER, NODE)
    objects.attachments[name] = {
        "status": {"attached": True, "attachmentMetadata": {"dev": "/dev/x"}}
    }
    await p.set_up(CLAIM, ctx(tmp_path, a_pod("u1", CLAIM)))
    assert [c[1][0].publish_context for c in driver.calls] == [{"dev": "/dev/x"}] * 2


async def test_a_block_local_pv_is_a_device_and_hostpath_block_pvs_are_refused(
    tmp_path: Path,
) -> None:
    objects = Objects()
    objects.bind("data", "pv1")
    spec = objects.pvs["pv1"]["spec"]
    spec["volumeMode"] = "Block"
    p = plugin(tmp_path, FakeDriver(), objects)
    spec.pop("csi")
    spec["hostPath"] = {"path": "/dev/null"}
    with pytest.raises(VolumeError, match="supported for CSI and local PVs only"):
        await p.set_up(CLAIM, ctx(tmp_path, a_pod("u1", CLAIM)))
    spec.pop("hostPath")
    spec["local"] = {"path": "/dev/null"}
    with pytest.raises(VolumeError, match="/dev/null is not a block device, it's a CharDevice"):
        await p.set_up(CLAIM, ctx(tmp_path, a_pod("u1", CLAIM)))
    node = tmp_path / "blk"
    os.mknod(node, stat.S_IFBLK | 0o600, os.makedev(7, 0))  # as loop0's (tests run as root)
    spec["local"] = {"path": str(node)}
    assert await p.set_up(CLAIM, ctx(tmp_path, a_pod("u1", CLAIM))) == Block(node)


@pytest.fixture
def ext4_image(tmp_path: Path) -> Path:
    image = tmp_path / "disk.img"
    image.write_bytes(bytes(4 << 20))
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    return image


async def test_a_device_with_another_filesystem_is_not_formatted(
    tmp_path: Path, ext4_image: Path
) -> None:
    image = ext4_image
    assert await localdevice.filesystem_of(str(image)) == "ext4"
    blank = tmp_path / "blank.img"
    blank.write_bytes(bytes(1 << 20))
    assert await localdevice.filesystem_of(str(blank)) == ""
    mounts = localdevice.LocalDeviceMounts(tmp_path)
    with pytest.raises(VolumeError, match="as 'xfs': it already contains 'ext4'"):
        await mounts.set_up(
            "pv1", str(image), fs_type="xfs", options=(), pod_volume=tmp_path / "pod" / "pv1"
        )
    assert not mounts.global_path("pv1").exists()


async def test_fs_group_is_applied_as_the_policy_says(tmp_path: Path) -> None:
    driver, objects = FakeDriver(), Objects()
    objects.bind("data", "pv1")
    objects.csidrivers[DRIVER] = {"spec": {"attachRequired": False, "fsGroupPolicy": "File"}}
    p = plugin(tmp_path, driver, objects)
    path = await p.set_up(CLAIM, ctx(tmp_path, a_pod("u1", CLAIM, fs_group=4321)))
    assert path.stat().st_gid == 4321
    assert path.stat().st_mode & 0o2070 == 0o2070
    os.chown(path, -1, 0)  # a later sync does not walk the volume again
    await p.set_up(CLAIM, ctx(tmp_path, a_pod("u1", CLAIM, fs_group=4321)))
    assert path.stat().st_gid == 0


async def test_online_expansion_when_the_claim_waits_for_the_node(tmp_path: Path) -> None:
    """Upstream's NodeExpander: NodeResizeInProgress before the call, then the capacity
    with the resize conditions and status gone; an older resizer's claim (no status, no
    allocatedResources) is expanded to the PV's size with nothing marked before."""
    driver, objects = FakeDriver(caps=frozenset({"EXPAND_VOLUME"})), Objects()
    objects.bind("data", "pv1")
    claim = objects.pvcs[("ns", "data")]
    claim["metadata"]["resourceVersion"] = "7"
    claim["status"]["capacity"] = {"storage": "1Mi"}
    objects.pvs["pv1"]["spec"]["capacity"] = {"storage": "1Mi"}
    p = plugin(tmp_path, driver, objects)
    path = await p.set_up(CLAIM, ctx(tmp_path, a_pod("u1", CLAIM)))
    assert driver.names() == ["publish"]  # nothing to grow
    objects.pvs["pv1"]["spec"]["capacity"] = {"storage": "2Mi"}
    claim["status"]["allocatedResources"] = {"storage": "2Mi"}
    await p.set_up(CLAIM, ctx(tmp_path, a_pod("u1", CLAIM)))
    assert driver.names() == ["publish"]  # allocated, but the resizer did not hand it over
    claim["status"]["allocatedResourceStatuses"] = {"storage": "NodeResizePending"}
    claim["status"]["conditions"] = [
        {"type": "FileSystemResizePending", "status": "True"},
        {"type": "Resizing", "status": "True"},  # read before the resizer finished
        {"type": "NodeResizeError", "status": "True"},
        {"type": "Other", "status": "True"},
    ]
    await p.set_up(CLAIM, ctx(tmp_path, a_pod("u1", CLAIM)))
    assert driver.calls[-1] == ("expand", ("vol-1", str(path), 2 << 20))
    version = {"resourceVersion": "7"}
    assert objects.patches == [
        (
            ("ns", "data"),
            {
                "status": {"allocatedResourceStatuses": {"storage": "NodeResizeInProgress"}},
                "metadata": version,
            },
        ),
        (
            ("ns", "data"),
            {
                "status": {
                    "capacity": {"storage": "2Mi"},
                    "conditions": [{"type": "Other", "status": "True"}],
                    "allocatedResourceStatuses": {"storage": None},
                },
                "metadata": version,
            },
        ),
    ]
    objects.patches.clear()
    del claim["status"]["allocatedResourceStatuses"], claim["status"]["allocatedResources"]
    objects.pvs["pv1"]["spec"]["capacity"] = {"storage": "3Mi"}
    await p.set_up(CLAIM, ctx(tmp_path, a_pod("u1", CLAIM)))
    assert driver.calls[-1] == ("expand", ("vol-1", str(path), 3 << 20))
    [(_, finished)] = objects.patches
    assert finished["status"]["capacity"] == {"storage": "3Mi"}


async def test_a_failed_node_expansion_is_written_to_the_claim_and_recovered(
    tmp_path: Path,
) -> None:
    """CSI Mock's 'Expansion with recovery' specs: a final error leaves the claim
    NodeResizeInProgress with a NodeResizeError condition, an InvalidArgument one makes
    it NodeResizeInfeasible; once the user asks for less, the node expands to the
    allocated (smaller) size and the claim is clean again. A driver that does not answer
    marks nothing."""
    driver, objects = FakeDriver(caps=frozenset({"EXPAND_VOLUME"})), Objects()
    objects.bind("data", "pv1")
    claim = objects.pvcs[("ns", "data")]
    claim["spec"]["resources"] = {"requests": {"storage": "9Gi"}}
    claim["status"].update(
        capacity={"storage": "1Gi"},
        allocatedResources={"storage": "9Gi"},
        allocatedResourceStatuses={"storage": "NodeResizePending"},
    )
    objects.pvs["pv1"]["spec"]["capacity"] = {"storage": "9Gi"}
    p = plugin(tmp_path, driver, objects)
    pod = a_pod("u1", CLAIM)
    driver.expand_fail = CSIError(
        "NodeExpandVolume: PERMISSION_DENIED: no", code="PERMISSION_DENIED"
    )
    path = await p.set_up(CLAIM, ctx(tmp_path, pod))  # the pod's volume is still there
    assert driver.calls[-1] == ("expand", ("vol-1", str(path), 9 << 30))
    [(_, marked), (_, failed)] = objects.patches
    assert marked["status"]["allocatedResourceStatuses"] == {"storage": "NodeResizeInProgress"}
    assert "allocatedResourceStatuses" not in failed["status"]  # stays in progress
    [error] = failed["status"]["conditions"]
    assert error["type"] == "NodeResizeError" and error["status"] == "True"
    assert error["message"] == "failed to expand pvc with NodeExpandVolume: PERMISSION_DENIED: no"

    objects.patches.clear()
    driver.expand_fail = CSIError("NodeExpandVolume: INVALID_ARGUMENT: no", code="INVALID_ARGUMENT")
    claim["status"]["allocatedResourceStatuses"] = {"storage": "NodeResizeInProgress"}
    await p.set_up(CLAIM, ctx(tmp_path, pod))
    [(_, failed)] = objects.patches  # already in progress: not marked again
    assert failed["status"]["allocatedResourceStatuses"] == {"storage": "NodeResizeInfeasible"}

    objects.patches.clear()
    claim["status"]["allocatedResourceStatuses"] = {"storage": "NodeResizeInfeasible"}
    calls = len(driver.calls)
    await p.set_up(CLAIM, ctx(tmp_path, pod))
    assert len(driver.calls) == calls and objects.patches == []  # infeasible: left alone

    # the user asks for 5Gi; the resizer allocates it and hands it to the node again
    driver.expand_fail = None
    claim["spec"]["resources"] = {"requests": {"storage": "5Gi"}}
    claim["status"]["allocatedResources"] = {"storage": "5Gi"}
    claim["status"]["allocatedResourceStatuses"] = {"storage": "NodeResizePending"}
    claim["status"]["conditions"] = [dict(error)]
    await p.set_up(CLAIM, ctx(tmp_path, pod))
    assert driver.calls[-1] == ("expand", ("vol-1", str(path), 5 << 30))
    finished = objects.patches[-1][1]["status"]
    assert finished == {
        "capacity": {"storage": "5Gi"},
        "conditions": None,
        "allocatedResourceStatuses": {"storage": None},
    }

    objects.patches.clear()
    claim["status"]["capacity"] = {"storage": "5Gi"}
    claim["status"]["allocatedResourceStatuses"] = {"storage": "NodeResizePending"}
    claim["status"]["allocatedResources"] = {"storage": "6Gi"}
    driver.expand_fail = DriverUnavailable(
        "NodeExpandVolume: UNAVAILABLE: gone", code="UNAVAILABLE"
    )
    await p.set_up(CLAIM, ctx(tmp_path, pod))
    assert [patch["status"] for _, patch in objects.patches] == [
        {"allocatedResourceStatuses": {"storage": "NodeResizeInProgress"}}
    ]


async def test_node_expansion_carries_the_node_expand_secret_only(tmp_path: Path) -> None:
    """Upstream's csi_expander sends NodeExpandVolume the PV's nodeExpandSecretRef secret
    (CSI Mock's 'CSI online volume expansion with secret' spec checks it); a secret not
    there yet leaves the volume as it is and the pod running, and the next sync expands."""
    driver, objects = FakeDriver(caps=frozenset({"EXPAND_VOLUME"})), Objects()
    objects.bind(
        "data",
        "pv1",
        nodePublishSecretRef={"namespace": "sec", "name": "publish"},
        nodeExpandSecretRef={"namespace": "sec", "name": "expand"},
    )
    objects.secrets[("sec", "publish")] = {"data": {"user": "cHVi"}}
    claim = objects.pvcs[("ns", "data")]
    claim["status"]["capacity"] = {"storage": "1Mi"}
    claim["status"]["allocatedResourceStatuses"] = {"storage": "NodeResizePending"}
    objects.pvs["pv1"]["spec"]["capacity"] = {"storage": "2Mi"}
    p = plugin(tmp_path, driver, objects)
    path = await p.set_up(CLAIM, ctx(tmp_path, a_pod("u1", CLAIM)))
    assert driver.names() == ["publish"] and objects.patches == []  # no secret: not grown
    objects.secrets[("sec", "expand")] = {"data": {"password": "dDBwLVNlY3JldA=="}}
    assert await p.set_up(CLAIM, ctx(tmp_path, a_pod("u1", CLAIM))) == path
    assert driver.calls[-1] == ("expand", ("vol-1", str(path), 2 << 20))
    assert driver.expanded[-1].secrets == {"password": "t0p-Secret"}
    assert objects.patches[-1][1]["status"]["capacity"] == {"storage": "2Mi"}


class Recorded:
    """The Events the plugin records: (kind, name, type, reason, message)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, str, str, str]] = []

    def emit(self, involved: JSON, type_: str, reason: str, message: str) -> None:
        self.events.append((involved["kind"], involved["name"], type_, reason, message))


def merge_patch(target: JSON, patch: JSON) -> None:
    """A JSON merge patch applied in place, as the apiserver applies the plugin's."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            merge_patch(target[key], value)
        else:
            target[key] = value


class ClusterObjects(Objects):
    """The API reads of `Objects` with claim status patches applied to the claim (every
    node of a test reads the same claim, as every kubelet reads the apiserver's), and the
    Events every node records."""

    def __init__(self) -> None:
        super().__init__()
        self.recorded = Recorded()

    async def patch_pvc_status(self, namespace: str, name: str, patch: JSON) -> JSON | None:
        await super().patch_pvc_status(namespace, name, patch)
        claim = self.pvcs[(namespace, name)]
        merge_patch(claim, {"status": patch["status"]})
        return json.loads(json.dumps(claim))


def node_plugin(
    root: Path, node: str, driver: FakeDriver, objects: ClusterObjects
) -> CSIVolumePlugin:
    return plugin(root, driver, objects, node=node, events=objects.recorded)


def shared_claim(objects: Objects, *, modes: list[str], annotations: JSON | None = None) -> JSON:
    """A bound claim of 1Gi on a 1Gi PV, with the access modes given."""
    objects.bind("data", "pv1")
    claim = objects.pvcs[("ns", "data")]
    claim["spec"].update(accessModes=modes, resources={"requests": {"storage": "1Gi"}})
    claim["status"]["capacity"] = {"storage": "1Gi"}
    if annotations:
        claim["metadata"]["annotations"] = annotations
    objects.pvs["pv1"]["spec"].update(accessModes=modes, capacity={"storage": "1Gi"})
    return claim


def resize(objects: Objects, claim: JSON, size: str) -> None:
    """What the external-resizer does: the PV grown, the claim allocated and handed to
    the nodes (and the request the user made)."""
    objects.pvs["pv1"]["spec"]["capacity"] = {"storage": size}
    claim["spec"]["resources"] = {"requests": {"storage": size}}
    claim["status"]["allocatedResources"] = {"storage": size}
    claim["status"]["allocatedResourceStatuses"] = {"storage": "NodeResizePending"}


@pytest.mark.parametrize(
    ("modes", "annotations", "second_node_expands"),
    [
        (["ReadWriteMany"], None, True),
        (["ReadWriteOnce", "ReadWriteMany"], None, True),
        (["ReadWriteMany"], {"volume.kubernetes.io/node-expansion-not-required": "true"}, False),
        (["ReadWriteOnce"], None, False),
    ],
)
async def test_a_read_write_many_volume_is_expanded_on_every_node_that_mounts_it(
    tmp_path: Path, modes: list[str], annotations: JSON | None, second_node_expands: bool
) -> None:
    """Upstream's node expander per node: the first node marks the claim, expands its mount
    and writes the new capacity; a second node mounting the same ReadWriteMany claim
    (now updated, no resize status) expands its own mount too, writing nothing to the
    claim, each with FileSystemResizeSuccessful on its pod and on the claim. Without
    ReadWriteMany, or with the node-expansion-not-required annotation, the second node
    counts its volume at the claim's size without a call. Neither node expands again."""
    objects = ClusterObjects()
    claim = shared_claim(objects, modes=modes, annotations=annotations)
    driver_a, driver_b = (FakeDriver(caps=frozenset({"EXPAND_VOLUME"})) for _ in range(2))
    node_a = node_plugin(tmp_path / "a", "node-a", driver_a, objects)
    node_b = node_plugin(tmp_path / "b", "node-b", driver_b, objects)
    pod_a, pod_b = a_pod("ua", CLAIM), a_pod("ub", CLAIM)
    path_a = await node_a.set_up(CLAIM, ctx(tmp_path / "a", pod_a))
    path_b = await node_b.set_up(CLAIM, ctx(tmp_path / "b", pod_b))
    assert driver_a.names() == driver_b.names() == ["publish"]

    resize(objects, claim, "2Gi")
    await node_a.set_up(CLAIM, ctx(tmp_path / "a", pod_a))
    assert driver_a.calls[-1] == ("expand", ("vol-1", str(path_a), 2 << 30))
    assert [patch["status"] for _, patch in objects.patches] == [
        {"allocatedResourceStatuses": {"storage": "NodeResizeInProgress"}},
        {
            "capacity": {"storage": "2Gi"},
            "conditions": None,
            "allocatedResourceStatuses": {"storage": None},
        },
    ]
    assert claim["status"]["capacity"] == {"storage": "2Gi"}
    assert not claim["status"].get("allocatedResourceStatuses")
    success_a = 'MountVolume.NodeExpandVolume succeeded for volume "pv1" node-a'
    events = objects.recorded.events
    assert events == [
        ("Pod", "pod-ua", "Normal", "FileSystemResizeSuccessful", success_a),
        ("PersistentVolumeClaim", "data", "Normal", "FileSystemResizeSuccessful", success_a),
    ]

    objects.patches.clear()
    events.clear()
    await node_b.set_up(CLAIM, ctx(tmp_path / "b", pod_b))
    assert objects.patches == []  # the claim is not written again
    if second_node_expands:
        assert driver_b.calls[-1] == ("expand", ("vol-1", str(path_b), 2 << 30))
        success_b = 'MountVolume.NodeExpandVolume succeeded for volume "pv1" node-b'
        assert events == [
            ("Pod", "pod-ub", "Normal", "FileSystemResizeSuccessful", success_b),
            ("PersistentVolumeClaim", "data", "Normal", "FileSystemResizeSuccessful", success_b),
        ]
    else:
        assert driver_b.names() == ["publish"] and events == []

    calls_a, calls_b = len(driver_a.calls), len(driver_b.calls)
    await node_a.set_up(CLAIM, ctx(tmp_path / "a", pod_a))
    await node_b.set_up(CLAIM, ctx(tmp_path / "b", pod_b))
    assert (len(driver_a.calls), len(driver_b.calls)) == (calls_a, calls_b)
    assert objects.patches == []


async def test_a_node_that_saw_the_claim_updated_when_its_volume_came_does_not_expand(
    tmp_path: Path,
) -> None:
    """As upstream's actual state of world, a node starts from the claim's capacity when
    the volume comes to it: a ReadWriteMany volume first mounted on a node after another
    node expanded it (the claim already at the PV's size) is not expanded there, the next
    resize is; once it leaves the node (its last pod torn down) and comes back, the node
    starts again from the claim."""
    objects = ClusterObjects()
    claim = shared_claim(objects, modes=["ReadWriteMany"])
    driver = FakeDriver(caps=frozenset({"EXPAND_VOLUME"}))
    node = node_plugin(tmp_path, NODE, driver, objects)
    resize(objects, claim, "2Gi")
    claim["status"]["capacity"] = {"storage": "2Gi"}  # another node finished
    del claim["status"]["allocatedResourceStatuses"]
    path = await node.set_up(CLAIM, ctx(tmp_path, a_pod("u1", CLAIM)))
    await node.set_up(CLAIM, ctx(tmp_path, a_pod("u1", CLAIM)))
    assert driver.names() == ["publish"]

    resize(objects, claim, "3Gi")  # the next resize reaches this node's mount
    await node.set_up(CLAIM, ctx(tmp_path, a_pod("u1", CLAIM)))
    assert driver.calls[-1] == ("expand", ("vol-1", str(path), 3 << 30))

    # The volume leaves the node; another node grows it to 4Gi; mounted here again, it
    # comes at its new size (upstream starts from the claim): nothing to expand, where
    # the 3Gi this node had expanded it to would have asked for a call.
    assert isinstance(path, Path)
    await node.tear_down(path.parent)
    resize(objects, claim, "4Gi")
    claim["status"]["capacity"] = {"storage": "4Gi"}
    del claim["status"]["allocatedResourceStatuses"]
    driver.calls.clear()
    await node.set_up(CLAIM, ctx(tmp_path, a_pod("u2", CLAIM)))
    assert driver.names() == ["publish"]


async def test_resize_failures_are_events_and_failed_precondition_stops_the_node(
    tmp_path: Path,
) -> None:
    """A driver's refusal is a VolumeResizeFailed Warning on the pod (upstream's online
    expansion error) besides the claim's NodeResizeError; FailedPrecondition (the driver
    cannot expand the volume in use) is written to the claim but is no Event, and this
    node does not call again until the volume leaves it."""
    objects = ClusterObjects()
    claim = shared_claim(objects, modes=["ReadWriteOnce"])
    driver = FakeDriver(caps=frozenset({"EXPAND_VOLUME"}))
    node = node_plugin(tmp_path, NODE, driver, objects)
    pod = a_pod("u1", CLAIM)
    path = await node.set_up(CLAIM, ctx(tmp_path, pod))
    resize(objects, claim, "2Gi")
    events = objects.recorded.events

    driver.expand_fail = CSIError("NodeExpandVolume: INTERNAL: disk busy", code="INTERNAL")
    await node.set_up(CLAIM, ctx(tmp_path, pod))
    assert events == [
        (
            "Pod",
            "pod-u1",
            "Warning",
            "VolumeResizeFailed",
            'NodeExpandVolume.NodeExpandVolume failed for volume "pv1" : '
            "NodeExpandVolume: INTERNAL: disk busy",
        )
    ]
    [condition] = claim["status"]["conditions"]
    assert condition["type"] == "NodeResizeError"

    events.clear()
    driver.expand_fail = CSIError(
        "NodeExpandVolume: FAILED_PRECONDITION: in use", code="FAILED_PRECONDITION"
    )
    await node.set_up(CLAIM, ctx(tmp_path, pod))
    assert driver.calls[-1] == ("expand", ("vol-1", str(path), 2 << 30))
    assert events == []
    calls = len(driver.calls)
    driver.expand_fail = None
    await node.set_up(CLAIM, ctx(tmp_path, pod))
    assert len(driver.calls) == calls  # not again on this node

    assert isinstance(path, Path)
    await node.tear_down(path.parent)
    driver.calls.clear()
    path = await node.set_up(CLAIM, ctx(tmp_path, a_pod("u2", CLAIM)))
    assert driver.calls[-1] == ("expand", ("vol-1", str(path), 2 << 30))  # mounted anew
    assert claim["status"]["capacity"] == {"storage": "2Gi"}


async def test_a_read_only_claim_of_a_grown_volume_is_refused_with_an_event(
    tmp_path: Path,
) -> None:
    """Upstream's read-only check: a pod's read-only claim is never expanded; while the PV
    is above the claim, FileSystemResizeFailed (requested read-only file system) goes to
    the pod and to the claim once per pod and PV size (until the pod is forgotten)."""
    objects = ClusterObjects()
    claim = shared_claim(objects, modes=["ReadWriteOnce"])
    driver = FakeDriver(caps=frozenset({"EXPAND_VOLUME"}))
    node = node_plugin(tmp_path, NODE, driver, objects)
    read_only = {"name": "data", "persistentVolumeClaim": {"claimName": "data", "readOnly": True}}
    pod = a_pod("u1", read_only)
    await node.set_up(read_only, ctx(tmp_path, pod))
    resize(objects, claim, "2Gi")
    await node.set_up(read_only, ctx(tmp_path, pod))
    await node.set_up(read_only, ctx(tmp_path, pod))
    refused = 'MountVolume.NodeExpandVolume failed for volume "pv1" requested read-only file system'
    assert objects.recorded.events == [
        ("Pod", "pod-u1", "Warning", "FileSystemResizeFailed", refused),
        ("PersistentVolumeClaim", "data", "Warning", "FileSystemResizeFailed", refused),
    ]
    assert driver.names() == ["publish"] and objects.patches == []
    node.forget_pod("u1")  # its volumes torn down: a pod of that UID again is told again
    await node.set_up(read_only, ctx(tmp_path, pod))
    assert len(objects.recorded.events) == 4


# -- helpers ------------------------------------------------------------------------------


def test_access_modes() -> None:
    assert csi_access_mode([], frozenset()) == "SINGLE_NODE_WRITER"
    assert csi_access_mode(["ReadOnlyMany", "ReadWriteOnce"], frozenset()) == (
        "MULTI_NODE_READER_ONLY"
    )
    assert csi_access_mode(["ReadWriteMany"], frozenset()) == "MULTI_NODE_MULTI_WRITER"
    multi = frozenset({"SINGLE_NODE_MULTI_WRITER"})
    assert csi_access_mode(["ReadWriteOnce"], multi) == "SINGLE_NODE_MULTI_WRITER"
    assert csi_access_mode(["ReadWriteOncePod"], multi) == "SINGLE_NODE_SINGLE_WRITER"
    with pytest.raises(VolumeError, match="unknown access mode"):
        csi_access_mode(["Sometimes"], frozenset())


def test_fs_group_policy() -> None:
    rwo = ["ReadWriteOnce"]
    assert applies_fs_group("File", fs_type="", access_modes=["ReadWriteMany"])
    assert not applies_fs_group("None", fs_type="ext4", access_modes=rwo)
    assert applies_fs_group("ReadWriteOnceWithFSType", fs_type="ext4", access_modes=rwo)
    assert not applies_fs_group("ReadWriteOnceWithFSType", fs_type="", access_modes=rwo)
    assert not applies_fs_group(
        "ReadWriteOnceWithFSType", fs_type="ext4", access_modes=["ReadWriteMany"]
    )
    assert applies_fs_group("ReadWriteOnceWithFSType", fs_type="ext4", access_modes=None)


def test_set_ownership(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir(mode=0o700)
    (tmp_path / "d" / "f").write_text("x")
    os.chmod(tmp_path / "d" / "f", 0o600)
    (tmp_path / "link").symlink_to("d")
    set_ownership(tmp_path, 4321, read_only=False, on_root_mismatch=False)
    for p in (tmp_path, tmp_path / "d", tmp_path / "d" / "f"):
        assert p.stat().st_gid == 4321
    assert os.lstat(tmp_path / "link").st_gid == 4321
    assert (tmp_path / "d").stat().st_mode & 0o7777 == 0o2770
    assert (tmp_path / "d" / "f").stat().st_mode & 0o777 == 0o660
    os.chmod(tmp_path / "d" / "f", 0o600)
    set_ownership(tmp_path, 4321, read_only=False, on_root_mismatch=True)
    assert (tmp_path / "d" / "f").stat().st_mode & 0o777 == 0o600  # the root matched


def test_names() -> None:
    digest = hashlib.sha256(f"vol-1{DRIVER}{NODE}".encode()).hexdigest()
    assert attachment_name("vol-1", DRIVER, NODE) == f"csi-{digest}"
    assert inline_handle("u1", "v") == "csi-" + hashlib.sha256(b"u1v").hexdigest()


async def test_a_read_write_once_pod_volume_held_by_another_pod_is_refused(
    tmp_path: Path,
) -> None:
    """A PV whose one access mode is ReadWriteOncePod: a second pod on the node gets
    upstream's refusal (nothing published for it) until the first pod's volume is torn
    down (for a Block-mode PV too); the holder's own later syncs go on, and a PV that
    also lists ReadWriteOnce is shared as before."""
    driver, objects = FakeDriver(), Objects()
    objects.bind("data", "pv1")
    objects.pvs["pv1"]["spec"]["accessModes"] = ["ReadWriteOncePod"]
    p = plugin(tmp_path, driver, objects)
    one, two = a_pod("u1", CLAIM), a_pod("u2", CLAIM)
    path1 = await p.set_up(CLAIM, ctx(tmp_path, one))
    with pytest.raises(VolumeError) as err:
        await p.set_up(CLAIM, ctx(tmp_path, two))
    assert str(err.value) == RWOP_IN_USE
    assert not (tmp_path / "pods/u2/volumes").exists()
    await p.set_up(CLAIM, ctx(tmp_path, one))
    assert driver.names() == ["stage", "publish"]
    await p.tear_down(path1.parent)
    path2 = await p.set_up(CLAIM, ctx(tmp_path, two))
    assert path2 == tmp_path / "pods/u2/volumes/kubernetes.io~csi/pv1/mount"

    # Block mode: the same refusal while u2 holds it (its record is in the same place).
    objects.pvs["pv1"]["spec"]["volumeMode"] = "Block"
    with pytest.raises(VolumeError, match=RWOP_IN_USE):
        await p.set_up(CLAIM, ctx(tmp_path, one))
    assert not (tmp_path / "pods/u1/volumeDevices").exists()

    assert not rwop_held_elsewhere(["ReadWriteOncePod", "ReadWriteOnce"], ["u1"], "u2")
    assert not rwop_held_elsewhere(["ReadWriteOnce"], ["u1"], "u2")
    assert not rwop_held_elsewhere(["ReadWriteOncePod"], ["u2"], "u2")
    assert rwop_held_elsewhere(["ReadWriteOncePod"], ["u2", "u1"], "u2")
