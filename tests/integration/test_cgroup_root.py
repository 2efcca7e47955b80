"""cgroupRoot on real containerd (cgroupfs driver): a node started with a private
`--cgroup-root` puts its pods under `<root>/kubepods` (the QoS cgroups beside them),
never in the host's `/kubepods` that the other test nodes share; eviction reads the
allocatable memory signal from `<root>/kubepods`; the pod cgroup goes with the pod.
enforceNodeAllocatable [pods]: `<root>/kubepods` holds capacity − kubeReserved −
systemReserved (memory, CPU shares, pids.max), the besteffort QoS cgroup 2 shares, the
burstable one the Burstable pods' CPU requests as shares."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from klet.cgroups.machine import mem_total_bytes, read_machine

from tests.harness.node import EVICTION_PASSES, KletNode
from tests.harness.pods import running
from tests.harness.waiting import wait_for

CG = Path("/sys/fs/cgroup")
MI = 1024**2
CONTROLLERS = ("cpu", "memory", "pids")
ALLOCATABLE = "allocatableMemory.available"

POD = """
apiVersion: v1
kind: Pod
metadata:
  name: rooted
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: main
      image: registry.klet.test/busybox:1.36
      command: ["sleep", "100000"]
      resources:
        requests: {cpu: 100m, memory: 32Mi}
"""


def read(path: Path) -> str:
    return path.read_text().strip()


def huge_page_bytes() -> int:
    return sum(read_machine(Path("/")).hugepages.values())


def _remove_tree(rel: str) -> None:
    """rmdir the cgroup `rel` and what is below it in every v1 hierarchy, deepest first
    (a cgroup directory goes with rmdir once it holds no process)."""
    for hierarchy in CG.iterdir():
        top = hierarchy / rel
        if not top.is_dir() or top.is_symlink():
            continue
        for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            d.rmdir()
        top.rmdir()


@pytest.fixture
def cgroup_root() -> Iterator[str]:
    rel = f"klet-test-{uuid.uuid4().hex[:8]}"
    yield f"/{rel}"
    _remove_tree(rel)


def test_pods_go_under_the_cgroup_root(
    node_factory: Any, manifests: Path, cgroup_root: str
) -> None:
    node: KletNode = node_factory(
        manifest_dir=manifests,
        extra_flags=[
            "--cgroup-root",
            cgroup_root,
            "--system-reserved",
            "memory=256Mi,cpu=500m",
            "--kube-reserved",
            "memory=256Mi,pid=1000",
        ],
    )
    node.start()

    # eviction observes allocatableMemory.available only where it finds the kubepods
    # cgroup: the node's own, which syncloop makes with its first pod (the host's
    # /kubepods, when other nodes made one, is not this node's)
    def observed() -> float | None:
        return node.metric("eviction", "klet_eviction_signal_capacity", eviction_signal=ALLOCATABLE)

    node.wait_passes("eviction", EVICTION_PASSES, 1, timeout_s=30)
    assert not (CG / "memory" / cgroup_root.lstrip("/")).exists()
    assert observed() is None

    (manifests / "rooted.yaml").write_text(POD)
    pod: dict[str, Any] = wait_for(
        lambda: running(node, "rooted"), timeout_s=30, what="rooted Running"
    )
    uid = pod["metadata"]["uid"]
    # enforceNodeAllocatable [pods] (the default): capacity − kubeReserved −
    # systemReserved on <root>/kubepods; the besteffort QoS cgroup at the minimum shares
    top = f"{cgroup_root.lstrip('/')}/kubepods"
    memory = mem_total_bytes() - 512 * MI - huge_page_bytes()
    assert read(CG / "memory" / top / "memory.limit_in_bytes") == str(memory // 4096 * 4096)
    cpu_millis = (os.cpu_count() or 1) * 1000 - 500
    assert read(CG / "cpu" / top / "cpu.shares") == str(cpu_millis * 1024 // 1000)
    pid_max = int(read(Path("/proc/sys/kernel/pid_max")))
    assert read(CG / "pids" / top / "pids.max") == str(pid_max - 1000)
    assert read(CG / "cpu" / top / "besteffort" / "cpu.shares") == "2"
    # the burstable QoS cgroup: the Burstable pods' CPU requests (100m) as shares
    assert read(CG / "cpu" / top / "burstable" / "cpu.shares") == "102"
    mine = f"{cgroup_root.lstrip('/')}/kubepods/burstable/pod{uid}"
    for ctrl in CONTROLLERS:
        assert (CG / ctrl / mine).is_dir(), ctrl
        assert not (CG / ctrl / "kubepods" / "burstable" / f"pod{uid}").exists(), ctrl
    assert (CG / "memory" / mine / "memory.limit_in_bytes").is_file()
    # the container's processes are in the pod cgroup under the root
    procs = [
        p
        for d in (CG / "cpu" / mine).iterdir()
        if d.is_dir()
        for p in (d / "cgroup.procs").read_text().split()
    ]
    assert procs
    assert f"/{mine}/" in Path(f"/proc/{procs[0]}/cgroup").read_text()

    assert wait_for(observed, timeout_s=30, what="allocatableMemory.available observed")

    (manifests / "rooted.yaml").unlink()
    wait_for(
        lambda: not any((CG / c / mine).exists() for c in CONTROLLERS),
        timeout_s=30,
        what="the pod cgroup under the root removed",
    )
