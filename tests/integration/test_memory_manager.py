"""The Static memory manager and the single-numa-node topology manager on real
containerd, on this one-NUMA-node machine (`memoryManagerPolicy: Static`,
`reservedMemory` 100Mi on node 0 = the default evictionHard memory.available,
`topologyManagerPolicy: single-numa-node`).

Covers: a Guaranteed pod is admitted (its single-node hint is preferred), runs, and its
container's cgroup cpuset.mems is 0 (the CRI create config's cpuset_mems); the state
file `<root-dir>/memory_manager_state` is upstream's JSON with a checksum that
verifies, recording the container's memory block on node 0; a best-effort pod runs
without a block; a Guaranteed pod asking more memory than node 0 has is refused with
upstream's TopologyAffinityError and never reaches the runtime; syncloop SIGKILLed and
restarted keeps the container (same ID, no restart) and the block; upstream's
kubelet_memory_manager_* and kubelet_topology_manager_* series count them; the pod removed,
its block is freed. Apart: a state file written for another policy stops syncloop at
start with upstream's message."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from klet.cri import CRISettings, RuntimeClient
from klet.model.types import ContainerID
from klet.syncloop.memorymanager.state import decode

from tests.harness.node import KletNode, container_status, run_syncloop
from tests.harness.pods import running, runtime_sandboxes
from tests.harness.waiting import wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(180),
    pytest.mark.skipif(
        not Path("/sys/devices/system/node/node0").is_dir()
        or Path("/sys/devices/system/node/node1").exists(),
        reason="the proof is for a machine with one NUMA node",
    ),
]

CONFIG = """\
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
memoryManagerPolicy: Static
reservedMemory:
  - numaNode: 0
    limits: {memory: 100Mi}
topologyManagerPolicy: single-numa-node
"""
POD = """
apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: main
      image: registry.klet.test/busybox:1.36
      command: ["sleep", "100000"]
{resources}
"""
GUARANTEED = """      resources:
        limits: {cpu: 100m, memory: 32Mi}"""
HUGE = """      resources:
        limits: {{cpu: 100m, memory: "{memory}"}}"""


def mem_total(path: str) -> int:
    for line in Path(path).read_text().splitlines():
        parts = line.split()
        if "MemTotal:" in parts:
            return int(parts[parts.index("MemTotal:") + 1]) * 1024
    raise AssertionError(f"no MemTotal in {path}")


def cpuset_mems(node: KletNode, pod: dict[str, Any]) -> str:
    cid = container_status(pod, "main")["containerID"].split("://", 1)[1]

    async def go() -> int:
        cri = RuntimeClient(CRISettings(runtime_endpoint=node.stack.runtime_endpoint, timeout_s=30))
        try:
            return await cri.container_pid(ContainerID(cid))
        finally:
            await cri.close()

    pid = asyncio.run(go())
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpuset" in controllers.split(","):
            base = Path("/sys/fs/cgroup") / controllers / path.lstrip("/")
            return (base / "cpuset.mems").read_text().strip()
    raise AssertionError(f"no cpuset cgroup for {pid}")


def rejected(node: KletNode, name: str) -> dict[str, Any] | None:
    pod = node.pods().get(f"{name}-{node.node_name}")
    return pod if pod and pod["status"].get("phase") == "Failed" else None


def test_a_guaranteed_pod_gets_node_0_and_keeps_it_across_a_restart(
    node_factory: Any, manifests: Path, tmp_path: Path
) -> None:
    config = tmp_path / "kubelet.yaml"
    config.write_text(CONFIG)
    node: KletNode = node_factory(manifest_dir=manifests, extra_flags=["--config", str(config)])
    state_file = node.root_dir / "memory_manager_state"
    (manifests / "pinned.yaml").write_text(POD.format(name="pinned", resources=GUARANTEED))
    (manifests / "plain.yaml").write_text(POD.format(name="plain", resources=""))
    node.start()
    pinned = wait_for(lambda: running(node, "pinned"), timeout_s=60, what="pinned Running")
    plain = wait_for(lambda: running(node, "plain"), timeout_s=60, what="plain Running")
    assert pinned["status"]["qosClass"] == "Guaranteed"
    assert cpuset_mems(node, pinned) == "0"
    uid = pinned["metadata"]["uid"]
    blob = state_file.read_bytes()
    doc = json.loads(blob)
    assert list(doc) == ["policyName", "machineState", "entries", "checksum"]
    assert doc["policyName"] == "Static"
    assert doc["entries"] == {
        uid: {"main": [{"numaAffinity": [0], "type": "memory", "size": 32 << 20}]}
    }
    node0 = doc["machineState"]["0"]
    assert node0["memoryMap"]["memory"]["systemReserved"] == 100 << 20
    assert node0["memoryMap"]["memory"]["reserved"] == 32 << 20
    assert node0["numberOfAssignments"] == 1 and node0["cells"] == [0]
    decode(blob)  # the checksum verifies
    assert plain["metadata"]["uid"] not in doc["entries"]

    # Just more than node 0 can give (its MemTotal less the reservation): where the
    # machine has more memory than its NUMA node reports (this VM does) the resource fit
    # passes and the topology manager refuses; else the fit refuses first, as upstream.
    node0 = mem_total("/sys/devices/system/node/node0/meminfo")
    ask = node0 - (100 << 20) + (64 << 20)
    huge = HUGE.format(memory=str(ask))
    (manifests / "huge.yaml").write_text(POD.format(name="huge", resources=huge))
    failed = wait_for(lambda: rejected(node, "huge"), timeout_s=30, what="huge Failed")
    if mem_total("/proc/meminfo") - node0 > (64 << 20):
        assert failed["status"]["reason"] == "TopologyAffinityError"
        assert failed["status"]["message"] == (
            "Pod was rejected: Resources cannot be allocated with Topology locality"
        )
    else:  # the fit's refusal of a static (critical) pod: no pod to preempt
        assert failed["status"]["reason"] == "UnexpectedAdmissionError"
    assert runtime_sandboxes(node.stack, f"huge-{node.node_name}") == []
    # upstream's series on syncloop's /metrics: the pinned container's pinning, and the
    # three admissions (pinned, plain, huge) of which the topology manager refused one
    assert node.metric("syncloop", "kubelet_memory_manager_pinning_requests_total") == 1
    assert node.metric("syncloop", "kubelet_memory_manager_pinning_errors_total") == 0
    assert node.metric("syncloop", "kubelet_topology_manager_admission_requests_total") == 3
    assert node.metric("syncloop", "kubelet_topology_manager_admission_errors_total") == (
        1 if failed["status"]["reason"] == "TopologyAffinityError" else 0
    )

    before = container_status(node.pods()[f"pinned-{node.node_name}"], "main")
    node.kill("syncloop")
    node.start("syncloop")
    node.wait_passes("syncloop", "kubelet_pleg_relist_duration_seconds_count", 3, timeout_s=60)
    now = container_status(node.pods()[f"pinned-{node.node_name}"], "main")
    assert (now["containerID"], now["restartCount"]) == (before["containerID"], 0)
    assert decode(state_file.read_bytes()).blocks(uid, "main") is not None
    assert "memory blocks released" not in node.log("syncloop")

    (manifests / "pinned.yaml").unlink()
    (manifests / "huge.yaml").unlink()
    wait_for(
        lambda: "entries" not in json.loads(state_file.read_bytes()),
        timeout_s=60,
        what="the block freed",
    )
    assert (
        json.loads(state_file.read_bytes())["machineState"]["0"]["memoryMap"]["memory"]["reserved"]
        == 0
    )


def test_a_state_file_of_another_policy_stops_syncloop(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "memory_manager_state").write_bytes(
        b'{"policyName":"None","machineState":{},"checksum":4236770233}'
    )
    config = tmp_path / "kubelet.yaml"
    config.write_text(CONFIG)
    res = run_syncloop(tmp_path, "--config", str(config))
    assert res.returncode == 1
    assert "configured policy 'Static' differs from state checkpoint policy 'None'" in res.stderr
    assert "delete the memory manager checkpoint file" in res.stderr
