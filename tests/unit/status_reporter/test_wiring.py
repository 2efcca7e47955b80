"""What building a standalone status-reporter's dependencies loads (wiring.py): with the
read-only port on and the kubelet API off (Webhook authorization without a kubeconfig,
a standalone node's usual set-up), /metrics/cadvisor has a CRI client of its own, but
neither gRPC nor the CRI stubs are imported until the page is first asked for (issue
42: about 13 MB resident), and closing the deps at shutdown does not open it either.
A fresh interpreter builds the deps, so modules the test process holds hide nothing;
the same probe sees both once the client class is imported (it can fail)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

PROBE = """
import asyncio, json, sys
from klet.config import load_settings
from klet.status_reporter.wiring import build_deps

settings = load_settings(
    ["--read-only-port=10255", "--run-dir={run_dir}"], env={{}}, service="status-reporter"
)
deps = build_deps(settings)
assert deps.kubelet_api is None and deps.container_metrics is not None
def loaded():
    return sorted({{m.partition(".")[0] for m in sys.modules}} & {{"grpc", "cri_api"}})
built = loaded()
asyncio.run(deps.close())
closed = loaded()
{then}
print(json.dumps([built, closed, loaded()]))
"""


def _loads(tmp: Path, then: str = "") -> list[list[str]]:
    code = PROBE.format(run_dir=tmp, then=then)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    result: list[list[str]] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_standalone_deps_load_no_grpc_until_cadvisor_is_asked_for(tmp_path: Path) -> None:
    built, closed, _ = _loads(tmp_path)
    assert built == [] and closed == []


def test_the_probe_sees_the_cri_client_once_it_is_opened(tmp_path: Path) -> None:
    """The client class the page's first scrape builds (klet.wiring.runtime_client):
    importing it loads both, so the test above can fail."""
    _, _, after = _loads(tmp_path, then="from klet.cri import RuntimeClient")
    assert after == ["cri_api", "grpc"]
