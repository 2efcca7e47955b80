"""Init containers and sidecars on real containerd: init containers run one at a time
in order before the main containers; a failing one is retried with back-off (its
status shows the Error / CrashLoopBackOff that kubectl prints as `Init:Error` and
`Init:CrashLoopBackOff`) or fails the pod under restartPolicy Never without the main
container ever being created; sidecars start before the main containers, are restarted
when they exit, stay up while the main containers run and are stopped after them."""

from __future__ import annotations

import asyncio
from datetime import datetime
from pathlib import Path
from typing import Any

from klet.cri import CRISettings, RuntimeClient
from klet.cri import labels as L
from klet.devstack import DevStack

from tests.harness.node import KletNode
from tests.harness.waiting import wait_for

IMAGE = "registry.klet.test/busybox:1.36"


def manifest(name: str, *, policy: str, inits: str, main: str, grace: int = 2) -> str:
    return f"""
apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  restartPolicy: {policy}
  terminationGracePeriodSeconds: {grace}
  initContainers:
{inits}
  containers:
    - name: main
      image: {IMAGE}
      command: ["sh", "-c", "{main}"]
"""


def init(name: str, script: str, *, sidecar: bool = False) -> str:
    extra = "\n      restartPolicy: Always" if sidecar else ""
    return f"""    - name: {name}
      image: {IMAGE}
      command: ["sh", "-c", "{script}"]{extra}"""


def status_of(node: KletNode, name: str) -> dict[str, Any] | None:
    pod = node.pods().get(f"{name}-{node.node_name}")
    return None if pod is None else pod["status"]


def by_name(entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in entries}


def container_names(stack: DevStack, pod_name: str) -> set[str]:
    """The names of every container CRI has for the pod, running or not."""

    async def go() -> set[str]:
        cri = RuntimeClient(CRISettings(runtime_endpoint=stack.runtime_endpoint, timeout_s=10))
        try:
            return {
                c.name for c in await cri.list_containers(label_selector={L.POD_NAME: pod_name})
            }
        finally:
            await cri.close()

    return asyncio.run(go())


def ts(value: str) -> datetime:
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ")


def test_init_containers_run_in_order_before_main(node_factory: Any, manifests: Path) -> None:
    node: KletNode = node_factory(manifest_dir=manifests)
    node.start()
    inits = "\n".join([init("first", "sleep 3"), init("second", "sleep 1")])
    (manifests / "ordered.yaml").write_text(
        manifest("ordered", policy="Always", inits=inits, main="sleep 100000")
    )

    def first_running() -> dict[str, Any] | None:
        s = status_of(node, "ordered")
        if s is None or "initContainerStatuses" not in s:
            return None
        return s if "running" in s["initContainerStatuses"][0]["state"] else None

    during = wait_for(first_running, timeout_s=20, what="first init container running")
    # kubectl prints this as Init:0/2: the second waits, the main container too.
    second = during["initContainerStatuses"][1]
    assert second["state"]["waiting"]["reason"] == "PodInitializing"
    assert during["containerStatuses"][0]["state"]["waiting"]["reason"] == "PodInitializing"
    assert during["phase"] == "Pending"
    initialized = next(c for c in during["conditions"] if c["type"] == "Initialized")
    assert initialized["status"] == "False"

    def main_running() -> dict[str, Any] | None:
        s = status_of(node, "ordered")
        ok = s is not None and "running" in s["containerStatuses"][0]["state"]
        return s if ok else None

    after = wait_for(main_running, timeout_s=30, what="main container running")
    done = by_name(after["initContainerStatuses"])
    assert set(done) == {"first", "second"}
    assert all(d["state"]["terminated"]["reason"] == "Completed" for d in done.values())
    assert all(d["ready"] for d in done.values())
    # One at a time: the second started only after the first finished.
    first_end = ts(done["first"]["state"]["terminated"]["finishedAt"])
    assert first_end <= ts(done["second"]["state"]["terminated"]["startedAt"])
    main_start = ts(after["containerStatuses"][0]["state"]["running"]["startedAt"])
    assert ts(done["second"]["state"]["terminated"]["finishedAt"]) <= main_start
    assert after["phase"] == "Running"
    conditions = {c["type"]: c["status"] for c in after["conditions"]}
    assert (conditions.get("Initialized"), conditions.get("Ready")) == ("True", "True")


def test_failing_init_container_backs_off_and_main_never_starts(
    node_factory: Any, manifests: Path, devstack: DevStack
) -> None:
    node: KletNode = node_factory(manifest_dir=manifests)
    node.start()
    inits = "\n".join([init("setup", "echo failing; exit 3"), init("later", "true")])
    (manifests / "crashy.yaml").write_text(
        manifest("crashy", policy="Always", inits=inits, main="sleep 100000")
    )

    def crash_looping() -> dict[str, Any] | None:
        s = status_of(node, "crashy")
        if s is None or "initContainerStatuses" not in s:
            return None
        setup = s["initContainerStatuses"][0]
        waiting = setup["state"].get("waiting", {})
        return s if waiting.get("reason") == "CrashLoopBackOff" else None

    s = wait_for(crash_looping, timeout_s=40, what="Init:CrashLoopBackOff")
    setup = s["initContainerStatuses"][0]
    assert setup["lastState"]["terminated"]["exitCode"] == 3
    assert setup["lastState"]["terminated"]["reason"] == "Error"
    assert setup["restartCount"] >= 1
    assert "back-off" in setup["state"]["waiting"]["message"]
    assert s["phase"] == "Pending"
    # Neither the second init container nor the main container ever ran.
    assert container_names(devstack, f"crashy-{node.node_name}") == {"setup"}


def test_failed_init_container_fails_a_never_pod(
    node_factory: Any, manifests: Path, devstack: DevStack
) -> None:
    node: KletNode = node_factory(manifest_dir=manifests)
    node.start()
    (manifests / "never.yaml").write_text(
        manifest("never", policy="Never", inits=init("setup", "exit 7"), main="sleep 100000")
    )

    def failed() -> dict[str, Any] | None:
        s = status_of(node, "never")
        return s if s is not None and s["phase"] == "Failed" else None

    s = wait_for(failed, timeout_s=30, what="pod Failed after its init container failed")
    # kubectl prints this as Init:Error.
    terminated = s["initContainerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 7 and terminated["reason"] == "Error"
    assert s["containerStatuses"][0]["state"]["waiting"]["reason"] == "PodInitializing"
    assert container_names(devstack, f"never-{node.node_name}") == {"setup"}


def test_sidecar_is_restarted_while_main_runs(node_factory: Any, manifests: Path) -> None:
    node: KletNode = node_factory(manifest_dir=manifests)
    node.start()
    sidecar = init("helper", "sleep 2; exit 1", sidecar=True)
    (manifests / "restarts.yaml").write_text(
        manifest("restarts", policy="Always", inits=sidecar, main="sleep 100000")
    )

    def sidecar_restarted() -> dict[str, Any] | None:
        s = status_of(node, "restarts")
        if s is None or "running" not in s["containerStatuses"][0]["state"]:
            return None
        return s if s["initContainerStatuses"][0]["restartCount"] >= 1 else None

    s = wait_for(sidecar_restarted, timeout_s=40, what="sidecar restarted beside main")
    assert s["phase"] == "Running"
    helper = s["initContainerStatuses"][0]
    terminated = helper["state"].get("terminated") or helper["lastState"]["terminated"]
    assert terminated["exitCode"] == 1
    # The main container kept running through the sidecar's restarts.
    assert s["containerStatuses"][0]["restartCount"] == 0


def test_sidecar_starts_first_and_stops_after_main(node_factory: Any, manifests: Path) -> None:
    node: KletNode = node_factory(manifest_dir=manifests)
    node.start()
    # The main container runs 5 s and ends the pod (OnFailure, exit 0); the sidecar
    # runs until it is stopped.
    sidecar = init("helper", "trap 'exit 0' TERM; sleep 100000 & wait", sidecar=True)
    (manifests / "sidecar.yaml").write_text(
        manifest("sidecar", policy="OnFailure", inits=sidecar, main="sleep 5", grace=5)
    )

    def both_running() -> dict[str, Any] | None:
        s = status_of(node, "sidecar")
        if s is None or "running" not in s["containerStatuses"][0]["state"]:
            return None
        return s if "running" in s["initContainerStatuses"][0]["state"] else None

    s = wait_for(both_running, timeout_s=30, what="sidecar and main running")
    helper, main = s["initContainerStatuses"][0], s["containerStatuses"][0]
    assert helper["started"] and helper["ready"] and s["phase"] == "Running"
    assert ts(helper["state"]["running"]["startedAt"]) <= ts(main["state"]["running"]["startedAt"])

    def succeeded() -> dict[str, Any] | None:
        st = status_of(node, "sidecar")
        return st if st is not None and st["phase"] == "Succeeded" else None

    done = wait_for(succeeded, timeout_s=60, what="pod Succeeded once main exited")
    helper, main = done["initContainerStatuses"][0], done["containerStatuses"][0]
    assert main["state"]["terminated"]["exitCode"] == 0
    # The sidecar was stopped once the main container had ended, not before, and
    # was not restarted.
    assert ts(helper["state"]["terminated"]["finishedAt"]) >= ts(
        main["state"]["terminated"]["finishedAt"]
    )
    assert helper["restartCount"] == 0
