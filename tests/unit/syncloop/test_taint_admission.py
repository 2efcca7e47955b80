"""Admission by the Node's NoExecute taints (admit.py, nodetaints.py), as upstream's
predicate handler: a pod that is not static must tolerate every NoExecute taint
(reason TaintToleration, upstream's message), other effects are the scheduler's,
static pods are exempt, critical API pods are not, every toleration rule of
ToleratesTaint, the check after NodePorts; the ledger reads the taints current at each
decision. NodeTaints starts from registerWithTaints, reads then watches the Node on a
fake API, keeps the taints through an outage, reads again after 410 Gone, falls back
to the initial taints when the Node is missing or deleted."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from klet.kube import Gone, NotFound, Unavailable, WatchEvent
from klet.model.types import JSON
from klet.syncloop.admission.admit import (
    ADMIT,
    NODE_PORTS,
    TAINT_TOLERATION,
    AdmissionLedger,
    NodeInfo,
    admit_pod,
    tolerates_taint,
    untolerated_no_execute,
)
from klet.syncloop.admission.nodetaints import NodeTaints

NODE = NodeInfo(
    name="node1",
    labels={"kubernetes.io/os": "linux"},
    allocatable={"cpu": 4000, "memory": 8 * 1024**3, "pods": 110},
)
DRAIN = {"key": "drain", "value": "now", "effect": "NoExecute"}
NO_SCHEDULE = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}
PREFER = {"key": "soft", "effect": "PreferNoSchedule"}


def pod(tolerations: list[JSON] | None = None, *, source: str = "api", **spec: Any) -> JSON:
    return {
        "metadata": {
            "name": "p",
            "namespace": "default",
            "uid": "u1",
            "annotations": {"kubernetes.io/config.source": source},
        },
        "spec": {
            "containers": [{"name": "c", "image": "busybox"}],
            **({"tolerations": tolerations} if tolerations is not None else {}),
            **spec,
        },
    }


def tainted(*taints: JSON) -> NodeInfo:
    return NodeInfo(NODE.name, NODE.labels, NODE.allocatable, taints=taints)


def test_the_rejection_is_upstreams() -> None:
    assert TAINT_TOLERATION.reason == "TaintToleration"
    assert TAINT_TOLERATION.message == (
        "Predicate TaintToleration failed: node(s) had taints that the pod didn't tolerate"
    )
    assert TAINT_TOLERATION.status_message == (
        "Pod was rejected: Predicate TaintToleration failed: node(s) had taints that the pod "
        "didn't tolerate"
    )


@pytest.mark.parametrize(
    ("taints", "p", "verdict"),
    [
        ((), pod(), ADMIT),
        ((DRAIN,), pod(), TAINT_TOLERATION),
        ((NO_SCHEDULE, PREFER), pod(), ADMIT),  # only NoExecute is the kubelet's
        ((DRAIN,), pod([{"key": "drain", "operator": "Exists"}]), ADMIT),
        ((DRAIN,), pod([{"key": "drain", "value": "now", "effect": "NoExecute"}]), ADMIT),
        ((DRAIN,), pod([{"key": "drain", "value": "later"}]), TAINT_TOLERATION),
        (
            (DRAIN,),
            pod([{"key": "drain", "operator": "Exists", "effect": "NoSchedule"}]),
            TAINT_TOLERATION,
        ),
        ((DRAIN,), pod([{"operator": "Exists"}]), ADMIT),  # tolerates everything
        ((DRAIN,), pod([{"operator": "Exists", "effect": "NoExecute"}]), ADMIT),
        ((DRAIN,), pod([{"key": "other", "operator": "Exists"}]), TAINT_TOLERATION),
        (
            (DRAIN, {"key": "b", "effect": "NoExecute"}),
            pod([{"key": "drain", "operator": "Exists"}]),
            TAINT_TOLERATION,  # every NoExecute taint must be tolerated
        ),
        (
            (DRAIN,),
            pod([{"key": "drain", "operator": "Exists", "tolerationSeconds": 0}]),
            ADMIT,  # tolerationSeconds is the taint manager's, not admission's
        ),
        ((DRAIN,), pod(source="file"), ADMIT),  # static pods are exempt
        ((DRAIN,), pod(source="http"), ADMIT),
        ((DRAIN,), pod(priority=2_000_001_000), TAINT_TOLERATION),  # critical API pods are not
    ],
)
def test_no_execute_taints(taints: tuple[JSON, ...], p: JSON, verdict: Any) -> None:
    assert admit_pod(p, others=[], node=tainted(*taints)) == verdict


@pytest.mark.parametrize(
    ("toleration", "taint", "tolerated"),
    [
        ({"key": "k", "value": "v"}, {"key": "k", "value": "v", "effect": "NoExecute"}, True),
        (
            {"key": "k", "operator": "Equal", "value": "v"},
            {"key": "k", "value": "w", "effect": "NoExecute"},
            False,
        ),
        ({"key": "k"}, {"key": "k", "effect": "NoExecute"}, True),  # empty values are equal
        (
            {"key": "k", "operator": "Exists", "value": ""},
            {"key": "k", "value": "x", "effect": "NoExecute"},
            True,
        ),
        (
            {"key": "k", "operator": "Gt", "value": "1"},
            {"key": "k", "value": "2", "effect": "NoExecute"},
            False,
        ),
        (
            {"effect": "NoExecute", "operator": "Exists"},
            {"key": "any", "effect": "NoExecute"},
            True,
        ),
        (
            {"effect": "NoSchedule", "operator": "Exists"},
            {"key": "any", "effect": "NoExecute"},
            False,
        ),
    ],
)
def test_toleration_rules(toleration: JSON, taint: JSON, tolerated: bool) -> None:
    assert tolerates_taint(toleration, taint) is tolerated


def test_the_first_untolerated_taint_is_found() -> None:
    b = {"key": "b", "effect": "NoExecute"}
    assert (
        untolerated_no_execute([NO_SCHEDULE, DRAIN, b], [{"key": "drain", "operator": "Exists"}])
        == b
    )
    assert untolerated_no_execute([NO_SCHEDULE], []) is None


def test_checked_after_node_ports() -> None:
    """Upstream appends the taint failure after the general predicates' and reports the
    first: a pod failing both is rejected for its ports."""
    ports = [{"containerPort": 80, "hostPort": 8080}]
    p = pod()
    p["spec"]["containers"][0]["ports"] = ports
    other = pod()
    other["spec"]["containers"][0]["ports"] = ports
    assert admit_pod(p, others=[other], node=tainted(DRAIN)) == NODE_PORTS


class Taints:
    def __init__(self) -> None:
        self.now: tuple[JSON, ...] = ()

    def taints(self) -> tuple[JSON, ...]:
        return self.now


def test_the_ledger_reads_the_taints_of_each_decision() -> None:
    source = Taints()
    ledger = AdmissionLedger(NODE, taints=source)
    assert ledger.decide("a", pod(), others=[]).admit
    source.now = (DRAIN,)
    assert ledger.decide("b", pod(), others=[]) == TAINT_TOLERATION
    assert ledger.verdict("a") == ADMIT  # decided once: a later taint does not change it
    source.now = ()
    assert ledger.decide("c", pod(), others=[]).admit


# -- NodeTaints on a fake API ---------------------------------------------------------


def node(rv: str, *taints: JSON) -> JSON:
    return {"metadata": {"name": "node1", "resourceVersion": rv}, "spec": {"taints": list(taints)}}


class FakeNodeApi:
    """Answers queued per call: a Node (or an exception) for get, a list of events (or
    an exception raised after them) for each watch."""

    def __init__(self) -> None:
        self.gets: list[JSON | Exception] = []
        self.watches: list[tuple[list[WatchEvent], Exception | None]] = []
        self.watched_from: list[str] = []

    async def get_node(self) -> JSON:
        answer = self.gets.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def watch_node(self, resource_version: str) -> AsyncIterator[WatchEvent]:
        self.watched_from.append(resource_version)
        events, error = self.watches.pop(0)
        for e in events:
            yield e
        if error is not None:
            raise error


def follower(api: FakeNodeApi, initial: tuple[JSON, ...] = ()) -> NodeTaints:
    async def no_sleep(_: float) -> None:
        return None

    return NodeTaints(api, initial=initial, sleep=no_sleep)


def test_read_then_watch_follows_the_taints() -> None:
    api = FakeNodeApi()
    api.gets = [node("5", DRAIN)]
    api.watches = [
        (
            [
                WatchEvent("MODIFIED", node("6", NO_SCHEDULE)),
                WatchEvent("BOOKMARK", {"metadata": {"resourceVersion": "9"}}),
            ],
            None,
        ),
        ([WatchEvent("MODIFIED", node("10", DRAIN, NO_SCHEDULE))], None),
    ]
    t = follower(api, initial=({"key": "registered", "effect": "NoExecute"},))

    async def go() -> None:
        assert t.taints() == ({"key": "registered", "effect": "NoExecute"},)
        await t.step()
        assert t.taints() == (DRAIN,)
        await t.step()
        assert t.taints() == (NO_SCHEDULE,)
        await t.step()
        assert t.taints() == (DRAIN, NO_SCHEDULE)

    asyncio.run(go())
    assert api.watched_from == ["5", "9"]  # each watch from the last resourceVersion


def test_an_outage_keeps_the_last_taints_and_gone_reads_again() -> None:
    api = FakeNodeApi()
    api.gets = [node("5", DRAIN), node("20")]
    api.watches = [([], Unavailable("connection refused")), ([], Gone("too old"))]
    t = follower(api)

    async def go() -> None:
        await t.step()
        with pytest.raises(Unavailable):
            await t.step()
        assert t.taints() == (DRAIN,)  # kept while the apiserver is away
        await t.step()  # 410: the next step reads the Node again
        assert t.taints() == (DRAIN,)
        await t.step()
        assert t.taints() == ()

    asyncio.run(go())


def test_a_missing_or_deleted_node_is_the_initial_one() -> None:
    registered = ({"key": "registered", "effect": "NoExecute"},)
    api = FakeNodeApi()
    api.gets = [NotFound("nodes node1 not found"), node("3", DRAIN)]
    api.watches = [([WatchEvent("DELETED", node("4", DRAIN))], None)]
    t = follower(api, initial=registered)

    async def go() -> None:
        await t.step()
        assert t.taints() == registered
        await t.step()
        assert t.taints() == (DRAIN,)
        await t.step()
        assert t.taints() == registered

    asyncio.run(go())


def test_run_backs_off_and_carries_on_after_errors() -> None:
    api = FakeNodeApi()
    api.gets = [Unavailable("down"), Unavailable("down"), node("7", DRAIN)]
    pauses: list[float] = []
    done = asyncio.Event()

    async def record(seconds: float) -> None:
        pauses.append(seconds)
        if not api.gets:
            done.set()
            await asyncio.Event().wait()

    t = NodeTaints(api, sleep=record)
    api.watches = [([], None)]

    async def go() -> None:
        task = asyncio.create_task(t.run())
        await done.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())
    assert pauses[:2] == [0.8, 1.6]  # upstream's reflector back-off, doubling
    assert t.taints() == (DRAIN,)
