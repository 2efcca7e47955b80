"""The pods' volumes in use, and their usage, in the bus `volumes` table.

A root task of the leader. Every `scan_period_s` it reads what is on disk (each pod's
`volumes/kubernetes.io~csi/<name>/vol_data.json`, which the CSI plugin writes before a
publish and removes after the unpublish; a raw block volume's too, its usage asked of
the driver for its publish file) and brings the table in line: a record per
volume, keyed `<pod uid>/<volume name>`, with upstream's unique volume name
(`kubernetes.io/csi/<driver>^<handle>`), which status-reporter reports as the Node's
`volumesInUse` so the attach-detach controller does not detach a volume still mounted.
The scan is what makes it restart-proof: a new leader finds the same files.

Usage is measured every `volumeStatsAggPeriod` per volume, as upstream's volume stat
calculator does, through the driver's `NodeGetVolumeStats` when it has the
GET_VOLUME_STATS capability (a driver without it gives no usage, as upstream reports
none); status-reporter serves it in /stats/summary (with `pvcRef`) and as the
`kubelet_volume_stats_*` metrics. A driver that fails the call keeps the last usage and
is asked again at the next period; the failure is logged once until it recovers.
The volumes upstream measures on the node itself are here too, found the same way
(their directories under `pods/<uid>/volumes/`) and measured as upstream's MetricsDu
does: used bytes and inodes by walking the directory as `du` (klet.stats.host.dir_usage),
capacity, available bytes and inode totals by statfs of its filesystem. These are
memory-backed emptyDirs (the tmpfs mounted at `kubernetes.io~empty-dir/<name>`; a
disk-backed one is measured by status-reporter with the pod's other disk usage, as part
of its ephemeral storage), measured every period, and configMap, secret, projected and
downwardAPI volumes, measured once while they exist (upstream wraps theirs in
NewCachedMetrics). Their records have no unique name: nothing attaches them, so they are
not in the Node's `volumesInUse`, and no claim, so they have no
`kubelet_volume_stats_*` series. A walk that cannot read everything gives no usage
rather than a lower bound. Filesystem-mode `local` PVs are measured every period as
upstream's MetricsStatFS does (capacity, available and used bytes and inodes all from
statfs of the directory, or of a block device's node mount), found through the records
the CSI plugin writes under the pod (`localrecords`), and carry their claim, so they get
`pvcRef` and `kubelet_volume_stats_*` series. Not measured, as upstream: hostPath
(MetricsNil in upstream's plugin); left out for now: Block-mode `local` PVs (upstream's
MetricsBlock, the device's size).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from klet.bus import BusError
from klet.csi import CSIError, VolumeStats
from klet.hostfs import on_host
from klet.model.records import VolumeRecord
from klet.model.types import JSON
from klet.obs import OnceLogger
from klet.stats.host import dir_usage
from klet.syncloop.volumes import csiblock, localrecords
from klet.syncloop.volumes.csi import (
    DATA_FILE,
    DIR_NAME,
    GET_VOLUME_STATS,
    MOUNT_DIR,
    ClientPool,
    DriverDirectory,
    unique_name,
)

log = logging.getLogger(__name__)

SCAN_PERIOD_S = 5.0

EMPTY_DIR = "kubernetes.io~empty-dir"
# The plugin directories of the volumes measured on the node → measured once (True:
# upstream's NewCachedMetrics) or every period. emptyDirs: only memory-backed ones.
MEASURED_HERE = {
    EMPTY_DIR: False,
    "kubernetes.io~configmap": True,
    "kubernetes.io~secret": True,
    "kubernetes.io~projected": True,
    "kubernetes.io~downward-api": True,
}


class VolumeTable(Protocol):
    async def put(self, key: str, record: VolumeRecord) -> None: ...

    async def delete(self, key: str) -> None: ...

    async def all(self) -> dict[str, VolumeRecord]: ...


class StatsDriver(Protocol):
    async def node_capabilities(self) -> frozenset[str]: ...

    async def volume_stats(
        self, volume_id: str, *, volume_path: str, staging_path: str = ""
    ) -> VolumeStats: ...

    async def close(self) -> None: ...


def on_disk(root_dir: Path) -> dict[str, tuple[VolumeRecord, JSON]]:
    """key → (a record without usage, the vol_data.json) for every published volume."""
    out: dict[str, tuple[VolumeRecord, JSON]] = {}
    for data_file in sorted((root_dir / "pods").glob(f"*/volumes/{DIR_NAME}/*/{DATA_FILE}")):
        try:
            data = json.loads(data_file.read_text())
        except (OSError, ValueError):
            continue  # being written, or left half-made by a crash: the plugin cleans it
        if not isinstance(data, dict) or not data.get("driverName"):
            continue
        uid = data_file.parents[3].name
        volume = str(data.get("kletPodVolume") or data_file.parent.name)
        handle = str(data.get("volumeHandle") or "")
        record = _unmeasured(
            uid, volume, data, unique_name=unique_name(str(data["driverName"]), handle)
        )
        data["_target"] = str(data_file.parent / MOUNT_DIR)
        if data.get("volumeMode") == csiblock.BLOCK_MODE:  # the device file the pod uses
            data["_target"] = str(csiblock.publish_path(root_dir, data_file.parent.name, uid))
        out[f"{uid}/{volume}"] = (record, data)
    return out


def measured_here(root_dir: Path) -> dict[str, tuple[VolumeRecord, JSON]]:
    """key → (a record without usage, what to measure) for every volume of a
    MEASURED_HERE type: its directory (`_path`) and whether it is measured once."""
    out: dict[str, tuple[VolumeRecord, JSON]] = {}
    for dir_name, once in MEASURED_HERE.items():
        for path in sorted((root_dir / "pods").glob(f"*/volumes/{dir_name}/*")):
            if not path.is_dir() or path.is_symlink():
                continue
            if dir_name == EMPTY_DIR and not os.path.ismount(path):
                continue  # disk-backed: status-reporter measures it (klet.stats)
            uid = path.parents[2].name
            record = _unmeasured(uid, path.name, {}, unique_name="")  # no record names its pod
            out[f"{uid}/{path.name}"] = (record, {"_path": str(path), "_once": once})
    return out


def _unmeasured(uid: str, volume: str, data: JSON, *, unique_name: str) -> VolumeRecord:
    """The record of `uid`'s `volume` before any measure, naming its pod and claim from
    what klet wrote beside the volume (`data`)."""
    return VolumeRecord(
        pod_uid=uid,
        namespace=str(data.get("kletPodNamespace") or ""),
        pod=str(data.get("kletPodName") or ""),
        volume=volume,
        claim=str(data.get("kletClaimName") or ""),
        unique_name=unique_name,
        usage={},
        measured_at=0.0,
    )


def local_volumes(root_dir: Path) -> dict[str, tuple[VolumeRecord, JSON]]:
    """key → (a record without usage, what to statfs: `_statfs`) for every `local` PV
    record of a pod whose volumes are not torn down yet."""
    out: dict[str, tuple[VolumeRecord, JSON]] = {}
    for (uid, volume), data in localrecords.read_all(root_dir).items():
        record = _unmeasured(uid, volume, data, unique_name="")
        path = Path(str(data["path"]))
        out[f"{uid}/{volume}"] = (
            record,
            {"_statfs": str(on_host(path) if data.get("host") else path)},
        )
    return out


def statfs_usage(path: Path) -> JSON | None:
    """Upstream's MetricsStatFS of `path` (fs.Info) in the Summary API's keys: used is
    the filesystem's used blocks, not a walk; None when it cannot be read."""
    try:
        fs = os.statvfs(path)
    except OSError:
        return None
    return {
        "capacityBytes": fs.f_blocks * fs.f_frsize,
        "availableBytes": fs.f_bavail * fs.f_frsize,
        "usedBytes": (fs.f_blocks - fs.f_bfree) * fs.f_frsize,
        "inodes": fs.f_files,
        "inodesFree": fs.f_ffree,
        "inodesUsed": fs.f_files - fs.f_ffree,
    }


def du_and_statfs(path: Path) -> JSON | None:
    """Upstream's MetricsDu of `path` in the Summary API's keys; None when the walk
    could not read everything (or the directory went away meanwhile)."""
    usage = dir_usage(path)
    try:
        fs = os.statvfs(path)
    except OSError:
        return None
    if not usage.complete or not path.is_dir():
        return None
    return {
        "capacityBytes": fs.f_blocks * fs.f_frsize,
        "availableBytes": fs.f_bavail * fs.f_frsize,
        "usedBytes": usage.bytes,
        "inodes": fs.f_files,
        "inodesFree": fs.f_ffree,
        "inodesUsed": usage.inodes,
    }


class VolumeStatsCollector:
    """Keeps the `volumes` table true to the disk and measures usage."""

    def __init__(
        self,
        *,
        root_dir: Path,
        table: VolumeTable,
        drivers: DriverDirectory,
        connect: Callable[[str, str], StatsDriver],
        stats_period_s: float,
        scan_period_s: float = SCAN_PERIOD_S,
        clock: Callable[[], float] = time.time,
        timing: Callable[[str, float], None] | None = None,
    ) -> None:
        self.timing = timing
        """Told (metric source, seconds) of every measurement: the driver's name for a
        NodeGetVolumeStats, `du` for a walk, `statfs` for a local PV (upstream's
        kubelet_volume_metric_collection_duration_seconds{metric_source})."""
        self.root_dir = root_dir
        self.table = table
        self.drivers = drivers
        self.stats_period_s = stats_period_s
        self.scan_period_s = scan_period_s
        self.clock = clock
        self._clients: ClientPool[StatsDriver] = ClientPool(connect)
        self._known: dict[str, VolumeRecord] | None = None
        self._next: dict[str, float] = {}  # key -> when to measure its usage next
        self._once = OnceLogger(log, level=logging.WARNING)

    async def run(self) -> None:
        while True:
            try:
                await self.sync_once()
            except BusError as err:
                self._once.error("bus", "volumes table not updated", cause=str(err), error=str(err))
                self._known = None  # read it again: a write may or may not have landed
            else:
                self._once.clear("bus", "volumes table updated again")
            await asyncio.sleep(self.scan_period_s)

    async def sync_once(self) -> None:
        if self._known is None:
            self._known = await self.table.all()
        known = self._known
        found = await asyncio.to_thread(on_disk, self.root_dir)
        found.update(await asyncio.to_thread(measured_here, self.root_dir))
        found.update(await asyncio.to_thread(local_volumes, self.root_dir))
        for key in sorted(set(known) - set(found)):
            await self.table.delete(key)
            del known[key]
        self._next = {k: v for k, v in self._next.items() if k in found}
        now = self.clock()
        for key, (fresh, data) in found.items():
            old = known.get(key)
            record = fresh
            if old is not None and replace(old, usage={}, measured_at=0.0) == fresh:
                record = old
            if now >= self._next.get(key, 0.0):
                self._next[key] = now + self.stats_period_s
                record = await self._measure(record, data, now)
            if record != old:
                await self.table.put(key, record)
                known[key] = record

    def _timed(self, source: str, started: float) -> None:
        if self.timing is not None:
            self.timing(source, time.perf_counter() - started)

    async def _measure(self, record: VolumeRecord, data: JSON, now: float) -> VolumeRecord:
        if "_statfs" in data:
            started = time.perf_counter()
            usage = await asyncio.to_thread(statfs_usage, Path(str(data["_statfs"])))
            self._timed("statfs", started)
            return record if usage is None else replace(record, usage=usage, measured_at=now)
        if "_path" in data:
            return await self._measure_here(record, data, now)
        driver = str(data["driverName"])
        if not await asyncio.to_thread(Path(str(data["_target"])).exists):
            return record  # not published yet (waiting for its attachment)
        entry = await self.drivers.get(driver)
        if entry is None:
            return record
        try:
            if GET_VOLUME_STATS not in await self._clients.capabilities(entry):
                return record  # the driver gives none
            client = await self._clients.get(entry)
            started = time.perf_counter()
            try:
                stats = await client.volume_stats(
                    str(data.get("volumeHandle") or ""),
                    volume_path=str(data["_target"]),
                    staging_path=str(data.get("stagingTargetPath") or ""),
                )
            finally:
                self._timed(driver, started)
        except CSIError as err:
            self._once.error(
                f"stats:{driver}",
                "volume stats not read",
                cause=str(err),
                driver=driver,
                error=str(err),
            )
            return record
        self._once.clear(f"stats:{driver}", "volume stats read again", driver=driver)
        return replace(record, usage=dict(stats.usage), measured_at=now)

    async def _measure_here(self, record: VolumeRecord, data: JSON, now: float) -> VolumeRecord:
        key = f"{record.pod_uid}/{record.volume}"
        if data["_once"] and record.measured_at:
            self._next[key] = math.inf  # measured once, kept while the volume exists
            return record
        started = time.perf_counter()
        usage = await asyncio.to_thread(du_and_statfs, Path(str(data["_path"])))
        self._timed("du", started)
        if usage is None:
            return record  # asked again at the next period
        if data["_once"]:
            self._next[key] = math.inf
        return replace(record, usage=usage, measured_at=now)
