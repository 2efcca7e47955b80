"""FileSource.run_once: every scan is counted (what a test waits on to know the
directory was looked at again), a snapshot is offered only when the pods changed."""

from __future__ import annotations

from pathlib import Path

from klet.pod_source.inbox import Inbox
from klet.pod_source.metrics import create_metrics
from klet.pod_source.sources.files import FileSource
from prometheus_client import CollectorRegistry

POD = """
apiVersion: v1
kind: Pod
metadata: {name: web}
spec:
  containers: [{name: c, image: busybox}]
"""


async def test_every_scan_is_counted_and_a_change_offered_once(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    inbox = Inbox()
    source = FileSource(
        path=tmp_path,
        node_name="n1",
        period_s=1.0,
        inbox=inbox,
        metrics=create_metrics(registry),
        use_inotify=False,
    )
    (tmp_path / "web.yaml").write_text(POD)

    await source.run_once()
    pending, polled = inbox.take()
    assert [p["metadata"]["name"] for p in pending["file"]] == ["web-n1"] and polled

    await source.run_once()
    pending, polled = inbox.take()
    assert pending == {} and polled  # the same pods: a poll, no snapshot

    assert registry.get_sample_value("klet_pod_source_file_scans_total") == 2
    assert registry.get_sample_value("klet_pod_source_snapshots_total", {"source": "file"}) == 1
