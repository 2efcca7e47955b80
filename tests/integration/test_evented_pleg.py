"""The evented PLEG on real containerd 1.6 (its own events API; CRI GetContainerEvents
is UNIMPLEMENTED there).

With the safety-net relist set to 120 s, only the event path can report in time:
- a container whose process is SIGKILLed shows as terminated in `/pods` with no
  further relist (the relist counter does not move);
- a container that dies while containerd is down (SIGKILLed daemon, shims alive) is
  reported once containerd is back: the stream drops, syncloop re-subscribes and relists
  everything at once.
- with featureGates.EventedPLEG=false no stream is opened and PLEG relists every second.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from klet.devstack import DevStack

from tests.harness.node import RELISTS, KletNode, container_status
from tests.harness.pods import running
from tests.harness.waiting import wait_for

SLEEPER = """
apiVersion: v1
kind: Pod
metadata:
  name: sleeper
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
    - name: main
      image: registry.klet.test/busybox:1.36
      command: ["sleep", "100000"]
"""

STREAM_UP = "klet_syncloop_runtime_event_stream_up"
STREAMS = "klet_syncloop_runtime_event_streams_total"
STREAM_ERRORS = "klet_syncloop_runtime_event_stream_errors_total"
EVENTS = "klet_syncloop_runtime_events_total"
LONG_RELIST = ["--evented-pleg-relist-period", "120s"]


def task_pid(stack: DevStack, container_id: str) -> int:
    """The host PID of a CRI container's init process (`ctr tasks ls`)."""
    assert stack.containerd is not None
    for line in stack.containerd.ctr(["tasks", "ls"], timeout_s=30).splitlines()[1:]:
        fields = line.split()
        if fields and fields[0] == container_id:
            return int(fields[1])
    raise LookupError(f"no task {container_id}")


def start_sleeper(node: KletNode, manifests: Path) -> str:
    """Start the node with the sleeper pod; its container ID once Running and subscribed."""
    node.start()
    # subscribed (and its catch-up relist done) long before the pod runs
    wait_for(lambda: node.metric("syncloop", STREAM_UP) == 1.0, timeout_s=30, what="stream up")
    (manifests / "sleeper.yaml").write_text(SLEEPER)
    pod = wait_for(lambda: running(node, "sleeper"), timeout_s=90, what="sleeper Running")
    return str(container_status(pod, "main")["containerID"]).removeprefix("containerd://")


def terminated(node: KletNode) -> dict[str, Any] | None:
    pod = node.pods().get(f"sleeper-{node.node_name}")
    if pod is None:
        return None
    state = container_status(pod, "main").get("state", {})
    return state.get("terminated")


def test_a_killed_container_is_reported_without_a_relist(
    node_factory: Any, manifests: Path, devstack: DevStack
) -> None:
    node: KletNode = node_factory(manifest_dir=manifests, extra_flags=LONG_RELIST)
    cid = start_sleeper(node, manifests)
    relists = node.metric("syncloop", RELISTS)
    os.kill(task_pid(devstack, cid), signal.SIGKILL)
    done = wait_for(lambda: terminated(node), timeout_s=60, what="sleeper terminated in /pods")
    assert done["exitCode"] == 137 and done["reason"] == "Error"
    assert node.metric("syncloop", RELISTS) == relists  # the event did it, not a relist
    assert (node.metric("syncloop", EVENTS, kind="exited") or 0) >= 1
    assert node.metric("syncloop", STREAMS, source="containerd") == 1


def test_a_death_while_containerd_is_down_is_reported_after_resubscribing(
    node_factory: Any, manifests: Path, devstack: DevStack
) -> None:
    assert devstack.containerd is not None
    node: KletNode = node_factory(manifest_dir=manifests, extra_flags=LONG_RELIST)
    cid = start_sleeper(node, manifests)
    pid = task_pid(devstack, cid)
    relists = node.metric("syncloop", RELISTS) or 0
    devstack.containerd.crash()  # SIGKILL: the shims and containers live on
    try:
        wait_for(lambda: node.metric("syncloop", STREAM_UP) == 0.0, timeout_s=30, what="drop")
        os.kill(pid, signal.SIGKILL)
    finally:
        devstack.containerd.recover()
    done = wait_for(lambda: terminated(node), timeout_s=90, what="sleeper terminated in /pods")
    assert done["exitCode"] == 137
    assert (node.metric("syncloop", STREAM_ERRORS) or 0) >= 1
    assert node.metric("syncloop", STREAMS, source="containerd") == 2
    assert node.metric("syncloop", STREAM_UP) == 1.0
    assert (node.metric("syncloop", RELISTS) or 0) > relists  # the catch-up relist


def test_the_gate_off_relists_every_second(node_factory: Any, manifests: Path) -> None:
    node: KletNode = node_factory(
        manifest_dir=manifests, extra_flags=[*LONG_RELIST, "--feature-gates", "EventedPLEG=false"]
    )
    node.start()
    node.wait_passes("syncloop", RELISTS, 3, timeout_s=60)
    assert node.metric("syncloop", STREAMS) is None
    assert (node.metric("syncloop", STREAM_UP) or 0.0) == 0.0
