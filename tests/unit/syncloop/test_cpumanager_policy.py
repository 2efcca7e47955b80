"""The static and none policies (klet.syncloop.cpumanager.policy): reserved CPUs (given or
taken lowest cores first, refused at zero), which containers get exclusive CPUs
(Guaranteed, whole-number requests), the shared pool shrinking and growing, an init
container's CPUs handed on, admission's refusal with upstream's reason and message,
full-pcpus-only and strict-cpu-reservation, the options refused by name, and the state
checks at start (upstream's validateState)."""

from __future__ import annotations

from typing import Any

import pytest
from klet.syncloop.cpumanager.policy import (
    AdmissionError,
    NonePolicy,
    Options,
    PolicyError,
    StaticPolicy,
    container_cpuset,
    guaranteed_cpus,
    parse_options,
    reserved_count,
    reuse,
)
from klet.syncloop.cpumanager.state import CPUState
from klet.syncloop.cpumanager.topology import CPUInfo, CPUTopology

TWO = CPUTopology({0: CPUInfo(0, 0, 0), 1: CPUInfo(1, 0, 0)})
FOUR_HT = CPUTopology({c: CPUInfo(core=c % 2, socket=0, numa=0) for c in range(4)})


def _c(name: str, cpu: str | None, mem: str | None = "64Mi", **extra: Any) -> dict[str, Any]:
    res: dict[str, str] = {}
    if cpu is not None:
        res["cpu"] = cpu
    if mem is not None:
        res["memory"] = mem
    return {"name": name, "resources": {"requests": res, "limits": res} if res else {}, **extra}


def _pod(uid: str, *containers: dict[str, Any], inits: tuple[Any, ...] = ()) -> dict[str, Any]:
    return {
        "metadata": {"uid": uid, "name": uid, "namespace": "default"},
        "spec": {"containers": list(containers), "initContainers": list(inits)},
    }


def _allocate_pod(
    policy: StaticPolicy | NonePolicy, state: CPUState, pod: dict[str, Any]
) -> CPUState:
    """Each container in turn, init containers first, the init containers' CPUs handed
    on (`reuse`), as the topology manager has the CPU manager allocate them."""
    reusable: frozenset[int] = frozenset()
    spec = pod["spec"]
    for c in [*spec.get("initContainers", ()), *spec["containers"]]:
        state, cpus = policy.allocate(state, pod, c, reusable=reusable)
        reusable = reuse(reusable, pod, c, cpus)
    return state


def _static(topo: CPUTopology = TWO, count: int = 1, **opts: bool) -> StaticPolicy:
    return StaticPolicy.create(topo, count=count, explicit=frozenset(), options=Options(**opts))


def test_reserved_cpus_are_the_lowest_cores_or_the_given_ones() -> None:
    assert _static().reserved == {0}
    assert _static(FOUR_HT, 2).reserved == {0, 2}  # one whole core
    given = StaticPolicy.create(TWO, count=1, explicit=frozenset({1}), options=Options())
    assert given.reserved == {1}
    with pytest.raises(PolicyError, match="not online"):
        StaticPolicy.create(TWO, count=1, explicit=frozenset({5}), options=Options())
    with pytest.raises(PolicyError, match="unable to reserve the required amount of CPUs"):
        _static(count=3)


def test_reserved_count_rounds_up_and_refuses_zero() -> None:
    assert reserved_count(500, 0) == 1
    assert reserved_count(1000, 1001) == 3
    with pytest.raises(PolicyError, match=r"systemreserved.cpu \+ kubereserved.cpu"):
        reserved_count(0, 0)


@pytest.mark.parametrize(
    ("container", "expected"),
    [
        (_c("a", "1"), 1),
        (_c("a", "2000m"), 2),
        (_c("a", "1500m"), 0),
        (_c("a", "100m"), 0),
    ],
)
def test_guaranteed_whole_cpus_only(container: dict[str, Any], expected: int) -> None:
    assert guaranteed_cpus(_pod("u", container), container) == expected


def test_burstable_and_best_effort_pods_share_the_pool() -> None:
    burstable = _c("a", None)
    burstable["resources"] = {"requests": {"cpu": "1"}}
    assert guaranteed_cpus(_pod("u", burstable), burstable) == 0
    assert guaranteed_cpus(_pod("u", _c("a", None, None)), _c("a", None, None)) == 0


def test_a_guaranteed_pod_gets_the_unreserved_cpu_and_the_pool_shrinks() -> None:
    policy = _static()
    state = policy.start(CPUState(policy="static"))
    assert state.default == {0, 1}
    state = _allocate_pod(policy, state, _pod("g", _c("app", "1")))
    assert state.assignments == {"g": {"app": {1}}}
    assert state.default == {0}
    assert container_cpuset(state, "g", "app") == {1}
    assert container_cpuset(state, "be", "x") == {0}  # the shared pool
    # the same pod again (a restart's re-admission) keeps its CPUs
    assert _allocate_pod(policy, state, _pod("g", _c("app", "1"))) == state
    # nothing left for a second one: upstream's reason and message
    with pytest.raises(AdmissionError) as err:
        _allocate_pod(policy, state, _pod("h", _c("app", "1")))
    assert err.value.reason == "UnexpectedAdmissionError"
    assert err.value.message == (
        "Allocate failed due to not enough cpus available to satisfy request: requested=1, "
        "available=0, which is unexpected"
    )
    # removed: back in the pool
    state = policy.remove(state, "g", "app")
    assert state.default == {0, 1}
    assert state.assignments == {}


def test_an_init_containers_cpus_are_handed_on() -> None:
    policy = _static(FOUR_HT, 1)
    state = policy.start(CPUState(policy="static"))
    pod = _pod("p", _c("app", "1"), inits=(_c("init", "1"),))
    state = _allocate_pod(policy, state, pod)
    assert state.assignments["p"]["init"] == state.assignments["p"]["app"]
    # removing the init container keeps the CPUs its sibling holds out of the pool
    after = policy.remove(state, "p", "init")
    assert after.default == state.default
    # a sidecar (restartPolicy Always) runs beside the app: not handed on
    pod = _pod("q", _c("app", "1"), inits=(_c("side", "1", restartPolicy="Always"),))
    fresh = _allocate_pod(policy, policy.start(CPUState(policy="static")), pod)
    assert not fresh.assignments["q"]["side"] & fresh.assignments["q"]["app"]


def test_pod_level_resources_run_in_the_shared_pool() -> None:
    policy = _static()
    pod = _pod("p", _c("app", "1"))
    pod["spec"]["resources"] = {"requests": {"cpu": "1"}, "limits": {"cpu": "1"}}
    state = policy.start(CPUState(policy="static"))
    assert _allocate_pod(policy, state, pod) == state


def test_full_pcpus_only_refuses_a_part_core_with_smt_alignment_error() -> None:
    policy = _static(FOUR_HT, 2, full_pcpus_only=True)
    state = policy.start(CPUState(policy="static"))
    with pytest.raises(AdmissionError) as err:
        _allocate_pod(policy, state, _pod("p", _c("app", "1")))
    assert err.value.reason == "SMTAlignmentError"
    assert err.value.message == (
        "SMT Alignment Error: requested 1 cpus not multiple cpus per core = 2"
    )
    state = _allocate_pod(policy, state, _pod("p", _c("app", "2")))
    assert state.assignments["p"]["app"] == {1, 3}


def test_strict_reservation_keeps_shared_containers_off_the_reserved_cpus() -> None:
    policy = _static(strict_reservation=True)
    state = policy.start(CPUState(policy="static"))
    assert state.default == {1}
    assert container_cpuset(state, "be", "x") == {1}


def test_options_as_upstream_reads_them() -> None:
    assert parse_options({"full-pcpus-only": "true"}, alpha=False, beta=True) == Options(
        full_pcpus_only=True
    )
    assert parse_options({"strict-cpu-reservation": "1"}, alpha=False, beta=True) == Options(
        strict_reservation=True
    )
    assert parse_options(
        {"distribute-cpus-across-cores": "true"}, alpha=True, beta=True
    ) == Options(spread_cores=True)
    assert parse_options({"distribute-cpus-across-numa": "false"}, alpha=False, beta=True) == (
        Options()
    )


@pytest.mark.parametrize(
    ("options", "alpha", "beta", "message"),
    [
        ({"bogus": "true"}, True, True, 'unknown CPU Manager Policy option: "bogus"'),
        (
            {"distribute-cpus-across-cores": "true"},
            False,
            True,
            'Alpha-level Options not enabled, but option "distribute-cpus-across-cores"',
        ),
        (
            {"strict-cpu-reservation": "true"},
            False,
            False,
            'Beta-level Options not enabled, but option "strict-cpu-reservation"',
        ),
        ({"full-pcpus-only": "yes"}, False, True, 'bad value for option "full-pcpus-only"'),
        (
            {"full-pcpus-only": "true", "distribute-cpus-across-cores": "true"},
            True,
            True,
            "can not be used at the same time",
        ),
        (
            {"distribute-cpus-across-numa": "true"},
            False,
            True,
            "distribute-cpus-across-numa: not implemented by klet",
        ),
        (
            {"prefer-align-cpus-by-uncorecache": "true"},
            False,
            True,
            "prefer-align-cpus-by-uncorecache: not implemented by klet",
        ),
        ({"align-by-socket": "true"}, True, True, "align-by-socket: not implemented by klet"),
    ],
)
def test_options_refused(options: dict[str, str], alpha: bool, beta: bool, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        parse_options(options, alpha=alpha, beta=beta)


@pytest.mark.parametrize(
    ("state", "message"),
    [
        (
            CPUState("static", frozenset(), {"p": {"c": frozenset({1})}}),
            "default cpuset cannot be empty",
        ),
        (CPUState("static", frozenset({1})), 'not all reserved cpus: "0"'),
        (
            CPUState("static", frozenset({0, 1}), {"p": {"c": frozenset({1})}}),
            'pod: p, container: c cpuset: "1" overlaps with default cpuset "0-1"',
        ),
        (
            CPUState("static", frozenset({0, 1, 2})),
            'current set of available CPUs "0-1" doesn\'t match with CPUs in state "0-2"',
        ),
    ],
)
def test_start_checks_the_state_against_the_node(state: CPUState, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        _static().start(state)


def test_start_keeps_a_consistent_state() -> None:
    state = CPUState("static", frozenset({0}), {"p": {"c": frozenset({1})}})
    assert _static().start(state) == state


def test_none_policy_gives_no_cpuset() -> None:
    policy = NonePolicy()
    state = policy.start(CPUState(policy="none"))
    assert _allocate_pod(policy, state, _pod("g", _c("app", "1"))) == state
    assert container_cpuset(state, "g", "app") == frozenset()
