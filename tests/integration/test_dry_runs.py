"""`klet gc --dry-run` and `klet evict --dry-run` against the running services on real
containerd and Redis (the harness's KletNode processes), run as an operator runs them:

- GC: a static pod whose manifest was removed leaves a stopped sandbox, an exited
  container and a log directory; the dry-run lists exactly those (container with its
  writable-layer bytes, sandbox, log directory with its files' bytes) and, with
  `--threshold 1`, the unused image pulled for the test; nothing is removed by any
  dry-run (same images, containers, sandboxes, log files, `images` table and Events
  before and after); a CollectNow then removes exactly the containers and sandboxes
  the dry-run listed;
- eviction: two apiserver pods (played by the test as pod-source's api source, as
  tests/integration/test_eviction.py does), one BestEffort and one within a 1Gi memory
  request; with the configured thresholds nothing is met and every signal is listed
  with its value; with `--signal memory.available<99%` (a threshold any machine is
  below) memory.available is met, the BestEffort pod is first and marked for eviction
  with upstream's message and grace 1 s, the other is second; nothing changes: the
  same containers keep running, the pods stay Running, no Evicted event, no
  MemoryPressure, no eviction counted, and the next real pass evicts nobody (the
  hypothetical threshold did not leak into the manager); a bad threshold is refused
  naming `--signal` (exit 2);
- a service that is not running is named with the socket path looked at (exit 1).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from klet.cri import CRISettings, RuntimeClient
from klet.cri import labels as L
from klet.devstack import HTTPD_IMAGE, DevStack
from klet.model.layout import IMAGE_GC, grpc_socket
from klet.rpc.gc import GarbageCollectorClient

from tests.harness.node import EVICTION_PASSES, KletNode, bus_events, fetch
from tests.harness.pods import running
from tests.harness.waiting import wait_for
from tests.integration.conftest import remove_node_pods
from tests.integration.test_eviction import api_pod, node_conditions, phase, publish

BUSYBOX = "registry.klet.test/busybox:1.36"


def static_pod(name: str) -> str:
    return f"""
apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: main
      image: {BUSYBOX}
      command: ["sh", "-c", "echo {name} is up; sleep 100000"]
"""


# Fails twice, then succeeds (a counter in its emptyDir): three exited instances of one
# container, of which container GC keeps the newest. The restart back-off is capped at
# 1 s by the node's configuration file.
THIRD_TIME_LUCKY = f"""
apiVersion: v1
kind: Pod
metadata:
  name: done
spec:
  restartPolicy: OnFailure
  terminationGracePeriodSeconds: 1
  volumes: [{{name: data, emptyDir: {{}}}}]
  containers:
    - name: try
      image: {BUSYBOX}
      volumeMounts: [{{name: data, mountPath: /data}}]
      command: ["sh", "-c", "n=$(ls /data | wc -l); touch /data/$n; echo try $n; [ $n -ge 2 ]"]
"""
CONFIG = """\
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
crashLoopBackOff:
  maxContainerRestartPeriod: 1s
"""


def klet(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "klet.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def ok(*args: str) -> str:
    done = klet(*args)
    assert done.returncode == 0, done.stderr
    return done.stdout


def cri_call(stack: DevStack, fn: Any) -> Any:
    async def go() -> Any:
        cri = RuntimeClient(CRISettings(runtime_endpoint=stack.runtime_endpoint, timeout_s=60))
        try:
            return await fn(cri)
        finally:
            await cri.close()

    return asyncio.run(go())


def runtime_state(stack: DevStack) -> dict[str, Any]:
    async def go(cri: RuntimeClient) -> dict[str, Any]:
        return {
            "images": sorted((i.id, i.repo_tags) for i in await cri.list_images()),
            "sandboxes": sorted((s.id, s.state.value) for s in await cri.list_pod_sandboxes()),
            "containers": sorted((c.id, c.state.value) for c in await cri.list_containers()),
        }

    state: dict[str, Any] = cri_call(stack, go)
    return state


def files(root: Path) -> list[tuple[str, int]]:
    return sorted(
        (str(Path(d, f).relative_to(root)), os.lstat(Path(d, f)).st_size)
        for d, _, names in os.walk(root)
        for f in names
    )


def bus_hash(node: KletNode, name: str) -> dict[Any, Any]:
    async def go() -> dict[Any, Any]:
        bus = node.bus()
        try:
            return dict(await bus.client.hgetall(bus.key(name)))
        finally:
            await bus.close()

    return asyncio.run(go())


def ready(node: KletNode, service: str) -> bool:
    try:
        fetch(f"http://127.0.0.1:{node.ports[service]}/readyz")
    except OSError:
        return False
    return True


@pytest.fixture
def gc_node(devstack: DevStack, tmp_path: Path) -> Iterator[tuple[KletNode, Path]]:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    config = tmp_path / "kubelet.yaml"
    config.write_text(CONFIG)
    node = KletNode(
        devstack,
        tmp_path / "n",
        node_name="drygc",
        manifest_dir=manifests,
        # The periodic image pass off (and CollectNow's below any real disk use), so
        # this test never removes the shared stack's images; --threshold answers for 1%.
        extra_flags=[
            "--config",
            str(config),
            "--image-gc-high-threshold",
            "100",
            "--image-gc-low-threshold",
            "80",
            "--minimum-image-ttl-duration",
            "0s",
        ],
    )
    try:
        yield node, manifests
    finally:
        node.stop()
        asyncio.run(remove_node_pods(devstack.runtime_endpoint, node.node_name))
        node.release_mounts()


def test_gc_dry_run_lists_what_a_pass_removes_and_removes_nothing(
    gc_node: tuple[KletNode, Path], devstack: DevStack
) -> None:
    node, manifests = gc_node
    run_dir = str(node.dir / "run")
    cri_call(devstack, lambda cri: cri.pull_image(HTTPD_IMAGE))
    for name in ("gone", "stays"):
        (manifests / f"{name}.yaml").write_text(static_pod(name))
    (manifests / "done.yaml").write_text(THIRD_TIME_LUCKY)
    node.start()
    for name in ("gone", "stays"):
        wait_for(lambda n=name: running(node, n), timeout_s=60, what=f"{name} Running")
    (manifests / "gone.yaml").unlink()
    gone, done = f"gone-{node.node_name}", f"done-{node.node_name}"

    def settled() -> bool:
        async def go(cri: RuntimeClient) -> bool:
            left = await cri.list_pod_sandboxes(label_selector={L.POD_NAME: gone})
            tries = await cri.list_containers(label_selector={L.POD_NAME: done})
            exited = [c for c in tries if c.state.value == "CONTAINER_EXITED"]
            return not left and len(exited) == 3

        return bool(cri_call(devstack, go)) and node.pods()[done]["status"]["phase"] == "Succeeded"

    # syncloop has removed the deleted pod's sandbox (its log directory stays for GC),
    # and the third attempt of "done" succeeded: two dead instances beyond the one kept.
    wait_for(settled, timeout_s=60, what="the deleted pod gone and done Succeeded")
    wait_for(lambda: ready(node, "image-gc"), timeout_s=30, what="image-gc ready")

    before = runtime_state(devstack)
    logs_before = files(node.logs_dir)
    images_table = bus_hash(node, "images")
    events_before = len(bus_events(node))

    plan = json.loads(ok("gc", "--dry-run", "--run-dir", run_dir, "-o", "json"))
    text = ok("gc", "--dry-run", "--run-dir", run_dir)
    what_if = json.loads(
        ok("gc", "--dry-run", "--run-dir", run_dir, "--threshold", "1", "-o", "json")
    )
    print(text)
    print(ok("gc", "--dry-run", "--run-dir", run_dir, "--threshold", "1"))

    assert runtime_state(devstack) == before
    assert files(node.logs_dir) == logs_before
    assert bus_hash(node, "images") == images_table
    assert len(bus_events(node)) == events_before

    [log] = [r for r in plan["removals"] if r["pod"] == f"default/{gone}"]
    assert (log["kind"], log["reason"]) == ("log-dir", "pod gone")
    log_dir = log["id"]
    assert log["bytes"] == sum(s for p, s in logs_before if p.startswith(f"{log_dir}/")) > 0
    dead = [r for r in plan["removals"] if r["pod"] == f"default/{done}"]
    assert [(r["kind"], r["name"], r["reason"]) for r in dead] == [
        ("container", "try", "dead, beyond the dead instances kept")
    ] * 2
    assert not [r for r in plan["removals"] if "stays" in r["pod"]]
    assert plan["high_threshold_percent"] == 100
    assert plan["problem"] == "image GC is off: imageGCHighThresholdPercent is 100"
    assert not [r for r in plan["removals"] if r["kind"] == "image"]
    assert f"default/{gone}" in text and "beyond the dead instances kept" in text

    assert (what_if["high_threshold_percent"], what_if["low_threshold_percent"]) == (1, 1)
    images = {r["name"]: r for r in what_if["removals"] if r["kind"] == "image"}
    assert HTTPD_IMAGE in images and images[HTTPD_IMAGE]["bytes"] > 0
    assert BUSYBOX not in images  # "stays" uses it

    async def collect() -> Any:
        client = GarbageCollectorClient(grpc_socket(node.dir / "run", IMAGE_GC), timeout_s=60)
        try:
            return await client.collect_now()
        finally:
            await client.close()

    asyncio.run(collect())
    after = runtime_state(devstack)
    planned = {r["id"] for r in plan["removals"] if r["kind"] in ("container", "sandbox")}
    removed = {i for i, _ in before["containers"] + before["sandboxes"]} - {
        i for i, _ in after["containers"] + after["sandboxes"]
    }
    assert removed == planned
    assert not (node.logs_dir / log_dir).exists()


@pytest.fixture
def evict_node(devstack: DevStack, tmp_path: Path) -> Iterator[KletNode]:
    node = KletNode(devstack, tmp_path / "n", node_name="dryevict")
    try:
        yield node
    finally:
        node.stop()
        uids = [p["metadata"]["uid"] for p in getattr(node, "test_pods", [])]
        asyncio.run(remove_node_pods(devstack.runtime_endpoint, node.node_name, uids=uids))
        node.release_mounts()


def test_evict_dry_run_ranks_the_pods_and_evicts_nobody(
    evict_node: KletNode, devstack: DevStack
) -> None:
    node = evict_node
    run_dir = str(node.dir / "run")
    hog = api_pod(node, "hog", command=["sleep", "100000"])
    calm = api_pod(node, "calm", command=["sleep", "100000"], requests={"memory": "1Gi"})
    node.test_pods = [hog, calm]  # type: ignore[attr-defined]
    node.start("syncloop", "status-reporter", "eviction")
    publish(node, hog, calm)
    for name in ("hog", "calm"):
        wait_for(lambda n=name: phase(node, n) == "Running", timeout_s=60, what=f"{name} Running")
    wait_for(lambda: ready(node, "eviction"), timeout_s=30, what="eviction ready")

    def containers() -> list[tuple[str, str, str]]:
        async def go(cri: RuntimeClient) -> list[tuple[str, str, str]]:
            uids = {hog["metadata"]["uid"], calm["metadata"]["uid"]}
            return sorted(
                (c.labels.get(L.POD_NAME, ""), c.id, c.state.value)
                for c in await cri.list_containers()
                if c.labels.get(L.POD_UID) in uids
            )

        return list(cri_call(devstack, go))

    before = containers()
    assert len(before) == 2 and all(s == "CONTAINER_RUNNING" for _, _, s in before)
    events_before = len(bus_events(node))

    now = json.loads(ok("evict", "--dry-run", "--run-dir", run_dir, "-o", "json"))
    print(ok("evict", "--dry-run", "--run-dir", run_dir))
    signals = {s["signal"]: s for s in now["signals"]}
    assert {"memory.available", "nodefs.available", "pid.available"} <= set(signals)
    memory = signals["memory.available"]
    assert memory["threshold"] == "memory.available<100Mi (hard)"
    assert memory["capacity"] > memory["available"] > memory["threshold_value"] == 100 << 20
    assert not memory["met"] and now["signal"] == "" and now["pods"] == []
    assert now["summary"] == "no threshold is met: nothing would be evicted"

    what_if = json.loads(
        ok(
            "evict",
            "--dry-run",
            "--run-dir",
            run_dir,
            "--signal",
            "memory.available<99%",
            "-o",
            "json",
        )
    )
    print(ok("evict", "--dry-run", "--run-dir", run_dir, "--signal", "memory.available<99%"))
    assert what_if["thresholds"][0] == "memory.available<99% (hard)"
    assert what_if["signal"] == "memory.available"
    assert what_if["conditions"] == ["MemoryPressure"]
    ranked = [(p["pod"], p["evict"]) for p in what_if["pods"]]
    assert ranked == [("default/hog", True), ("default/calm", False)], what_if["pods"]
    first = what_if["pods"][0]
    assert first["grace_period_s"] == 1
    assert first["message"].startswith("The node was low on resource: memory. Threshold quantity: ")
    assert first["reason"].startswith("memory working set ") and "no request" in first["reason"]
    assert "within its request 1Gi" in what_if["pods"][1]["reason"]
    assert (
        what_if["summary"] == "memory.available is met: would evict default/hog (one pod per pass)"
    )

    bad = klet("evict", "--dry-run", "--run-dir", run_dir, "--signal", "memory.available<-1Gi")
    assert bad.returncode == 2
    assert "--signal.memory.available: eviction threshold memory.available must be positive" in (
        bad.stderr
    )

    node.wait_passes("eviction", EVICTION_PASSES, 2, timeout_s=60)
    assert containers() == before
    assert phase(node, "hog") == phase(node, "calm") == "Running"
    assert node_conditions(node).get("MemoryPressure") == "False"
    assert not [
        e
        for e in bus_events(node)[events_before:]
        if e.reason in ("Evicted", "EvictionThresholdMet")
    ]
    assert (
        node.metric("eviction", "kubelet_evictions", eviction_signal="memory.available") or 0
    ) == 0


def test_a_service_not_running_is_named(tmp_path: Path) -> None:
    done = klet("gc", "--dry-run", "--run-dir", str(tmp_path))
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "klet gc: image-gc is not running here: no socket at "
        f"{tmp_path}/grpc/image-gc/image-gc.sock"
    )
    done = klet("evict", "--dry-run", "--run-dir", str(tmp_path))
    assert done.returncode == 1 and "eviction is not running here" in done.stderr
