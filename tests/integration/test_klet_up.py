"""`klet up` as an operator runs it: it starts its own Redis, registry and containerd,
runs the example static pods, restarts a service that dies (and says so), and on
SIGTERM stops everything it started, leaving no process behind."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
from klet.devstack import Pidfile, free_port

from tests.harness.node import wait_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return (
        Path(f"/proc/{pid}").exists()
        and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
    )


def test_klet_up_runs_examples_supervises_and_stops_cleanly() -> None:
    run_dir = Path(tempfile.mkdtemp(prefix="klet-up-", dir="/tmp"))
    ro_port, healthz_port = free_port(), free_port()
    out = (run_dir / "up.log").open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "klet.cli.main",
            "up",
            "--run-dir",
            str(run_dir),
            "--pod-manifest-path",
            str(ROOT / "examples" / "static-pods"),
            "--read-only-port",
            str(ro_port),
            "--healthz-port",
            str(healthz_port),
            "--hostname-override",
            "upnode",
        ],
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    log = run_dir / "up.log"
    try:

        def pods() -> dict[str, dict]:  # type: ignore[type-arg]
            with urllib.request.urlopen(f"http://127.0.0.1:{ro_port}/pods", timeout=2) as r:
                return {p["metadata"]["name"]: p for p in json.load(r)["items"]}

        wait_for(
            lambda: pods().get("web-upnode", {}).get("status", {}).get("phase") == "Running",
            timeout_s=60,
            what="the example web pod Running",
        )
        text = log.read_text()
        for service in ("pod-source", "syncloop", "status-reporter"):
            assert re.search(rf"^{service}\s*\|", text, re.M), f"no tagged output from {service}"
        pids = {m[0]: int(m[1]) for m in re.findall(r"started (\S+) \(pid (\d+)\)", text)}
        assert set(pids) >= {"pod-source", "syncloop", "status-reporter"}
        web_ids = [c["containerID"] for c in pods()["web-upnode"]["status"]["containerStatuses"]]

        os.kill(pids["syncloop"], signal.SIGKILL)
        wait_for(
            lambda: "restarted syncloop" in log.read_text(), timeout_s=20, what="syncloop restarted"
        )
        assert re.search(r"syncloop exited with code -9 .* restarting", log.read_text())
        time.sleep(3)
        assert [
            c["containerID"] for c in pods()["web-upnode"]["status"]["containerStatuses"]
        ] == web_ids

        endpoints = json.loads((run_dir / "endpoints.json").read_text())
        assert endpoints["runtime_endpoint"].startswith(f"unix://{run_dir}")
        crictl = subprocess.run(
            [sys.executable, "-m", "klet.cli.main", "crictl", "--run-dir", str(run_dir), "pods"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert "web-upnode" in crictl.stdout
        children = [int(m) for m in re.findall(r"pid (\d+)\)", log.read_text())]
        recorded = [Pidfile(p).read() for p in (run_dir / "stack").glob("*/*.pid")]
        daemon_pids = [r[0] for r in recorded if r is not None]
        assert daemon_pids, "no pid files of the private daemons"
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
        out.close()
    assert code == 0, log.read_text()[-3000:]
    for pid in children + daemon_pids:
        assert not alive(pid), f"pid {pid} still running after klet up stopped"
    leftovers = subprocess.run(
        ["pgrep", "-f", str(run_dir)], capture_output=True, text=True
    ).stdout.split()
    assert not leftovers, f"processes still naming {run_dir}: {leftovers}"
    shutil.rmtree(run_dir, ignore_errors=True)
