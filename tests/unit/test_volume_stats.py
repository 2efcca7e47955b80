"""Volumes in use and their usage, from syncloop's disk scan to what status-reporter shows:
the collector keeps the bus `volumes` table true to the pods' vol_data.json files (a new
one added, a removed one deleted, a restarted collector rereads the table; a raw block
volume's usage asked for at its publish file), measures usage through the driver every
period and only with GET_VOLUME_STATS, keeps the last usage when the driver fails; the
view turns the table into volumesInUse (None before its first read, kept while the bus
is down), the kubelet_volume_stats_* gauges of claims and the Summary's `volume`
entries; the node status lists volumesInUse and deletes the field when nothing is in
use. The volumes measured on the node (configMap, secret, projected, downwardAPI here;
memory-backed emptyDirs need a tmpfs: tests/integration/test_csi_volume_stats.py) get
du-and-statfs usage once (each walk and each driver call timed in
kubelet_volume_metric_collection_duration_seconds by source), stay out of volumesInUse
and the gauges, and show in the Summary's list; disk-backed emptyDirs
(status-reporter's) and hostPath (upstream measures none) are not recorded.
Filesystem-mode `local` PVs get statfs usage every period with their claim's gauges,
from the record the CSI plugin writes at set-up."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from klet.bus import BusUnavailable
from klet.bus.schema import NodeBus
from klet.csi import CSIError, VolumeStats
from klet.model.records import CSIDriverRecord
from klet.status_reporter.cluster import nodestatus as ns
from klet.syncloop.metrics import volume_stat_collection
from klet.syncloop.volumes.volumestats import VolumeStatsCollector
from klet.testbed.fakes.bus import FakeBus
from prometheus_client import CollectorRegistry

from tests.unit.status_reporter.cluster.test_nodestatus import CFG, obs

DRIVER = "drv.klet.test"


class Driver:
    def __init__(self, caps: frozenset[str] = frozenset({"GET_VOLUME_STATS"})) -> None:
        self.caps = caps
        self.asked: list[tuple[str, str]] = []
        self.fail = False

    async def close(self) -> None:
        return None

    async def node_capabilities(self) -> frozenset[str]:
        return self.caps

    async def volume_stats(
        self, volume_id: str, *, volume_path: str, staging_path: str = ""
    ) -> VolumeStats:
        self.asked.append((volume_id, volume_path))
        if self.fail:
            raise CSIError("NodeGetVolumeStats: INTERNAL: boom", code="INTERNAL")
        return VolumeStats(usage={"capacityBytes": 100, "usedBytes": 10, "inodes": 5})


class Drivers:
    async def get(self, key: str) -> CSIDriverRecord | None:
        if key != DRIVER:
            return None
        return CSIDriverRecord(
            name=DRIVER,
            endpoint="/e.sock",
            registration="/r.sock",
            node_id="n",
            max_volumes=0,
            topology={},
            versions="1.0.0",
            registered_at=1.0,
        )


def publish(root: Path, uid: str, name: str, *, claim: str = "", handle: str = "h1") -> Path:
    volume_dir = root / "pods" / uid / "volumes" / "kubernetes.io~csi" / name
    volume_dir.mkdir(parents=True)
    data = {
        "driverName": DRIVER,
        "volumeHandle": handle,
        "specVolID": name,
        "stagingTargetPath": "",
        "kletPodNamespace": "ns",
        "kletPodName": f"pod-{uid}",
        "kletPodVolume": "data",
        "kletClaimName": claim,
    }
    (volume_dir / "vol_data.json").write_text(json.dumps(data))
    (volume_dir / "mount").mkdir()  # the driver's publish makes it
    return volume_dir


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def collector(
    root: Path,
    bus: FakeBus,
    driver: Driver,
    clock: Clock,
    registry: CollectorRegistry | None = None,
) -> VolumeStatsCollector:
    return VolumeStatsCollector(
        root_dir=root,
        table=NodeBus.of(bus, service="syncloop").volumes,
        drivers=Drivers(),
        connect=lambda endpoint, name: driver,
        stats_period_s=60.0,
        clock=clock,
        timing=None if registry is None else volume_stat_collection(registry),
    )


def timed(registry: CollectorRegistry, source: str) -> float | None:
    return registry.get_sample_value(
        "kubelet_volume_metric_collection_duration_seconds_count", {"metric_source": source}
    )


async def test_the_table_follows_the_disk_and_usage_the_period(tmp_path: Path) -> None:
    bus, driver, clock, registry = FakeBus(), Driver(), Clock(), CollectorRegistry()
    table = NodeBus.of(bus, service="status-reporter").volumes
    c = collector(tmp_path, bus, driver, clock, registry)
    volume_dir = publish(tmp_path, "u1", "pv1", claim="data")
    await c.sync_once()
    [record] = (await table.all()).values()
    assert (record.pod_uid, record.namespace, record.pod, record.volume, record.claim) == (
        "u1",
        "ns",
        "pod-u1",
        "data",
        "data",
    )
    assert record.unique_name == f"kubernetes.io/csi/{DRIVER}^h1"
    assert record.usage == {"capacityBytes": 100, "usedBytes": 10, "inodes": 5}
    assert record.measured_at == 1000.0
    assert driver.asked == [("h1", str(volume_dir / "mount"))]

    clock.now += 30
    await c.sync_once()
    assert len(driver.asked) == 1  # within the period
    clock.now += 31
    driver.fail = True
    await c.sync_once()
    assert len(driver.asked) == 2
    [kept] = (await table.all()).values()
    assert kept.usage == record.usage and kept.measured_at == 1000.0  # the last usage stays
    assert timed(registry, DRIVER) == 2  # each driver call timed, the failed one too

    # A restarted collector starts from the table; the volume goes with its files.
    fresh = collector(tmp_path, bus, driver, clock)
    (volume_dir / "vol_data.json").unlink()
    await fresh.sync_once()
    assert await table.all() == {}


async def test_a_volume_waiting_for_its_attachment_is_in_use_but_not_measured(
    tmp_path: Path,
) -> None:
    bus, driver, clock = FakeBus(), Driver(), Clock()
    table = NodeBus.of(bus, service="status-reporter").volumes
    volume_dir = publish(tmp_path, "u1", "pv1", claim="data")
    (volume_dir / "mount").rmdir()  # vol_data.json written, the publish not done yet
    await collector(tmp_path, bus, driver, clock).sync_once()
    [record] = (await table.all()).values()
    assert record.unique_name == f"kubernetes.io/csi/{DRIVER}^h1"  # in volumesInUse
    assert record.usage == {} and driver.asked == []


async def test_a_raw_block_volume_is_in_use_and_measured_at_its_publish_file(
    tmp_path: Path,
) -> None:
    bus, driver, clock = FakeBus(), Driver(), Clock()
    volume_dir = publish(tmp_path, "u1", "pv1", claim="data")
    (volume_dir / "mount").rmdir()  # a block volume's record holds only its data
    data = json.loads((volume_dir / "vol_data.json").read_text())
    (volume_dir / "vol_data.json").write_text(json.dumps({**data, "volumeMode": "Block"}))
    target = tmp_path / "plugins/kubernetes.io/csi/volumeDevices/publish/pv1/u1"
    target.parent.mkdir(parents=True)
    target.touch()  # the driver's publish file
    await collector(tmp_path, bus, driver, clock).sync_once()
    [record] = (await NodeBus.of(bus, service="status-reporter").volumes.all()).values()
    assert record.unique_name == f"kubernetes.io/csi/{DRIVER}^h1"
    assert driver.asked == [("h1", str(target))] and record.usage["capacityBytes"] == 100


async def test_a_driver_without_volume_stats_gives_none(tmp_path: Path) -> None:
    bus, driver, clock = FakeBus(), Driver(caps=frozenset()), Clock()
    publish(tmp_path, "u1", "inline")
    await collector(tmp_path, bus, driver, clock).sync_once()
    [record] = (await NodeBus.of(bus, service="status-reporter").volumes.all()).values()
    assert (record.usage, record.measured_at, record.claim) == ({}, 0.0, "")
    assert driver.asked == []


async def test_the_view_the_metrics_and_the_summary(tmp_path: Path) -> None:
    from klet.status_reporter.tables.volumes import VolumeView

    bus, driver, clock = FakeBus(), Driver(), Clock()
    publish(tmp_path, "u1", "pv1", claim="data")
    publish(tmp_path, "u2", "inline", handle="h2")
    await collector(tmp_path, bus, driver, clock).sync_once()
    registry = CollectorRegistry()
    view = VolumeView(NodeBus.of(bus, service="status-reporter").volumes, registry)
    assert view.in_use() is None
    await view.refresh()
    assert view.in_use() == (f"kubernetes.io/csi/{DRIVER}^h1", f"kubernetes.io/csi/{DRIVER}^h2")
    labels = {"namespace": "ns", "persistentvolumeclaim": "data"}
    assert registry.get_sample_value("kubelet_volume_stats_capacity_bytes", labels) == 100
    assert registry.get_sample_value("kubelet_volume_stats_used_bytes", labels) == 10
    assert registry.get_sample_value("kubelet_volume_stats_available_bytes", labels) is None
    [measured] = view.measured("u1")
    assert measured.claim == "data"

    bus.error = BusUnavailable("redis down")
    await view.refresh()
    assert len(view.in_use() or ()) == 2  # kept while the bus is down


def test_node_status_lists_volumes_in_use() -> None:
    base = obs()
    using = ns.Observations(
        machine=base.machine,
        node_ips=base.node_ips,
        runtime=base.runtime,
        volumes_in_use=("kubernetes.io/csi/d^b", "kubernetes.io/csi/d^a"),
    )
    first = ns.node_status(CFG, using, existing=None, now=0.0)
    assert first["volumesInUse"] == ["kubernetes.io/csi/d^b", "kubernetes.io/csi/d^a"]
    unknown = ns.node_status(CFG, base, existing=first, now=10.0)
    assert unknown["volumesInUse"] == first["volumesInUse"]  # not read yet: as the Node says
    none = ns.Observations(
        machine=base.machine, node_ips=base.node_ips, runtime=base.runtime, volumes_in_use=()
    )
    cleared = ns.node_status(CFG, none, existing=first, now=20.0)
    assert cleared["volumesInUse"] is None  # the patch deletes the field
    assert ns.status_changed(first, cleared)
    assert not ns.status_changed({**first, "volumesInUse": None}, cleared)
    assert ns.status_patch(cleared)["status"]["volumesInUse"] is None


def du(path: Path) -> tuple[int, int]:
    """Bytes allocated and inodes under `path`, itself included, counted here."""
    entries = [path, *path.rglob("*")]
    return sum(os.lstat(p).st_blocks * 512 for p in entries), len(entries)


async def test_volumes_of_the_node_measured_once_with_du_and_statfs(tmp_path: Path) -> None:
    from klet.status_reporter.tables.volumes import VolumeView

    bus, driver, clock = FakeBus(), Driver(), Clock()
    table = NodeBus.of(bus, service="status-reporter").volumes
    volumes = tmp_path / "pods" / "u1" / "volumes"
    dirs = {
        "config": volumes / "kubernetes.io~configmap" / "config",
        "creds": volumes / "kubernetes.io~secret" / "creds",
        "all-in-one": volumes / "kubernetes.io~projected" / "all-in-one",
        "podinfo": volumes / "kubernetes.io~downward-api" / "podinfo",
    }
    for i, d in enumerate(dirs.values()):
        d.mkdir(parents=True)
        (d / "..data").mkdir()
        (d / "..data" / "key").write_bytes(b"x" * 5000 * (i + 1))
    (volumes / "kubernetes.io~empty-dir" / "scratch").mkdir(parents=True)  # on disk
    (volumes / "kubernetes.io~host-path" / "host").mkdir(parents=True)
    timings = CollectorRegistry()
    c = collector(tmp_path, bus, driver, clock, timings)
    await c.sync_once()
    assert timed(timings, "du") == 4  # one walk per volume
    records = await table.all()
    assert set(records) == {f"u1/{name}" for name in dirs}
    fs = os.statvfs(tmp_path)
    for name, d in dirs.items():
        r = records[f"u1/{name}"]
        assert (r.pod_uid, r.volume, r.claim, r.unique_name) == ("u1", name, "", "")
        used, inodes = du(d)
        assert r.usage["usedBytes"] == used and r.usage["inodesUsed"] == inodes == 3
        assert r.usage["capacityBytes"] == fs.f_blocks * fs.f_frsize
        assert r.usage["inodes"] == fs.f_files
        assert set(r.usage) == {
            "capacityBytes",
            "availableBytes",
            "usedBytes",
            "inodes",
            "inodesFree",
            "inodesUsed",
        }
        assert r.measured_at == 1000.0
    assert driver.asked == []

    # Measured once (upstream's NewCachedMetrics): a later period keeps the first usage,
    # and so does a restarted collector.
    (dirs["config"] / "..data" / "more").write_bytes(b"y" * 9000)
    clock.now += 120
    await c.sync_once()
    await collector(tmp_path, bus, driver, clock).sync_once()
    assert (await table.all())["u1/config"] == records["u1/config"]

    registry = CollectorRegistry()
    view = VolumeView(table, registry)
    await view.refresh()
    assert view.in_use() == ()  # nothing attaches them
    assert [r.volume for r in view.measured("u1")] == sorted(dirs)
    assert (
        registry.get_sample_value(
            "kubelet_volume_stats_used_bytes", {"namespace": "", "persistentvolumeclaim": ""}
        )
        is None
    )

    # Gone with its directory.
    for d in dirs["podinfo"].rglob("*"):
        if d.is_file():
            d.unlink()
    (dirs["podinfo"] / "..data").rmdir()
    dirs["podinfo"].rmdir()
    await c.sync_once()
    assert "u1/podinfo" not in await table.all()


class StatVfs:
    """os.statvfs's answer for a made-up filesystem (the math checked exactly)."""

    f_blocks, f_bfree, f_bavail, f_frsize = 1000, 400, 300, 4096
    f_files, f_ffree = 500, 120


async def test_local_pvs_are_measured_with_statfs_and_carry_their_claim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Filesystem-mode `local` PV set up by the CSI plugin (a directory handed to the
    runtime as it is) is recorded under the pod, measured every period as upstream's
    MetricsStatFS (used = blocks - bfree, inodesUsed = files - ffree), and gets the
    claim's kubelet_volume_stats_* series and the Summary entry; a hostPath PV is not
    measured (upstream's MetricsNil); the record goes when the pod's volumes do."""
    from klet.status_reporter.tables.volumes import VolumeView
    from klet.syncloop.volumes import localrecords

    from tests.unit.syncloop.test_csi_volumes import CLAIM, FakeDriver, Objects, a_pod, ctx, plugin

    disk, host = tmp_path / "mnt" / "disk1", tmp_path / "srv"
    disk.mkdir(parents=True)
    host.mkdir()
    objects = Objects()
    objects.bind("data", "pv1")
    objects.bind("logs", "pv2")
    del objects.pvs["pv1"]["spec"]["csi"], objects.pvs["pv2"]["spec"]["csi"]
    objects.pvs["pv1"]["spec"]["local"] = {"path": str(disk)}
    objects.pvs["pv2"]["spec"]["hostPath"] = {"path": str(host)}
    p = plugin(tmp_path, FakeDriver(), objects)
    logs = {"name": "logs", "persistentVolumeClaim": {"claimName": "logs"}}
    pod = a_pod("u1", CLAIM, logs)
    assert await p.set_up(CLAIM, ctx(tmp_path, pod)) == disk
    assert await p.set_up(logs, ctx(tmp_path, pod)) == host
    record_file = localrecords.record_path(tmp_path / "pods" / "u1", "data")
    assert json.loads(record_file.read_text())["path"] == str(disk)

    measured: list[str] = []

    def statvfs(path: str | os.PathLike[str]) -> StatVfs:
        measured.append(str(path))
        return StatVfs()

    monkeypatch.setattr(os, "statvfs", statvfs)
    bus, driver, clock = FakeBus(), Driver(), Clock()
    table = NodeBus.of(bus, service="status-reporter").volumes
    c = collector(tmp_path, bus, driver, clock)
    await c.sync_once()
    records = await table.all()
    assert set(records) == {"u1/data"}  # no hostPath record
    r = records["u1/data"]
    assert (r.namespace, r.pod, r.volume, r.claim, r.unique_name) == (
        "ns",
        "pod-u1",
        "data",
        "data",
        "",
    )
    assert r.usage == {
        "capacityBytes": 1000 * 4096,
        "availableBytes": 300 * 4096,
        "usedBytes": 600 * 4096,
        "inodes": 500,
        "inodesFree": 120,
        "inodesUsed": 380,
    }
    assert measured == [str(disk)]
    clock.now += 60  # every period, not once
    await c.sync_once()
    assert measured == [str(disk)] * 2

    registry = CollectorRegistry()
    view = VolumeView(table, registry)
    await view.refresh()
    labels = {"namespace": "ns", "persistentvolumeclaim": "data"}
    assert registry.get_sample_value("kubelet_volume_stats_used_bytes", labels) == 600 * 4096
    assert registry.get_sample_value("kubelet_volume_stats_inodes_free", labels) == 120
    assert view.in_use() == ()  # nothing attaches a local PV
    [entry] = view.measured("u1")
    assert entry.claim == "data"

    p.forget_pod("u1")  # the pod's volumes are torn down
    assert not record_file.exists()
    await c.sync_once()
    assert await table.all() == {}
