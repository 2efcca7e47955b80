"""Usage of the volumes the node measures itself, on real containerd: a static pod with
a memory-backed emptyDir (a tmpfs syncloop mounts), a disk-backed emptyDir and a
downwardAPI volume, its container writing 300 KiB into the tmpfs after it starts.

Covers: syncloop's collector puts the memory emptyDir in the bus `volumes` table with
the usage du and statfs give on the host (capacity, available bytes and inode totals
from statfs of the tmpfs, used bytes and inodes the walk's count), measured again each
volumeStatsAggPeriod (1 s here) so the data written after the first measurement shows;
the downwardAPI volume with its files' usage; not the disk emptyDir (status-reporter
measures that one with the pod's disk usage). Both records have no unique name and no
claim: status-reporter's view lists them for the Summary's `volume` entries, not as
volumes in use, and /metrics has no `kubelet_volume_stats_*` series. (The Summary's
rendering of a measured record is the one CSI volumes use, unit-tested; the kubelet API
here would need its certificates: tests/integration/test_kubelet_api_containerd.py.)
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest
from klet.bus.schema import NodeBus
from klet.model.records import VolumeRecord
from klet.status_reporter.tables.volumes import VolumeView
from prometheus_client import CollectorRegistry

from tests.harness.node import KletNode
from tests.harness.pods import running
from tests.harness.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

POD = """
apiVersion: v1
kind: Pod
metadata: {name: volstats}
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: main
      image: registry.klet.test/busybox:1.36
      command: [sh, -c, "sleep 2; head -c 307200 /dev/zero > /mem/data; sleep 100000"]
      volumeMounts:
        - {name: mem, mountPath: /mem}
        - {name: disk, mountPath: /disk}
        - {name: podinfo, mountPath: /podinfo}
  volumes:
    - name: mem
      emptyDir: {medium: Memory, sizeLimit: 16Mi}
    - name: disk
      emptyDir: {}
    - name: podinfo
      downwardAPI:
        items:
          - path: labels
            fieldRef: {fieldPath: metadata.labels}
"""


def records(node: KletNode) -> dict[str, VolumeRecord]:
    """The bus `volumes` table, as status-reporter reads it."""

    async def read() -> dict[str, VolumeRecord]:
        bus = node.bus(service="status-reporter")
        try:
            return dict(await NodeBus.of(bus, service="status-reporter").volumes.all())
        finally:
            await bus.close()

    return asyncio.run(read())


async def read_view(node: KletNode) -> VolumeView:
    """status-reporter's view of the table, after one read."""
    bus = node.bus(service="status-reporter")
    try:
        view = VolumeView(NodeBus.of(bus, service="status-reporter").volumes, CollectorRegistry())
        await view.refresh()
        return view
    finally:
        await bus.close()


def du(path: Path) -> tuple[int, int]:
    entries = [path, *path.rglob("*")]
    return sum(os.lstat(p).st_blocks * 512 for p in entries), len(entries)


def test_memory_emptydir_and_downward_api_usage(node_factory: Any, manifests: Path) -> None:
    node: KletNode = node_factory(
        manifest_dir=manifests,
        extra_flags=["--volume-stats-agg-period", "1s"],
    )
    node.start()
    (manifests / "volstats.yaml").write_text(POD)
    pod = f"volstats-{node.node_name}"
    wait_for(lambda: running(node, "volstats"), timeout_s=30, what="volstats Running")
    uid = node.pods()[pod]["metadata"]["uid"]
    volumes = node.root_dir / "pods" / uid / "volumes"
    tmpfs = volumes / "kubernetes.io~empty-dir" / "mem"
    assert os.path.ismount(tmpfs)

    def written() -> dict[str, VolumeRecord] | None:
        found = records(node)
        mem = found.get(f"{uid}/mem")
        return found if mem and int(mem.usage.get("usedBytes") or 0) >= 307200 else None

    found = wait_for(written, timeout_s=30, what="the tmpfs's 300 KiB in the volumes table")
    # The disk emptyDir is status-reporter's (klet.stats), hostPath-like volumes none.
    assert set(found) == {f"{uid}/mem", f"{uid}/podinfo"}
    assert all(r.unique_name == "" and r.claim == "" for r in found.values())
    mem = found[f"{uid}/mem"].usage
    fs = os.statvfs(tmpfs)
    assert mem["capacityBytes"] == fs.f_blocks * fs.f_frsize == 16 * 1024 * 1024
    assert mem["inodes"] == fs.f_files
    assert int(mem["availableBytes"]) <= fs.f_blocks * fs.f_frsize - 307200
    assert (mem["usedBytes"], mem["inodesUsed"]) == du(tmpfs)  # written once, stable since

    podinfo_dir = volumes / "kubernetes.io~downward-api" / "podinfo"
    podinfo = found[f"{uid}/podinfo"].usage
    used, inodes = du(podinfo_dir)
    assert podinfo["inodesUsed"] == inodes >= 3  # the dir, ..data, labels ...
    assert podinfo["usedBytes"] == used

    # What status-reporter makes of them: the Summary's `volume` entries, not in use,
    # no kubelet_volume_stats_* series (no claim).
    view = asyncio.run(read_view(node))
    assert view.in_use() == ()
    assert [r.volume for r in view.measured(uid)] == ["mem", "podinfo"]
    assert node.metric("status-reporter", "kubelet_volume_stats_used_bytes") is None
