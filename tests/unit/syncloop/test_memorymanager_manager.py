"""The memory manager (klet.syncloop.memorymanager.manager) over a temporary root dir
and a fake two-node machine: memoryManagerPolicy Static needs reservedMemory adding up
to kube-reserved + system-reserved + evictionHard's memory.available; allocation writes
`memory_manager_state` before it answers and gives the container's cpuset.mems; a new
manager over the same root dir (a restarted syncloop) reads the blocks back and the
re-admitted container keeps them; a file of another policy or a corrupt one stops the
start with upstream's message; inactive pods' blocks are released; the None policy
writes upstream's empty file and sets no cpuset.mems."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from klet.config import KubeletConfiguration
from klet.model.types import JSON
from klet.syncloop.memorymanager.manager import MemoryManager, create_manager
from klet.syncloop.memorymanager.numa import Machine
from klet.syncloop.memorymanager.policy import MemoryManagerError, NUMANode
from klet.syncloop.topologymanager.hints import TopologyHint

GI = 1 << 30
MACHINE = Machine((NUMANode(0, 4 * GI), NUMANode(1, 4 * GI)), {0: [10, 20], 1: [20, 10]})
NO_HINT = TopologyHint(None, False)


def cfg(**fields: object) -> KubeletConfiguration:
    base = {
        "memory_manager_policy": "Static",
        "kube_reserved": {"memory": "412Mi"},
        "reserved_memory": (
            {"numaNode": 0, "limits": {"memory": "256Mi"}},
            {"numaNode": 1, "limits": {"memory": "256Mi"}},
        ),
    }
    return dataclasses.replace(KubeletConfiguration(), **{**base, **fields})  # type: ignore[arg-type]


def pod(uid: str, memory: str = "1Gi") -> JSON:
    res = {"cpu": "1", "memory": memory}
    return {
        "metadata": {"uid": uid, "name": uid, "namespace": "default"},
        "spec": {"containers": [{"name": "app", "resources": {"requests": res, "limits": res}}]},
    }


def static(root: Path) -> MemoryManager:
    m = create_manager(cfg(), root, machine=MACHINE)
    m.load()
    return m


def test_static_needs_reserved_memory_that_adds_up(tmp_path: Path) -> None:
    with pytest.raises(MemoryManagerError, match="should specify the system reserved memory"):
        create_manager(cfg(reserved_memory=()), tmp_path, machine=MACHINE)
    # 412Mi kube-reserved + 100Mi evictionHard = 512Mi, not 256Mi
    bad = ({"numaNode": 0, "limits": {"memory": "256Mi"}},)
    with pytest.raises(MemoryManagerError, match="not equal to the value 536870912"):
        create_manager(cfg(reserved_memory=bad), tmp_path, machine=MACHINE)


def test_allocation_is_written_before_the_answer_and_survives_a_restart(tmp_path: Path) -> None:
    m = static(tmp_path)
    p = pod("a")
    c = p["spec"]["containers"][0]
    assert m.allocate(p, c, TopologyHint(2, True)) is None
    assert m.cpuset_mems("a", "app") == "1"
    doc = json.loads((tmp_path / "memory_manager_state").read_bytes())
    assert doc["policyName"] == "Static"
    assert doc["entries"] == {"a": {"app": [{"numaAffinity": [1], "type": "memory", "size": GI}]}}
    again = static(tmp_path)
    assert again.cpuset_mems("a", "app") == "1"
    assert again.topology_hints(p, c) == {"memory": [TopologyHint(2, True)]}
    assert again.allocate(p, c, TopologyHint(2, True)) is None
    assert again.state == m.state


def test_a_container_that_fits_nowhere_gets_upstreams_words(tmp_path: Path) -> None:
    m = static(tmp_path)
    p = pod("a", "9Gi")
    assert m.allocate(p, p["spec"]["containers"][0], NO_HINT) == (
        "[memorymanager] failed to get the default NUMA affinity, no NUMA nodes with enough "
        "memory is available"
    )


def test_a_bad_file_stops_the_start(tmp_path: Path) -> None:
    path = tmp_path / "memory_manager_state"
    path.write_bytes(b'{"policyName":"None","machineState":{},"checksum":4236770233}')
    with pytest.raises(MemoryManagerError, match="configured policy 'Static' differs"):
        create_manager(cfg(), tmp_path, machine=MACHINE).check()
    path.write_bytes(b'{"policyName":"Static","machineState":{},"checksum":1}')
    with pytest.raises(MemoryManagerError, match="checkpoint is corrupted.*drain this node"):
        create_manager(cfg(), tmp_path, machine=MACHINE).check()


def test_inactive_pods_are_released(tmp_path: Path) -> None:
    m = static(tmp_path)
    for uid in ("a", "b"):
        p = pod(uid)
        assert m.allocate(p, p["spec"]["containers"][0], NO_HINT) is None
    m.release({"b": pod("b")})
    assert m.cpuset_mems("a", "app") == ""
    assert m.cpuset_mems("b", "app") == "0"
    assert set(json.loads((tmp_path / "memory_manager_state").read_bytes())["entries"]) == {"b"}


def test_the_none_policy(tmp_path: Path) -> None:
    m = create_manager(KubeletConfiguration(), tmp_path)
    m.load()
    assert (tmp_path / "memory_manager_state").read_bytes() == (
        b'{"policyName":"None","machineState":{},"checksum":4236770233}'
    )
    p = pod("a")
    assert m.topology_hints(p, p["spec"]["containers"][0]) is None
    assert m.allocate(p, p["spec"]["containers"][0], NO_HINT) is None
    assert m.cpuset_mems("a", "app") == ""
