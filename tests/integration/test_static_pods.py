"""Static pods end to end on real containerd: a manifest becomes running containers and
a Running status in /pods, its CRI calls counted in upstream's runtime operation
metrics; restarts follow restartPolicy with back-off; changed and removed manifests
replace and stop pods; malformed manifests hurt nobody else; and a SIGKILLed syncloop
or a restarted Redis restarts no container (and a Redis restarted empty never takes a
pod out of /pods while the services republish)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from klet.bus import NodeBus
from klet.devstack import DevStack

from tests.harness.node import RELISTS, KletNode, container_status, fetch
from tests.harness.pods import WEB, running, runtime_containers, runtime_sandboxes
from tests.harness.waiting import wait_for


def exiting_pod(name: str, policy: str, code: int, *, run_s: float = 0.5) -> str:
    return f"""
apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  restartPolicy: {policy}
  containers:
    - name: main
      image: registry.klet.test/busybox:1.36
      command: ["sh", "-c", "sleep {run_s}; exit {code}"]
"""


def test_two_container_pod_runs_and_serves(
    node_factory: Any, manifests: Path, devstack: DevStack
) -> None:
    node: KletNode = node_factory(manifest_dir=manifests)
    node.start()
    written = time.monotonic()
    (manifests / "web.yaml").write_text(WEB)
    pod = wait_for(
        lambda: running(node, "web"), timeout_s=10, what="web Running with both containers ready"
    )
    took = time.monotonic() - written
    status = pod["status"]
    assert status["podIP"] and status["startTime"]
    assert {c["name"] for c in status["containerStatuses"]} == {"httpd", "sleeper"}
    for c in status["containerStatuses"]:
        assert (
            c["containerID"].startswith("containerd://") and c["imageID"] and c["restartCount"] == 0
        )
        assert "running" in c["state"]
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert conditions["Ready"] == "True" and conditions["ContainersReady"] == "True"
    assert pod["metadata"]["annotations"]["kubernetes.io/config.source"] == "file"
    body = wait_for(
        lambda: fetch(f"http://{status['podIP']}:80/"),
        timeout_s=10,
        what="httpd answering on the pod IP",
    )
    assert body.strip() == "served-by-klet"
    print(f"manifest written -> Running in {took:.2f}s")
    # upstream's runtime operation metrics, from each service's own CRI calls
    ops = "kubelet_runtime_operations_total"
    for op in ("run_podsandbox", "create_container", "start_container", "list_containers"):
        assert (node.metric("syncloop", ops, operation_type=op) or 0) >= 1, op
    seconds = "kubelet_runtime_operations_duration_seconds_count"
    assert (node.metric("syncloop", seconds, operation_type="run_podsandbox") or 0) >= 1
    # No lifecycle call failed. (containerd 1.6 answers RuntimeConfig, which syncloop asks
    # for the runtime's cgroup driver at start, with Unimplemented: upstream counts that
    # error too, so it is not asserted away.)
    errors = "kubelet_runtime_operations_errors_total"
    for op in ("run_podsandbox", "create_container", "start_container", "list_containers"):
        assert node.metric("syncloop", errors, operation_type=op) is None, op
    wait_for(
        lambda: (node.metric("image-gc", ops, operation_type="list_images") or 0) >= 1,
        timeout_s=60,
        what="image-gc's list_images counted",
    )


@pytest.mark.parametrize(
    ("policy", "code", "restarts"),
    [("Always", 0, True), ("OnFailure", 1, True), ("OnFailure", 0, False), ("Never", 1, False)],
)
def test_restart_policy(
    node_factory: Any, manifests: Path, policy: str, code: int, restarts: bool
) -> None:
    node: KletNode = node_factory(manifest_dir=manifests)
    node.start()
    name = f"exit-{policy.lower()}-{code}"
    (manifests / f"{name}.yaml").write_text(exiting_pod(name, policy, code))
    full = f"{name}-{node.node_name}"
    if restarts:
        # First restart is immediate, the next waits out a 10 s back-off.
        pod = wait_for(
            lambda: (
                node.pods()[full]
                if container_status(node.pods()[full], "main")["restartCount"] >= 1
                else None
            ),
            timeout_s=20,
            what="first restart",
        )

        def backing_off() -> dict[str, Any] | None:
            cs = container_status(node.pods()[full], "main")
            return (
                cs if cs["state"].get("waiting", {}).get("reason") == "CrashLoopBackOff" else None
            )

        cs = wait_for(backing_off, timeout_s=20, what="CrashLoopBackOff after the second exit")
        assert cs["lastState"]["terminated"]["exitCode"] == code
        assert cs["lastState"]["terminated"]["reason"] == ("Completed" if code == 0 else "Error")
        assert "back-off 10s" in cs["state"]["waiting"]["message"]
        entered = time.monotonic()
        wait_for(
            lambda: container_status(node.pods()[full], "main")["restartCount"] >= 2,
            timeout_s=25,
            what="second restart after the back-off",
        )
        assert time.monotonic() - entered > 3  # it did wait (the back-off is 10 s from the exit)
        assert pod["status"]["phase"] in ("Running", "Pending")
    else:
        expected = "Succeeded" if code == 0 else "Failed"
        pod = wait_for(
            lambda: node.pods()[full] if node.pods()[full]["status"]["phase"] == expected else None,
            timeout_s=20,
            what=f"phase {expected}",
        )
        # Nothing restarts: three more relists, each of which would have seen a new
        # container (a bounded window, counted in relists rather than seconds).
        node.wait_passes("syncloop", RELISTS, 3, timeout_s=15)
        cs = container_status(node.pods()[full], "main")
        assert cs["restartCount"] == 0
        assert cs["state"]["terminated"]["exitCode"] == code


def test_changed_and_removed_manifest(
    node_factory: Any, manifests: Path, devstack: DevStack
) -> None:
    node: KletNode = node_factory(manifest_dir=manifests)
    node.start()
    path = manifests / "web.yaml"
    path.write_text(WEB)
    first = wait_for(lambda: running(node, "web"), timeout_s=15, what="web Running")
    path.write_text(WEB.replace('sleep", "100000', 'sleep", "200000'))
    second = wait_for(
        lambda: (
            (p := running(node, "web")) and p["metadata"]["uid"] != first["metadata"]["uid"] and p
        ),
        timeout_s=20,
        what="web replaced with a new UID",
    )
    full = f"web-{node.node_name}"
    wait_for(
        lambda: len(runtime_sandboxes(devstack, full)) == 1,
        timeout_s=15,
        what="old sandbox removed",
    )
    assert (
        second["metadata"]["annotations"]["kubernetes.io/config.hash"] == second["metadata"]["uid"]
    )
    removed_at = time.monotonic()
    path.unlink()
    wait_for(lambda: not runtime_sandboxes(devstack, full), timeout_s=20, what="sandbox removed")
    # grace 3 s; httpd and sleep ignore nothing, so well within grace + relist + file poll.
    assert time.monotonic() - removed_at < 3 + 10
    wait_for(lambda: full not in node.pods(), timeout_s=10, what="pod gone from /pods")


def test_malformed_manifests_do_not_hurt_good_ones(node_factory: Any, manifests: Path) -> None:
    node: KletNode = node_factory(manifest_dir=manifests)
    (manifests / "bad-yaml.yaml").write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: [unclosed\n"
    )
    (manifests / "service.yaml").write_text(
        "apiVersion: v1\nkind: Service\nmetadata: {name: svc}\n"
    )
    (manifests / "bad-name.yaml").write_text(WEB.replace("name: web", "name: Bad_Name!"))
    (manifests / "no-containers.yaml").write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: empty}\nspec: {containers: []}\n"
    )
    (manifests / "huge.yaml").write_bytes(b"# " + b"x" * (10 * 1024 * 1024 + 10) + b"\n")
    (manifests / "web.yaml").write_text(WEB)
    node.start()
    wait_for(lambda: running(node, "web"), timeout_s=15, what="the good pod Running")
    assert set(node.pods()) == {f"web-{node.node_name}"}
    log = node.log("pod-source")
    for bad in (
        "bad-yaml.yaml",
        "service.yaml",
        "bad-name.yaml",
        "no-containers.yaml",
        "huge.yaml",
    ):
        assert bad in log, f"{bad} not reported in the pod-source log"
    metrics = node.metrics("pod-source")
    errors = [
        line
        for line in metrics.splitlines()
        if line.startswith("klet_pod_source_manifest_errors_total{")
    ]
    assert sum(float(line.rsplit(" ", 1)[1]) for line in errors) >= 5
    for svc in ("pod-source", "syncloop", "status-reporter"):
        assert node.procs[svc].alive


# Ready through an exec probe every 8 s: a new prober's first probe comes at a random
# moment of its first period, so a syncloop that forgot the readiness on restart would
# report the pod unready for up to 8 s.
STEADY = """
apiVersion: v1
kind: Pod
metadata:
  name: steady
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: main
      image: registry.klet.test/busybox:1.36
      command: ["sleep", "100000"]
      readinessProbe:
        exec:
          command: ["true"]
        periodSeconds: 8
"""


def published(node: KletNode, uid: str) -> Any:
    async def go() -> Any:
        bus = node.bus()
        try:
            return await NodeBus.of(bus, service="status-reporter").status.get(uid)
        finally:
            await bus.close()

    return asyncio.run(go())


def test_syncloop_sigkill_and_redis_restart_restart_nothing(
    node_factory: Any, manifests: Path, devstack: DevStack, redis_server: Any
) -> None:
    node: KletNode = node_factory(manifest_dir=manifests, redis=redis_server)
    node.start()
    (manifests / "web.yaml").write_text(WEB)
    (manifests / "steady.yaml").write_text(STEADY)
    wait_for(lambda: running(node, "web"), timeout_s=15, what="web Running")
    full = f"web-{node.node_name}"
    before = runtime_containers(devstack, full)
    assert len(before) == 2
    steady = wait_for(
        lambda: (
            (p := node.pods().get(f"steady-{node.node_name}"))
            and container_status(p, "main").get("ready")
            and p
        ),
        timeout_s=30,
        what="steady ready",
    )
    uid = steady["metadata"]["uid"]
    earlier = published(node, uid)
    epoch = earlier.epoch

    node.kill("syncloop")
    node.start("syncloop")
    # The new syncloop's first status of steady keeps its readiness (no flap to
    # unready until its first probe, which comes at a random moment of 8 s: an exec
    # probe's first run after a restart is spread over its period).
    record = wait_for(
        lambda: (r := published(node, uid)) is not None and r.epoch != epoch and r,
        timeout_s=20,
        interval_s=0.02,
        what="steady's status from the new syncloop",
    )
    assert container_status({"status": record.status}, "main")["ready"] is True, record.status
    # Nothing else changed either: startTime and the conditions' lastTransitionTime
    # carry over, so the apiserver gets no status patch for it.
    assert record.status == earlier.status
    # The new syncloop adopts the pods: several of its relists pass and nothing restarts.
    node.wait_passes("syncloop", RELISTS, 4, timeout_s=20)
    assert runtime_containers(devstack, full) == before
    assert running(node, "web")
    (manifests / "steady.yaml").unlink()

    redis_server.stop()
    node.wait_passes("syncloop", RELISTS, 3, timeout_s=15)  # relisting goes on without Redis
    assert runtime_containers(devstack, full) == before  # Redis down: nothing stops
    assert running(node, "web"), "status-reporter keeps serving the last view"
    web_uid = node.pods()[full]["metadata"]["uid"]
    redis_server.restart()  # empty: the bus is rebuilt from the sources and the runtime

    def republished() -> bool:
        # /pods keeps web Running the whole time (the view keeps the lost tables until
        # pod-source and syncloop have written them again), until syncloop, its lease
        # back, has published web's status again.
        assert running(node, "web"), "/pods lost web after the Redis restart"
        return published(node, web_uid) is not None

    wait_for(republished, timeout_s=20, interval_s=0.05, what="web's status republished")
    wait_for(lambda: running(node, "web"), timeout_s=20, what="status back after Redis restart")
    node.wait_passes("syncloop", RELISTS, 5, timeout_s=20)
    assert runtime_containers(devstack, full) == before
    for svc in ("pod-source", "syncloop", "status-reporter"):
        assert node.procs[svc].alive, f"{svc} died"


STUBBORN = """
apiVersion: v1
kind: Pod
metadata:
  name: stubborn
spec:
  terminationGracePeriodSeconds: 4
  containers:
    - name: main
      image: registry.klet.test/busybox:1.36
      command: ["sh", "-c", "trap 'echo got TERM' TERM; while true; do sleep 1; done"]
"""


def test_removal_honours_grace_period(
    node_factory: Any, manifests: Path, devstack: DevStack
) -> None:
    """A container that ignores SIGTERM is stopped with SIGKILL only after its grace period."""
    node: KletNode = node_factory(manifest_dir=manifests)
    node.start()
    path = manifests / "stubborn.yaml"
    path.write_text(STUBBORN)
    wait_for(lambda: running(node, "stubborn"), timeout_s=15, what="stubborn Running")
    full = f"stubborn-{node.node_name}"
    log_dir = next(node.logs_dir.glob(f"default_{full}_*"))
    removed_at = time.monotonic()
    path.unlink()
    wait_for(lambda: not runtime_sandboxes(devstack, full), timeout_s=30, what="sandbox removed")
    took = time.monotonic() - removed_at
    assert took >= 4, f"removed after {took:.1f}s, before the 4 s grace period ran out"
    assert took < 4 + 10
    assert "got TERM" in (log_dir / "main" / "0.log").read_text(), "SIGTERM was not sent first"
