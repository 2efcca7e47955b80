"""`kubectl top` and the apiserver's node proxy on a klet node.

A klet node joins the real control plane with this host's non-loopback address as its
InternalIP (`--node-ip`; the apiserver refuses to proxy to a loopback node address and
EndpointSlices refuse loopback addresses) and runs a busy pod capped at 100m CPU. A real
metrics-server (tests/harness/metrics_server.py: the pinned upstream release behind the
aggregation layer, as upstream's manifests install it) scrapes klet's
`/metrics/resource` over TLS, verifying klet's serving certificate, with a client
certificate klet authorizes through a SubjectAccessReview (nodes/metrics). The built
kubectl's `top node` and `top pod` then show the node's and the pod's CPU and memory,
non-zero; `kubectl get --raw /api/v1/nodes/<node>/proxy/stats/summary` returns klet's
summary through the apiserver.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from klet.devstack import DevStack
from klet.model.units import parse_quantity
from klet.testbed.cluster import ControlPlane

from tests.harness.clusternode import cluster_node, wait_node_ready
from tests.harness.metrics_server import MetricsServer
from tests.harness.node import KletNode
from tests.harness.nodeaddress import host_address
from tests.harness.waiting import wait_for

NODE = "klettop1"
POD = "busy"

BUSY = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": POD, "namespace": "default"},
    "spec": {
        "nodeName": NODE,
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {
                "name": "spin",
                "image": "registry.klet.test/busybox:1.36",
                # Holds 8 MiB in a shell variable (a bare shell's working set shows as
                # "0Mi") and spins.
                "command": [
                    "sh",
                    "-c",
                    "held=$(head -c 8388608 /dev/zero | tr '\\0' x); while :; do :; done",
                ],
                # A tenth of a core: busy enough to measure, cheap on a shared machine.
                "resources": {"limits": {"cpu": "100m", "memory": "64Mi"}},
            }
        ],
    },
}


@pytest.fixture(scope="module")
def address() -> Iterator[str]:
    with host_address() as ip:
        yield ip


@pytest.fixture(scope="module")
def node(
    control_plane: ControlPlane,
    devstack: DevStack,
    tmp_path_factory: pytest.TempPathFactory,
    address: str,
) -> Iterator[KletNode]:
    base = tmp_path_factory.mktemp("topnode")
    flags = control_plane.node_flags(NODE, address)
    with cluster_node(control_plane, devstack, base, name=NODE, node_flags=flags) as kletnode:
        wait_node_ready(control_plane, NODE)
        control_plane.apply([BUSY])

        def running() -> bool:
            res = control_plane.kubectl("get", "pod", POD, "-o", "jsonpath={.status.phase}")
            return res.stdout == "Running"

        wait_for(running, timeout_s=60, what=f"pod {POD} Running")
        yield kletnode


@pytest.fixture(scope="module")
def metrics_server(
    control_plane: ControlPlane,
    node: KletNode,
    metrics_server_binary: Path,
    tmp_path_factory: pytest.TempPathFactory,
    address: str,
) -> Iterator[MetricsServer]:
    dir = tmp_path_factory.mktemp("metrics-server")
    with MetricsServer(control_plane, metrics_server_binary, dir, address=address) as server:
        yield server


def test_node_reports_the_non_loopback_address(
    control_plane: ControlPlane, node: KletNode, address: str
) -> None:
    res = control_plane.kubectl("get", "node", NODE, "-o", "json", check=True)
    addresses = json.loads(res.stdout)["status"]["addresses"]
    assert {"type": "InternalIP", "address": address} in addresses


def test_stats_summary_through_the_node_proxy(control_plane: ControlPlane, node: KletNode) -> None:
    path = f"/api/v1/nodes/{NODE}/proxy/stats/summary"

    def summary() -> dict[str, Any] | None:
        res = control_plane.kubectl("get", "--raw", path, check=True)
        body: dict[str, Any] = json.loads(res.stdout)
        return body if any(p["podRef"]["name"] == POD for p in body["pods"]) else None

    body = wait_for(summary, timeout_s=30, what=f"{POD} in the proxied /stats/summary")
    assert body["node"]["nodeName"] == NODE
    assert body["node"]["cpu"]["usageCoreNanoSeconds"] > 0
    assert body["node"]["memory"]["workingSetBytes"] > 0


def _top(control_plane: ControlPlane, *args: str) -> list[str]:
    """The columns of `kubectl top <args> --no-headers`' one line. Until metrics-server
    has metrics kubectl fails: CalledProcessError, which `wait_for` retries and, at its
    timeout, reports with kubectl's message."""
    res = control_plane.kubectl("top", *args, "--no-headers", check=True)
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 1, res.stdout
    return lines[0].split()


def test_kubectl_top_node(control_plane: ControlPlane, metrics_server: MetricsServer) -> None:
    # NAME CPU(cores) CPU(%) MEMORY(bytes) MEMORY(%); the first values come after two
    # scrapes (a CPU rate needs two samples), 10 s apart at the shortest resolution.
    def columns() -> list[str]:
        return _top(control_plane, "node", NODE)

    name, cpu, _cpu_pct, memory, _mem_pct = wait_for(
        columns, timeout_s=60, what=f"`kubectl top node {NODE}`"
    )
    assert name == NODE
    assert parse_quantity(cpu) > 0, cpu
    assert parse_quantity(memory) > 0, memory


def test_kubectl_top_pod(control_plane: ControlPlane, metrics_server: MetricsServer) -> None:
    # NAME CPU(cores) MEMORY(bytes); the busy loop is capped at 100m.
    def columns() -> list[str] | None:
        cols = _top(control_plane, "pod", POD, "--namespace", "default")
        # a pod's first window can be all idle start-up: wait for the loop to show
        return cols if parse_quantity(cols[1]) > 0 else None

    name, cpu, memory = wait_for(columns, timeout_s=60, what=f"`kubectl top pod {POD}` with CPU")
    assert name == POD
    assert 0 < parse_quantity(cpu) <= parse_quantity("300m"), cpu
    assert parse_quantity(memory) >= parse_quantity("4Mi"), memory  # it holds 8 MiB
