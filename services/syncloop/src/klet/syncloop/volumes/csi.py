"""CSI volumes, and the other volumes a PersistentVolumeClaim can bring, for a pod.

Three pod volume types end here: `persistentVolumeClaim` and `ephemeral` (a claim,
resolved to its bound PV by `claims`) and `csi` (an inline ephemeral volume of a CSI
driver). A claim's PV is a CSI volume, a `local` PV, a `hostPath` PV or an `nfs` PV
(mounted by the NFS plugin, `nfs`, with the PV's mount options and the claim
reference's readOnly); any other PV type fails the pod's volume with its name.

A CSI volume goes through the driver registered on this node (the bus `csidrivers`
table, which syncloop's plugin watcher fills), as upstream's CSI volume plugin drives it:

- **ReadWriteOncePod**: a PV whose one access mode is ReadWriteOncePod (Filesystem or
  Block) is refused to a pod while another pod's directory on the node holds it
  (upstream's MountVolume and MapVolume check and text; the scheduler enforces it too,
  but a pod given its nodeName bypasses that);
- **attach**: when the driver's CSIDriver object says `attachRequired` (or there is no
  CSIDriver object), the pod's `vol_data.json` is written first (which puts the volume
  in the Node's `status.volumesInUse`), and nothing is mounted until the Node's status
  lists it in `volumesInUse` and in `volumesAttached` and its VolumeAttachment
  (`csi-<sha256(handle+driver+node)>`, made by the attach-detach controller) is
  attached; the attachment's `attachmentMetadata` is the publish context;
- **stage** (`NodeStageVolume`, only for a driver with STAGE_UNSTAGE_VOLUME) once per
  volume on the node, at `<root-dir>/plugins/kubernetes.io/csi/<driver>/<sha256(handle)>/
  globalmount`, with the PV's `nodeStageSecretRef`;
- **publish** (`NodePublishVolume`) per pod at `<pod dir>/volumes/kubernetes.io~csi/
  <PV or volume name>/mount`, with the PV's volume attributes, mount options, access
  mode (the first of the PV's), read-only flag, `nodePublishSecretRef`, the pod's
  identity (`podInfoOnMount`) and service-account tokens (`tokenRequests`);
- **fsGroup**: given to a driver with VOLUME_MOUNT_GROUP; else applied to the published
  files once per publish (not at every sync) as the CSIDriver's `fsGroupPolicy` says
  (`File`; `ReadWriteOnceWithFSType`, the default, when the PV has an fsType and is
  ReadWriteOnce; `None`), skipped with `fsGroupChangePolicy: OnRootMismatch` when the
  root already has it;
- **expand** (`NodeExpandVolume`, for a driver with EXPAND_VOLUME) when the PV grew past
  the size this node last expanded the volume to (kept per volume while it is on the
  node, first the claim's capacity) and the claim waits for the node, to the claim's
  allocated size, with the claim's resize status and conditions written as upstream's
  kubelet writes them (`expansion`: NodeResizeInProgress, then the new capacity, or
  NodeResizeError / NodeResizeInfeasible on a driver's refusal); a ReadWriteMany volume
  whose claim another node already updated is expanded on this node's mount too, the
  claim left as it is; the resize Events on the pod and the claim;
- **unpublish** when the pod's volumes are torn down, and **unstage** when no pod on the
  node uses the volume any more.

A claim whose CSI PV has `volumeMode: Block` goes the same way with a block capability
and upstream's csi_block.go paths (`csiblock`): staged at `volumeDevices/staging/<pv>`,
published to a file per pod that the pod's `volumeDevices` link points at, which is the
device the runtime gets; its pod record is the same `vol_data.json` (`volumeMode: Block`).
A read-only one (the pod's claim, or the PV as for filesystem volumes here) is published
read-only and handed to containers with cgroup device permission "r" instead of "mrw"
(upstream's makeBlockVolumes; a read-only claim of a `local` Block PV gets "r" too).

Everything a tear-down needs is on disk, as upstream keeps it: `vol_data.json` beside
each pod's `mount` (upstream's keys, and klet's `kletPod*`/`kletClaimName` naming the
pod, its volume and claim for the volume stats) and beside each `globalmount`, so a
syncloop restarted (or a new leader) tears down what its predecessor set up, and a
staging left behind by a crash is found and unstaged (`sweep`). What is unstaged and
removed is never a path read from a file: a tear-down takes from `vol_data.json` only
whether the volume was staged, and makes the staging path again from the driver (a
valid driver name, `csidrivers.driver_name_problem`) and the handle; the sweep skips a
staging whose data names another driver or handle than its directory. Set-up runs at every
sync of the pod; a volume published by this process is not published again (unless the
driver asks for `requiresRepublish`), and one published by a predecessor is published
again, which CSI requires drivers to accept (the call is idempotent), as upstream's
reconstruction does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import os
import stat
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from klet.bus import BusError
from klet.bus.eventqueue import pod_reference
from klet.csi import Capability, CSIError, DriverUnavailable, Volume
from klet.hostfs import on_host
from klet.model.records import CSIDriverRecord
from klet.model.types import JSON
from klet.syncloop.environment.kubeobjects import ObjectUnavailable, secret_data
from klet.syncloop.plugins.csidrivers import driver_name_problem
from klet.syncloop.volumes import (
    claims,
    csiblock,
    expansion,
    fs,
    hostpath,
    localdevice,
    localrecords,
    nfs,
    ownership,
)
from klet.syncloop.volumes.base import (
    Block,
    TokenIssuer,
    VolumeContext,
    VolumeError,
    volume_path,
)
from klet.syncloop.volumes.emptydir import fs_group

log = logging.getLogger(__name__)

DIR_NAME = "kubernetes.io~csi"
DATA_FILE = "vol_data.json"
MOUNT_DIR = "mount"
GLOBAL_MOUNT = "globalmount"
GLOBAL_DIR = Path("plugins") / "kubernetes.io" / "csi"
"""Below the root dir: `<driver>/<sha256(volume handle)>/globalmount`, as upstream."""

STAGE_UNSTAGE = "STAGE_UNSTAGE_VOLUME"
GET_VOLUME_STATS = "GET_VOLUME_STATS"
EXPAND_VOLUME = "EXPAND_VOLUME"
VOLUME_MOUNT_GROUP = "VOLUME_MOUNT_GROUP"
SINGLE_NODE_MULTI_WRITER = "SINGLE_NODE_MULTI_WRITER"

EPHEMERAL_KEY = "csi.storage.k8s.io/ephemeral"
TOKENS_KEY = "csi.storage.k8s.io/serviceAccount.tokens"
DEFAULT_TOKEN_EXPIRATION_S = 3600


class DriverDirectory(Protocol):
    """The drivers registered on this node (the bus `csidrivers` table)."""

    async def get(self, key: str) -> CSIDriverRecord | None: ...


class NodeDriver(Protocol):
    """The node service of one CSI driver (`klet.csi.CSIClient`)."""

    async def node_capabilities(self) -> frozenset[str]: ...

    async def stage(self, volume: Volume, *, staging_path: str) -> None: ...

    async def unstage(self, volume_id: str, *, staging_path: str) -> None: ...

    async def publish(
        self, volume: Volume, *, target_path: str, staging_path: str = "", read_only: bool = False
    ) -> None: ...

    async def unpublish(self, volume_id: str, *, target_path: str) -> None: ...

    async def close(self) -> None: ...

    async def expand(
        self, volume: Volume, *, volume_path: str, staging_path: str = "", required_bytes: int
    ) -> int: ...


class ObjectEvents(Protocol):
    """Records an Event about any object (`klet.bus.eventqueue.EventQueue`): the resize
    Events go to the pod and to its claim, as upstream's."""

    def emit(self, involved: JSON, type_: str, reason: str, message: str) -> None: ...


class CSIObjects(claims.ClaimObjects, Protocol):
    """What the plugin reads from the apiserver (`ApiObjects`)."""

    async def get_csi_driver(self, name: str) -> JSON | None: ...

    async def get_volume_attachment(self, name: str) -> JSON | None: ...

    async def get_node(self, name: str) -> JSON | None: ...

    async def get_secret(self, namespace: str, name: str) -> JSON | None: ...

    async def patch_pvc_status(self, namespace: str, name: str, patch: JSON) -> JSON | None:
        """The claim as the apiserver holds it after the patch (None: not said)."""
        ...


class PooledDriver(Protocol):
    async def node_capabilities(self) -> frozenset[str]: ...

    async def close(self) -> None: ...


C = TypeVar("C", bound=PooledDriver)


class ClientPool(Generic[C]):
    """One client per registered driver, and its node capabilities asked once, both
    made again when the driver registers anew: a restarted driver gets a fresh channel
    rather than one deep in its reconnect back-off from the outage. `connect` makes a
    client of (endpoint, driver name)."""

    def __init__(self, connect: Callable[[str, str], C]) -> None:
        self.connect = connect
        self._clients: dict[str, tuple[float, C]] = {}
        self._capabilities: dict[tuple[str, float], frozenset[str]] = {}

    async def get(self, record: CSIDriverRecord) -> C:
        held = self._clients.get(record.endpoint)
        if held is not None and held[0] == record.registered_at:
            return held[1]
        if held is not None:
            await held[1].close()
            self._capabilities.pop((record.endpoint, held[0]), None)
        client = self.connect(record.endpoint, record.name)
        self._clients[record.endpoint] = (record.registered_at, client)
        return client

    async def capabilities(self, record: CSIDriverRecord) -> frozenset[str]:
        """The driver's node capabilities (NodeGetCapabilities); raises `CSIError`."""
        key = (record.endpoint, record.registered_at)
        caps = self._capabilities.get(key)
        if caps is None:
            caps = await (await self.get(record)).node_capabilities()
            self._capabilities[key] = caps
        return caps


def unique_name(driver: str, handle: str) -> str:
    """Upstream's unique name of a CSI volume (what `volumesInUse` and the Node's
    `volumesAttached` list)."""
    return f"kubernetes.io/csi/{driver}^{handle}"


CSI_PLUGIN = "kubernetes.io/csi"


def pv_plugin_name(spec: JSON) -> str:
    """Upstream's plugin name of a PV's volume."""
    if isinstance(spec.get("csi"), dict):
        return f"{CSI_PLUGIN}:{spec['csi'].get('driver') or ''}"
    if isinstance(spec.get("local"), dict):
        return "kubernetes.io/local-volume"
    if isinstance(spec.get("hostPath"), dict):
        return "kubernetes.io/host-path"
    if isinstance(spec.get("nfs"), dict):
        return nfs.PLUGIN_NAME
    return ""


def attachment_name(volume_handle: str, driver: str, node: str) -> str:
    """The VolumeAttachment the attach-detach controller makes for this volume and node."""
    return "csi-" + hashlib.sha256(f"{volume_handle}{driver}{node}".encode()).hexdigest()


def inline_handle(pod_uid: str, volume_name: str) -> str:
    """The volume handle of an inline (ephemeral) CSI volume, as upstream makes it."""
    return "csi-" + hashlib.sha256(f"{pod_uid}{volume_name}".encode()).hexdigest()


async def _remove_unmounted(path: Path) -> None:
    """Remove a publish or staging directory (`mount` or `globalmount` and klet's
    `vol_data.json`) after the driver's unpublish or unstage: by rmdir and unlink when
    that is all it holds, without reading the mount table (issue 42: one read each),
    else the careful way (a mount the driver left is unmounted first). Raises OSError
    naming what stays."""
    if await asyncio.to_thread(fs.remove_emptied, path, files=(DATA_FILE,)):
        return
    problems = await fs.remove_tree(path)
    if problems:
        raise OSError(f"{path} not removed: {'; '.join(problems)}")


def staging_path(root_dir: Path, driver: str, volume_handle: str) -> Path:
    """Where the volume is staged on this node. The driver name becomes a directory, so
    it must be a valid one (`VolumeError` naming it otherwise): the apiserver checks
    the name of a PV's or a pod's CSI driver, but this path is also made from what a
    `vol_data.json` on disk says."""
    why = driver_name_problem(driver)
    if why is not None:
        raise VolumeError(f"CSI driver {driver!r} is not usable in a path: {why}")
    digest = hashlib.sha256(volume_handle.encode()).hexdigest()
    return root_dir / GLOBAL_DIR / driver / digest / GLOBAL_MOUNT


_ACCESS_MODES = {
    "ReadWriteOnce": "SINGLE_NODE_WRITER",
    "ReadOnlyMany": "MULTI_NODE_READER_ONLY",
    "ReadWriteMany": "MULTI_NODE_MULTI_WRITER",
    "ReadWriteOncePod": "SINGLE_NODE_WRITER",
}


def csi_access_mode(access_modes: list[Any], capabilities: frozenset[str]) -> str:
    """The CSI access mode of the PV's first access mode (ReadWriteOnce without any)."""
    first = str(access_modes[0]) if access_modes else "ReadWriteOnce"
    if first not in _ACCESS_MODES:
        raise VolumeError(f"unknown access mode {first!r}")
    if SINGLE_NODE_MULTI_WRITER in capabilities and first == "ReadWriteOnce":
        return "SINGLE_NODE_MULTI_WRITER"
    if SINGLE_NODE_MULTI_WRITER in capabilities and first == "ReadWriteOncePod":
        return "SINGLE_NODE_SINGLE_WRITER"
    return _ACCESS_MODES[first]


# Upstream's refusal, word for word (operation_generator.go): the ReadWriteOncePod specs
# wait for a FailedMount event with this text.
RWOP_IN_USE = "volume uses the ReadWriteOncePod access mode and is already in use by another pod"


def rwop_held_elsewhere(access_modes: list[Any], holders: Iterable[str], pod_uid: str) -> bool:
    """Whether a pod must not use a volume another pod on the node holds: as upstream's
    MountVolume, only when ReadWriteOncePod is the PV's one access mode (with several,
    which one the pod means is not known) and a pod other than this one has it."""
    if list(access_modes) != ["ReadWriteOncePod"]:
        return False
    return any(uid != pod_uid for uid in holders)


def applies_fs_group(policy: str, *, fs_type: str, access_modes: list[Any] | None) -> bool:
    """Whether the kubelet changes the volume's group to the pod's fsGroup.

    `access_modes` is None for an inline volume (no PV)."""
    if policy == "File":
        return True
    if policy == "None":
        return False
    # ReadWriteOnceWithFSType
    if not fs_type:
        return False
    if access_modes is None:
        return True
    return "ReadWriteOnce" in access_modes or "ReadWriteOncePod" in access_modes


def set_ownership(path: Path, gid: int, *, read_only: bool, on_root_mismatch: bool) -> None:
    """Give every file below `path` the group `gid` with group access, and each directory
    the setgid bit, as upstream's volume ownership change does
    (`ownership.set_volume_ownership`: through descriptors, never following a link)."""
    if on_root_mismatch:
        st = os.stat(path)
        want = 0o2070 if not read_only else 0o2050
        if st.st_gid == gid and st.st_mode & want == want:
            return
    ownership.set_volume_ownership(path, gid, read_only=read_only)


def _write_json(path: Path, data: JSON) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, sort_keys=True))
    os.replace(tmp, path)


def _read_json(path: Path) -> JSON | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class CSIVolumePlugin:
    """`VolumePlugin` for CSI volumes and the PVs of claims."""

    dir_name = DIR_NAME

    def __init__(
        self,
        *,
        root_dir: Path,
        node_name: str,
        drivers: DriverDirectory,
        connect: Callable[[str, str], NodeDriver],
        objects: CSIObjects | None,
        tokens: TokenIssuer | None = None,
        clock: Callable[[], float] = time.time,
        nfs_volumes: nfs.NfsPlugin | None = None,
        events: ObjectEvents | None = None,
    ) -> None:
        self.root_dir = root_dir
        self.events = events
        # NFS PVs are mounted by the one NFS plugin that also serves inline nfs volumes
        # (and tears both down: they share its directory).
        self.nfs = nfs_volumes if nfs_volumes is not None else nfs.NfsPlugin()
        self.node_name = node_name
        self.drivers = drivers
        self.objects = objects
        self.tokens = tokens
        self.clock = clock
        self._clients: ClientPool[NodeDriver] = ClientPool(connect)
        self._published: set[Path] = set()
        self._local_devices = localdevice.LocalDeviceMounts(root_dir)
        # (pod UID, volume name) -> upstream's plugin name of what the volume resolved to
        self._names: dict[tuple[str, str], str] = {}
        self._staged: set[Path] = set()
        # Stage, publish, unpublish and unstage of one volume never overlap.
        self._locks: dict[str, asyncio.Lock] = {}
        # Staging data files naming another driver or handle than their directory's
        # (left alone by the sweep, logged once each).
        self._mismatched: set[Path] = set()
        # PVs whose NodeExpandVolume failed with a final error here (upstream's
        # volumesWithFinalExpansionErrors), forgotten once one succeeds.
        self._expansion_failed: set[str] = set()
        # Per volume on this node (its unique name), upstream's actual state of world:
        # the size this node last expanded it to (first the claim's capacity when it came
        # to the node), and whether the driver refused to expand it in use; both
        # forgotten when no pod on the node holds it any more.
        self._node_sizes: dict[str, int] = {}
        self._in_use_errors: set[str] = set()
        # (pod UID, unique name, PV capacity) whose read-only refusal was recorded.
        self._read_only_warned: set[tuple[str, str, str]] = set()

    def handles(self, volume: JSON) -> bool:
        return any(
            isinstance(volume.get(k), dict) for k in ("csi", "persistentVolumeClaim", "ephemeral")
        )

    def plugin_name(self, pod_uid: str, volume: JSON) -> str | None:
        """Upstream's plugin name of the volume (volume_manager_total_volumes)."""
        source = volume.get("csi")
        if isinstance(source, dict):
            return f"{CSI_PLUGIN}:{source.get('driver') or ''}"
        return self._names.get((pod_uid, str(volume.get("name") or "")))

    def forget_pod(self, pod_uid: str) -> None:
        """The pod's volumes are torn down: its names, read-only refusals recorded and
        `local` PV records go."""
        self._names = {k: v for k, v in self._names.items() if k[0] != pod_uid}
        self._read_only_warned = {s for s in self._read_only_warned if s[0] != pod_uid}
        if pod_uid and "/" not in pod_uid and pod_uid not in (".", ".."):
            localrecords.forget(self.root_dir / "pods" / pod_uid)

    # -- set-up ---------------------------------------------------------------------

    async def set_up(self, volume: JSON, ctx: VolumeContext) -> Path | Block:
        if self.objects is None:
            kind = next(k for k in _POD_VOLUME_TYPES if k in volume)
            raise VolumeError(
                f"{kind} volumes need the apiserver (claims, PVs and CSIDriver objects): "
                "this node runs standalone"
            )
        if isinstance(volume.get("csi"), dict):
            return await self._set_up_inline(volume, ctx)
        claimed = await claims.resolve(volume, ctx.pod, self.objects)
        spec = claimed.pv.get("spec") or {}
        key = (str(ctx.pod["metadata"]["uid"]), str(volume.get("name") or ""))
        self._names[key] = pv_plugin_name(spec)
        if claimed.block:
            if isinstance(spec.get("local"), dict):
                return await self._local_device(claimed, str(spec["local"].get("path") or ""))
            if isinstance(spec.get("csi"), dict):
                return await self._set_up_block(claimed, ctx, str(volume.get("name") or ""))
            kind = "nfs" if isinstance(spec.get("nfs"), dict) else "hostPath"
            raise VolumeError(
                f"PV {claimed.pv_name}: raw block (volumeMode Block) volumes are supported for "
                f"CSI and local PVs only (not for {kind} PVs)"
            )
        if isinstance(spec.get("csi"), dict):
            return await self._set_up_pv(claimed, ctx, str(volume.get("name") or ""))
        if isinstance(spec.get("local"), dict):
            return await self._local(claimed, ctx, spec, str(volume.get("name") or ""))
        if isinstance(spec.get("hostPath"), dict):
            source = spec["hostPath"]
            return await self._local_path(
                claimed, str(source.get("path") or ""), str(source.get("type") or "")
            )
        if isinstance(spec.get("nfs"), dict):
            wanted = nfs.pv_mount(claimed.pv, read_only=claimed.read_only)
            return await self.nfs.mount_at(wanted, self.nfs.pv_dir(ctx.pod_dir, claimed.pv_name))
        kind = next((k for k, v in spec.items() if isinstance(v, dict) and k not in _PV_FIELDS), "")
        raise VolumeError(
            f'PV {claimed.pv_name}: volume type "{kind or "none"}" is not supported by klet '
            "(CSI, local, hostPath and nfs PVs are)"
        )

    async def _local_device(self, claimed: claims.Claimed, path: str) -> Block:
        """A Block-mode `local` PV: the node's block device, handed to containers as is."""
        if not path:
            raise VolumeError(f"PV {claimed.pv_name} names no path")
        try:
            await asyncio.to_thread(hostpath.check_type, path, path_type="BlockDevice")
        except VolumeError as err:
            raise VolumeError(f"PV {claimed.pv_name}: {err}") from err
        return Block(Path(path), read_only=claimed.read_only)

    async def _local(
        self, claimed: claims.Claimed, ctx: VolumeContext, spec: JSON, volume_name: str
    ) -> Path:
        """A Filesystem-mode `local` PV: a directory of the node as it is, or a block
        device mounted for the node and bound into the pod (`localdevice`); either way
        recorded for the volume stats (`localrecords`: statfs of the directory, or of
        the device's node mount)."""
        path = str(spec["local"].get("path") or "")
        device: bool = await asyncio.to_thread(_is_block_device, path) if path else False
        if device:
            target = await self._local_devices.set_up(
                claimed.pv_name,
                path,
                fs_type=str(spec["local"].get("fsType") or ""),
                options=tuple(str(o) for o in spec.get("mountOptions") or []),
                pod_volume=volume_path(
                    ctx.pod_dir, dir_name=localdevice.DIR_NAME, name=claimed.pv_name
                ),
            )
            measured, host = self._local_devices.global_path(claimed.pv_name), False
        else:
            target = await self._local_path(claimed, path, "")
            measured, host = target, True
        record = {
            "path": str(measured),
            "host": host,
            "pv": claimed.pv_name,
            **_pod_keys(ctx.pod, volume_name, str(claimed.claim["metadata"].get("name") or "")),
        }
        await asyncio.to_thread(localrecords.write, ctx.pod_dir, volume_name, record)
        return target

    def more_dirs(self) -> Mapping[str, Callable[[Path], Awaitable[None]]]:
        """Block-device `local` PVs live under `kubernetes.io~local-volume`."""
        return {localdevice.DIR_NAME: self._local_devices.tear_down}

    async def _local_path(self, claimed: claims.Claimed, path: str, path_type: str) -> Path:
        """A `local` or `hostPath` PV: the node's own path, mounted as it is."""
        if not path:
            raise VolumeError(f"PV {claimed.pv_name} names no path")
        check = path_type
        if "local" in claimed.pv["spec"]:
            check = "Directory"  # a Filesystem-mode local PV is a directory of the node
        try:
            await asyncio.to_thread(hostpath.check_type, path, path_type=check)
        except VolumeError as err:
            raise VolumeError(f"PV {claimed.pv_name}: {err}") from err
        return Path(path)

    async def _set_up_pv(
        self, claimed: claims.Claimed, ctx: VolumeContext, volume_name: str
    ) -> Path:
        assert self.objects is not None
        source: JSON = claimed.pv["spec"]["csi"]
        driver = str(source.get("driver") or "")
        handle = str(source.get("volumeHandle") or "")
        if not driver or not handle:
            raise VolumeError(f"PV {claimed.pv_name}: csi needs a driver and a volumeHandle")
        record, client, caps = await self._driver(driver)
        csidriver = await self._csidriver(driver)
        dspec = (csidriver or {}).get("spec") or {}
        attach_id = ""
        if csidriver is None or dspec.get("attachRequired", True):
            attach_id = attachment_name(handle, driver, self.node_name)
        pod_uid = str(ctx.pod["metadata"]["uid"])
        holders = await asyncio.to_thread(self._holders, driver, handle)
        if rwop_held_elsewhere(claimed.pv["spec"].get("accessModes") or [], holders, pod_uid):
            raise VolumeError(RWOP_IN_USE)
        volume_dir = ctx.volume_dir(self, claimed.pv_name)
        staging_dir = staging_path(self.root_dir, driver, handle)
        data = {
            "specVolID": claimed.pv_name,
            "volumeHandle": handle,
            "driverName": driver,
            "nodeName": self.node_name,
            "attachmentID": attach_id,
            "volumeLifecycleMode": "Persistent",
            "stagingTargetPath": str(staging_dir) if STAGE_UNSTAGE in caps else "",
            **_pod_keys(ctx.pod, volume_name, str(claimed.claim["metadata"]["name"])),
        }
        publish_context: dict[str, str] = {}
        if attach_id:
            # The pod's vol_data.json first: it is what puts the volume in the Node's
            # volumesInUse, which must list it before anything is mounted.
            await asyncio.to_thread(_prepare_volume_dir, volume_dir, data)
            publish_context = await self._attached(attach_id, driver, handle)
        access_modes = list(claimed.pv["spec"].get("accessModes") or [])
        fs_type = str(source.get("fsType") or "")
        gid = fs_group(ctx.pod)
        mount_group = str(gid) if gid is not None and VOLUME_MOUNT_GROUP in caps else ""
        capability = Capability(
            access_mode=csi_access_mode(access_modes, caps),
            fs_type=fs_type,
            mount_flags=tuple(str(o) for o in claimed.pv["spec"].get("mountOptions") or []),
            mount_group=mount_group,
        )
        attributes = {str(k): str(v) for k, v in (source.get("volumeAttributes") or {}).items()}
        read_only = claimed.read_only or bool(source.get("readOnly"))
        async with self._lock(driver, handle):
            staging = str(data["stagingTargetPath"])
            if staging:
                if staging_dir not in self._staged:
                    stage_volume = Volume(
                        volume_id=handle,
                        capability=capability,
                        volume_context=attributes,
                        publish_context=publish_context,
                        secrets=await self._secret(source.get("nodeStageSecretRef"), "NodeStage"),
                    )
                    await self._stage(client, record, stage_volume, staging_dir)
            context = {**attributes, **await self._pod_context(ctx, dspec, ephemeral=False)}
            volume = Volume(
                volume_id=handle,
                capability=capability,
                volume_context=context,
                publish_context=publish_context,
                secrets=await self._secret(source.get("nodePublishSecretRef"), "NodePublish"),
            )
            target, fresh = await self._publish(
                client,
                record,
                volume,
                volume_dir,
                data,
                read_only=read_only,
                republish=bool(dspec.get("requiresRepublish")),
            )
            if fresh and not mount_group:
                await self._ownership(
                    ctx.pod, target, dspec, fs_type, access_modes, read_only=read_only
                )
            self._published.add(target)
            if EXPAND_VOLUME in caps:
                await self._expand(client, record, claimed, volume, target, staging, ctx.pod)
        return target

    async def _set_up_block(
        self, claimed: claims.Claimed, ctx: VolumeContext, volume_name: str
    ) -> Block:
        """A Block-mode CSI PV, as upstream's csi_block.go: NodeStageVolume at
        `volumeDevices/staging/<pv>` (a driver with STAGE_UNSTAGE_VOLUME), then
        NodePublishVolume of a block capability to the file `volumeDevices/publish/<pv>/
        <pod uid>`, linked from the pod's `volumeDevices/kubernetes.io~csi/<pv>`, which
        is the device handed to the runtime (`csiblock`)."""
        source: JSON = claimed.pv["spec"]["csi"]
        driver = str(source.get("driver") or "")
        handle = str(source.get("volumeHandle") or "")
        if not driver or not handle:
            raise VolumeError(f"PV {claimed.pv_name}: csi needs a driver and a volumeHandle")
        # Read-only (the pod's claim or, as for filesystem CSI volumes here, the PV): the
        # driver publishes it read-only and containers get it with cgroup permission "r".
        read_only = claimed.read_only or bool(source.get("readOnly"))
        record, client, caps = await self._driver(driver)
        csidriver = await self._csidriver(driver)
        dspec = (csidriver or {}).get("spec") or {}
        attach_id = ""
        if csidriver is None or dspec.get("attachRequired", True):
            attach_id = attachment_name(handle, driver, self.node_name)
        pv = claimed.pv_name
        uid = str(ctx.pod["metadata"]["uid"])
        holders = await asyncio.to_thread(self._holders, driver, handle)
        if rwop_held_elsewhere(claimed.pv["spec"].get("accessModes") or [], holders, uid):
            raise VolumeError(RWOP_IN_USE)  # upstream's MapVolume check, the same text
        staging_dir = csiblock.staging_path(self.root_dir, pv)
        target = csiblock.publish_path(self.root_dir, pv, uid)
        data = {
            "specVolID": pv,
            "volumeHandle": handle,
            "driverName": driver,
            "nodeName": self.node_name,
            "attachmentID": attach_id,
            "volumeLifecycleMode": "Persistent",
            "volumeMode": csiblock.BLOCK_MODE,
            "stagingTargetPath": str(staging_dir) if STAGE_UNSTAGE in caps else "",
            **_pod_keys(ctx.pod, volume_name, str(claimed.claim["metadata"]["name"])),
        }
        # The pod's record first: it puts the volume in the Node's volumesInUse (which
        # must list it before an attachable volume is used) and is what tear-down reads.
        await asyncio.to_thread(_prepare_volume_dir, ctx.volume_dir(self, pv), data)
        publish_context: dict[str, str] = {}
        if attach_id:
            publish_context = await self._attached(attach_id, driver, handle)
        capability = Capability(
            access_mode=csi_access_mode(list(claimed.pv["spec"].get("accessModes") or []), caps),
            block=True,
        )
        attributes = {str(k): str(v) for k, v in (source.get("volumeAttributes") or {}).items()}
        async with self._lock(driver, handle):
            if data["stagingTargetPath"] and staging_dir not in self._staged:
                stage_volume = Volume(
                    volume_id=handle,
                    capability=capability,
                    volume_context=attributes,
                    publish_context=publish_context,
                    secrets=await self._secret(source.get("nodeStageSecretRef"), "NodeStage"),
                )
                await asyncio.to_thread(
                    _prepare_block_staging,
                    self.root_dir,
                    pv,
                    {"driverName": driver, "volumeHandle": handle, "specVolID": pv},
                )
                try:
                    await client.stage(stage_volume, staging_path=str(staging_dir))
                except CSIError as err:
                    raise VolumeError(
                        f"MapVolume.SetUpDevice failed: rpc error: driver {driver}: {err}"
                    ) from err
                self._staged.add(staging_dir)
            if target not in self._published or dspec.get("requiresRepublish"):
                context = {**attributes, **await self._pod_context(ctx, dspec, ephemeral=False)}
                volume = Volume(
                    volume_id=handle,
                    capability=capability,
                    volume_context=context,
                    publish_context=publish_context,
                    secrets=await self._secret(source.get("nodePublishSecretRef"), "NodePublish"),
                )
                await asyncio.to_thread(
                    target.parent.mkdir, mode=csiblock.DIR_MODE, parents=True, exist_ok=True
                )
                try:
                    await client.publish(
                        volume,
                        target_path=str(target),
                        staging_path=str(data["stagingTargetPath"]),
                        read_only=read_only,
                    )
                except CSIError as err:
                    raise VolumeError(
                        f"MapVolume.MapPodDevice failed: rpc error: driver {driver}: {err}"
                    ) from err
                self._published.add(target)
            link = csiblock.pod_map_path(ctx.pod_dir, DIR_NAME, pv)
            await asyncio.to_thread(csiblock.ensure_link, link, target)
            if EXPAND_VOLUME in caps:  # a grown block volume: NodeExpandVolume on the file
                grown = Volume(
                    volume_id=handle,
                    capability=capability,
                    volume_context=attributes,
                    publish_context=publish_context,
                )
                await self._expand(
                    client, record, claimed, grown, target, str(data["stagingTargetPath"]), ctx.pod
                )
        return Block(link, read_only=read_only)

    async def _set_up_inline(self, volume: JSON, ctx: VolumeContext) -> Path:
        source: JSON = volume["csi"]
        name = str(volume.get("name") or "")
        driver = str(source.get("driver") or "")
        if not driver:
            raise VolumeError("csi volume names no driver")
        record, client, caps = await self._driver(driver)
        csidriver = await self._csidriver(driver)
        if csidriver is None:
            raise VolumeError(
                f'CSIDriver "{driver}" not found: an inline CSI volume needs the driver\'s '
                "CSIDriver object to allow the Ephemeral lifecycle mode"
            )
        dspec = csidriver.get("spec") or {}
        modes = list(dspec.get("volumeLifecycleModes") or ["Persistent"])
        if "Ephemeral" not in modes:
            raise VolumeError(
                f'volume mode "Ephemeral" not supported by driver {driver} (only supports {modes})'
            )
        uid = str(ctx.pod["metadata"]["uid"])
        handle = inline_handle(uid, name)
        fs_type = str(source.get("fsType") or "")
        gid = fs_group(ctx.pod)
        mount_group = str(gid) if gid is not None and VOLUME_MOUNT_GROUP in caps else ""
        capability = Capability(
            access_mode="SINGLE_NODE_WRITER", fs_type=fs_type, mount_group=mount_group
        )
        attributes = {str(k): str(v) for k, v in (source.get("volumeAttributes") or {}).items()}
        context = {**attributes, **await self._pod_context(ctx, dspec, ephemeral=True)}
        ref = source.get("nodePublishSecretRef")
        secret_ref = {**ref, "namespace": ctx.pod["metadata"].get("namespace")} if ref else None
        read_only = bool(source.get("readOnly"))
        volume_obj = Volume(
            volume_id=handle,
            capability=capability,
            volume_context=context,
            secrets=await self._secret(secret_ref, "NodePublish"),
        )
        data = {
            "specVolID": name,
            "volumeHandle": handle,
            "driverName": driver,
            "nodeName": self.node_name,
            "attachmentID": "",
            "volumeLifecycleMode": "Ephemeral",
            "stagingTargetPath": "",
            **_pod_keys(ctx.pod, name, ""),
        }
        async with self._lock(driver, handle):
            target, fresh = await self._publish(
                client,
                record,
                volume_obj,
                ctx.volume_dir(self, name),
                data,
                read_only=read_only,
                republish=bool(dspec.get("requiresRepublish")),
            )
            if fresh and not mount_group:
                await self._ownership(ctx.pod, target, dspec, fs_type, None, read_only=read_only)
            self._published.add(target)
        return target

    async def _stage(
        self, client: NodeDriver, record: CSIDriverRecord, volume: Volume, staging_dir: Path
    ) -> None:
        data = {"driverName": record.name, "volumeHandle": volume.volume_id}
        await asyncio.to_thread(_prepare_staging, staging_dir, data)
        try:
            await client.stage(volume, staging_path=str(staging_dir))
        except CSIError as err:
            raise VolumeError(
                f"MountVolume.MountDevice failed: rpc error: driver {record.name}: {err}"
            ) from err
        self._staged.add(staging_dir)

    async def _publish(
        self,
        client: NodeDriver,
        record: CSIDriverRecord,
        volume: Volume,
        volume_dir: Path,
        data: JSON,
        *,
        read_only: bool,
        republish: bool,
    ) -> tuple[Path, bool]:
        """Publish unless this process did already (or the driver wants it again); the
        target, and whether it is new to this process (the caller then applies fsGroup
        and marks it published, so a failed ownership change is tried again)."""
        target = volume_dir / MOUNT_DIR
        known = target in self._published
        if known and not republish:
            return target, False
        await asyncio.to_thread(_prepare_volume_dir, volume_dir, data)
        try:
            await client.publish(
                volume,
                target_path=str(target),
                staging_path=str(data.get("stagingTargetPath") or ""),
                read_only=read_only,
            )
        except CSIError as err:
            raise VolumeError(f"rpc error: driver {record.name}: {err}") from err
        return target, not known

    async def _expand(
        self,
        client: NodeDriver,
        record: CSIDriverRecord,
        claimed: claims.Claimed,
        volume: Volume,
        target: Path,
        staging: str,
        pod: JSON,
    ) -> None:
        """Online expansion as upstream's kubelet does it (`expansion.plan`, from the size
        this node last expanded the volume to): the claim marked NodeResizeInProgress,
        NodeExpandVolume to the allocated size, then the claim's new capacity; a driver's
        refusal written as the NodeResizeError condition (and NodeResizeInfeasible when
        it is one). The call carries the PV's `nodeExpandSecretRef` secret (only that
        one, as upstream's csi_expander). The pod keeps running on the old size whatever
        fails; the next sync decides again."""
        assert self.objects is not None
        pv_name = claimed.pv_name
        key = unique_name(record.name, volume.volume_id)
        node_bytes = self._node_sizes.get(key)
        if node_bytes is None:
            node_bytes = expansion.claim_bytes(claimed.claim)
            if node_bytes is not None:
                self._node_sizes[key] = node_bytes
        if claimed.read_only:
            self._refuse_read_only(claimed, pod, key)
            return
        step = expansion.plan(
            claimed.claim,
            claimed.pv,
            node_bytes=node_bytes,
            read_only=claimed.read_only,
            failed_before=pv_name in self._expansion_failed,
            in_use_error=key in self._in_use_errors,
        )
        if isinstance(step, expansion.Settled):
            self._node_sizes[key] = step.size_bytes
            return
        if step is None:
            return
        meta = claimed.claim["metadata"]
        namespace, name = str(meta["namespace"]), str(meta["name"])
        claim = claimed.claim
        source = (claimed.pv.get("spec") or {}).get("csi") or {}
        try:
            secrets = await self._secret(source.get("nodeExpandSecretRef"), "NodeExpand")
            marked = None
            if step.recovery and not step.claim_updated:
                marked = expansion.in_progress_patch(claim)
            if marked is not None:
                claim = await self.objects.patch_pvc_status(namespace, name, marked) or claim
            try:
                await client.expand(
                    dataclasses.replace(volume, secrets=secrets),
                    volume_path=str(target),
                    staging_path=staging,
                    required_bytes=step.size_bytes,
                )
            except CSIError as err:
                if err.code == expansion.IN_USE_CODE:
                    self._in_use_errors.add(key)  # not again on this node (upstream)
                if isinstance(err, DriverUnavailable) or not step.recovery:
                    raise  # transient, or an older resizer's claim: nothing to mark
                self._expansion_failed.add(pv_name)
                infeasible = expansion.is_infeasible(err.code, step)
                now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.clock()))
                failed = expansion.failed_patch(claim, str(err), infeasible=infeasible, now=now)
                if failed is not None:
                    await self.objects.patch_pvc_status(namespace, name, failed)
                raise
            self._expansion_failed.discard(pv_name)
            message = expansion.success_message(pv_name, self.node_name)
            self._record(pod_reference(pod), "Normal", expansion.RESIZE_SUCCESS, message)
            self._record(
                expansion.claim_reference(claim), "Normal", expansion.RESIZE_SUCCESS, message
            )
            if not step.claim_updated:
                await self.objects.patch_pvc_status(
                    namespace, name, expansion.finished_patch(claim, step.size)
                )
            self._node_sizes[key] = step.size_bytes
        except (CSIError, ObjectUnavailable, VolumeError) as err:
            log.warning(
                "volume not expanded",
                extra={"pv": pv_name, "driver": record.name, "error": str(err)},
            )
            if not (isinstance(err, CSIError) and err.code == expansion.IN_USE_CODE):
                self._record(
                    pod_reference(pod),
                    "Warning",
                    expansion.VOLUME_RESIZE_FAILED,
                    expansion.failure_message(pv_name, str(err)),
                )
            return
        log.info("volume expanded", extra={"pv": pv_name, "capacity": step.size})

    def _refuse_read_only(self, claimed: claims.Claimed, pod: JSON, key: str) -> None:
        """A pod's read-only claim of a grown volume: upstream's FileSystemResizeFailed
        on the pod and the claim, once per pod and PV size."""
        if not expansion.read_only_refused(claimed.claim, claimed.pv):
            return
        pv_size = str(((claimed.pv.get("spec") or {}).get("capacity") or {}).get("storage"))
        seen = (str((pod.get("metadata") or {}).get("uid") or ""), key, pv_size)
        if seen in self._read_only_warned:
            return
        self._read_only_warned.add(seen)
        message = expansion.read_only_message(claimed.pv_name)
        self._record(pod_reference(pod), "Warning", expansion.RESIZE_FAILED, message)
        self._record(
            expansion.claim_reference(claimed.claim), "Warning", expansion.RESIZE_FAILED, message
        )

    def _record(self, involved: JSON, type_: str, reason: str, message: str) -> None:
        if self.events is not None:
            self.events.emit(involved, type_, reason, message)

    def _forget_expansion(self, driver: str, handle: str) -> None:
        """The volume left the node: its next mount starts from the claim again."""
        key = unique_name(driver, handle)
        self._node_sizes.pop(key, None)
        self._in_use_errors.discard(key)
        self._read_only_warned = {s for s in self._read_only_warned if s[1] != key}

    async def _ownership(
        self,
        pod: JSON,
        target: Path,
        dspec: JSON,
        fs_type: str,
        access_modes: list[Any] | None,
        *,
        read_only: bool,
    ) -> None:
        """The pod's fsGroup on the freshly published files, when the CSIDriver's
        fsGroupPolicy asks for it (`access_modes` None: an inline volume)."""
        gid = fs_group(pod)
        policy = str(dspec.get("fsGroupPolicy") or "ReadWriteOnceWithFSType")
        if gid is None or not applies_fs_group(policy, fs_type=fs_type, access_modes=access_modes):
            return
        change = ((pod.get("spec") or {}).get("securityContext") or {}).get("fsGroupChangePolicy")
        if not await asyncio.to_thread(target.exists):
            return  # the driver made nothing there (the runtime makes the directory)
        try:
            await asyncio.to_thread(
                set_ownership,
                target,
                gid,
                read_only=read_only,
                on_root_mismatch=change == "OnRootMismatch",
            )
        except OSError as err:
            raise VolumeError(f"applying fsGroup {gid} to {target}: {err}") from err

    async def _driver(self, name: str) -> tuple[CSIDriverRecord, NodeDriver, frozenset[str]]:
        record = await self._registered(name)
        if record is None:
            raise VolumeError(f"driver name {name} not found in the list of registered CSI drivers")
        try:
            caps = await self._clients.capabilities(record)
        except CSIError as err:
            raise VolumeError(f"driver {name}: {err}") from err
        return record, await self._clients.get(record), caps

    async def _registered(self, name: str) -> CSIDriverRecord | None:
        """The driver's registration; a bus that does not answer fails the volume (to be
        tried again), it never fails the pod worker."""
        try:
            return await self.drivers.get(name)
        except BusError as err:
            raise VolumeError(f"the registered CSI drivers could not be read: {err}") from err

    async def _csidriver(self, name: str) -> JSON | None:
        assert self.objects is not None
        try:
            return await self.objects.get_csi_driver(name)
        except ObjectUnavailable as err:
            raise VolumeError(f"failed to read CSIDriver {name}: {err}") from err

    async def _attached(self, name: str, driver: str, handle: str) -> dict[str, str]:
        """The attachment's metadata once the volume is attached to this node: first
        listed in the Node's `status.volumesInUse` (as upstream's kubelet, which mounts an
        attachable volume only once its node status reports it in use, so the
        attach-detach controller cannot detach it under the mount), then in the Node's
        `status.volumesAttached` (the controller's word that it is attached; the Node
        authorizer lets a node read a VolumeAttachment only once it exists for the node),
        then attached in its VolumeAttachment."""
        assert self.objects is not None
        unique = unique_name(driver, handle)
        try:
            node = await self.objects.get_node(self.node_name)
        except ObjectUnavailable as err:
            raise VolumeError(f"failed to read Node {self.node_name}: {err}") from err
        node_status = (node or {}).get("status") or {}
        if unique not in (node_status.get("volumesInUse") or []):
            raise VolumeError(
                f"volume {handle} of driver {driver} has not been added to the list of "
                f"VolumesInUse in the node's volume status yet ({unique}; the attach-detach "
                "controller may detach a volume the Node does not list, so nothing is "
                "mounted before it does)"
            )
        listed = node_status.get("volumesAttached") or []
        if not any(v.get("name") == unique for v in listed):
            raise VolumeError(
                f"volume {handle} of driver {driver} is not attached to this node yet: "
                f"{unique} is not in the Node's status.volumesAttached (the driver's CSIDriver "
                "requires attach; the attach-detach controller lists it once attached)"
            )
        try:
            attachment = await self.objects.get_volume_attachment(name)
        except ObjectUnavailable as err:
            raise VolumeError(f"failed to read VolumeAttachment {name}: {err}") from err
        status = (attachment or {}).get("status") or {}
        if attachment is None or not status.get("attached"):
            why = "does not exist yet" if attachment is None else "is not attached yet"
            error = ((status.get("attachError") or {}).get("message")) or ""
            raise VolumeError(
                f"volume {handle} of driver {driver} is not attached to this node: "
                f"VolumeAttachment {name} {why}{': ' + error if error else ''} "
                "(the driver's CSIDriver requires attach)"
            )
        return {str(k): str(v) for k, v in (status.get("attachmentMetadata") or {}).items()}

    async def _secret(self, ref: Any, what: str) -> dict[str, str]:
        if not isinstance(ref, dict) or not ref.get("name"):
            return {}
        assert self.objects is not None
        namespace, name = str(ref.get("namespace") or ""), str(ref["name"])
        try:
            secret = await self.objects.get_secret(namespace, name)
        except ObjectUnavailable as err:
            raise VolumeError(f"fetching {what}SecretRef {namespace}/{name} failed: {err}") from err
        if secret is None:
            raise VolumeError(
                f'fetching {what}SecretRef {namespace}/{name} failed: secrets "{name}" not found'
            )
        return secret_data(secret)

    async def _pod_context(
        self, ctx: VolumeContext, dspec: JSON, *, ephemeral: bool
    ) -> dict[str, str]:
        """The pod's identity (`podInfoOnMount`) and tokens (`tokenRequests`)."""
        out: dict[str, str] = {}
        meta = ctx.pod.get("metadata") or {}
        account = str((ctx.pod.get("spec") or {}).get("serviceAccountName") or "default")
        if dspec.get("podInfoOnMount"):
            out.update(
                {
                    "csi.storage.k8s.io/pod.name": str(meta.get("name") or ""),
                    "csi.storage.k8s.io/pod.namespace": str(meta.get("namespace") or ""),
                    "csi.storage.k8s.io/pod.uid": str(meta.get("uid") or ""),
                    "csi.storage.k8s.io/serviceAccount.name": account,
                    EPHEMERAL_KEY: "true" if ephemeral else "false",
                }
            )
        requests = list(dspec.get("tokenRequests") or [])
        if requests:
            if self.tokens is None:
                raise VolumeError(
                    "the CSIDriver asks for service-account tokens; none can be issued"
                )
            tokens: dict[str, JSON] = {}
            for request in requests:
                audience = str(request.get("audience") or "")
                expiration = int(request.get("expirationSeconds") or DEFAULT_TOKEN_EXPIRATION_S)
                try:
                    token, expires = await self.tokens.token(
                        ctx.pod, service_account=account, audience=audience, expiration_s=expiration
                    )
                except Exception as err:  # the issuer's own errors: the message says why
                    raise VolumeError(
                        f"requesting a token for audience {audience!r}: {err}"
                    ) from err
                when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expires))
                tokens[audience] = {"token": token, "expirationTimestamp": when}
            out[TOKENS_KEY] = json.dumps(tokens, sort_keys=True)
        return out

    def _lock(self, driver: str, handle: str) -> asyncio.Lock:
        return self._locks.setdefault(f"{driver}\0{handle}", asyncio.Lock())

    # -- tear-down ------------------------------------------------------------------

    async def tear_down(self, path: Path) -> None:
        """Unpublish the pod's volume at `path`, then unstage it when no pod uses it."""
        data = await asyncio.to_thread(_read_json, path / DATA_FILE)
        if data is None:  # never published (a crash before vol_data.json was written)
            problems = await fs.remove_tree(path)
            if problems:
                raise OSError(f"{path} not removed: {'; '.join(problems)}")
            return
        driver = str(data.get("driverName") or "")
        handle = str(data.get("volumeHandle") or "")
        if data.get("volumeMode") == csiblock.BLOCK_MODE:
            await self._tear_down_block(
                path, driver, handle, staged=bool(data.get("stagingTargetPath"))
            )
            return
        target = path / MOUNT_DIR
        staging: Path | None = None
        if data.get("stagingTargetPath"):  # else the driver does not stage: no unstage
            # Only whether the volume was staged is taken from the file: the path is made
            # again from the driver and the handle, so a vol_data.json naming another
            # directory cannot have that unstaged and its parent removed.
            staging = staging_path(self.root_dir, driver, handle)
            if str(data["stagingTargetPath"]) != str(staging):
                log.warning(
                    "vol_data.json names another staging path; the one of its driver and "
                    "handle is used",
                    extra={"path": str(path), "recorded": str(data["stagingTargetPath"])},
                )
        async with self._lock(driver, handle):
            client = await self._client_for_teardown(driver, path)
            try:
                await client.unpublish(handle, target_path=str(target))
            except CSIError as err:
                raise VolumeError(f"UnmountVolume.TearDown failed: driver {driver}: {err}") from err
            self._published.discard(target)
            await _remove_unmounted(path)
            if not await asyncio.to_thread(self._in_use, driver, handle):
                self._forget_expansion(driver, handle)
            if staging is not None and await asyncio.to_thread(
                self._unstage_wanted, driver, handle, staging
            ):
                await self._unstage(client, driver, handle, staging)

    async def _tear_down_block(self, path: Path, driver: str, handle: str, *, staged: bool) -> None:
        """A pod's raw block volume (`path`: its record, `<pod dir>/volumes/kubernetes.io~csi/
        <pv>`): its link removed, NodeUnpublishVolume of its publish file, the record
        removed; NodeUnstageVolume when no pod on the node uses the volume any more. The
        paths are made again from the PV name and pod UID of `path`."""
        pv, uid = path.name, path.parents[2].name
        target = csiblock.publish_path(self.root_dir, pv, uid)
        link = csiblock.pod_map_path(path.parents[2], DIR_NAME, pv)
        async with self._lock(driver, handle):
            client = await self._client_for_teardown(driver, path)
            await asyncio.to_thread(csiblock.remove_link, link)
            try:
                await client.unpublish(handle, target_path=str(target))
            except CSIError as err:
                raise VolumeError(
                    f"UnmapVolume.UnmapPodDevice failed: driver {driver}: {err}"
                ) from err
            self._published.discard(target)
            for gone in (target, path):  # a publish file the driver left, then the record
                problems = await fs.remove_tree(gone)
                if problems:
                    raise OSError(f"{gone} not removed: {'; '.join(problems)}")
            await asyncio.to_thread(csiblock.remove_empty, target.parent)
            in_use = await asyncio.to_thread(self._in_use, driver, handle)
            if not in_use:
                self._forget_expansion(driver, handle)
            if staged and not in_use:
                await self._unstage_block(client, driver, handle, pv)

    async def _unstage_block(self, client: NodeDriver, driver: str, handle: str, pv: str) -> None:
        staging = csiblock.staging_path(self.root_dir, pv)
        if await asyncio.to_thread(os.path.lexists, staging):
            try:
                await client.unstage(handle, staging_path=str(staging))
            except CSIError as err:
                raise VolumeError(
                    f"UnmapDevice.TearDownDevice failed: driver {driver}: {err}"
                ) from err
        self._staged.discard(staging)
        for gone in (staging, csiblock.data_dir(self.root_dir, pv).parent):
            problems = await fs.remove_tree(gone)
            if problems:
                raise OSError(f"{gone} not removed: {'; '.join(problems)}")
        await asyncio.to_thread(csiblock.remove_empty, csiblock.publish_dir(self.root_dir, pv))

    async def _sweep_block(self) -> None:
        """Unstage every staged block volume no pod uses (left by a crash between a pod's
        unpublish and the unstage): its data names its driver and handle, its directory
        the PV."""
        for data_file in await asyncio.to_thread(self._block_data_files):
            data = await asyncio.to_thread(_read_json, data_file)
            if data is None:
                continue
            driver = str(data.get("driverName") or "")
            handle = str(data.get("volumeHandle") or "")
            pv = data_file.parents[1].name
            if data.get("specVolID") != pv or driver_name_problem(driver) is not None:
                if data_file not in self._mismatched:
                    self._mismatched.add(data_file)
                    log.warning(
                        "staging data does not match its directory; left alone",
                        extra={"path": str(data_file), "driver": driver},
                    )
                continue
            async with self._lock(driver, handle):
                in_use = await asyncio.to_thread(self._in_use, driver, handle)
                if in_use or await asyncio.to_thread(csiblock.publishes_left, self.root_dir, pv):
                    continue
                try:
                    client = await self._client_for_teardown(driver, data_file.parent)
                    await self._unstage_block(client, driver, handle, pv)
                except (VolumeError, OSError) as err:
                    log.warning(
                        "staged block volume not unstaged",
                        extra={"path": str(data_file.parent), "error": str(err)},
                    )

    def _block_data_files(self) -> list[Path]:
        return sorted((self.root_dir / csiblock.DEVICES_DIR).glob(f"*/data/{DATA_FILE}"))

    async def sweep(self) -> None:
        """Unstage every staged volume no pod on the node uses (left by a crash between
        a pod's unpublish and the unstage)."""
        await self._sweep_block()
        for data_file in await asyncio.to_thread(self._global_data_files):
            data = await asyncio.to_thread(_read_json, data_file)
            if data is None:
                continue
            driver = str(data.get("driverName") or "")
            handle = str(data.get("volumeHandle") or "")
            try:
                belongs = staging_path(self.root_dir, driver, handle).parent == data_file.parent
            except VolumeError:
                belongs = False
            if not belongs:  # what it names would be unstaged elsewhere: leave it
                if data_file not in self._mismatched:
                    self._mismatched.add(data_file)
                    log.warning(
                        "staging data does not match its directory; left alone",
                        extra={"path": str(data_file), "driver": driver},
                    )
                continue
            async with self._lock(driver, handle):
                if await asyncio.to_thread(self._in_use, driver, handle):
                    continue
                try:
                    client = await self._client_for_teardown(driver, data_file.parent)
                    await self._unstage(client, driver, handle, data_file.parent / GLOBAL_MOUNT)
                except (VolumeError, OSError) as err:
                    log.warning(
                        "staged volume not unstaged",
                        extra={"path": str(data_file.parent), "error": str(err)},
                    )

    async def _unstage(self, client: NodeDriver, driver: str, handle: str, staging: Path) -> None:
        try:
            await client.unstage(handle, staging_path=str(staging))
        except CSIError as err:
            raise VolumeError(f"UnmountDevice failed: driver {driver}: {err}") from err
        self._staged.discard(staging)
        await _remove_unmounted(staging.parent)

    async def _client_for_teardown(self, driver: str, path: Path) -> NodeDriver:
        record = await self._registered(driver)
        if record is None:
            raise VolumeError(
                f"{path} kept: driver {driver} is not registered on this node (it is needed to "
                "unmount the volume)"
            )
        return await self._clients.get(record)

    def _unstage_wanted(self, driver: str, handle: str, staging: Path) -> bool:
        """Staged (its global vol_data.json, written before the stage, is there: a pod
        that went while waiting for its attachment staged nothing) and no pod uses it."""
        staged = (staging.parent / DATA_FILE).exists()
        return staged and not self._in_use(driver, handle)

    def _in_use(self, driver: str, handle: str) -> bool:
        """Whether any pod directory on the node still holds this volume."""
        pods = self.root_dir / "pods"
        for data_file in pods.glob(f"*/volumes/{DIR_NAME}/*/{DATA_FILE}"):
            data = _read_json(data_file)
            if data and data.get("driverName") == driver and data.get("volumeHandle") == handle:
                return True
        return False

    def _holders(self, driver: str, handle: str) -> list[str]:
        """The UIDs of the pods whose directories hold this volume (its vol_data.json,
        written before the publish and removed by the tear-down)."""
        pods = self.root_dir / "pods"
        return [
            data_file.relative_to(pods).parts[0]
            for data_file in pods.glob(f"*/volumes/{DIR_NAME}/*/{DATA_FILE}")
            if (data := _read_json(data_file))
            and data.get("driverName") == driver
            and data.get("volumeHandle") == handle
        ]

    def _global_data_files(self) -> list[Path]:
        return sorted((self.root_dir / GLOBAL_DIR).glob(f"*/*/{DATA_FILE}"))


_POD_VOLUME_TYPES = ("csi", "persistentVolumeClaim", "ephemeral")
_PV_FIELDS = frozenset({"capacity", "claimRef", "nodeAffinity"})


def _pod_keys(pod: JSON, volume: str, claim: str) -> JSON:
    """klet's own vol_data.json keys: whose volume this is, for the volume stats."""
    meta = pod.get("metadata") or {}
    return {
        "kletPodNamespace": str(meta.get("namespace") or ""),
        "kletPodName": str(meta.get("name") or ""),
        "kletPodVolume": volume,
        "kletClaimName": claim,
    }


def _is_block_device(path: str) -> bool:
    try:
        return stat.S_ISBLK(os.stat(on_host(Path(path))).st_mode)
    except OSError:
        return False  # the directory check says what is wrong


def _prepare_block_staging(root_dir: Path, pv: str, data: JSON) -> None:
    """A block volume's staging directory and its data (for the sweep), before the stage."""
    data_dir = csiblock.data_dir(root_dir, pv)
    data_dir.mkdir(mode=csiblock.DIR_MODE, parents=True, exist_ok=True)
    _write_json(data_dir / DATA_FILE, data)
    csiblock.staging_path(root_dir, pv).mkdir(mode=csiblock.DIR_MODE, parents=True, exist_ok=True)


def _prepare_staging(staging_dir: Path, data: JSON) -> None:
    staging_dir.mkdir(parents=True, exist_ok=True)
    _write_json(staging_dir.parent / DATA_FILE, data)


def _prepare_volume_dir(volume_dir: Path, data: JSON) -> None:
    """The pod's volume directory and its `vol_data.json`, before the publish (the
    driver makes `mount` itself; upstream leaves that to it too)."""
    volume_dir.mkdir(parents=True, exist_ok=True)
    if _read_json(volume_dir / DATA_FILE) == data:
        return
    _write_json(volume_dir / DATA_FILE, data)
