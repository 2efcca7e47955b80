"""Lifecycle hooks and termination reporting on real containerd, seen from outside.

postStart runs before the container counts as started (the main process waits for the
file the hook writes), and a failing postStart records FailedPostStartHook and restarts
the container; preStop runs before the stop signal (it writes the termination message,
which `/pods` then reports), a preStop `sleep` delays the stop by its length but never
past the grace period; the image's StopSignal is what the process receives; the
message file lives under the node's root dir and goes with the pod;
FallbackToLogsOnError reports the log tail of a failed container; a container over its
memory limit is reported OOMKilled with exit code 137, and as lastState once restarted.
"""

from __future__ import annotations

import asyncio
import functools
import time
from pathlib import Path
from typing import Any

from klet.devstack import DevStack
from klet.devstack.images import USR1_STOP_IMAGE
from klet.model.layout import SYNCLOOP, grpc_socket
from klet.model.types import PodUID
from klet.rpc.podcontrol import PodControlClient

from tests.harness.node import KletNode, bus_events, container_status
from tests.harness.pods import running, runtime_sandboxes
from tests.harness.waiting import wait_for

BUSYBOX = "registry.klet.test/busybox:1.36"
# A main process that exits at once on SIGTERM (PID 1 ignores signals it does not trap).
SLEEPER = "trap 'exit 0' TERM; sleep 100000 & wait"


def kill(node: KletNode, uid: str, *, grace_s: int) -> None:
    async def go() -> None:
        client = PodControlClient(grpc_socket(node.dir / "run", SYNCLOOP), timeout_s=60)
        try:
            assert await client.kill_pod(
                PodUID(uid), grace_period_s=grace_s, reason="Test", message="killed by the test"
            )
        finally:
            await client.close()

    asyncio.run(go())


def terminated(node: KletNode, full: str, container: str = "main") -> dict[str, Any] | None:
    pod = node.pods().get(full)
    if pod is None:
        return None
    state: dict[str, Any] | None = container_status(pod, container)["state"].get("terminated")
    return state


def log_lines(node: KletNode, full: str, container: str = "main") -> list[str]:
    log_file = next(node.logs_dir.glob(f"default_{full}_*")) / container / "0.log"
    return [line.split(" ", 3)[3] for line in log_file.read_text().splitlines()]


POST_START = f"""
apiVersion: v1
kind: Pod
metadata: {{name: poststart}}
spec:
  terminationGracePeriodSeconds: 2
  containers:
    - name: main
      image: {BUSYBOX}
      command:
        - sh
        - -c
        - "while [ ! -f /tmp/ready ]; do sleep 0.1; done; echo saw $(cat /tmp/ready); {SLEEPER}"
      lifecycle:
        postStart:
          exec: {{command: ["sh", "-c", "echo hook-wrote-this > /tmp/ready"]}}
"""

FAILING_POST_START = f"""
apiVersion: v1
kind: Pod
metadata: {{name: badhook}}
spec:
  terminationGracePeriodSeconds: 2
  containers:
    - name: main
      image: {BUSYBOX}
      command: ["sh", "-c", "{SLEEPER}"]
      lifecycle:
        postStart:
          exec: {{command: ["sh", "-c", "echo no way >&2; exit 3"]}}
"""


def test_post_start_runs_before_the_container_counts_as_started(
    node_factory: Any, manifests: Path
) -> None:
    node: KletNode = node_factory(manifest_dir=manifests)
    node.start()
    (manifests / "poststart.yaml").write_text(POST_START)
    (manifests / "badhook.yaml").write_text(FAILING_POST_START)
    full = f"poststart-{node.node_name}"
    pod = wait_for(lambda: running(node, "poststart"), timeout_s=30, what="poststart Running")
    assert container_status(pod, "main")["restartCount"] == 0
    wait_for(
        lambda: log_lines(node, full) == ["saw hook-wrote-this"],
        timeout_s=10,
        what="the main process to see the file the postStart hook wrote",
    )

    bad = f"badhook-{node.node_name}"

    def restarted() -> dict[str, Any] | None:
        cs = container_status(node.pods()[bad], "main")
        return cs if cs["restartCount"] >= 1 and cs["lastState"].get("terminated") else None

    cs = wait_for(restarted, timeout_s=40, what="badhook restarted after its postStart failed")
    # Killed right after its start: SIGTERM ends the trapping shell with exit 0.
    assert cs["lastState"]["terminated"]["exitCode"] == 0
    recorded = [
        (e.involved["name"], e.type, e.reason, e.message, e.involved.get("fieldPath"))
        for e in bus_events(node)
    ]
    path = "spec.containers{main}"
    assert (bad, "Warning", "FailedPostStartHook", "PostStartHook failed", path) in recorded
    assert (bad, "Normal", "Killing", "FailedPostStartHook", path) in recorded
    assert not [r for r in recorded if r[0] == full and r[2] == "FailedPostStartHook"]


PRE_STOP_MESSAGE = f"""
apiVersion: v1
kind: Pod
metadata: {{name: prestop}}
spec:
  terminationGracePeriodSeconds: 20
  containers:
    - name: main
      image: {BUSYBOX}
      command: ["sh", "-c", "{SLEEPER}"]
      lifecycle:
        preStop:
          exec: {{command: ["sh", "-c", "echo bye > /dev/termination-log"]}}
"""


def test_pre_stop_writes_the_termination_message_before_the_stop(
    node_factory: Any, manifests: Path, devstack: DevStack
) -> None:
    node: KletNode = node_factory(manifest_dir=manifests)
    node.start()
    path = manifests / "prestop.yaml"
    path.write_text(PRE_STOP_MESSAGE)
    pod = wait_for(lambda: running(node, "prestop"), timeout_s=30, what="prestop Running")
    uid = pod["metadata"]["uid"]
    full = f"prestop-{node.node_name}"
    files = list((node.root_dir / "pods" / uid / "containers" / "main").iterdir())
    assert len(files) == 1 and files[0].read_text() == ""  # the mounted message file

    kill(node, uid, grace_s=20)
    state = wait_for(lambda: terminated(node, full), timeout_s=20, what="prestop terminated")
    assert state["message"] == "bye\n"
    assert state["exitCode"] == 0 and state["reason"] == "Completed"  # it got SIGTERM after
    assert files[0].read_text() == "bye\n"

    path.unlink()  # the pod is removed for good: its directory goes with it
    wait_for(lambda: not runtime_sandboxes(devstack, full), timeout_s=30, what="sandbox removed")
    wait_for(
        lambda: not (node.root_dir / "pods" / uid).exists(),
        timeout_s=10,
        what="the pod's directory removed",
    )


def removed(stack: DevStack, full: str) -> bool:
    return not runtime_sandboxes(stack, full)


def sleepy(name: str, *, sleep_s: int, grace_s: int) -> str:
    # The shell writes the time SIGTERM arrived into its log, then exits.
    return f"""
apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  terminationGracePeriodSeconds: {grace_s}
  containers:
    - name: main
      image: {BUSYBOX}
      command: ["sh", "-c", "trap 'echo TERM at $(date +%s); exit 0' TERM; sleep 100000 & wait"]
      lifecycle:
        preStop:
          sleep: {{seconds: {sleep_s}}}
"""


def test_pre_stop_sleep_delays_the_stop_but_not_past_the_grace_period(
    node_factory: Any, manifests: Path, devstack: DevStack
) -> None:
    node: KletNode = node_factory(manifest_dir=manifests)
    node.start()
    # "short": a 4 s sleep well inside its grace; "capped": 60 s of sleep, 3 s of grace.
    (manifests / "short.yaml").write_text(sleepy("short", sleep_s=4, grace_s=30))
    (manifests / "capped.yaml").write_text(sleepy("capped", sleep_s=60, grace_s=3))
    for name in ("short", "capped"):
        wait_for(functools.partial(running, node, name), timeout_s=30, what=f"{name} Running")
    removed_at = time.time()
    (manifests / "short.yaml").unlink()
    (manifests / "capped.yaml").unlink()
    took: dict[str, float] = {}
    for name in ("short", "capped"):
        full = f"{name}-{node.node_name}"
        log_dir = next(node.logs_dir.glob(f"default_{full}_*"))
        wait_for(functools.partial(removed, devstack, full), timeout_s=40, what=f"{name} removed")
        [line] = [x for x in (log_dir / "main" / "0.log").read_text().splitlines() if "TERM" in x]
        took[name] = int(line.rsplit(" ", 1)[1]) - removed_at
    # `date +%s` has whole seconds: allow one second of rounding below.
    assert 4 - 1 <= took["short"] < 4 + 8, took
    assert 3 - 1 <= took["capped"] < 3 + 8, took


STOP_SIGNAL = f"""
apiVersion: v1
kind: Pod
metadata: {{name: stopsig}}
spec:
  terminationGracePeriodSeconds: 20
  containers:
    - name: main
      image: {USR1_STOP_IMAGE}
      command:
        - sh
        - -c
        - >-
          trap 'echo got USR1 > /dev/termination-log; exit 0' USR1;
          trap 'echo got TERM > /dev/termination-log; exit 0' TERM;
          sleep 100000 & wait
"""


def test_the_image_stop_signal_reaches_the_process(node_factory: Any, manifests: Path) -> None:
    node: KletNode = node_factory(manifest_dir=manifests)
    node.start()
    (manifests / "stopsig.yaml").write_text(STOP_SIGNAL)
    pod = wait_for(lambda: running(node, "stopsig"), timeout_s=30, what="stopsig Running")
    kill(node, pod["metadata"]["uid"], grace_s=20)
    full = f"stopsig-{node.node_name}"
    state = wait_for(lambda: terminated(node, full), timeout_s=20, what="stopsig terminated")
    assert state["message"] == "got USR1\n"
    assert state["exitCode"] == 0


MESSAGES = f"""
apiVersion: v1
kind: Pod
metadata: {{name: messages}}
spec:
  restartPolicy: Never
  containers:
    - name: fails
      image: {BUSYBOX}
      command: ["sh", "-c", "echo first line; echo the last words; exit 3"]
      terminationMessagePolicy: FallbackToLogsOnError
    - name: succeeds
      image: {BUSYBOX}
      command: ["sh", "-c", "echo all good; exit 0"]
      terminationMessagePolicy: FallbackToLogsOnError
    - name: writes
      image: {BUSYBOX}
      command: ["sh", "-c", "echo from the file > /tmp/why; echo from the log; exit 4"]
      terminationMessagePath: /tmp/why
      terminationMessagePolicy: FallbackToLogsOnError
"""


def test_termination_messages_from_the_file_or_the_log_tail(
    node_factory: Any, manifests: Path
) -> None:
    node: KletNode = node_factory(manifest_dir=manifests)
    node.start()
    (manifests / "messages.yaml").write_text(MESSAGES)
    full = f"messages-{node.node_name}"
    pod = wait_for(
        lambda: (p := node.pods().get(full)) and p["status"]["phase"] == "Failed" and p,
        timeout_s=30,
        what="messages Failed",
    )
    fails = container_status(pod, "fails")["state"]["terminated"]
    assert fails["exitCode"] == 3 and fails["message"] == "first line\nthe last words\n"
    succeeds = container_status(pod, "succeeds")["state"]["terminated"]
    assert succeeds["exitCode"] == 0 and "message" not in succeeds
    writes = container_status(pod, "writes")["state"]["terminated"]
    assert writes["exitCode"] == 4 and writes["message"] == "from the file\n"


def oom_pod(name: str, policy: str) -> str:
    return f"""
apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  restartPolicy: {policy}
  terminationGracePeriodSeconds: 2
  containers:
    - name: main
      image: {BUSYBOX}
      # Allocating after a second: containerd's shim registers its OOM watcher just
      # after the start, and a kill before that is never reported as one (CRI says
      # Error). The test is about klet's reporting, not that runtime race.
      command: ["sh", "-c", "sleep 1; exec tail /dev/zero"]
      resources:
        limits: {{memory: 16Mi}}
"""


def test_oom_killed_is_reported_with_exit_code_137(node_factory: Any, manifests: Path) -> None:
    node: KletNode = node_factory(manifest_dir=manifests)
    node.start()
    (manifests / "oomonce.yaml").write_text(oom_pod("oomonce", "Never"))
    (manifests / "oomloop.yaml").write_text(oom_pod("oomloop", "Always"))
    once = f"oomonce-{node.node_name}"

    def oom_killed() -> dict[str, Any] | None:
        # containerd may announce the exit a few milliseconds before the OOM kill: the
        # status reads Error until then, and must turn OOMKilled (it once stuck).
        state = terminated(node, once)
        return state if state is not None and state["reason"] == "OOMKilled" else None

    state = wait_for(oom_killed, timeout_s=40, what="oomonce terminated OOMKilled")
    assert state["exitCode"] == 137
    assert node.pods()[once]["status"]["phase"] == "Failed"

    loop = f"oomloop-{node.node_name}"

    def restarted() -> dict[str, Any] | None:
        cs = container_status(node.pods()[loop], "main")
        last = cs["lastState"].get("terminated") or {}
        return cs if cs["restartCount"] >= 1 and last.get("reason") == "OOMKilled" else None

    cs = wait_for(restarted, timeout_s=40, what="oomloop restarted after an OOMKilled")
    assert cs["lastState"]["terminated"]["exitCode"] == 137
