"""A service run as a process, as a container or `klet up` runs it: without a format
flag every line it writes is klog's text line (or a continuation of a multi-line value)
carrying its service's name; `--logging-format json` makes every line a JSON object.
`python -m klet.<service> --version` and `klet run <service> --version` print the
version line and exit 0 for each of the five services."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from klet.devstack import ManagedProcess, RedisServer
from klet.model.layout import DEFAULT_SERVICE_PORTS

NODE = "logs-node"
SERVICE = "pod-source"
HEADER = re.compile(r'^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d{6} {1,7}\d+ [\w./]+\.py:\d+\] "')


def run_pod_source(tmp_path: Path, redis: RedisServer, *extra: str) -> list[str]:
    """The lines pod-source writes from start until it has published its port and
    stopped on SIGTERM (without ManagedProcess's own start line)."""
    (tmp_path / "manifests").mkdir()
    port_file = tmp_path / "port.json"
    argv = [
        sys.executable, "-m", "klet.pod_source",
        *redis.service_flags(NODE, SERVICE),
        "--hostname-override", NODE,
        "--run-dir", str(tmp_path / "run"),
        "--pod-manifest-path", str(tmp_path / "manifests"),
        "--service-port", "0",
        "--service-port-file", str(port_file),
        *extra,
    ]  # fmt: skip
    proc = ManagedProcess(SERVICE, argv, dir=tmp_path / "proc")
    proc.start()
    try:
        proc.wait_ready(port_file.exists, 60, "its port file")
    finally:
        code = proc.stop()
    assert code == 0, proc.log_path.read_text()[-4000:]
    lines = proc.log_path.read_text().splitlines()
    assert lines[0].startswith("--- ")
    return lines[1:]


def test_text_lines_by_default(tmp_path: Path, redis_server: RedisServer) -> None:
    lines = run_pod_source(tmp_path, redis_server)
    records = [line for line in lines if not line.startswith("\t") and line != " >"]
    assert records, lines
    for line in records:
        assert HEADER.match(line), line
        assert ' service="pod-source"' in line, line
    assert any('] "service port published" service="pod-source" port=' in r for r in records)


def test_json_lines_on_request(tmp_path: Path, redis_server: RedisServer) -> None:
    lines = run_pod_source(tmp_path, redis_server, "--logging-format", "json")
    found = [json.loads(line) for line in lines]
    assert {f["service"] for f in found} == {"pod-source"}
    assert "service port published" in [f["msg"] for f in found]


@pytest.mark.parametrize("service", sorted(DEFAULT_SERVICE_PORTS))
def test_every_service_prints_its_version(service: str) -> None:
    module = f"klet.{service.replace('-', '_')}"
    for argv in (
        [sys.executable, "-m", module, "--version"],
        [sys.executable, "-m", "klet.cli.main", "run", service, "--version"],
    ):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert re.fullmatch(rf"klet {service} \S+ \(kubelet v1\.\d+\.\d+\)\n", done.stdout)
