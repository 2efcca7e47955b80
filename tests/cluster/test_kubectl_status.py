"""The STATUS column the real kubectl prints for pods klet runs, through the apiserver:
`Init:0/2` while an init container runs, `Init:CrashLoopBackOff` and `Init:Error` for
failing init containers (restartPolicy Always / Never), `CrashLoopBackOff`,
`ErrImagePull`/`ImagePullBackOff`, `OOMKilled`, `Completed`, `Error`, and a pod with a
running sidecar shown `Running` with both containers ready. kubectl derives the string
from the pod status klet reports, so this checks the reasons, states and counts match
what upstream's kubelet would report for the same pods."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from klet.devstack import DevStack
from klet.testbed.cluster import ControlPlane

from tests.harness.clusternode import cluster_node, wait_node_ready
from tests.harness.node import KletNode
from tests.harness.waiting import wait_for

NODE = "kletstatus1"
IMAGE = "registry.klet.test/busybox:1.36"


def container(name: str, script: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": IMAGE, "command": ["sh", "-c", script], **extra}


def pod(name: str, *, containers: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": NODE,
            "terminationGracePeriodSeconds": 2,
            "containers": containers,
            **spec,
        },
    }


SLEEP = "sleep 100000"

PODS = {
    "init-wait": pod(
        "init-wait",
        initContainers=[container("first", SLEEP), container("second", "true")],
        containers=[container("main", SLEEP)],
    ),
    "init-crash": pod(
        "init-crash",
        initContainers=[container("setup", "exit 1")],
        containers=[container("main", SLEEP)],
    ),
    "init-error": pod(
        "init-error",
        restartPolicy="Never",
        initContainers=[container("setup", "exit 1")],
        containers=[container("main", SLEEP)],
    ),
    "crash": pod("crash", containers=[container("main", "exit 1")]),
    "pull-fail": pod(
        "pull-fail",
        containers=[{"name": "main", "image": "registry.klet.test/no-such-image:1"}],
    ),
    "oom": pod(
        "oom",
        restartPolicy="Never",
        containers=[
            container(
                "main",
                # After a second: containerd's shim registers its OOM watcher just after
                # the start; a kill before that is never reported as one (CRI: Error).
                "sleep 1; exec tail /dev/zero",
                resources={"limits": {"memory": "16Mi"}},
            )
        ],
    ),
    "done": pod("done", restartPolicy="Never", containers=[container("main", "true")]),
    "failed": pod("failed", restartPolicy="Never", containers=[container("main", "exit 2")]),
    "with-sidecar": pod(
        "with-sidecar",
        initContainers=[container("proxy", SLEEP, restartPolicy="Always")],
        containers=[container("main", SLEEP)],
    ),
}

# What kubectl must print at some point (pods pass through other strings on the way).
EXPECTED = {
    "init-wait": "Init:0/2",
    "init-crash": "Init:CrashLoopBackOff",
    "init-error": "Init:Error",
    "crash": "CrashLoopBackOff",
    "pull-fail": "ImagePullBackOff",
    "oom": "OOMKilled",
    "done": "Completed",
    "failed": "Error",
    "with-sidecar": "Running",
}


@pytest.fixture(scope="module")
def node(
    control_plane: ControlPlane, devstack: DevStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KletNode]:
    base = tmp_path_factory.mktemp("statusnode")
    with cluster_node(control_plane, devstack, base, name=NODE) as kletnode:
        yield kletnode


def row(cp: ControlPlane, name: str) -> dict[str, str] | None:
    """kubectl's table row for a pod: READY, STATUS, RESTARTS."""
    r = cp.kubectl("get", "pod", name, "--no-headers")
    if r.returncode != 0 or not r.stdout.strip():
        return None
    fields = r.stdout.split()
    return {"ready": fields[1], "status": fields[2], "restarts": fields[3]}


def test_kubectl_prints_upstream_status_strings(
    node: KletNode, control_plane: ControlPlane
) -> None:
    cp = control_plane

    wait_node_ready(cp, NODE)
    for manifest in PODS.values():
        r = cp.kubectl("create", "-f", "-", input=json.dumps(manifest))
        assert r.returncode == 0, r.stderr

    seen: dict[str, list[str]] = {name: [] for name in PODS}

    def all_seen() -> bool:
        done = True
        for name, wanted in EXPECTED.items():
            if wanted in seen[name]:
                continue
            current = row(cp, name)
            if current is not None and seen[name][-1:] != [current["status"]]:
                seen[name].append(current["status"])
            done = done and wanted in seen[name]
        return done

    try:
        wait_for(all_seen, timeout_s=120, what="every STATUS string", interval_s=0.5)
    finally:
        print({name: statuses for name, statuses in seen.items()})
    sidecar = row(cp, "with-sidecar")
    assert sidecar is not None and sidecar["ready"] == "2/2", sidecar
    crash = row(cp, "crash")
    assert crash is not None and int(crash["restarts"].split()[0]) >= 1, crash
    # The Never pods stay as they ended.
    for name, status in (("done", "Completed"), ("failed", "Error"), ("init-error", "Init:Error")):
        current = row(cp, name)
        assert current is not None and current["status"] == status, (name, current)
