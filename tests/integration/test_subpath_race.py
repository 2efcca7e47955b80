"""subPath mounts under attack on real containerd (the CVE-2021-25741 class).

One container of a pod keeps swapping the directory `x` of a shared emptyDir for a
symlink to `/` and back, while a dozen other containers mount `x` through `subPath`
and are started, and restarted, again and again. Each victim looks at its mount for a
file that only the node's root has (the test's own temporary file). Over dozens of
starts no victim ever sees it; the starts that lost the race wait in
CreateContainerConfigError with an event naming the subPath; every subPath is a single
bind mount under the pod's `volume-subpaths` (re-creating a container takes its old
mount off first); removing the pod unmounts them all.

Against the old code (the realpath-checked path handed to the runtime) a victim sees
the node's root within a few starts.
"""

from __future__ import annotations

import collections
import time
from pathlib import Path
from typing import Any

import pytest

from tests.harness.node import KletNode, bus_events
from tests.harness.waiting import wait_for
from tests.integration.test_volumes import EMPTY_DIR, host_mounts, mounts_below

IMAGE = "registry.klet.test/busybox:1.36"
VICTIMS = 12
MIN_RUNS = 30
"""Victim runs (each a container start that got its subPath mounted) to wait for."""

SWAPPER = """\
    - name: swapper
      image: {image}
      command:
        - sh
        - -c
        - |
          cd /shared
          mkdir x
          while :; do
            mv x saved; ln -s / x; usleep 1000; rm x; mv saved x; usleep 1000
          done
      volumeMounts: [{{name: shared, mountPath: /shared}}]
"""

VICTIM = """\
    - name: victim{i}
      image: {image}
      env: [{{name: ME, value: victim{i}}}]
      command:
        - sh
        - -c
        - |
          mktemp /report/ran-$ME.XXXXXX >/dev/null
          if [ -e "/sub{marker}" ]; then ls -A /sub > "$(mktemp /report/escaped-$ME.XXXXXX)"; fi
          sleep 1
      volumeMounts:
        - {{name: shared, mountPath: /sub, subPath: x}}
        - {{name: report, mountPath: /report}}
"""


def manifest(marker: Path) -> str:
    victims = "".join(VICTIM.format(i=i, image=IMAGE, marker=marker) for i in range(VICTIMS))
    return f"""
apiVersion: v1
kind: Pod
metadata: {{name: race}}
spec:
  terminationGracePeriodSeconds: 1
  volumes:
    - {{name: shared, emptyDir: {{}}}}
    - {{name: report, emptyDir: {{}}}}
  containers:
{SWAPPER.format(image=IMAGE)}{victims}"""


@pytest.mark.timeout(420)
def test_a_symlink_swapped_in_never_exposes_the_node_root(
    node_factory: Any, manifests: Path, tmp_path: Path
) -> None:
    # a file only the node's root has: a victim sees it at /sub<path> only if `/` was
    # mounted there
    marker = tmp_path / "only-on-the-node"
    marker.write_text("node")
    node: KletNode = node_factory(manifest_dir=manifests)
    node.start()
    (manifests / "race.yaml").write_text(manifest(marker))
    full = f"race-{node.node_name}"
    pod = wait_for(lambda: node.pods().get(full), timeout_s=60, what="the race pod known")
    uid = pod["metadata"]["uid"]
    pod_dir = node.root_dir / "pods" / uid
    report = pod_dir / "volumes" / EMPTY_DIR / "report"

    def runs() -> list[Path]:
        return sorted(report.glob("ran-*")) if report.is_dir() else []

    def escapes() -> list[str]:
        found = sorted(report.glob("escaped-*")) if report.is_dir() else []
        return [f"{p.name}: {p.read_text()!r}" for p in found]

    deadline = time.monotonic() + 240
    while len(runs()) < MIN_RUNS and not escapes() and time.monotonic() < deadline:
        time.sleep(1)
    assert escapes() == [], "a subPath container saw the node's root"
    assert len(runs()) >= MIN_RUNS, f"only {len(runs())} victim runs in time"
    assert len({p.name.split(".")[0] for p in runs()}) > 1

    # the starts that lost the race wait with a clear reason naming the subPath
    refused = [
        e.message
        for e in bus_events(node, "race")
        if e.reason == "Failed" and "failed to prepare subPath" in e.message
    ]
    assert refused, "no start ever met the swapped symlink"
    assert all('for volumeMount "shared"' in m and "subPath `x`" in m for m in refused), refused

    # each victim's subPath is one bind mount (the earlier instance's mount taken off
    # first), and nothing of the pod is mounted anywhere else under the node's directory
    subpaths = pod_dir / "volume-subpaths"
    points = [
        line.split()[4]
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if line.split()[4].startswith(f"{subpaths}/")
    ]
    stacked = [p for p, n in collections.Counter(points).items() if n > 1]
    assert points and stacked == [], stacked
    assert all(p.startswith(f"{subpaths}/shared/victim") for p in points), points
    assert set(mounts_below(node.root_dir)) == set(points)
    assert str(subpaths) not in host_mounts()

    # the pod's removal unmounts every subPath bind mount and removes the directory
    (manifests / "race.yaml").unlink()
    wait_for(lambda: full not in node.pods(), timeout_s=90, what="race gone")
    wait_for(lambda: not pod_dir.exists(), timeout_s=60, what="the pod directory removed")
    assert mounts_below(node.root_dir) == []
