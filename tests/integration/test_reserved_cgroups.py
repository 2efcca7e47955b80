"""enforceNodeAllocatable system-reserved and kube-reserved on this host's cgroup v1
hierarchies (cgroupfs driver): syncloop writes systemReserved and kubeReserved (CPU
shares, memory limit, pids.max) onto the existing cgroups systemReservedCgroup and
kubeReservedCgroup, records a NodeAllocatableEnforced Event on the Node for each, and
refuses to start, naming the field, the path and the key, when one does not exist
(creating nothing; here named by the --system-reserved-cgroup flag over the file). The
cgroups are the test's own, under a private top cgroup."""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.node import KletNode, bus_events, run_syncloop
from tests.harness.waiting import wait_for

CG = Path("/sys/fs/cgroup")
MI = 1024**2
HIERARCHIES = ("cpu", "memory", "pids")


def config(top: str, *, system: str, kube: str) -> str:
    return f"""apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupRoot: {top}
enforceNodeAllocatable: [pods, system-reserved, kube-reserved]
systemReservedCgroup: {system}
kubeReservedCgroup: {kube}
systemReserved: {{cpu: 500m, memory: 256Mi, pid: "1000"}}
kubeReserved: {{cpu: 200m, memory: 128Mi, pid: "500"}}
"""


@pytest.fixture
def top() -> Iterator[str]:
    """A private top cgroup in the cpu, memory and pids hierarchies, with `system` and
    `kube` below it; removed with whatever is below it afterwards."""
    rel = f"klet-test-{uuid.uuid4().hex[:8]}"
    for h in HIERARCHIES:
        for name in ("system", "kube"):
            (CG / h / rel / name).mkdir(parents=True)
    yield f"/{rel}"
    for h in CG.iterdir():
        d = h / rel
        if d.is_dir() and not h.is_symlink():
            for sub in sorted((p for p in d.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                sub.rmdir()
            d.rmdir()


def read(path: Path) -> str:
    return path.read_text().strip()


def test_reserved_limits_written_with_node_events(
    node_factory: Any, tmp_path: Path, top: str
) -> None:
    path = tmp_path / "kubelet.yaml"
    path.write_text(config(top, system=f"{top}/system", kube=f"{top}/kube"))
    node: KletNode = node_factory(extra_flags=["--config", str(path)])
    node.start("syncloop")

    def enforced() -> list[str]:
        return [e.message for e in bus_events(node) if e.reason == "NodeAllocatableEnforced"]

    messages = wait_for(
        lambda: enforced() if len(enforced()) >= 2 else None,
        timeout_s=20,
        what="two NodeAllocatableEnforced Events",
    )
    assert messages == [
        f"Updated limits on system reserved cgroup {top}/system",
        f"Updated limits on kube reserved cgroup {top}/kube",
    ]
    (event,) = [e for e in bus_events(node) if e.message == messages[0]]
    assert (event.type, event.involved["kind"], event.involved["name"]) == (
        "Normal",
        "Node",
        node.node_name,
    )
    rel = top.lstrip("/")
    kube = f"{rel}/kube"
    assert read(CG / "cpu" / rel / "system" / "cpu.shares") == str(500 * 1024 // 1000)
    assert read(CG / "memory" / rel / "system" / "memory.limit_in_bytes") == str(256 * MI)
    assert read(CG / "pids" / rel / "system" / "pids.max") == "1000"
    assert read(CG / "cpu" / kube / "cpu.shares") == str(200 * 1024 // 1000)
    assert read(CG / "memory" / kube / "memory.limit_in_bytes") == str(128 * MI)
    assert read(CG / "pids" / kube / "pids.max") == "500"
    assert "FailedNodeAllocatableEnforcement" not in {e.reason for e in bus_events(node)}


def test_a_missing_reserved_cgroup_refuses_the_start(top: str) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="krc-", dir="/tmp"))
    try:
        path = tmp / "kubelet.yaml"
        missing = f"{top}/nothing"
        path.write_text(config(top, system=f"{top}/system", kube=f"{top}/kube"))
        res = run_syncloop(
            tmp,
            "--config",
            str(path),
            "--system-reserved-cgroup",
            missing,  # over the file's
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    assert res.returncode == 1, res.stderr
    assert (
        f"systemReservedCgroup: {missing} does not exist "
        "(enforceNodeAllocatable has system-reserved)"
    ) in res.stderr
    assert not any((CG / h / missing.lstrip("/")).exists() for h in HIERARCHIES)
    # nothing was written: the existing cgroups keep the kernel's defaults
    for name in ("system", "kube"):
        assert read(CG / "pids" / top.lstrip("/") / name / "pids.max") == "max"
