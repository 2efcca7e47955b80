"""Soak: a node with many pods survives every kind of fault without touching them.

`make soak` runs this (it is not part of `make test`: with 110 pods it takes tens of
minutes). One cluster-mode node (real kube-apiserver, real containerd) runs N static
pods, each with one container whose readiness is an exec probe on a file. Then, in a
seeded random order and at random moments, it injects:

- each of the five services SIGKILLed `KLET_SOAK_SERVICE_KILLS` times (restarted after
  a random pause, as a supervisor would);
- Redis restarted empty (a flush) `KLET_SOAK_REDIS_FLUSHES` times;
- containerd SIGKILLed `KLET_SOAK_CONTAINERD_KILLS` times (its shims keep the containers,
  as upstream's node e2e restart test does), then restarted;
- the apiserver down for `KLET_SOAK_APISERVER_DOWN_S` seconds.

During every fault it flips the readiness of one pod (through CRI exec), a status update
that must reach both `/pods` and the apiserver's mirror pod once the fault is over. After each
fault it measures the convergence time, from the moment the component is back until every
pod is Running with the readiness it should have, in `/pods` and in the apiserver. At the
end it asserts: 0 containers restarted or replaced (CRI container IDs and restartCount),
0 lost status updates, 0 duplicate Events; and it writes the figures to `bench/results/soak.json`.

`KLET_SOAK_PODS` (default 110) and `KLET_SOAK_SEED` set the size and the order.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from klet.cri import CRISettings, RuntimeClient
from klet.cri import labels as L
from klet.devstack import DevStack
from klet.model.types import ContainerID
from klet.testbed.cluster import ControlPlane

from tests.harness.clusternode import cluster_node
from tests.harness.node import SERVICES, KletNode
from tests.harness.waiting import wait_for

pytestmark = pytest.mark.timeout(4 * 3600)

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "default"


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


PODS = _env_int("KLET_SOAK_PODS", 110)
SERVICE_KILLS = _env_int("KLET_SOAK_SERVICE_KILLS", 10)
CONTAINERD_KILLS = _env_int("KLET_SOAK_CONTAINERD_KILLS", 6)
REDIS_FLUSHES = _env_int("KLET_SOAK_REDIS_FLUSHES", 1)
APISERVER_DOWN_S = _env_int("KLET_SOAK_APISERVER_DOWN_S", 120)
SEED = _env_int("KLET_SOAK_SEED", 20261125)
CONVERGE_S = _env_int("KLET_SOAK_CONVERGE_S", 300)

# Readiness is an httpGet probe of /ready, a file the test creates and removes through CRI
# exec: syncloop probes over HTTP itself, so 110 pods do not cost 55 runc execs a second.
POD = """
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: default
spec:
  terminationGracePeriodSeconds: 5
  containers:
    - name: main
      image: registry.klet.test/httpd:1.36
      command: ["sh", "-c", "echo ok > /www/ready && exec httpd -f -p 8080 -h /www"]
      readinessProbe:
        httpGet:
          path: /ready
          port: 8080
        periodSeconds: 2
        failureThreshold: 1
        successThreshold: 1
"""


@dataclass
class Fault:
    kind: str  # "service", "redis", "containerd", "apiserver"
    target: str = ""

    def __str__(self) -> str:
        return f"{self.kind}:{self.target}" if self.target else self.kind


@dataclass
class Soak:
    node: KletNode
    stack: DevStack
    plane: ControlPlane
    names: list[str]
    expected_ready: dict[str, bool] = field(default_factory=dict)
    convergence: dict[str, list[float]] = field(default_factory=dict)
    flips: int = 0

    def full(self, name: str) -> str:
        return f"{name}-{self.node.node_name}"

    # -- observations --------------------------------------------------------------

    def node_view(self) -> dict[str, bool] | None:
        """Pod -> ready from `/pods`, if every pod is Running; None otherwise."""
        pods = self.node.pods()
        out: dict[str, bool] = {}
        for name in self.names:
            pod = pods.get(self.full(name))
            if pod is None or pod["status"].get("phase") != "Running":
                return None
            statuses = pod["status"].get("containerStatuses", [])
            if len(statuses) != 1 or "running" not in statuses[0].get("state", {}):
                return None
            out[name] = bool(statuses[0].get("ready"))
        return out

    def api_view(self) -> dict[str, bool] | None:
        """Pod -> Ready condition of the mirror pods, if every one is Running."""
        raw = self.plane.get(
            f"/api/v1/namespaces/{NAMESPACE}/pods?fieldSelector=spec.nodeName={self.node.node_name}"
        )
        items = {p["metadata"]["name"]: p for p in json.loads(raw)["items"]}
        out: dict[str, bool] = {}
        for name in self.names:
            pod = items.get(self.full(name))
            if pod is None or pod.get("status", {}).get("phase") != "Running":
                return None
            ready = next(
                (c for c in pod["status"].get("conditions", []) if c["type"] == "Ready"), None
            )
            out[name] = ready is not None and ready["status"] == "True"
        return out

    def converged(self) -> bool:
        return self.node_view() == self.expected_ready and self.api_view() == self.expected_ready

    def wait_converged(self, label: str, since: float) -> None:
        wait_for(self.converged, timeout_s=CONVERGE_S, what=f"convergence after {label}")
        took = time.monotonic() - since
        self.convergence.setdefault(label, []).append(took)
        print(f"soak: converged after {label} in {took:.2f}s", flush=True)

    # -- actions ---------------------------------------------------------------------

    def flip(self, name: str) -> None:
        """Toggle one pod's readiness file through CRI exec."""
        print(f"soak: flip {name} ready={not self.expected_ready[name]}", flush=True)
        ready = not self.expected_ready[name]
        cmd = ["sh", "-c", "echo ok > /www/ready"] if ready else ["rm", "-f", "/www/ready"]
        cid = next(iter(containers(self.stack, self.full(name))))
        code, _out, err = cri(
            self.stack, lambda c: c.exec_sync(ContainerID(cid), cmd, timeout_s=10)
        )
        assert code == 0, f"exec {cmd} in {name}: {err!r}"
        self.expected_ready[name] = ready
        self.flips += 1

    def inject(self, fault: Fault, rng: random.Random, during: Callable[[], None]) -> float:
        """Inject `fault`, call `during` while the component is down (containerd: just
        before, as the flip itself goes through CRI), repair it; return when it was back."""
        print(f"soak: fault {fault}", flush=True)
        if fault.kind == "service":
            self.node.kill(fault.target)
            during()
            time.sleep(rng.uniform(0.0, 2.0))
            self.node.start(fault.target)
        elif fault.kind == "redis":
            self.stack.redis.stop()
            during()
            self.stack.redis.start()  # empty: a flushed Redis
        elif fault.kind == "containerd":
            assert self.stack.containerd is not None
            during()
            self.stack.containerd.crash()
            time.sleep(rng.uniform(0.5, 3.0))
            self.stack.containerd.recover()
            # containerd answers `ctr version` before its CRI plugin has reloaded its state.
            wait_for(
                lambda: containers(self.stack) is not None,
                timeout_s=CONVERGE_S,
                what="CRI serving again",
            )
        elif fault.kind == "apiserver":
            self.plane.stop_apiserver()
            during()
            time.sleep(APISERVER_DOWN_S)
            self.plane.start_apiserver()
        else:
            raise ValueError(f"unknown fault {fault}")
        return time.monotonic()


def cri(stack: DevStack, call: Any) -> Any:
    async def go() -> Any:
        client = RuntimeClient(CRISettings(runtime_endpoint=stack.runtime_endpoint, timeout_s=30))
        try:
            return await call(client)
        finally:
            await client.close()

    return asyncio.run(go())


def containers(stack: DevStack, pod_name: str | None = None) -> dict[str, str]:
    """Running container id -> pod name, of one pod or of every labelled pod."""
    selector = {L.POD_NAME: pod_name} if pod_name else None
    listed = cri(stack, lambda c: c.list_containers(label_selector=selector))
    return {
        c.id: c.labels.get(L.POD_NAME, "") for c in listed if c.state.value == "CONTAINER_RUNNING"
    }


def schedule(rng: random.Random) -> list[Fault]:
    faults = [Fault("service", s) for s in SERVICES for _ in range(SERVICE_KILLS)]
    faults += [Fault("containerd") for _ in range(CONTAINERD_KILLS)]
    faults += [Fault("redis") for _ in range(REDIS_FLUSHES)]
    if APISERVER_DOWN_S > 0:
        faults.append(Fault("apiserver"))
    rng.shuffle(faults)
    return faults


def duplicate_events(plane: ControlPlane, node: KletNode) -> list[str]:
    """Events of the soak's pods that were posted twice: the same object, reason,
    container and message in two Events or with a count above one. Probe results
    (Unhealthy) repeat by nature and are left out."""
    raw = plane.get(f"/api/v1/namespaces/{NAMESPACE}/events?limit=5000")
    seen: Counter[tuple[str, str, str, str]] = Counter()
    for ev in json.loads(raw)["items"]:
        obj = ev.get("involvedObject", {})
        if not obj.get("name", "").endswith(f"-{node.node_name}") or ev["reason"] == "Unhealthy":
            continue
        key = (obj["name"], ev["reason"], obj.get("fieldPath", ""), ev.get("message", ""))
        seen[key] += max(1, int(ev.get("count") or 1))
    return [f"{k} x{n}" for k, n in seen.items() if n > 1]


@pytest.fixture
def soak(control_plane: ControlPlane, devstack: DevStack, tmp_path: Path) -> Iterator[Soak]:
    names = [f"soak-{i:03d}" for i in range(PODS)]
    with cluster_node(control_plane, devstack, tmp_path / "node", name="soaknode") as node:
        manifests: Path = node.manifests  # type: ignore[attr-defined]
        for name in names:
            (manifests / f"{name}.yaml").write_text(POD.format(name=name))
        s = Soak(node, devstack, control_plane, names, {n: True for n in names})
        yield s
        for name in names:
            (manifests / f"{name}.yaml").unlink(missing_ok=True)


def test_soak(soak: Soak) -> None:
    rng = random.Random(SEED)
    began = time.monotonic()
    soak.wait_converged("start", began)
    initial = containers(soak.stack)
    ours = {cid for cid, pod in initial.items() if pod.endswith("-soaknode")}
    assert len(ours) == PODS

    faults = schedule(rng)
    flip_order = list(soak.names)
    rng.shuffle(flip_order)
    for i, fault in enumerate(faults):
        time.sleep(rng.uniform(0.0, 3.0))  # a random moment
        name = flip_order[i % len(flip_order)]
        back = soak.inject(fault, rng, lambda name=name: soak.flip(name))
        soak.wait_converged(str(fault), back)

    # The final view: nothing replaced, nothing restarted, every flip reported.
    final = {cid for cid, pod in containers(soak.stack).items() if pod.endswith("-soaknode")}
    pods = soak.node.pods()
    restarts = sum(
        c["restartCount"]
        for n in soak.names
        for c in pods[soak.full(n)]["status"]["containerStatuses"]
    )
    lost = sum(
        1
        for view in (soak.node_view(), soak.api_view())
        for n in soak.names
        if view is None or view[n] != soak.expected_ready[n]
    )
    duplicates = duplicate_events(soak.plane, soak.node)
    figures = {
        "pods": PODS,
        "seed": SEED,
        "faults": len(faults),
        "flips": soak.flips,
        "container_restarts": restarts,
        "containers_replaced": len(ours - final),
        "lost_status_updates": lost,
        "duplicate_events": len(duplicates),
        "total_s": round(time.monotonic() - began, 1),
        "convergence_s": {
            kind: {
                "n": len(times),
                "median": round(statistics.median(times), 2),
                "max": round(max(times), 2),
            }
            for kind, times in soak.convergence.items()
        },
    }
    out = REPO / "bench" / "results" / "soak.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))
    assert final == ours, f"containers replaced: {sorted(ours - final)}"
    assert restarts == 0
    assert lost == 0
    assert not duplicates, duplicates
