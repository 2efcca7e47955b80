"""Replicas of one service on one host, as `docker compose up --scale pod-source=2` runs
them on the host's network: two `klet run pod-source` processes with --service-port=0
and one run directory both serve, on distinct ports the kernel picked, both published
under <run-dir>/ports/pod-source/; `klet healthcheck pod-source` passes for each through
its own --service-port-file (what KLET_SERVICE_PORT_FILE gives it in its container);
both are healthy and only the lease holder is ready. SIGKILLing the leader (no clean
exit) leaves the standby's check passing, the dead one's own check failing, and its
published file ignored and removed by readers; the standby turns ready once it takes
the lease over; a clean stop removes the survivor's files."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from klet.devstack import ManagedProcess, RedisServer
from klet.portfiles import PortRecord, live_replicas, read_port_file

from tests.harness.node import fetch, sample_value
from tests.harness.waiting import wait_for

NODE = "ports-node"
SERVICE = "pod-source"


def healthcheck(port_file: Path) -> subprocess.CompletedProcess[str]:
    """`klet healthcheck pod-source` as compose's health check runs it in a container."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KLET_SERVICE_")}
    env["KLET_SERVICE_PORT_FILE"] = str(port_file)
    return subprocess.run(
        [sys.executable, "-m", "klet.cli.main", "healthcheck", SERVICE],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def status(record: PortRecord, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{record.port}{path}", timeout=5) as r:
            return int(r.status)
    except urllib.error.HTTPError as err:
        return err.code


def leading(record: PortRecord) -> float | None:
    """This replica's `klet_leader` gauge."""
    page = fetch(f"http://127.0.0.1:{record.port}/metrics", timeout_s=5)
    return sample_value(page, "klet_leader", service=SERVICE)


class Replica:
    def __init__(self, name: str, dir: Path, run_dir: Path, redis: RedisServer) -> None:
        self.port_file = dir / name / "own" / "klet-service-port.json"
        self.port_file.parent.mkdir(parents=True)
        manifests = dir / "manifests"
        manifests.mkdir(exist_ok=True)
        flags = [
            *redis.service_flags(NODE, SERVICE),
            "--hostname-override", NODE,
            "--run-dir", str(run_dir),
            "--pod-manifest-path", str(manifests),
            "--file-check-frequency", "1s",
            "--service-port", "0",
            "--service-port-file", str(self.port_file),
        ]  # fmt: skip
        self.proc = ManagedProcess(
            name, [sys.executable, "-m", "klet.cli.main", "run", SERVICE, *flags], dir=dir / name
        )

    def record(self) -> PortRecord:
        return read_port_file(self.port_file)

    def log(self) -> str:
        return self.proc.log_path.read_text(errors="replace")[-4000:]


@pytest.fixture
def replicas(tmp_path: Path, redis_server: RedisServer) -> Iterator[list[Replica]]:
    run_dir = tmp_path / "run"
    made = [Replica(n, tmp_path, run_dir, redis_server) for n in ("a", "b")]
    try:
        yield made
    finally:
        for r in made:
            r.proc.stop()


def test_two_replicas_serve_publish_and_check_their_own_ports(
    replicas: list[Replica], tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    for r in replicas:
        assert healthcheck(r.port_file).returncode == 1  # not started: nothing to check
        r.proc.start()
    for r in replicas:
        r.proc.wait_ready(r.port_file.exists, 60, "its port file")
    a, b = (r.record() for r in replicas)
    assert a.port != b.port
    assert {a.port, b.port}.isdisjoint({10260})  # not the default: the kernel picked
    assert (a.pid, b.pid) == (replicas[0].proc.pid, replicas[1].proc.pid)

    def both_published() -> list[PortRecord] | None:
        found = live_replicas(run_dir, SERVICE)
        return found if len(found) == 2 else None

    published = wait_for(both_published, timeout_s=30, what="both replicas published")
    assert sorted(published, key=lambda p: p.port) == sorted([a, b], key=lambda p: p.port)

    def passes(r: Replica) -> subprocess.CompletedProcess[str] | None:
        result = healthcheck(r.port_file)
        return result if result.returncode == 0 else None

    for r in replicas:
        result = wait_for(
            functools.partial(passes, r),
            timeout_s=60,
            what=f"klet healthcheck of replica {r.proc.name}",
        )
        assert result.stderr == ""
    # Both healthy, only the lease holder ready (a standby stands by).
    wait_for(
        lambda: sorted(status(x, "/readyz") for x in (a, b)) == [200, 500],
        timeout_s=60,
        what="one ready replica, one standby",
    )
    assert [status(x, "/healthz") for x in (a, b)] == [200, 200]
    # klet_leader tells the two apart as /readyz does.
    assert sorted(leading(x) for x in (a, b)) == [0.0, 1.0]

    # The leader crashes: no clean exit, both of its files stay behind.
    leader_index = 0 if status(a, "/readyz") == 200 else 1
    killed, survivor = replicas[leader_index], replicas[1 - leader_index]
    dead, alive = (a, b) if leader_index == 0 else (b, a)
    killed.proc.kill()
    assert killed.port_file.exists()
    failed = healthcheck(killed.port_file)
    assert failed.returncode == 1, failed
    assert f":{dead.port}/" in failed.stderr  # it tried the dead replica's port, no other
    # The standby is healthy while nobody leads, and its check finds its own port.
    assert healthcheck(survivor.port_file).returncode == 0, survivor.log()
    assert live_replicas(run_dir, SERVICE) == [alive]
    # The dead one's was removed by the reader.
    [left] = [p.name for p in (run_dir / "ports" / SERVICE).iterdir()]
    assert left.startswith(f"{alive.hostname}-{alive.pid}-") and left.endswith(".json")
    # Once the dead leader's lease expires the standby takes over: now it is ready.
    wait_for(lambda: status(alive, "/readyz") == 200, timeout_s=60, what="the standby taking over")
    assert leading(alive) == 1.0
    assert healthcheck(survivor.port_file).returncode == 0, survivor.log()

    # A clean stop takes its files with it.
    assert survivor.proc.stop() == 0
    assert not survivor.port_file.exists()
    assert live_replicas(run_dir, SERVICE) == []
    assert list((run_dir / "ports" / SERVICE).iterdir()) == []
