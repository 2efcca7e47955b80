"""Container probes on real containerd, observed from outside through `/pods`, CRI and events.

Covers: an httpGet readiness probe (port by name, custom header) on the httpd image
flips the container's `ready` and the pod's Ready/ContainersReady conditions to False
when the served file is removed inside the container and back when it is restored, with
`Readiness probe failed: HTTP probe failed with statuscode: 404`, both outcomes counted
in syncloop's `prober_probe_total`; an exec liveness
probe that starts failing gets the container killed and restarted (restartCount, the
`Unhealthy` and `Killing` events with upstream's messages) within the probe's own
terminationGracePeriodSeconds rather than the pod's; a startup probe that never
succeeds restarts the container and keeps `started: false`; a startup probe that
succeeds has the readiness probe run at once, however long its period; a tcpSocket readiness
probe follows a listener inside the container; a gRPC readiness probe of a host-network
pod follows a real grpc.health.v1 server's SERVING / NOT_SERVING.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent import futures
from datetime import datetime
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from klet.cri import CRISettings, RuntimeClient
from klet.devstack import free_port
from klet.model.records import EventRecord
from klet.model.types import ContainerID

from tests.harness.node import KletNode, bus_events, container_status, klet_why, why_story
from tests.harness.waiting import wait_for

BUSYBOX = "registry.klet.test/busybox:1.36"
HTTPD = "registry.klet.test/httpd:1.36"


def pod_of(node: KletNode, name: str) -> dict[str, Any] | None:
    return node.pods().get(f"{name}-{node.node_name}")


def ready_state(node: KletNode, name: str) -> tuple[bool, str, str] | None:
    """(container ready, pod Ready condition, ContainersReady condition) of a running pod."""
    pod = pod_of(node, name)
    if pod is None or pod["status"].get("phase") != "Running":
        return None
    conditions = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
    statuses = pod["status"].get("containerStatuses") or []
    ready = bool(statuses) and all(c["ready"] for c in statuses)
    return ready, conditions.get("Ready", ""), conditions.get("ContainersReady", "")


def wait_ready(node: KletNode, name: str, ready: bool, *, timeout_s: float = 40) -> None:
    expected = (ready, str(ready), str(ready))

    wait_for(
        lambda: ready_state(node, name) == expected,
        timeout_s=timeout_s,
        what=f"{name}'s (ready, Ready, ContainersReady) to be {expected}",
    )


def container_id(node: KletNode, name: str, container: str = "main") -> ContainerID:
    pod = pod_of(node, name)
    assert pod is not None
    return ContainerID(container_status(pod, container)["containerID"].split("://", 1)[1])


def exec_in(node: KletNode, cid: ContainerID, *cmd: str) -> tuple[int, str]:
    async def go() -> tuple[int, str]:
        cri = RuntimeClient(CRISettings(runtime_endpoint=node.stack.runtime_endpoint, timeout_s=30))
        try:
            code, out, err = await cri.exec_sync(cid, list(cmd), timeout_s=10)
            return code, (out + err).decode()
        finally:
            await cri.close()

    return asyncio.run(go())


def has_event(node: KletNode, name: str, reason: str, message: str) -> EventRecord | None:
    return next(
        (e for e in bus_events(node, name) if e.reason == reason and e.message.startswith(message)),
        None,
    )


def epoch(rfc3339: str) -> float:
    return datetime.strptime(rfc3339, "%Y-%m-%dT%H:%M:%S%z").timestamp()


@pytest.fixture
def node(node_factory: Any, manifests: Path) -> KletNode:
    n: KletNode = node_factory(manifest_dir=manifests)
    n.start()
    return n


HTTP_READY = f"""
apiVersion: v1
kind: Pod
metadata:
  name: webready
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: main
      image: {HTTPD}
      ports: [{{name: http, containerPort: 80}}]
      readinessProbe:
        httpGet:
          path: /index.html
          port: http
          httpHeaders: [{{name: X-Probe, value: klet}}]
        periodSeconds: 1
        failureThreshold: 1
"""


def test_http_readiness_follows_the_served_file(node: KletNode, manifests: Path) -> None:
    (manifests / "webready.yaml").write_text(HTTP_READY)
    wait_ready(node, "webready", True, timeout_s=60)
    cid = container_id(node, "webready")

    assert exec_in(node, cid, "rm", "/www/index.html")[0] == 0
    wait_ready(node, "webready", False)
    pod = pod_of(node, "webready")
    assert pod is not None
    ready = next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "ContainersNotReady"
    assert ready["message"] == "containers with unready status: [main]"
    event = wait_for(
        lambda: has_event(
            node, "webready", "Unhealthy", "Readiness probe failed: HTTP probe failed with"
        ),
        timeout_s=20,
        what="the Unhealthy event",
    )
    assert event.type == "Warning"
    assert event.message == "Readiness probe failed: HTTP probe failed with statuscode: 404"
    assert event.involved["fieldPath"] == "spec.containers{main}"

    assert exec_in(node, cid, "sh", "-c", "echo back > /www/index.html")[0] == 0
    wait_ready(node, "webready", True)
    # the container was never restarted: readiness only gates traffic
    assert container_id(node, "webready") == cid
    # syncloop's /metrics counted both outcomes under upstream's name and labels
    metrics = node.metrics("syncloop")
    for result in ("successful", "failed"):
        assert any(
            line.startswith("prober_probe_total{")
            and 'probe_type="Readiness"' in line
            and f'result="{result}"' in line
            and 'container="main"' in line
            and float(line.rsplit(" ", 1)[1]) >= 1
            for line in metrics.splitlines()
        ), result
    (manifests / "webready.yaml").unlink()


LIVENESS = f"""
apiVersion: v1
kind: Pod
metadata:
  name: live
spec:
  terminationGracePeriodSeconds: 120
  containers:
    - name: main
      image: {BUSYBOX}
      command: ["sh", "-c", "touch /tmp/alive; exec sleep 100000"]
      livenessProbe:
        exec:
          command: ["cat", "/tmp/alive"]
        periodSeconds: 1
        failureThreshold: 2
        terminationGracePeriodSeconds: 2
"""


def test_exec_liveness_failure_restarts_the_container(node: KletNode, manifests: Path) -> None:
    (manifests / "live.yaml").write_text(LIVENESS)
    wait_ready(node, "live", True, timeout_s=60)
    cid = container_id(node, "live")
    pod = pod_of(node, "live")
    assert pod is not None and container_status(pod, "main")["restartCount"] == 0

    assert exec_in(node, cid, "rm", "/tmp/alive")[0] == 0

    def restarted() -> dict[str, Any] | None:
        p = pod_of(node, "live")
        if p is None:
            return None
        status = container_status(p, "main")
        if status["restartCount"] >= 1 and "running" in status["state"]:
            return status
        return None

    # sleep as PID 1 ignores SIGTERM: only the probe's 2 s grace (not the pod's 120 s)
    # lets this happen within the wait
    status = wait_for(restarted, timeout_s=60, what="live restarted")
    assert status["containerID"].split("://", 1)[1] != cid
    terminated = status["lastState"]["terminated"]
    assert terminated["exitCode"] == 137
    assert terminated["containerID"].endswith(cid)

    unhealthy = has_event(node, "live", "Unhealthy", "Liveness probe failed: ")
    assert unhealthy is not None and unhealthy.type == "Warning"
    assert "/tmp/alive" in unhealthy.message  # cat's own complaint, as upstream reports
    killing = has_event(
        node, "live", "Killing", "Container main failed liveness probe, will be restarted"
    )
    assert killing is not None and killing.type == "Normal"
    assert killing.involved["fieldPath"] == "spec.containers{main}"
    assert epoch(terminated["finishedAt"]) - killing.at < 15

    # klet why tells the story, the answer first: the liveness probe, with its output.
    pod_name = f"default/live-{node.node_name}"
    story = wait_for(
        lambda: (s := why_story(node, pod_name)) is not None and s["restarts"] >= 1 and s,
        timeout_s=30,
        what="klet why live: a restart",
    )
    answer = story["answer"]
    assert answer.startswith("restarted 1 time: liveness probe failed (Liveness probe failed: ")
    assert "/tmp/alive" in answer and "exited with code 137 (SIGKILL)" in answer, answer
    seen = [(e["what"], e["reason"], e.get("container", "")) for e in story["timeline"]]
    for step in [
        ("event", "Pulled", "main"),
        ("event", "Started", "main"),
        ("started", "Running", "main"),
        ("event", "Unhealthy", "main"),
        ("event", "Killing", "main"),
        ("exited", "Error", "main"),
    ]:
        assert step in seen, (step, seen)
    killed = next(e for e in story["timeline"] if e["reason"] == "Killing")
    exited = next(e for e in story["timeline"] if e["what"] == "exited")
    assert killed["at"] <= exited["at"] and exited["detail"]["exitCode"] == 137
    assert exited["detail"]["signal"] == "SIGKILL" and exited["source"] == "status"
    assert killed["source"] == "syncloop"
    text = klet_why(node, pod_name).stdout.splitlines()
    assert text[0] == f"{pod_name} (uid {story['uid']}): {answer}"
    assert text[2].split()[:4] == ["TIME", "SOURCE", "CONTAINER", "TYPE"]

    # The history outlives its writer: a status-reporter killed and started again (a
    # new leader) keeps it, records what comes next, and repeats nothing.
    before = story["timeline"]
    node.kill("status-reporter")
    node.start("status-reporter")
    (manifests / "live.yaml").unlink()
    stopping = ("Killing", "Stopping container main")
    after = wait_for(
        lambda: (
            (s := why_story(node, pod_name)) is not None
            and stopping in [(e["reason"], e["message"]) for e in s["timeline"]]
            and s["timeline"]
        ),
        timeout_s=60,
        what="klet why live: the removal recorded by the new leader",
    )
    for e in before:
        assert after.count(e) == 1, e
    assert len(after) > len(before)


STARTUP = f"""
apiVersion: v1
kind: Pod
metadata:
  name: slowstart
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: main
      image: {BUSYBOX}
      command: ["sleep", "100000"]
      startupProbe:
        exec:
          command: ["test", "-f", "/tmp/started"]
        periodSeconds: 1
        failureThreshold: 2
        terminationGracePeriodSeconds: 1
      readinessProbe:
        exec:
          command: ["true"]
        periodSeconds: 1
"""


def test_startup_probe_that_never_succeeds_restarts(node: KletNode, manifests: Path) -> None:
    (manifests / "slowstart.yaml").write_text(STARTUP)

    def restarted_running() -> dict[str, Any] | None:
        p = pod_of(node, "slowstart")
        if p is None:
            return None
        status = container_status(p, "main")
        if status["restartCount"] >= 1 and "running" in status["state"]:
            return p
        return None

    pod = wait_for(restarted_running, timeout_s=60, what="slowstart restarted")
    status = container_status(pod, "main")
    assert status["started"] is False
    assert status["ready"] is False
    conditions = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
    assert conditions["Ready"] == "False" and conditions["ContainersReady"] == "False"
    assert has_event(node, "slowstart", "Unhealthy", "Startup probe failed: ") is not None
    assert (
        has_event(
            node, "slowstart", "Killing", "Container main failed startup probe, will be restarted"
        )
        is not None
    )
    # the readiness probe never ran before start-up: no readiness event, never ready
    assert has_event(node, "slowstart", "Unhealthy", "Readiness") is None
    (manifests / "slowstart.yaml").unlink()


STARTED_THEN_READY = f"""
apiVersion: v1
kind: Pod
metadata:
  name: startready
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: main
      image: {BUSYBOX}
      command: ["sh", "-c", "sleep 3; touch /tmp/started; exec sleep 100000"]
      startupProbe:
        exec: {{command: ["test", "-f", "/tmp/started"]}}
        periodSeconds: 1
        failureThreshold: 60
      readinessProbe:
        exec: {{command: ["true"]}}
        periodSeconds: 60
"""


def test_readiness_runs_as_soon_as_the_startup_probe_succeeds(
    node: KletNode, manifests: Path
) -> None:
    (manifests / "startready.yaml").write_text(STARTED_THEN_READY)

    def started() -> dict[str, Any] | None:
        p = pod_of(node, "startready")
        return p if p is not None and container_status(p, "main").get("started") else None

    wait_for(started, timeout_s=60, what="startready's startup probe to succeed")
    # Upstream's prober runs the readiness probe when the container has started; waiting
    # for its 60 s period would keep it unready for up to a minute.
    wait_ready(node, "startready", True, timeout_s=20)
    pod = pod_of(node, "startready")
    assert pod is not None and container_status(pod, "main")["restartCount"] == 0
    (manifests / "startready.yaml").unlink()


TCP_READY = f"""
apiVersion: v1
kind: Pod
metadata:
  name: tcpready
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: main
      image: {BUSYBOX}
      command: ["sh", "-c", "mkdir -p /srv && httpd -p 8080 -h /srv && exec sleep 100000"]
      readinessProbe:
        tcpSocket:
          port: 8080
        periodSeconds: 1
        failureThreshold: 1
"""


def test_tcp_readiness_follows_the_listener(node: KletNode, manifests: Path) -> None:
    (manifests / "tcpready.yaml").write_text(TCP_READY)
    wait_ready(node, "tcpready", True, timeout_s=60)
    cid = container_id(node, "tcpready")
    assert exec_in(node, cid, "killall", "httpd")[0] == 0
    wait_ready(node, "tcpready", False)
    pod = pod_of(node, "tcpready")
    assert pod is not None
    ip = pod["status"]["podIP"]
    event = wait_for(
        lambda: has_event(node, "tcpready", "Unhealthy", "Readiness probe failed: "),
        timeout_s=20,
        what="the Unhealthy event",
    )
    assert event.message == (
        f"Readiness probe failed: dial tcp {ip}:8080: connect: connection refused"
    )
    assert exec_in(node, cid, "httpd", "-p", "8080", "-h", "/srv")[0] == 0
    wait_ready(node, "tcpready", True)
    (manifests / "tcpready.yaml").unlink()


@pytest.fixture
def health_server() -> Iterator[tuple[int, health.HealthServicer]]:
    """A real grpc.health.v1 server on the host, as a host-network pod would run one."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = free_port()
    server.add_insecure_port(f"0.0.0.0:{port}")
    server.start()
    yield port, servicer
    server.stop(None).wait()


def test_grpc_readiness_follows_the_health_service(
    node: KletNode, manifests: Path, health_server: tuple[int, health.HealthServicer]
) -> None:
    port, servicer = health_server
    servicer.set("klet", health_pb2.HealthCheckResponse.SERVING)
    (manifests / "grpcready.yaml").write_text(
        f"""
apiVersion: v1
kind: Pod
metadata:
  name: grpcready
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 1
  containers:
    - name: main
      image: {BUSYBOX}
      command: ["sleep", "100000"]
      readinessProbe:
        grpc:
          port: {port}
          service: klet
        periodSeconds: 1
        failureThreshold: 1
"""
    )
    wait_ready(node, "grpcready", True, timeout_s=60)
    servicer.set("klet", health_pb2.HealthCheckResponse.NOT_SERVING)
    wait_ready(node, "grpcready", False)
    event = has_event(node, "grpcready", "Unhealthy", "Readiness probe failed: ")
    assert event is not None
    assert event.message == (
        'Readiness probe failed: service unhealthy (responded with "NOT_SERVING")'
    )
    servicer.set("klet", health_pb2.HealthCheckResponse.SERVING)
    wait_ready(node, "grpcready", True)
    (manifests / "grpcready.yaml").unlink()
