"""A smoke subset of Kubernetes' [NodeConformance] e2e tests against klet, in `make test`.

The whole suite (`make conformance`, tools/e2e/conformance.py) takes tens of minutes;
this runs the same cluster (dev stack, the suite's images, a control plane with
controllers, `klet up` as the node) with a focus made of about twenty fast specs across
the areas a regression would show in: pods, environment and downward API, ConfigMap,
Secret, projected and emptyDir volumes, probes, lifecycle hooks, security context, and
the behaviours the full suite found missing (service environment variables, sysctl
admission, downward-API resource fields). It passes when every one of them ran and
passed, and fails naming each that did not with its reason. Warm (binaries and image
layers cached) it took 136 s on 2 cores shared with other test runs (2 ginkgo processes;
the two probe specs alone watch for about a minute each).

The binaries come from `make cluster-binaries` and `make e2e-binaries` (both part of
`make test`); a cold build takes minutes, longer than the test timeout, so when they are
missing the test fails at once and says so.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness.suite_smoke import LIFECYCLE, check_all_passed, focus_of, require_binaries
from tools.e2e.conformance import SKIP, SuiteRun, conform

pytestmark = pytest.mark.timeout(900)

# Leaf texts of [NodeConformance] specs (k8s.io/kubernetes v1.34.4 test/e2e/common),
# each with its container text so that a leaf text shared by two files selects one:
# the pod lifecycle (LIFECYCLE), then the rest.
SMOKE = LIFECYCLE + (
    # pods, containers, sysctls
    "[sig-node] Pods should contain environment variables for services",
    "[sig-node] Containers should use the image defaults if command and args are blank",
    "[sig-node] Sysctls [LinuxOnly] [NodeConformance] "
    "should not launch unsafe, but not explicitly enabled sysctls on the node",
    # environment, downward API
    "[sig-node] Variable Expansion should allow composing env vars into new env vars",
    "[sig-node] ConfigMap should be consumable via environment variable",
    "[sig-node] Secrets should be consumable from pods in env vars",
    "[sig-storage] Downward API volume should provide podname only",
    "[sig-storage] Downward API volume should provide container's cpu request",
    # volumes
    "[sig-storage] ConfigMap should be consumable from pods in volume with mappings "
    "[NodeConformance]",
    "[sig-storage] Secrets should be consumable from pods in volume with defaultMode set",
    "[sig-storage] Projected combined "
    "should project all components that make up the projection API",
    "[sig-storage] EmptyDir volumes should support (root,0644,tmpfs)",
    # probes
    "[sig-node] Probing container with readiness probe that fails "
    "should never be ready and never restart",
    # security context
    "[sig-node] Security Context When creating a container with runAsUser "
    "should run the container with uid 65534",
    "[sig-node] Security Context when creating containers with AllowPrivilegeEscalation "
    "should not allow privilege escalation when false",
)


def test_smoke_subset_passes(tmp_path: Path) -> None:
    require_binaries()
    outcome = conform(
        SuiteRun(focus=focus_of(SMOKE), skip=SKIP, procs=2, timeout="12m", verbose=False),
        tmp_path / "run",
    )
    check_all_passed(outcome.results, SMOKE, tmp_path / "run")
