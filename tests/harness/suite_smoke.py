"""What the two smoke subsets of upstream's e2e suites (tests/conformance) share: one
focus for a list of spec texts, the binaries built beforehand, and the check that
exactly those specs ran and passed."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tools.e2e.conformance import CLUSTER_BUILD, E2E_BUILD
from tools.e2e.report import Results

# Leaf texts of [NodeConformance] specs (k8s.io/kubernetes v1.34.4 test/e2e/common),
# each with its container text so that a leaf text shared by two files selects one.
# The pod lifecycle: create and remove, the host IP, init containers, a termination
# message, logs through the apiserver, an exec liveness probe's restart, a postStart
# hook, the downward API. Part of the conformance smoke subset, and what the systemd
# tier runs on its systemd-driver node.
LIFECYCLE = (
    "[sig-node] Pods should get a host IP",
    "[sig-node] Pods should be submitted and removed",
    "[sig-node] InitContainer [NodeConformance] "
    "should invoke init containers on a RestartNever pod",
    "[sig-node] Container Runtime blackbox test on terminated container should report "
    "termination message from file when pod succeeds and TerminationMessagePolicy "
    "FallbackToLogsOnError is set",
    "[sig-node] Kubelet when scheduling a busybox command in a pod should print the output to logs",
    '[sig-node] Probing container should be restarted with a exec "cat /tmp/health" liveness probe',
    "[sig-node] Container Lifecycle Hook when create a pod with lifecycle hook "
    "should execute poststart exec hook properly",
    "[sig-node] Downward API should provide pod name, namespace and IP address as env vars",
)


def focus_of(texts: tuple[str, ...]) -> str:
    """One ginkgo focus (RE2) matching these spec texts (ginkgo matches more than the
    text, so no ^ anchor: `check_all_passed` checks that exactly these were selected)."""
    return "|".join(re.escape(t) for t in texts)


def require_binaries() -> None:
    """Fail at once when the control plane or the suite is not built: a cold build takes
    minutes, longer than a smoke test's timeout."""
    for script, target in ((CLUSTER_BUILD, "cluster-binaries"), (E2E_BUILD, "e2e-binaries")):
        check = subprocess.run(["bash", str(script), "--check"], capture_output=True, text=True)
        if check.returncode != 0:
            pytest.fail(
                f"{script} has not built its binaries yet and a cold build takes several "
                f"minutes: run `make {target}` first",
                pytrace=False,
            )


def check_all_passed(results: Results, texts: tuple[str, ...], logs: Path) -> None:
    """Every one of `texts` ran and passed, and nothing else ran; else a failure naming
    each spec that did not pass with its reason."""
    ran = {s.text: s for s in results.specs}
    missing = [t for t in texts if not any(text.startswith(t) for text in ran)]
    assert not missing, f"specs not selected (renamed upstream?): {missing}"
    bad = [s for s in results.specs if s.state != "passed"]
    assert not bad and not results.problems, "\n".join(
        [f"{s.text}: {s.state}\n  {s.reason}" for s in bad]
        + [f"{p.node}: {p.reason}" for p in results.problems]
        + [f"(logs: {logs})"]
    )
    assert len(results.specs) == len(texts), sorted(ran)
