"""A smoke subset of upstream's storage e2e specs against klet, in `make test`.

The whole selection (`make conformance-storage`: PersistentVolumes and
PersistentVolumes-local, 46 specs) takes about an hour here, most of it the NFS specs
this machine's kernel cannot run timing out; this runs the same way (the `storage`
preset of tools/e2e/conformance.py, in a PID and mount namespace of its own, with klet
as the node) a focus of eight fast specs, one per kind of volume klet sets up: local PVs
on a directory, a tmpfs and a symlinked bind mount; a raw block PV handed to the
container as a device; block devices as Filesystem PVs, one formatted by klet and one
already formatted (each pod reading what the other wrote); and the two [Conformance]
lifecycle specs of PVs and claims. It passes when every one of them ran and passed, and
fails naming each that did not with its reason. Warm it took about 3 minutes on 2 cores
(set-up of the dev stack and control plane included).

The binaries come from `make cluster-binaries` and `make e2e-binaries` (both part of
`make test`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.suite_smoke import check_all_passed, focus_of, require_binaries
from tools.e2e.conformance import REPO
from tools.e2e.report import parse_report

pytestmark = pytest.mark.timeout(900)

_LOCAL = "[sig-storage] PersistentVolumes-local "
_ONE = "One pod requesting one prebound PVC should be able to mount volume and "
_TWO = "Two pods mounting a local volume "

# Leaf texts of storage specs (k8s.io/kubernetes v1.34.4 test/e2e/storage), with their
# container texts.
SMOKE = (
    f"{_LOCAL}[Volume type: dir] {_ONE}write from pod1",
    f"{_LOCAL}[Volume type: tmpfs] {_TWO}at the same time "
    "should be able to write from pod1 and read from pod2",
    f"{_LOCAL}[Volume type: dir-link-bindmounted] {_ONE}read from pod1",
    f"{_LOCAL}[Volume type: block] {_ONE}write from pod1",
    f"{_LOCAL}[Volume type: blockfswithoutformat] {_ONE}read from pod1",
    f"{_LOCAL}[Volume type: blockfswithformat] {_TWO}one after the other "
    "should be able to write from pod1 and read from pod2",
    "[sig-storage] PersistentVolumes CSI Conformance "
    "should run through the lifecycle of a PV and a PVC",
    "[sig-storage] PersistentVolumes CSI Conformance should apply changes to a pv/pvc status",
)


def test_storage_smoke_subset_passes(tmp_path: Path) -> None:
    require_binaries()
    # A process of its own: the preset runs it again in a PID and mount namespace.
    command = [
        sys.executable,
        "-m",
        "tools.e2e.conformance",
        "--preset=storage",
        f"--focus={focus_of(SMOKE)}",
        "--procs=2",
        "--timeout=12m",
        "--quiet",
        f"--out={tmp_path}",
    ]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=840)
    report = tmp_path / "run" / "report.json"
    assert report.exists(), f"no report; the run said:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    check_all_passed(parse_report(json.loads(report.read_text())), SMOKE, tmp_path / "run")
