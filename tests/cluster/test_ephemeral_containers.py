"""Ephemeral containers through the apiserver: `kubectl debug` adds one to a running
pod (the pods/ephemeralcontainers subresource); klet starts it in the pod's sandbox,
reports it in status.ephemeralContainerStatuses, and serves exec and logs into it,
while the pod's own container keeps running untouched (same container ID, no restart).
A second one, targeting the app container, sees the app's processes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from klet.devstack import DevStack
from klet.testbed.cluster import ControlPlane

from tests.harness.clusternode import cluster_node
from tests.harness.node import KletNode
from tests.harness.waiting import wait_for

NODE = "kletdebug1"
IMAGE = "registry.klet.test/busybox:1.36"
POD = "debug-target"


@pytest.fixture(scope="module")
def node(
    control_plane: ControlPlane, devstack: DevStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KletNode]:
    base = tmp_path_factory.mktemp("debugnode")
    with cluster_node(control_plane, devstack, base, name=NODE) as kletnode:
        yield kletnode


def get_pod(cp: ControlPlane) -> dict[str, Any] | None:
    r = cp.kubectl("get", "pod", POD, "-o", "json")
    return json.loads(r.stdout) if r.returncode == 0 else None


def status_of(p: dict[str, Any] | None, key: str, name: str) -> dict[str, Any] | None:
    for s in ((p or {}).get("status") or {}).get(key) or []:
        if s.get("name") == name:
            return dict(s)
    return None


def running(cp: ControlPlane, key: str, name: str) -> dict[str, Any] | None:
    s = status_of(get_pod(cp), key, name)
    return s if s is not None and "running" in (s.get("state") or {}) else None


def test_kubectl_debug_runs_an_ephemeral_container_beside_the_pods_own(
    node: KletNode, control_plane: ControlPlane
) -> None:
    cp = control_plane
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": POD, "namespace": "default"},
        "spec": {
            "nodeName": NODE,
            "terminationGracePeriodSeconds": 2,
            "containers": [
                {"name": "app", "image": IMAGE, "command": ["sleep", "100000"]},
            ],
        },
    }
    r = cp.kubectl("create", "-f", "-", input=json.dumps(manifest))
    assert r.returncode == 0, r.stderr
    app = wait_for(
        lambda: running(cp, "containerStatuses", "app"), timeout_s=120, what="app running"
    )

    r = cp.kubectl(
        "debug",
        POD,
        f"--image={IMAGE}",
        "--container=debugger",
        "--",
        "sh",
        "-c",
        "while [ ! -e /tmp/stop ]; do echo polo; sleep 1; done",
    )
    assert r.returncode == 0, r.stderr
    debugger = wait_for(
        lambda: running(cp, "ephemeralContainerStatuses", "debugger"),
        timeout_s=120,
        what="debugger running in ephemeralContainerStatuses",
    )
    assert debugger["containerID"].startswith("containerd://")
    assert debugger["imageID"] and debugger["ready"] is False
    wait_for(
        lambda: "polo" in cp.kubectl("logs", POD, "-c", "debugger").stdout,
        timeout_s=60,
        what="the debugger's log",
    )
    r = cp.kubectl("exec", POD, "-c", "debugger", "--", "echo", "marco")
    assert r.returncode == 0 and "marco" in r.stdout, r.stderr

    # A debugger targeting the app shares its PID namespace: it sees `sleep 100000`.
    r = cp.kubectl(
        "debug", POD, f"--image={IMAGE}", "--container=peek", "--target=app", "--", "sleep", "1d"
    )
    assert r.returncode == 0, r.stderr
    wait_for(lambda: running(cp, "ephemeralContainerStatuses", "peek"), timeout_s=120, what="peek")
    r = cp.kubectl("exec", POD, "-c", "peek", "--", "ps", "-o", "args")
    assert r.returncode == 0 and "sleep 100000" in r.stdout, (r.stdout, r.stderr)

    # The pod's own container was neither restarted nor replaced; the pod stays Ready.
    after = get_pod(cp)
    app_after = status_of(after, "containerStatuses", "app")
    assert app_after is not None
    assert app_after["containerID"] == app["containerID"]
    assert app_after["restartCount"] == 0 and "running" in app_after["state"]
    assert after is not None and after["status"]["phase"] == "Running"
    assert [s["name"] for s in after["status"]["ephemeralContainerStatuses"]] == [
        "debugger",
        "peek",
    ]

    # The debugger exits: it is not started again, and the app keeps running.
    r = cp.kubectl("exec", POD, "-c", "debugger", "--", "touch", "/tmp/stop")
    assert r.returncode == 0, r.stderr
    done = wait_for(
        lambda: (
            s
            if (s := status_of(get_pod(cp), "ephemeralContainerStatuses", "debugger"))
            and "terminated" in s["state"]
            else None
        ),
        timeout_s=60,
        what="debugger terminated",
    )
    assert done["restartCount"] == 0
    final = status_of(get_pod(cp), "containerStatuses", "app")
    assert final is not None and final["containerID"] == app["containerID"]
    assert "running" in final["state"]
    cp.kubectl("delete", "pod", POD, "--wait=false")
