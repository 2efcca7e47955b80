"""`klet events` against a real standalone node, run as a process as an operator would,
with status-reporter's bus user: a pod whose image does not exist shows its Pulling,
Failed and BackOff Events with BackOff folded into one row whose count is the number of
records on the bus; a pod that starts shows Pulled/Created/Started; `-n` filters; a
corrupt stream entry is skipped with a warning naming its key and ID; `-f` prints an
Event recorded after it started; and no consumer group is created or read by it (the
only group is status-reporter's `pod-history`)."""

from __future__ import annotations

import asyncio
import json
import os
import selectors
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from klet.bus.acl import SERVICES

from tests.harness.node import KletNode, bus_events
from tests.harness.pods import running
from tests.harness.waiting import wait_for

MISSING = """
apiVersion: v1
kind: Pod
metadata:
  name: nosuchimage
  namespace: kube-system
spec:
  containers:
    - name: main
      image: registry.klet.test/klet-events-no-such-image:1
"""

STARTS = """
apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: main
      image: registry.klet.test/busybox:1.36
      command: ["sleep", "100000"]
"""


def klet_events(node: KletNode, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "klet.cli.main",
        "events",
        *node.redis_flags("status-reporter"),
        *args,
    ]


def run_events(node: KletNode, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        klet_events(node, *args), capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0, done.stderr
    return done


def events_json(node: KletNode, *args: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(run_events(node, "-o", "json", *args).stdout)["items"]
    return items


def backoff_of(items: list[dict[str, Any]], pod: str) -> dict[str, Any]:
    return next(e for e in items if e["reason"] == "BackOff" and e["involvedObject"]["name"] == pod)


def test_events_of_a_failing_and_a_starting_pod(node_factory: Any, manifests: Path) -> None:
    node: KletNode = node_factory(manifest_dir=manifests)
    node.start()
    missing = f"nosuchimage-{node.node_name}"
    (manifests / "missing.yaml").write_text(MISSING)
    (manifests / "starts.yaml").write_text(STARTS.format(name="starts"))
    wait_for(lambda: running(node, "starts"), timeout_s=30, what="starts Running")
    # The back-off repeats: wait until klet events has folded at least two BackOffs.
    wait_for(
        lambda: backoff_of(events_json(node), missing)["count"] >= 2,
        timeout_s=60,
        what="BackOff of nosuchimage twice in klet events",
    )
    # Nothing records more once syncloop is gone: the counts can be compared exactly.
    node.stop("syncloop")
    on_bus = [e for e in bus_events(node) if e.involved.get("name") == missing]
    items = events_json(node)
    row = backoff_of(items, missing)
    assert row["count"] == sum(1 for e in on_bus if e.reason == "BackOff")
    assert row["type"] == "Normal" and row["metadata"]["namespace"] == "kube-system"
    assert row["involvedObject"]["fieldPath"] == "spec.containers{main}"
    assert row["firstTimestamp"] <= row["lastTimestamp"]
    reasons = {(e["reason"], e["message"]) for e in items if e["involvedObject"]["name"] == missing}
    image = "registry.klet.test/klet-events-no-such-image:1"
    assert ("Pulling", f'Pulling image "{image}"') in reasons
    assert ("Failed", "Error: ErrImagePull") in reasons or (
        "Failed",
        "Error: ImagePullBackOff",
    ) in reasons
    assert any(
        r == "Failed" and m.startswith(f'Failed to pull image "{image}"') for r, m in reasons
    )
    started = f"starts-{node.node_name}"
    assert {"Created", "Started"} <= {
        e["reason"] for e in items if e["involvedObject"]["name"] == started
    }
    # Every record is in some row: the counts add up to what the streams hold.
    assert sum(e["count"] for e in items) == len(bus_events(node))

    # The table, as kubectl prints it.
    table = run_events(node).stdout.splitlines()
    assert table[0].split() == ["NAMESPACE", "LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    backoff = next(line for line in table if " BackOff " in line and missing in line)
    assert backoff.startswith("kube-system ")
    assert f"(x{row['count']} over " in backoff and f"pod/{missing}" in backoff
    assert any(
        line.startswith("default ") and " Started " in line and f"pod/{started}" in line
        for line in table
    )
    wide = run_events(node, "-o", "wide").stdout.splitlines()
    assert "SUBOBJECT" in wide[0] and "COUNT" in wide[0] and "FIRST SEEN" in wide[0]
    # -n: one namespace, no NAMESPACE column.
    only = run_events(node, "-n", "default").stdout.splitlines()
    assert only[0].split()[:2] == ["LAST", "SEEN"]
    assert not any(missing in line for line in only) and any(started in line for line in only)

    # A corrupt entry: skipped with a warning naming the key and the entry ID.
    bad_id = asyncio.run(add_raw(node, "events:syncloop", {"r": '{"v": 1, "reason": 3}'}))
    done = run_events(node, "-o", "json")
    assert f"skipping entry {bad_id} of klet:{node.node_name}:events:syncloop" in done.stderr
    assert sum(e["count"] for e in json.loads(done.stdout)["items"]) == len(on_bus_all(node)) - 1

    # Reading took nothing from anyone: standalone, the only consumer group is the one
    # status-reporter's leader records the pods' histories with, and klet events read
    # nothing through it (every one of its entries was delivered to that leader).
    found = asyncio.run(groups(node))
    assert {g["name"] for gs in found.values() for g in gs} == {"pod-history"}
    for gs in found.values():
        assert all(g["consumers"] <= 1 for g in gs), gs


def test_follow_prints_an_event_recorded_after_it_started(
    node_factory: Any, manifests: Path
) -> None:
    node: KletNode = node_factory(manifest_dir=manifests)
    node.start()
    proc = subprocess.Popen(
        klet_events(node, "-f"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    lines = Lines(proc)
    try:
        header = lines.until(lambda line: "LAST SEEN" in line, timeout_s=20)
        assert header.split()[0] == "NAMESPACE"
        (manifests / "late.yaml").write_text(STARTS.format(name="late"))
        late = f"pod/late-{node.node_name}"
        started = lines.until(lambda line: " Started " in line and late in line, timeout_s=60)
        assert started.startswith("default ") and "Normal" in started
    finally:
        lines.selector.close()
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()
        errors = proc.stderr.read()
        proc.stderr.close()
    assert "Traceback" not in errors, errors


class Lines:
    """The lines a running process writes, waited for with a deadline."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        self.proc = proc
        self.stdout = proc.stdout
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.stdout, selectors.EVENT_READ)
        self.seen: list[str] = []

    def until(self, wanted: Any, *, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            if not self.selector.select(timeout=left):
                continue
            line = self.stdout.readline()
            if not line:
                raise AssertionError(f"klet events exited {self.proc.wait()}; saw {self.seen}")
            self.seen.append(line.rstrip("\n"))
            if wanted(line):
                return line.rstrip("\n")
        raise AssertionError(f"no such line in {timeout_s}s; saw {self.seen}")


async def add_raw(node: KletNode, stream: str, fields: dict[str, str]) -> str:
    bus = node.bus()
    try:
        return str(await bus.client.xadd(bus.key(stream), fields))  # type: ignore[arg-type]
    finally:
        await bus.close()


def on_bus_all(node: KletNode) -> list[Any]:
    """Every entry of the node's Event streams, decodable or not."""

    async def go() -> list[Any]:
        bus = node.bus()
        try:
            found: list[Any] = []
            for service in SERVICES:
                found += await bus.client.xrange(bus.key(f"events:{service}"))
            return found
        finally:
            await bus.close()

    return asyncio.run(go())


async def groups(node: KletNode) -> dict[str, Any]:
    bus = node.bus()
    try:
        out = {}
        for service in SERVICES:
            key = bus.key(f"events:{service}")
            if await bus.client.exists(key) and (found := await bus.client.xinfo_groups(key)):
                out[key] = found
        return out
    finally:
        await bus.close()
