"""The CPU manager as the topology manager's hint provider and first allocator
(klet.syncloop.cpumanager.policy hints and allocate, cpumanager.manager): over a fake
two-socket, two-NUMA-node machine (12 CPUs, two threads per core, six on each node)
the hints for requests that fit one node, both nodes or none, with upstream's
preferred flags (as few nodes as the machine can hold the request in); hints
regenerated from CPUs a container already holds; the pod's hints (scope pod) for what
the whole pod takes at once; none for a shared-pool container or under the none
policy. The merged hint steers the pick: CPUs of the hinted node first, the rest from
anywhere; single-numa-node refuses a pod no single node can hold and places one that
fits on one node (where, unhinted, the packing would have split it); container scope
hints each container after its siblings took their CPUs; the CPU manager's own
refusal reasons pass through the topology manager unchanged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from klet.syncloop.cpumanager.manager import CPUManager
from klet.syncloop.cpumanager.policy import (
    NonePolicy,
    Options,
    StaticPolicy,
    pod_guaranteed_cpus,
)
from klet.syncloop.cpumanager.state import CPUState
from klet.syncloop.cpumanager.topology import CPUInfo, CPUTopology
from klet.syncloop.topologymanager.hints import NUMAInfo, TopologyHint
from klet.syncloop.topologymanager.manager import TopologyManager

# the machine of upstream's topology_hints_test: threads c and c + 6 share a core; CPUs
# 0-2 and 6-8 are socket and NUMA node 0, the others node 1
DUAL = CPUTopology({c: CPUInfo(core=c % 6, socket=c % 6 // 3, numa=c % 6 // 3) for c in range(12)})
NODE0, NODE1, BOTH = 0b01, 0b10, 0b11
NUMA = NUMAInfo((0, 1))


def _c(name: str, cpu: str | None, **extra: Any) -> dict[str, Any]:
    res = {"cpu": cpu, "memory": "64Mi"} if cpu else {}
    return {"name": name, "resources": {"requests": res, "limits": res}, **extra}


def _pod(uid: str, *containers: dict[str, Any], inits: tuple[Any, ...] = ()) -> dict[str, Any]:
    return {
        "metadata": {"uid": uid, "name": uid, "namespace": "default"},
        "spec": {"initContainers": list(inits), "containers": list(containers)},
    }


def _policy(**options: bool) -> StaticPolicy:
    # no reserved CPUs, as upstream's hint tests: the free CPUs are the default set
    return StaticPolicy(topology=DUAL, reserved=frozenset(), options=Options(**options))


def _state(
    default: set[int], assignments: dict[str, dict[str, set[int]]] | None = None
) -> CPUState:
    return CPUState(
        "static",
        frozenset(default),
        {p: {c: frozenset(s) for c, s in cs.items()} for p, cs in (assignments or {}).items()},
    )


FREE_4_AND_6 = {2, 3, 4, 5, 6, 7, 8, 9, 10, 11}
"""Four free CPUs on node 0 (2 6 7 8: one whole core), six on node 1."""


@pytest.mark.parametrize(
    ("request_cpus", "default", "held", "want"),
    [
        pytest.param(
            "2",
            FREE_4_AND_6,
            None,
            [TopologyHint(NODE0, True), TopologyHint(NODE1, True), TopologyHint(BOTH, False)],
            id="2 CPUs: either node, preferred; both nodes not",
        ),
        pytest.param(
            "5",
            FREE_4_AND_6,
            None,
            [TopologyHint(NODE1, True), TopologyHint(BOTH, False)],
            id="5 CPUs: only node 1 has them",
        ),
        pytest.param(
            "7",
            FREE_4_AND_6,
            None,
            [TopologyHint(BOTH, True)],
            id="7 CPUs: no node holds 7, so both nodes are preferred",
        ),
        pytest.param("11", FREE_4_AND_6, None, [], id="11 CPUs: 10 free, fits nowhere"),
        pytest.param(
            "2", {0, 3}, None, [TopologyHint(BOTH, False)], id="2 CPUs, one free on each node"
        ),
        pytest.param(
            "2",
            set(),
            {0, 6},
            [TopologyHint(NODE0, True), TopologyHint(BOTH, False)],
            id="held on node 0: regenerated from the held CPUs",
        ),
        pytest.param(
            "2",
            set(),
            {3, 9},
            [TopologyHint(NODE1, True), TopologyHint(BOTH, False)],
            id="held on node 1",
        ),
        pytest.param(
            "11",
            {11},
            set(range(11)),
            [TopologyHint(BOTH, True)],
            id="held across both nodes",
        ),
        pytest.param("3", set(), {0, 6}, [], id="held another count: unsatisfiable"),
    ],
)
def test_container_hints(
    request_cpus: str, default: set[int], held: set[int] | None, want: list[TopologyHint]
) -> None:
    pod = _pod("p", _c("app", request_cpus))
    state = _state(default, {"p": {"app": held}} if held is not None else None)
    hints = _policy().container_hints(state, pod, pod["spec"]["containers"][0])
    assert hints == want


def test_no_hints_for_a_shared_pool_container_or_the_none_policy(tmp_path: Path) -> None:
    policy = _policy()
    state = _state(FREE_4_AND_6)
    burstable = _pod("b", {"name": "app", "resources": {"requests": {"cpu": "1"}}})
    assert policy.container_hints(state, burstable, burstable["spec"]["containers"][0]) is None
    fractional = _pod("f", _c("app", "1500m"))
    assert policy.container_hints(state, fractional, fractional["spec"]["containers"][0]) is None
    assert policy.pod_hints(state, fractional) is None
    guaranteed = _pod("g", _c("app", "2"))
    none = CPUManager(NonePolicy(), tmp_path)
    assert none.topology_hints(guaranteed, guaranteed["spec"]["containers"][0]) is None
    assert none.pod_topology_hints(guaranteed) is None


def test_pod_hints_cover_what_the_whole_pod_takes() -> None:
    # two app containers of 3 and a sidecar of 1 run together: 7; the init container's
    # 4 (with the sidecar started before it: 5) is less
    pod = _pod(
        "p",
        _c("a", "3"),
        _c("b", "3"),
        inits=(_c("side", "1", restartPolicy="Always"), _c("init", "4")),
    )
    assert pod_guaranteed_cpus(pod) == 7
    assert _policy().pod_hints(_state(FREE_4_AND_6), pod) == [TopologyHint(BOTH, True)]
    six = _pod("q", _c("a", "3"), _c("b", "3"))
    assert _policy().pod_hints(_state(FREE_4_AND_6), six) == [
        TopologyHint(NODE1, True),
        TopologyHint(BOTH, False),
    ]
    # once held (a restart), the hints of the held CPUs
    held = _state(set(), {"q": {"a": {3, 9, 4}, "b": {10, 5, 11}}})
    assert _policy().pod_hints(held, six) == [TopologyHint(NODE1, True), TopologyHint(BOTH, False)]


def test_allocation_takes_the_hinted_nodes_cpus_first() -> None:
    policy = _policy()
    pod = _pod("p", _c("app", "4"))
    app = pod["spec"]["containers"][0]
    state = _state(FREE_4_AND_6)
    _, unhinted = policy.allocate(state, pod, app)
    assert unhinted == {2, 8, 3, 9}  # packing: whole cores, the most used node's first
    _, on_node1 = policy.allocate(state, pod, app, numa=NODE1)
    assert {DUAL.details[c].numa for c in on_node1} == {1} and len(on_node1) == 4
    # the hinted node has too few: all of its CPUs, the rest from elsewhere
    big = _pod("q", _c("app", "6"))
    _, split = policy.allocate(state, big, big["spec"]["containers"][0], numa=NODE0)
    assert {2, 6, 7, 8} <= split and len(split) == 6


def _manager(tmp_path: Path, default: set[int], **options: bool) -> CPUManager:
    m = CPUManager(_policy(**options), tmp_path)
    m.load()
    # another pod holds the rest
    m.state = _state(default, {"other": {"x": set(range(12)) - default}})
    return m


def _topology(policy: str, m: CPUManager, scope: str = "container") -> TopologyManager:
    return TopologyManager(policy=policy, scope=scope, numa=NUMA, providers=[m], allocators=[m])


def test_single_numa_node_places_a_pod_on_one_node_or_refuses_it(tmp_path: Path) -> None:
    m = _manager(tmp_path / "a", FREE_4_AND_6)
    topology = _topology("single-numa-node", m)
    assert topology.admit("p", _pod("p", _c("app", "5")), []) is None
    assert topology.affinity("p", "app") == TopologyHint(NODE1, True)
    assert {DUAL.details[c].numa for c in m.exclusive("p", "app")} == {1}
    assert len(m.exclusive("p", "app")) == 5
    # unhinted (topology policy none) the same request is split over both nodes
    plain = _manager(tmp_path / "b", FREE_4_AND_6)
    assert _topology("none", plain).admit("p", _pod("p", _c("app", "5")), []) is None
    assert {DUAL.details[c].numa for c in plain.exclusive("p", "app")} == {0, 1}
    # 7 CPUs fit on no single node: refused, nothing taken
    refused = _manager(tmp_path / "c", FREE_4_AND_6)
    assert _topology("single-numa-node", refused).admit("r", _pod("r", _c("app", "7")), []) == (
        "TopologyAffinityError",
        "Resources cannot be allocated with Topology locality",
    )
    assert refused.exclusive("r", "app") == frozenset()
    assert refused.state.default == FREE_4_AND_6
    # best-effort admits it across both nodes
    best = _manager(tmp_path / "d", FREE_4_AND_6)
    assert _topology("best-effort", best).admit("r", _pod("r", _c("app", "7")), []) is None
    assert len(best.exclusive("r", "app")) == 7


def test_container_scope_hints_each_container_after_its_siblings(tmp_path: Path) -> None:
    m = _manager(tmp_path / "a", FREE_4_AND_6)
    pod = _pod("p", _c("a", "3"), _c("b", "3"))
    assert _topology("single-numa-node", m).admit("p", pod, []) is None
    # a: node 0 (narrowest, lowest); b: node 0 has one CPU left, so node 1
    assert {DUAL.details[c].numa for c in m.exclusive("p", "a")} == {0}
    assert {DUAL.details[c].numa for c in m.exclusive("p", "b")} == {1}
    # scope pod: the pod's 6 fit only on node 1, both containers go there
    pm = _manager(tmp_path / "b", FREE_4_AND_6)
    assert _topology("single-numa-node", pm, scope="pod").admit("p", pod, []) is None
    on = {DUAL.details[c].numa for n in ("a", "b") for c in pm.exclusive("p", n)}
    assert on == {1}


def test_an_init_containers_cpus_are_hinted_and_handed_on(tmp_path: Path) -> None:
    m = _manager(tmp_path, FREE_4_AND_6)
    pod = _pod("p", _c("app", "6"), inits=(_c("init", "6"),))
    assert _topology("single-numa-node", m).admit("p", pod, []) is None
    # the app container reuses the init container's six CPUs on node 1
    assert m.exclusive("p", "app") == m.exclusive("p", "init")
    assert {DUAL.details[c].numa for c in m.exclusive("p", "app")} == {1}


def test_the_cpu_managers_reason_passes_through(tmp_path: Path) -> None:
    m = _manager(tmp_path, FREE_4_AND_6, full_pcpus_only=True)
    assert _topology("best-effort", m).admit("p", _pod("p", _c("app", "1")), []) == (
        "SMTAlignmentError",
        "SMT Alignment Error: requested 1 cpus not multiple cpus per core = 2",
    )
