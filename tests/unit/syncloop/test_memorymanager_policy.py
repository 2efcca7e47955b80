"""The Static memory manager policy (klet.syncloop.memorymanager.policy) on fake
two-node machines: reservedMemory adds up to Node Allocatable's reservation or is
refused naming the type and node; the default machine state takes huge pages and the
reservation off each node; hints are the node sets that fit, preferred when narrowest,
regenerated from the blocks of a container already placed; allocation follows the
topology hint, picks the narrowest set without one, spreads over a group when one node
cannot hold the request and never joins a node used alone into a group; release frees
the memory; a restart's state is checked against the machine as upstream's
validateState; pods that are not Guaranteed get nothing."""

from __future__ import annotations

import pytest
from klet.model.types import JSON
from klet.syncloop.memorymanager.policy import (
    AllocationError,
    MemoryManagerError,
    NUMANode,
    StaticPolicy,
    container_numa_nodes,
    pod_requests,
    reserved_per_node,
)
from klet.syncloop.memorymanager.state import MemoryState, MemoryTable
from klet.syncloop.topologymanager.hints import TopologyHint, mask_of

GI = 1 << 30
NODES = (NUMANode(0, 4 * GI, {"hugepages-2Mi": 512 << 20}), NUMANode(1, 4 * GI))
RESERVED = {0: {"memory": GI}, 1: {"memory": GI}}
NO_HINT = TopologyHint(None, False)


def pod(uid: str, *mems: str, qos: str = "Guaranteed", hugepages: str | None = None) -> JSON:
    containers = []
    for i, m in enumerate(mems):
        res = {"cpu": "1", "memory": m}
        if hugepages:
            res["hugepages-2Mi"] = hugepages
        limits = dict(res) if qos == "Guaranteed" else {}
        containers.append({"name": f"c{i}", "resources": {"requests": res, "limits": limits}})
    return {
        "metadata": {"uid": uid, "name": uid, "namespace": "default"},
        "spec": {"containers": containers},
    }


def fresh() -> tuple[StaticPolicy, MemoryState]:
    policy = StaticPolicy(NODES, RESERVED)
    return policy, policy.start(MemoryState("Static"))


def test_reserved_memory_must_add_up_to_node_allocatables_reservation() -> None:
    entries = [
        {"numaNode": 0, "limits": {"memory": "600Mi"}},
        {"numaNode": 1, "limits": {"memory": "500Mi"}},
    ]
    got = reserved_per_node(entries, NODES, {"memory": 1100 << 20})
    assert got == {0: {"memory": 600 << 20}, 1: {"memory": 500 << 20}}
    with pytest.raises(MemoryManagerError, match="total amount 1153433600 of type 'memory'"):
        reserved_per_node(entries, NODES, {"memory": 100 << 20})
    with pytest.raises(MemoryManagerError, match="NUMA node 7 that does not exist"):
        reserved_per_node([{"numaNode": 7, "limits": {"memory": "1Gi"}}], NODES, {"memory": GI})
    with pytest.raises(MemoryManagerError, match=r"reservedMemory\[0\].limits.cpu"):
        reserved_per_node([{"numaNode": 0, "limits": {"cpu": "1"}}], NODES, {})
    with pytest.raises(MemoryManagerError, match="'hugepages-2Mi' is not equal"):
        reserved_per_node(entries, NODES, {"memory": 1100 << 20, "hugepages-2Mi": 2 << 20})


def test_the_default_machine_state() -> None:
    _, state = fresh()
    assert state.machine is not None
    mm0 = state.machine[0].memory_map or {}
    assert mm0["hugepages-2Mi"] == MemoryTable(512 << 20, 0, 512 << 20, 0, 512 << 20)
    free0 = 4 * GI - GI - (512 << 20)
    assert mm0["memory"] == MemoryTable(4 * GI, GI, free0, 0, free0)
    assert state.machine[1].cells == [1]


def test_hints_are_the_node_sets_that_fit_preferred_when_narrowest() -> None:
    policy, state = fresh()
    small = pod("a", "1Gi")
    hints = policy.hints(state, small, small["spec"]["containers"][0]) or {}
    assert list(hints["memory"] or ()) == [
        TopologyHint(1, True),
        TopologyHint(2, True),
        TopologyHint(3, False),
    ]
    big = pod("b", "5Gi")  # more than either node holds
    hints = policy.hints(state, big, big["spec"]["containers"][0]) or {}
    assert list(hints["memory"] or ()) == [TopologyHint(3, True)]
    burstable = pod("c", "1Gi", qos="Burstable")
    assert policy.hints(state, burstable, burstable["spec"]["containers"][0]) is None
    assert policy.allocate(state, burstable, burstable["spec"]["containers"][0], NO_HINT) is state


def test_allocation_follows_the_hint_and_frees_on_remove() -> None:
    policy, state = fresh()
    p = pod("a", "1Gi", hugepages="4Mi")
    c = p["spec"]["containers"][0]
    after = policy.allocate(state, p, c, TopologyHint(mask_of([0]), True))
    assert container_numa_nodes(after, "a", "c0") == [0]
    node0 = (after.machine or {})[0]
    assert node0.number_of_assignments == 2  # memory and hugepages blocks
    assert (node0.memory_map or {})["memory"].reserved == GI
    assert (node0.memory_map or {})["hugepages-2Mi"].reserved == 4 << 20
    assert policy.allocate(after, p, c, NO_HINT) is after  # already placed
    hints = policy.hints(after, p, c) or {}
    assert list(hints["memory"] or ()) == [TopologyHint(1, True)]  # regenerated
    back = policy.remove(after, "a", "c0")
    assert back == state


def test_without_a_hint_the_narrowest_node_is_taken() -> None:
    policy, state = fresh()
    p = pod("a", "1Gi")
    after = policy.allocate(state, p, p["spec"]["containers"][0], NO_HINT)
    assert container_numa_nodes(after, "a", "c0") == [0]


def test_a_request_larger_than_a_node_spreads_over_the_group() -> None:
    policy, state = fresh()
    p = pod("a", "5Gi")
    after = policy.allocate(state, p, p["spec"]["containers"][0], TopologyHint(1, True))
    assert container_numa_nodes(after, "a", "c0") == [0, 1]
    assert [(after.machine or {})[n].cells for n in (0, 1)] == [[0, 1], [0, 1]]


def test_a_node_used_alone_is_never_joined_into_a_group() -> None:
    policy, state = fresh()
    first = pod("a", "1Gi")
    state = policy.allocate(state, first, first["spec"]["containers"][0], TopologyHint(1, True))
    second = pod("b", "4Gi")  # fits the free memory of both nodes together
    c = second["spec"]["containers"][0]
    assert policy.hints(state, second, c) == {"memory": []}
    with pytest.raises(AllocationError, match="no NUMA nodes with enough memory"):
        policy.allocate(state, second, c, NO_HINT)
    with pytest.raises(AllocationError, match="violates NUMA node allocation"):
        policy.allocate(state, second, c, TopologyHint(3, False))


def test_pod_requests_take_the_larger_of_init_and_app_containers() -> None:
    p = pod("a", "1Gi", "1Gi")
    p["spec"]["initContainers"] = [
        {"name": "init", "resources": {"requests": {"memory": "3Gi"}}},
        {"name": "side", "restartPolicy": "Always", "resources": {"requests": {"memory": "1Gi"}}},
    ]
    assert pod_requests(p) == {"memory": 3 * GI}


def test_a_restarted_state_is_checked_against_the_machine() -> None:
    policy, state = fresh()
    p = pod("a", "1Gi")
    state = policy.allocate(state, p, p["spec"]["containers"][0], NO_HINT)
    assert policy.start(state) is state
    tampered = state.clone()
    ((tampered.machine or {})[0].memory_map or {})["memory"].free += 1
    with pytest.raises(MemoryManagerError, match="expected machine state is different"):
        policy.start(tampered)
    with pytest.raises(MemoryManagerError, match="differs from state checkpoint policy 'None'"):
        policy.start(MemoryState("None"))
    orphan = MemoryState("Static", {}, state.entries)
    with pytest.raises(MemoryManagerError, match="can not be empty"):
        policy.start(orphan)
    other = StaticPolicy(NODES, {0: {"memory": 2 * GI}, 1: {}})
    with pytest.raises(MemoryManagerError, match="expected machine state"):
        other.start(state)
