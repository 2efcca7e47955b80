"""Critical pod preemption (admission/preemption.py, its use in admit.py and PodController).

Covers, table-driven: who may preempt whom (critical over non-critical, a higher
spec.priority over a lower one when both are set); each pod's request as upstream's
GetResourceRequest (1 for pods, millicores, the overhead only on a non-zero request);
the requirement from a shortfall (requested - (capacity - used)); the set chosen
(BestEffort before Burstable before Guaranteed, a class only for what the ones below it
cannot free, the closest pod each round, ties to the smaller memory then cpu request and,
on equal pods, to upstream's swap-removal order, several requirements at once, critical
pods never taken) and upstream's error text when no set frees enough. Through admit_pod:
a critical pod short only of resources is admitted with the pods to preempt and the
signal; short and failing another predicate it is rejected with that predicate; with
nothing to preempt, UnexpectedAdmissionError; a non-critical pod and a resize
(preempt=False) are rejected as before. Through the ledger's re-admission, a preempted
pod is not counted for the pods after it. Through PodController on FakeRuntimeService: a
static pod arriving at a full node kills the BestEffort pod (Warning Preempting Event;
status Failed, reason Preempting, upstream's message, DisruptionTarget), then runs, and
kubelet_preemptions{preemption_signal="pods"} is 1.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from klet.model.pod import CONFIG_SOURCE
from klet.model.records import DesiredPod, SourceState
from klet.model.types import JSON, PodUID
from klet.syncloop.admission.admit import AdmissionLedger, NodeInfo, Verdict, admit_pod
from klet.syncloop.admission.preemption import (
    InsufficientResource,
    NoPreemptionSet,
    Requirement,
    pods_to_preempt,
    preemptable,
    preemption_signal,
    requirements,
    resource_request,
)
from klet.syncloop.pods.controller import PodController
from klet.syncloop.wiring import Deps
from klet.testbed.fakes.cri import FakeRuntimeService

from .helpers import IdleWorkers, UidEvents, wire

MI = 1024**2
GI = 1024**3
IMAGE = "registry.klet.test/busybox:1.36"
CRITICAL = 2_000_000_000


def pod(
    uid: str,
    *,
    req: dict[str, str] | None = None,
    limits: dict[str, str] | None = None,
    priority: int | None = None,
    static: bool = False,
    created: int | None = None,
    **spec: Any,
) -> JSON:
    """A one-container pod; requests `req`, limits `limits` (equal ones: Guaranteed),
    created `created` seconds into 2026."""
    container: JSON = {"name": "main", "image": IMAGE, "command": ["sleep", "1000"]}
    resources: JSON = {}
    if req is not None:
        resources["requests"] = req
    if limits is not None:
        resources["limits"] = limits
    if resources:
        container["resources"] = resources
    meta: JSON = {"name": uid, "namespace": "default", "uid": uid}
    if static:
        meta["annotations"] = {CONFIG_SOURCE: "file"}
    if created is not None:
        meta["creationTimestamp"] = f"2026-01-01T00:00:{created:02d}Z"
    out: JSON = {"metadata": meta, "spec": {"containers": [container], **spec}}
    if priority is not None:
        out["spec"]["priority"] = priority
    return out


def best_effort(uid: str, **kw: Any) -> JSON:
    return pod(uid, **kw)


def burstable(uid: str, cpu: str = "0", memory: str = "0", **kw: Any) -> JSON:
    req = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v != "0"} or {"cpu": "1m"}
    return pod(uid, req=req, **kw)


def guaranteed(uid: str, cpu: str, memory: str, **kw: Any) -> JSON:
    both = {"cpu": cpu, "memory": memory}
    return pod(uid, req=dict(both), limits=dict(both), **kw)


STATIC = pod("static", static=True)
PRIORITY_CRITICAL = pod("crit", priority=CRITICAL)


def uids(pods: list[JSON]) -> list[str]:
    return [p["metadata"]["uid"] for p in pods]


# -- who may preempt whom ------------------------------------------------------------


@pytest.mark.parametrize(
    ("preemptor", "preemptee", "want"),
    [
        pytest.param(STATIC, best_effort("x"), True, id="static over non-critical"),
        pytest.param(PRIORITY_CRITICAL, best_effort("x", priority=0), True, id="critical prio"),
        pytest.param(pod("m"), best_effort("x"), False, id="neither critical nor prioritised"),
        pytest.param(STATIC, pod("s2", static=True), False, id="critical never over critical"),
        pytest.param(
            STATIC, pod("c", priority=CRITICAL), False, id="static has no priority to compare"
        ),
        pytest.param(
            pod("hi", priority=CRITICAL + 1000),
            pod("c", priority=CRITICAL),
            True,
            id="both critical, higher priority",
        ),
        pytest.param(pod("a", priority=10), pod("b", priority=5), True, id="higher priority"),
        pytest.param(pod("a", priority=5), pod("b", priority=5), False, id="equal priority"),
        pytest.param(pod("a", priority=10), pod("b"), False, id="preemptee without priority"),
    ],
)
def test_preemptable(preemptor: JSON, preemptee: JSON, want: bool) -> None:
    assert preemptable(preemptor, preemptee) is want


# -- requests and requirements -------------------------------------------------------


@pytest.mark.parametrize(
    ("p", "resource", "want"),
    [
        pytest.param(best_effort("a"), "pods", 1, id="a pod is one pod"),
        pytest.param(burstable("a", cpu="250m"), "cpu", 250, id="millicores"),
        pytest.param(burstable("a", memory="64Mi"), "memory", 64 * MI, id="bytes"),
        pytest.param(best_effort("a"), "cpu", 0, id="none"),
        pytest.param(
            burstable("a", cpu="200m", overhead={"cpu": "100m"}),
            "cpu",
            300,
            id="overhead on a request",
        ),
        pytest.param(
            burstable("a", memory="1Mi", overhead={"cpu": "100m"}),
            "cpu",
            0,
            id="no overhead without a request",
        ),
    ],
)
def test_resource_request(p: JSON, resource: str, want: int) -> None:
    assert resource_request(p, resource) == want


def test_requirements_are_what_is_still_lacking_and_the_signal_the_first() -> None:
    shortfalls = [
        InsufficientResource("pods", requested=1, used=3, capacity=3),
        InsufficientResource("cpu", requested=800, used=1500, capacity=2000),
    ]
    required = requirements(shortfalls)
    assert required == (Requirement("pods", 1), Requirement("cpu", 300))
    assert preemption_signal(required) == "pods"
    assert preemption_signal(()) == ""


# -- the set chosen ------------------------------------------------------------------


def req(**amounts: int) -> list[Requirement]:
    return [Requirement(k.replace("_", "-"), v) for k, v in amounts.items()]


@pytest.mark.parametrize(
    ("candidates", "required", "want"),
    [
        pytest.param(
            [guaranteed("g", "1", "1Gi"), burstable("b", cpu="100m"), best_effort("e")],
            req(pods=1),
            ["e"],
            id="a pod slot: BestEffort goes first",
        ),
        pytest.param(
            [best_effort("e"), burstable("b", cpu="600m"), guaranteed("g", "1", "1Gi")],
            req(cpu=500),
            ["b"],
            id="cpu: BestEffort frees none, one Burstable is enough",
        ),
        pytest.param(
            [
                best_effort("e"),
                burstable("b1", memory="1Gi"),
                guaranteed("g4", "1", "4Gi"),
                guaranteed("g2", "1", "2Gi"),
            ],
            req(memory=3 * GI),
            ["b1", "g2"],
            id="Guaranteed only for what the others cannot free, the smaller one",
        ),
        pytest.param(
            [burstable("b3", cpu="300m"), burstable("b10", cpu="1"), burstable("b20", cpu="2")],
            req(cpu=1000),
            ["b10"],
            id="covering pods tie at distance 0: the smaller request",
        ),
        pytest.param(
            [burstable("b5", cpu="500m"), burstable("b4", cpu="400m"), burstable("b3", cpu="300m")],
            req(cpu=900),
            ["b5", "b4"],
            id="closest first, round by round",
        ),
        pytest.param(
            [
                burstable("m1", cpu="500m", memory="2Gi"),
                burstable("m2", cpu="500m", memory="1Gi"),
            ],
            req(cpu=500),
            ["m2"],
            id="equal cpu: the smaller memory request",
        ),
        pytest.param(
            [best_effort("e1"), best_effort("e2"), best_effort("e3")],
            req(pods=1),
            ["e3"],
            id="equal pods: the last one, as upstream's loop",
        ),
        pytest.param(
            [best_effort("e1"), best_effort("e2"), best_effort("e3")],
            req(pods=2),
            ["e3", "e2"],
            id="equal pods, two rounds: upstream's swap-removal order",
        ),
        pytest.param(
            [best_effort("e"), burstable("b", cpu="600m")],
            req(pods=1, cpu=500),
            ["b"],
            id="two requirements: the one pod that frees both",
        ),
        pytest.param(
            [best_effort("e"), burstable("b", cpu="600m", priority=CRITICAL)],
            req(pods=1),
            ["e"],
            id="critical pods are never candidates",
        ),
    ],
)
def test_pods_to_preempt(
    candidates: list[JSON], required: list[Requirement], want: list[str]
) -> None:
    assert uids(pods_to_preempt(STATIC, candidates, required)) == want


@pytest.mark.parametrize(
    ("candidates", "required", "text"),
    [
        pytest.param([], req(pods=1), "[(res: pods, q: 1), ]", id="nobody to preempt"),
        pytest.param(
            [burstable("b", cpu="300m"), best_effort("e")],
            req(cpu=500, memory=GI),
            "[(res: cpu, q: 200), (res: memory, q: 1073741824), ]",
            id="all together free too little",
        ),
        pytest.param(
            [burstable("b", cpu="2", priority=CRITICAL)],
            req(cpu=500),
            "[(res: cpu, q: 500), ]",
            id="only critical pods",
        ),
    ],
)
def test_no_set_frees_enough(
    candidates: list[JSON], required: list[Requirement], text: str
) -> None:
    with pytest.raises(NoPreemptionSet) as err:
        pods_to_preempt(STATIC, candidates, required)
    assert str(err.value) == "no set of running pods found to reclaim resources: " + text


# -- admit_pod -------------------------------------------------------------------------

NODE = NodeInfo(name="node1", labels={}, allocatable={"pods": 3, "cpu": 2000, "memory": 4 * GI})
FULL = [
    burstable("b", cpu="500m"),
    best_effort("e"),
    guaranteed("g", "1", "1Gi"),
]
NO_SET = (
    "Unexpected error while attempting to recover from admission failure: preemption: "
    "error finding a set of pods to preempt: no set of running pods found to reclaim "
    "resources: "
)


@pytest.mark.parametrize(
    ("p", "others", "want"),
    [
        pytest.param(
            STATIC, FULL, Verdict(True, preempt=("e",), preemption_signal="pods"), id="pods"
        ),
        pytest.param(
            pod("c", req={"cpu": "1", "memory": "3Gi"}, priority=CRITICAL),
            [best_effort("e"), burstable("big", cpu="1500m", memory="2Gi")],
            Verdict(True, preempt=("big",), preemption_signal="cpu"),
            id="cpu and memory, one pod frees both",
        ),
        pytest.param(
            pod("c", req={"cpu": "1"}, static=True, nodeName="elsewhere"),
            FULL,
            Verdict(
                False,
                "NodeName",
                "Predicate NodeName failed: node(s) didn't match the requested node name",
            ),
            id="another predicate fails too: only it is reported",
        ),
        pytest.param(
            STATIC,
            [pod(u, priority=CRITICAL) for u in "xyz"],
            Verdict(False, "UnexpectedAdmissionError", NO_SET + "[(res: pods, q: 1), ]"),
            id="nothing preemptable",
        ),
        pytest.param(
            best_effort("n"),
            FULL,
            Verdict(
                False,
                "OutOfpods",
                "Node didn't have enough resource: pods, requested: 1, used: 3, capacity: 3",
            ),
            id="not critical: rejected",
        ),
        pytest.param(STATIC, FULL[:2], Verdict(True), id="fits: nothing preempted"),
    ],
)
def test_admit_pod_preempts_for_critical_pods(p: JSON, others: list[JSON], want: Verdict) -> None:
    assert admit_pod(p, others=others, node=NODE) == want


def test_a_resize_does_not_preempt() -> None:
    verdict = admit_pod(STATIC, others=FULL, node=NODE, preempt=False)
    assert (verdict.admit, verdict.reason, verdict.preempt) == (False, "OutOfpods", ())


def test_readmission_does_not_count_a_preempted_pod_for_those_after_it() -> None:
    node = NodeInfo(name="node1", labels={}, allocatable={"pods": 2, "cpu": 1000})
    ledger = AdmissionLedger(node=node)
    running = {
        "a": (best_effort("a", created=1), 0.0),
        "b": (burstable("b", cpu="100m", created=2), 0.0),
        "s": (pod("s", static=True, created=3), 0.0),
        "t": (best_effort("t", created=4), 0.0),
    }
    verdicts = ledger.readmit(running)
    assert verdicts["s"] == Verdict(True, preempt=("a",), preemption_signal="pods")
    # t sees b and s, not a (preempted): a full node again, and t is not critical
    assert (verdicts["t"].admit, verdicts["t"].reason) == (False, "OutOfpods")


# -- through the controller ----------------------------------------------------------


READY = {"file": SourceState(source="file", ready=True, at=0.0)}


def record(p: JSON) -> DesiredPod:
    uid = p["metadata"]["uid"]
    return DesiredPod(uid=PodUID(uid), pod=p, source="file", hash=uid, seen_at=0.0)


@pytest.fixture
def world(tmp_path: Path) -> tuple[PodController, Deps, FakeRuntimeService, UidEvents]:
    t = 1_700_000_000.0
    cri = FakeRuntimeService(clock=lambda: int(t * 1e9))
    cri.add_image(IMAGE)
    events = UidEvents()
    node = NodeInfo(name="node1", labels={}, allocatable={"pods": 2, "cpu": 4000})
    deps = wire(tmp_path, cri, events=events, clock=lambda: t, node=node, node_name="")
    deps.controller.workers = IdleWorkers()  # type: ignore[assignment]
    return deps.controller, deps, cri, events


def running(cri: FakeRuntimeService) -> set[str]:
    return {
        s.config.labels["io.kubernetes.pod.uid"]
        for s in cri.sandboxes.values()
        if s.state.value == "SANDBOX_READY"
    }


async def test_a_static_pod_at_a_full_node_preempts_the_best_effort_pod(
    world: tuple[PodController, Deps, FakeRuntimeService, UidEvents],
) -> None:
    controller, deps, cri, events = world
    table = {
        "b": record(burstable("b", cpu="500m", created=1)),
        "e": record(best_effort("e", created=2, terminationGracePeriodSeconds=5)),
    }
    controller.apply_desired(table, READY, read_from=0)
    await controller.sync_once("b")
    await controller.sync_once("e")
    assert running(cri) == {"b", "e"}
    table["s"] = record(pod("s", static=True, created=3))
    controller.apply_desired(table, READY, read_from=0)
    critical = asyncio.create_task(controller.sync_once("s"))
    for _ in range(50):  # until its admission asked for e's kill
        await asyncio.sleep(0)
        if controller.pods["e"].kill is not None:
            break
    assert controller.pods["e"].kill is not None
    assert not critical.done()  # the critical pod waits for the preempted one
    await controller.sync_once("e")  # e's worker carries the kill out
    await critical
    assert running(cri) == {"b", "s"}
    status = controller.publisher.get("e")
    assert status is not None
    assert (status["phase"], status["reason"], status["message"]) == (
        "Failed",
        "Preempting",
        "Preempted in order to admit critical pod",
    )
    [target] = [c for c in status["conditions"] if c["type"] == "DisruptionTarget"]
    assert (target["status"], target["reason"], target["message"]) == (
        "True",
        "TerminationByKubelet",
        "Pod was preempted by Kubelet to accommodate a critical pod.",
    )
    assert ("e", "Warning", "Preempting", "Preempted in order to admit critical pod") in (
        events.emitted
    )
    assert [e for e in events.emitted if e[0] in ("b", "s") and e[1] == "Warning"] == []
    signal = {"preemption_signal": "pods"}
    assert deps.registry.get_sample_value("kubelet_preemptions", signal) == 1
