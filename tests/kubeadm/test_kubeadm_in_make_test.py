"""kubeadm's smoke (test_kubeadm_smoke.py) as `make test` runs it: in a mount and network
namespace of its own (`unshare --mount --net`, as `make test-kubeadm` runs the module
with the rest of tests/kubeadm), so kubeadm's files and fixed ports never reach the host
or the session's other tests. The smoke's own pytest runs there and must pass; its
output is this test's failure message.

kubeadm comes from `make kubeadm-binary` (tools/test.sh builds it with the control plane
before the second session; the smoke's preparation builds it too when it is missing);
the smoke needs no addon built.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.kubeadm.kubeadmnode import REPO

SMOKE = "tests/kubeadm/test_kubeadm_smoke.py"


@pytest.mark.timeout(480)
def test_the_kubeadm_smoke_passes_in_a_namespace_of_its_own() -> None:
    res = subprocess.run(
        ["unshare", "--mount", "--net", "--propagation", "private",
         sys.executable, "-m", "pytest", SMOKE, "-q", "-p", "no:cacheprovider"],
        env={**os.environ, "KLET_KUBEADM_TESTS": "1"},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=450,
        check=False,
    )  # fmt: skip
    assert res.returncode == 0, (
        f"{SMOKE} exited {res.returncode}:\n{res.stdout[-12000:]}\n{res.stderr[-3000:]}"
    )
