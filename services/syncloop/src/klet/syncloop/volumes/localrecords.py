"""Which pod uses which Filesystem-mode `local` PV, on disk, for the volume stats.

Upstream measures a `local` PV (MetricsStatFS of the pod's bind mount of it) and
reports it with its claim in /stats/summary and `kubelet_volume_stats_*`. klet hands a
directory `local` PV to the runtime as it is, so nothing under the pod's `volumes/`
says the pod uses it, or through which claim. The CSI plugin (which sets up the PVs of
claims) therefore writes one small record per pod volume at
`<pod dir>/plugins/kubernetes.io~local-volume/<pod volume name>.json` (upstream's
per-pod plugin directory): the path to statfs, the claim, the pod's name and
namespace. The volume stats collector (`volumestats`) reads them; the plugin removes
them once the pod's volumes are torn down (`forget`), and they go with the pod
directory in any case. A record is read only to statfs its path: nothing is mounted,
unmounted or removed at a path read from it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path

from klet.model.types import JSON

RECORDS_DIR = Path("plugins") / "kubernetes.io~local-volume"
"""Below a pod directory."""


def record_path(pod_dir: Path, volume: str) -> Path:
    return pod_dir / RECORDS_DIR / f"{volume}.json"


def write(pod_dir: Path, volume: str, record: JSON) -> None:
    """Write the record of `volume` unless it already says the same (set-up runs at
    every sync of the pod)."""
    path = record_path(pod_dir, volume)
    text = json.dumps(record, sort_keys=True)
    with contextlib.suppress(OSError):
        if path.read_text() == text:
            return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def forget(pod_dir: Path) -> None:
    """Remove every record of the pod (its volumes are torn down)."""
    shutil.rmtree(pod_dir / RECORDS_DIR, ignore_errors=True)


def read_all(root_dir: Path) -> dict[tuple[str, str], JSON]:
    """(pod UID, pod volume name) → record, for every well-formed record on disk."""
    out: dict[tuple[str, str], JSON] = {}
    for path in sorted((root_dir / "pods").glob(f"*/{RECORDS_DIR}/*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being written, or half-made by a crash: written again at the next sync
        if not isinstance(data, dict) or not data.get("path"):
            continue
        out[(path.parents[2].name, path.name.removesuffix(".json"))] = data
    return out
