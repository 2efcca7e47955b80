"""The memory and topology managers' configuration (klet.config.validation,
klet.config.support): memoryManagerPolicy Static loads with reservedMemory and is
refused without; reservedMemory entries are checked as upstream's
validateReservedMemoryConfiguration (memory and hugepages only, not zero, no duplicate
per node, no unknown field); every topology manager policy and scope loads, and its
options are upstream's two, with their values and gates checked; none of these fields
is refused as not implemented any more."""

from __future__ import annotations

import dataclasses

import pytest
from klet.config import KubeletConfiguration
from klet.config.support import unimplemented_problems
from klet.config.validation import validate_problems

RESERVED = ({"numaNode": 0, "limits": {"memory": "1100Mi"}},)


def _problems(**fields: object) -> list[str]:
    cfg = dataclasses.replace(KubeletConfiguration(), **fields)  # type: ignore[arg-type]
    return [str(p) for p in validate_problems(cfg)] + [str(p) for p in unimplemented_problems(cfg)]


@pytest.mark.parametrize(
    "fields",
    [
        {"memory_manager_policy": "Static", "reserved_memory": RESERVED},
        {"memory_manager_policy": "None"},
        {"topology_manager_policy": "single-numa-node", "topology_manager_scope": "pod"},
        {"topology_manager_policy": "restricted"},
        {"topology_manager_policy": "best-effort"},
        {
            "topology_manager_policy": "best-effort",
            "topology_manager_policy_options": {
                "prefer-closest-numa-nodes": "true",
                "max-allowable-numa-nodes": "16",
            },
        },
        {
            "reserved_memory": (
                {"numaNode": 0, "limits": {"memory": "1Gi", "hugepages-2Mi": "4Mi"}},
                {"numaNode": 1, "limits": {"memory": "1Gi"}},
            )
        },
    ],
)
def test_accepted(fields: dict[str, object]) -> None:
    assert _problems(**fields) == []


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"memory_manager_policy": "Static"}, "memoryManagerPolicy: Static needs reservedMemory"),
        ({"memory_manager_policy": "static"}, "memoryManagerPolicy: must be one of None, Static"),
        (
            {"reserved_memory": ({"numaNode": 0, "limits": {"cpu": "1"}},)},
            "reservedMemory[0].limits.cpu: the limit type 'cpu' for NUMA node 0 is not supported",
        ),
        (
            {"reserved_memory": ({"numaNode": 0, "limits": {"memory": "0"}},)},
            "reservedMemory[0].limits.memory: reserved memory may not be zero",
        ),
        (
            {
                "reserved_memory": (
                    {"numaNode": 0, "limits": {"memory": "1Gi"}},
                    {"numaNode": 0, "limits": {"memory": "1Gi"}},
                )
            },
            "reservedMemory[1].limits.memory: the reserved memory has a duplicate value",
        ),
        (
            {"reserved_memory": ({"numaNode": -1, "limits": {"memory": "1Gi"}},)},
            "reservedMemory[0].numaNode: must be a NUMA node number",
        ),
        (
            {"reserved_memory": ({"numa": 0, "limits": {"memory": "1Gi"}},)},
            "reservedMemory[0].numa: unknown field",
        ),
        ({"topology_manager_scope": "node"}, "topologyManagerScope: must be one of"),
        ({"topology_manager_policy": "strict"}, "topologyManagerPolicy: must be one of"),
    ],
)
def test_refused(fields: dict[str, object], problem: str) -> None:
    assert any(p.startswith(problem) for p in _problems(**fields)), _problems(**fields)


def test_topology_options() -> None:
    unknown = _problems(topology_manager_policy_options={"align-by-socket": "true"})
    assert any(
        p.startswith("topologyManagerPolicyOptions.align-by-socket: unknown Topology Manager")
        for p in unknown
    )
    bad = _problems(topology_manager_policy_options={"prefer-closest-numa-nodes": "yes"})
    assert any("must be true or false, not 'yes'" in p for p in bad)
    small = _problems(topology_manager_policy_options={"max-allowable-numa-nodes": "4"})
    assert any("must be an integer of at least 8" in p for p in small)
    gated = _problems(
        topology_manager_policy_options={"max-allowable-numa-nodes": "9"},
        feature_gates={"TopologyManagerPolicyBetaOptions": False},
    )
    assert any("requires feature gate TopologyManagerPolicyBetaOptions" in p for p in gated)
