"""Container log rotation and `kubectl logs` across it, on real containerd.

A node runs with containerLogMaxSize 64Ki, containerLogMaxFiles 3 and the shortest
monitor interval (3 s), and a pod whose `fast` container writes numbered lines at a few
hundred KB/s forever and whose `once` container writes for about ten seconds, prints
`end-of-run` and exits (to be restarted). syncloop rotates the logs through CRI
ReopenContainerLog: rotated files appear, older ones gzipped, never more than three
files, the total bounded. The kubelet API (served in this process over the node's pod
view, as in test_kubelet_api_containerd) then answers what `kubectl logs` asks:
`--tail` spanning into a rotated file, `--limit-bytes`, `--since`, `--previous`
(the exited container's log across its rotated and gzipped files) and `-f`, which
keeps delivering every line, in order and without gaps, across rotations.
"""

from __future__ import annotations

import concurrent.futures
import re
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from klet.testbed.pki import CertificateAuthority, CertPair

from tests.harness.node import KletNode, container_status
from tests.harness.waiting import wait_for
from tests.integration.test_kubelet_api_containerd import Client, serving_api

PAD = "x" * 80
WRITER = f"""
apiVersion: v1
kind: Pod
metadata:
  name: writer
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: fast
      image: registry.klet.test/busybox:1.36
      command:
        - sh
        - -c
        - >-
          i=0; while true; do j=0; while [ $j -lt 200 ]; do
          i=$((i+1)); j=$((j+1)); echo fast-$i-{PAD}; done; sleep 0.1; done
    - name: once
      image: registry.klet.test/busybox:1.36
      command:
        - sh
        - -c
        - >-
          i=0; while [ $i -lt 8000 ]; do j=0; while [ $j -lt 100 ]; do
          i=$((i+1)); j=$((j+1)); echo once-$i-{PAD}; done; sleep 0.1; done;
          echo end-of-run; exit 1
"""

CONFIG = """\
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerLogMaxSize: 64Ki
containerLogMaxFiles: 3
containerLogMonitorInterval: 3s
"""


def runtime_time(stamp: str) -> float:
    """Seconds of a CRI log line's RFC3339Nano time: the runtime trims trailing zeros of
    the fraction (`...40.93409Z`), so it is not always 9 digits."""
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    return datetime.fromisoformat(whole + "+00:00").timestamp() + float(f"0.{fraction or 0}")


@pytest.fixture
def pki(tmp_path: Path) -> tuple[CertificateAuthority, CertPair, CertPair]:
    ca = CertificateAuthority.create(tmp_path / "pki", "container-logs-test-ca")
    serving = ca.issue(
        "system:node:test", ["system:nodes"], ip_addresses=["127.0.0.1"], server=True
    )
    admin = ca.issue("test-admin", ["system:masters"], client=True, name="admin")
    return ca, serving, admin


@pytest.fixture
def writer(node_factory: Any, manifests: Path, tmp_path: Path) -> KletNode:
    config = tmp_path / "kubelet.yaml"
    config.write_text(CONFIG)
    node: KletNode = node_factory(manifest_dir=manifests, extra_flags=["--config", str(config)])
    node.start()
    (manifests / "writer.yaml").write_text(WRITER)

    def running() -> bool:
        pod = node.pods().get(f"writer-{node.node_name}")
        return bool(pod and pod["status"].get("phase") == "Running")

    wait_for(running, timeout_s=30, what="writer Running")
    return node


def log_dir(node: KletNode, container: str) -> Path:
    [pod_dir] = node.logs_dir.glob("default_writer-*")
    return pod_dir / container


def numbers(text: str, prefix: str) -> list[int]:
    return [int(m) for m in re.findall(rf"^{prefix}-(\d+)-", text, re.MULTILINE)]


def consecutive(values: list[int]) -> bool:
    return bool(values) and values == list(range(values[0], values[0] + len(values)))


def follow(client: Client, path: str, seconds: float) -> list[str]:
    """The lines of a followed log for `seconds`."""
    lines: list[str] = []
    deadline = time.monotonic() + seconds
    with urllib.request.urlopen(client.url + path, context=client.context(), timeout=10) as r:
        while time.monotonic() < deadline:
            raw = r.readline()
            if not raw:
                break
            lines.append(raw.decode().rstrip("\n"))
    return lines


def test_rotation_and_kubectl_logs_across_it(
    writer: KletNode, pki: tuple[CertificateAuthority, CertPair, CertPair]
) -> None:
    fast = log_dir(writer, "fast")
    pod = f"writer-{writer.node_name}"
    with serving_api(writer, pki) as (admin, _, _):
        logs = f"/containerLogs/default/{pod}/fast"
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            followed = pool.submit(follow, admin, logs + "?follow=true&tailLines=1", 12)
            rotated_at_start = set(fast.glob("0.log.*"))

            # rotation: rotated files, older ones gzipped, at most three files in all
            def compressed() -> list[Path]:
                return sorted(fast.glob("0.log.*.gz"))

            wait_for(compressed, timeout_s=20, what="a gzipped rotated log of fast")
            files = sorted(p.name for p in fast.iterdir() if not p.name.endswith(".tmp"))
            assert len(files) <= 3 and "0.log" in files, files
            assert sum(p.stat().st_size for p in fast.iterdir()) < 4 * 2**20

            # --tail reaching into the rotated files: the newest lines, in order
            current_lines = (fast / "0.log").read_bytes().count(b"\n")
            want = current_lines + 500
            status, body = admin.get(f"{logs}?tailLines={want}")
            got = numbers(body.decode(), "fast")
            assert status == 200 and len(got) == want and consecutive(got), got[:3]

            status, body = admin.get(f"{logs}?tailLines=1")
            assert status == 200 and len(numbers(body.decode(), "fast")) == 1

            # --limit-bytes
            status, body = admin.get(f"{logs}?limitBytes=100")
            assert status == 200 and len(body) == 100 and body.startswith(b"fast-")

            # --since: only recent lines (runtime timestamps), still consecutive
            status, body = admin.get(f"{logs}?sinceSeconds=2&timestamps=true")
            asked = datetime.now(UTC).timestamp()
            text = body.decode()
            stamps = [runtime_time(line.split(" ")[0]) for line in text.splitlines()]
            assert stamps and min(stamps) >= asked - 2 - 1.5 and max(stamps) <= asked + 1
            assert consecutive(numbers(re.sub(r"^\S+ ", "", text, flags=re.M), "fast"))

            # -f across rotations: every line, in order, no gaps, no repeats
            lines = followed.result(timeout=30)
        rotated_meanwhile = set(fast.glob("0.log.*")) - rotated_at_start
        assert rotated_meanwhile, "no rotation happened while following"
        seen = numbers("\n".join(lines), "fast")
        assert len(seen) > 1000 and consecutive(seen), (len(seen), seen[:3], seen[-3:])

        # --previous: the exited container's log, across its rotated (gzipped) files
        def restarted() -> bool:
            pod_json = writer.pods()[pod]
            return int(container_status(pod_json, "once").get("restartCount", 0)) >= 1

        wait_for(restarted, timeout_s=60, what="once restarted")
        once = f"/containerLogs/default/{pod}/once"
        assert list(log_dir(writer, "once").glob("0.log.*.gz")), "once was never rotated twice"
        status, body = admin.get(f"{once}?previous=true&tailLines=1")
        assert (status, body) == (200, b"end-of-run\n")
        status, body = admin.get(f"{once}?previous=true")
        text = body.decode()
        assert status == 200 and text.endswith("once-8000-" + PAD + "\nend-of-run\n")
        got = numbers(text, "once")
        assert consecutive(got) and got[-1] == 8000
