"""Pod admission (admission.py and its use in PodController), table-driven.

Covers every rejection reason with upstream's reason and message (OutOfpods, OutOfcpu,
OutOfmemory, OutOfephemeral-storage, OutOf<scalar>, NodeAffinity, NodeName, NodePorts,
the two OS checks, PodFeatureUnsupported for a user namespace, and for a RuntimeClass or
resource claims on a standalone node, naming each field) and the order in which the
checks run; the request rules (limits as default requests, sum of regular containers and
sidecars, peak of init containers with the sidecars started before them, pod-level
requests, overhead); host ports with the 0.0.0.0 wildcard, protocols, host-network
defaults and sidecars; every node affinity operator and term rule; counting only
admitted pods that still run; the re-admission order after a restart. Through
PodController on FakeRuntimeService: a rejected pod is Failed with "Pod was rejected:
..." and a Warning Event and never gets a sandbox; a pod is admitted once; after a
restart the pods with running containers are re-admitted first, so a new pod is the one
rejected at the limit; every rejection (also one at the re-admission) counts once in
kubelet_admission_rejections_total by reason.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from klet.model.pod import pod_requests
from klet.model.records import DesiredPod, SourceState
from klet.model.types import JSON, PodUID
from klet.syncloop.admission.admit import (
    ADMIT,
    AdmissionLedger,
    NodeInfo,
    Verdict,
    admission_order,
    admit_pod,
    host_ports,
    matches_node_affinity,
    port_conflict,
)
from klet.syncloop.model.runtimepod import RuntimePod
from klet.syncloop.pods.controller import PodController
from klet.syncloop.wiring import Deps
from klet.testbed.fakes.cri import FakeRuntimeService

from .helpers import IdleWorkers, UidEvents, wire

MI = 1024**2
GI = 1024**3
IMAGE = "registry.klet.test/busybox:1.36"

NODE = NodeInfo(
    name="node1",
    labels={
        "kubernetes.io/hostname": "node1",
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "zone": "a",
        "cores": "8",
    },
    allocatable={
        "cpu": 2000,
        "memory": 4 * GI,
        "ephemeral-storage": 10 * GI,
        "pods": 3,
        "hugepages-2Mi": 64 * MI,
        "example.com/gpu": 1,
    },
)


def c(name: str = "main", req: dict[str, str] | None = None, **extra: Any) -> JSON:
    """A container with requests `req` (and e.g. limits=..., ports=..., restartPolicy=...)."""
    out: JSON = {"name": name, "image": IMAGE, **extra}
    limits = out.pop("limits", None)
    if req is not None or limits is not None:
        out["resources"] = {}
        if req is not None:
            out["resources"]["requests"] = req
        if limits is not None:
            out["resources"]["limits"] = limits
    return out


def mk(*containers: JSON, inits: tuple[JSON, ...] = (), uid: str = "p", **spec: Any) -> JSON:
    meta = spec.pop("metadata", {})
    out: JSON = {
        "metadata": {"name": uid, "namespace": "default", "uid": uid, **meta},
        "spec": {"containers": list(containers) or [c()], **spec},
    }
    if inits:
        out["spec"]["initContainers"] = list(inits)
    return out


# -- requests ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pod", "want"),
    [
        pytest.param(mk(c()), {}, id="no requests"),
        pytest.param(
            mk(c(req={"cpu": "250m", "memory": "64Mi", "ephemeral-storage": "1Gi"})),
            {"cpu": 250, "memory": 64 * MI, "ephemeral-storage": GI},
            id="one container, millicores and bytes",
        ),
        pytest.param(mk(c(req={"cpu": "0.0001"})), {"cpu": 1}, id="cpu rounds up to 1m"),
        pytest.param(
            mk(c(limits={"cpu": "1", "memory": "1Gi"})),
            {"cpu": 1000, "memory": GI},
            id="limits are the default requests",
        ),
        pytest.param(
            mk(c(req={"cpu": "100m"}, limits={"cpu": "1", "memory": "1Gi"})),
            {"cpu": 100, "memory": GI},
            id="explicit request wins over the limit",
        ),
        pytest.param(
            mk(c("a", {"cpu": "100m"}), c("b", {"cpu": "200m", "memory": "1Mi"})),
            {"cpu": 300, "memory": MI},
            id="regular containers add up",
        ),
        pytest.param(
            mk(c("a", {"cpu": "100m"}), inits=(c("i", {"cpu": "500m", "memory": "1Mi"}),)),
            {"cpu": 500, "memory": MI},
            id="an init container bigger than the sum sets the peak",
        ),
        pytest.param(
            mk(
                c("a", {"cpu": "300m"}),
                inits=(c("i1", {"cpu": "100m"}), c("i2", {"cpu": "200m"})),
            ),
            {"cpu": 300},
            id="init containers run one at a time: their max, not their sum",
        ),
        pytest.param(
            mk(
                c("a", {"cpu": "100m"}),
                inits=(c("side", {"cpu": "200m"}, restartPolicy="Always"),),
            ),
            {"cpu": 300},
            id="a sidecar adds to the regular containers",
        ),
        pytest.param(
            mk(
                c("a", {"cpu": "100m"}),
                inits=(
                    c("side", {"cpu": "200m"}, restartPolicy="Always"),
                    c("init", {"cpu": "500m"}),
                ),
            ),
            {"cpu": 700},
            id="an init container after a sidecar runs beside it",
        ),
        pytest.param(
            mk(
                c("a", {"cpu": "100m"}),
                inits=(
                    c("init", {"cpu": "500m"}),
                    c("side", {"cpu": "200m"}, restartPolicy="Always"),
                ),
            ),
            {"cpu": 500},
            id="an init container before a sidecar does not",
        ),
        pytest.param(
            mk(c(req={"cpu": "100m"}), overhead={"cpu": "50m", "memory": "10Mi"}),
            {"cpu": 150, "memory": 10 * MI},
            id="pod overhead is added",
        ),
        pytest.param(
            mk(c("a", {"cpu": "100m"}), c("b"), resources={"requests": {"cpu": "1"}}),
            {"cpu": 1000},
            id="pod-level requests replace the containers'",
        ),
        pytest.param(
            mk(c(), resources={"limits": {"memory": "1Gi"}}),
            {"memory": GI},
            id="pod-level limit alone is the request",
        ),
        pytest.param(
            mk(c(req={"memory": "1Mi"}), resources={"limits": {"memory": "1Gi"}}),
            {"memory": MI},
            id="pod-level limit does not override container requests",
        ),
        pytest.param(
            mk(c(req={"hugepages-2Mi": "4Mi", "example.com/gpu": "1"})),
            {"hugepages-2Mi": 4 * MI, "example.com/gpu": 1},
            id="scalar resources",
        ),
    ],
)
def test_pod_requests(pod: JSON, want: dict[str, int]) -> None:
    assert pod_requests(pod) == want


# -- reasons -------------------------------------------------------------------------


def running_pod(uid: str, **req: str) -> JSON:
    return mk(c(req=dict(req) or None), uid=uid)


def out_of(resource: str, requested: int, used: int, capacity: int) -> Verdict:
    return Verdict(
        False,
        f"OutOf{resource}",
        f"Node didn't have enough resource: {resource}, requested: {requested}, "
        f"used: {used}, capacity: {capacity}",
    )


NODE_AFFINITY = Verdict(
    False,
    "NodeAffinity",
    "Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector",
)


@pytest.mark.parametrize(
    ("pod", "others", "want"),
    [
        pytest.param(mk(c()), [], ADMIT, id="empty node"),
        pytest.param(
            mk(c()),
            [running_pod("a"), running_pod("b")],
            ADMIT,
            id="third pod fits maxPods 3",
        ),
        pytest.param(
            mk(c()),
            [running_pod("a"), running_pod("b"), running_pod("c")],
            out_of("pods", 1, 3, 3),
            id="OutOfpods",
        ),
        pytest.param(
            mk(c(req={"cpu": "1500m"})),
            [running_pod("a", cpu="600m")],
            out_of("cpu", 1500, 600, 2000),
            id="OutOfcpu in millicores",
        ),
        pytest.param(
            mk(c(req={"cpu": "1400m"})),
            [running_pod("a", cpu="600m")],
            ADMIT,
            id="cpu exactly fits",
        ),
        pytest.param(
            mk(c(req={"memory": "3Gi"})),
            [running_pod("a", memory="2Gi")],
            out_of("memory", 3 * GI, 2 * GI, 4 * GI),
            id="OutOfmemory in bytes",
        ),
        pytest.param(
            mk(c(req={"ephemeral-storage": "11Gi"})),
            [],
            out_of("ephemeral-storage", 11 * GI, 0, 10 * GI),
            id="OutOfephemeral-storage",
        ),
        pytest.param(
            mk(c(req={"hugepages-2Mi": "128Mi"})),
            [],
            out_of("hugepages-2Mi", 128 * MI, 0, 64 * MI),
            id="OutOfhugepages",
        ),
        pytest.param(
            mk(c(req={"hugepages-1Gi": "1Gi"})),
            [],
            out_of("hugepages-1Gi", GI, 0, 0),
            id="a huge page size the node lacks",
        ),
        pytest.param(
            mk(c(req={"example.com/gpu": "2"})),
            [],
            out_of("example.com/gpu", 2, 0, 1),
            id="an extended resource the node offers",
        ),
        pytest.param(
            mk(c(req={"other.io/fpga": "4"})),
            [],
            ADMIT,
            id="an extended resource the node does not offer is ignored",
        ),
        pytest.param(
            mk(c(req={"cpu": "3", "memory": "8Gi"})),
            [running_pod("a"), running_pod("b"), running_pod("c")],
            out_of("pods", 1, 3, 3),
            id="pods is reported before cpu",
        ),
        pytest.param(
            mk(c(req={"cpu": "3", "memory": "8Gi"})),
            [],
            out_of("cpu", 3000, 0, 2000),
            id="cpu is reported before memory",
        ),
        pytest.param(
            mk(c(req={"cpu": "3"}), nodeSelector={"zone": "b"}),
            [],
            out_of("cpu", 3000, 0, 2000),
            id="resources are checked before affinity",
        ),
        pytest.param(mk(c(), nodeSelector={"zone": "a"}), [], ADMIT, id="nodeSelector matches"),
        pytest.param(mk(c(), nodeSelector={"zone": "b"}), [], NODE_AFFINITY, id="NodeAffinity"),
        pytest.param(mk(c(), nodeName="node1"), [], ADMIT, id="own node name"),
        pytest.param(
            mk(c(), nodeName="node2"),
            [],
            Verdict(
                False,
                "NodeName",
                "Predicate NodeName failed: node(s) didn't match the requested node name",
            ),
            id="NodeName",
        ),
        pytest.param(
            mk(c(ports=[{"containerPort": 80, "hostPort": 8080}])),
            [mk(c(ports=[{"containerPort": 80, "hostPort": 8080}]), uid="a")],
            Verdict(
                False,
                "NodePorts",
                "Predicate NodePorts failed: node(s) didn't have free ports for the "
                "requested pod ports",
            ),
            id="NodePorts",
        ),
        pytest.param(
            mk(c(), metadata={"labels": {"kubernetes.io/os": "windows"}}),
            [],
            Verdict(
                False,
                "PodOSSelectorNodeLabelDoesNotMatch",
                "Failed to admit pod as the `kubernetes.io/os` label doesn't match node label",
            ),
            id="os label",
        ),
        pytest.param(
            mk(c(), metadata={"labels": {"kubernetes.io/os": "linux"}}),
            [],
            ADMIT,
            id="matching os label",
        ),
        pytest.param(
            mk(c(), os={"name": "windows"}),
            [],
            Verdict(
                False,
                "PodOSNotSupported",
                "Failed to admit pod as the OS field doesn't match node OS",
            ),
            id="os field",
        ),
    ],
)
def test_admit_pod(pod: JSON, others: list[JSON], want: Verdict) -> None:
    assert admit_pod(pod, others=others, node=NODE) == want


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        pytest.param({"hostUsers": False}, "spec.hostUsers: user namespaces", id="hostUsers"),
        pytest.param({"runtimeClassName": "gvisor"}, "spec.runtimeClassName: ", id="runtime"),
        pytest.param(
            {"resourceClaims": [{"name": "gpu", "resourceClaimName": "g"}]},
            "spec.resourceClaims: ResourceClaims are read from the API server",
            id="pod claims standalone",
        ),
    ],
)
def test_fields_asking_for_more_than_klet_gives_are_refused(spec: JSON, named: str) -> None:
    pod = mk(c(), **spec)
    verdict = admit_pod(pod, others=[], node=NODE)
    assert not verdict.admit and verdict.reason == "PodFeatureUnsupported"
    assert verdict.message.startswith("Pod requires features this node lacks: ")
    assert named in verdict.message


@pytest.mark.parametrize(
    "spec",
    [{"hostUsers": True}, {"runtimeClassName": ""}, {"resourceClaims": []}],
    ids=["host user namespace", "empty runtime class", "no claims"],
)
def test_what_klet_gives_anyway_is_admitted(spec: JSON) -> None:
    assert admit_pod(mk(c(), **spec), others=[], node=NODE) == ADMIT


def test_a_runtime_class_is_admitted_where_it_can_be_looked_up() -> None:
    pod = mk(c(), runtimeClassName="crun")
    standalone = admit_pod(pod, others=[], node=NODE)
    assert not standalone.admit and "standalone" in standalone.message
    cluster = dataclasses.replace(NODE, runtime_classes=True)
    assert admit_pod(pod, others=[], node=cluster) == ADMIT


def test_resource_claims_are_admitted_where_they_can_be_read() -> None:
    pod = mk(
        c(resources={"claims": [{"name": "gpu"}]}),
        resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "t"}],
    )
    standalone = admit_pod(pod, others=[], node=NODE)
    assert not standalone.admit and standalone.reason == "PodFeatureUnsupported"
    assert "spec.resourceClaims" in standalone.message and "standalone" in standalone.message
    cluster = dataclasses.replace(NODE, runtime_classes=True)
    assert admit_pod(pod, others=[], node=cluster) == ADMIT


def test_every_refused_field_is_named_and_os_comes_first() -> None:
    pod = mk(c(), hostUsers=False, runtimeClassName="kata")
    verdict = admit_pod(pod, others=[], node=NODE)
    assert "spec.hostUsers" in verdict.message and "spec.runtimeClassName" in verdict.message
    pod = mk(c(), hostUsers=False, os={"name": "windows"})
    assert admit_pod(pod, others=[], node=NODE).reason == "PodOSNotSupported"


def test_rejected_status_message_is_upstreams() -> None:
    verdict = admit_pod(mk(c(), nodeSelector={"zone": "b"}), others=[], node=NODE)
    assert verdict.status_message == (
        "Pod was rejected: Predicate NodeAffinity failed: "
        "node(s) didn't match Pod's node affinity/selector"
    )


# -- host ports ----------------------------------------------------------------------


def port(host_port: int, host_ip: str = "", protocol: str = "", container_port: int = 80) -> JSON:
    out: JSON = {"containerPort": container_port}
    if host_port:
        out["hostPort"] = host_port
    if host_ip:
        out["hostIP"] = host_ip
    if protocol:
        out["protocol"] = protocol
    return out


@pytest.mark.parametrize(
    ("want", "used", "conflict"),
    [
        pytest.param(("0.0.0.0", "TCP", 80), [("0.0.0.0", "TCP", 80)], True, id="same wildcard"),
        pytest.param(("0.0.0.0", "TCP", 80), [("10.0.0.1", "TCP", 80)], True, id="wildcard wants"),
        pytest.param(("10.0.0.1", "TCP", 80), [("0.0.0.0", "TCP", 80)], True, id="wildcard used"),
        pytest.param(("10.0.0.1", "TCP", 80), [("10.0.0.1", "TCP", 80)], True, id="same ip"),
        pytest.param(("10.0.0.1", "TCP", 80), [("10.0.0.2", "TCP", 80)], False, id="other ip"),
        pytest.param(("0.0.0.0", "UDP", 80), [("0.0.0.0", "TCP", 80)], False, id="other proto"),
        pytest.param(("0.0.0.0", "TCP", 81), [("0.0.0.0", "TCP", 80)], False, id="other port"),
        pytest.param(("0.0.0.0", "TCP", 80), [], False, id="nothing used"),
    ],
)
def test_port_conflict(
    want: tuple[str, str, int], used: list[tuple[str, str, int]], conflict: bool
) -> None:
    assert port_conflict(want, used) is conflict


@pytest.mark.parametrize(
    ("pod", "want"),
    [
        pytest.param(mk(c(ports=[port(0)])), [], id="no host port"),
        pytest.param(mk(c(ports=[port(8080)])), [("0.0.0.0", "TCP", 8080)], id="defaults"),
        pytest.param(
            mk(c(ports=[port(53, "10.0.0.1", "UDP")])),
            [("10.0.0.1", "UDP", 53)],
            id="explicit ip and protocol",
        ),
        pytest.param(
            mk(c(ports=[port(0, container_port=9000)]), hostNetwork=True),
            [("0.0.0.0", "TCP", 9000)],
            id="host network: hostPort defaults to containerPort",
        ),
        pytest.param(
            mk(c(), inits=(c("side", restartPolicy="Always", ports=[port(7000)]),)),
            [("0.0.0.0", "TCP", 7000)],
            id="sidecar ports count",
        ),
        pytest.param(
            mk(c(), inits=(c("init", ports=[port(7000)]),)),
            [],
            id="init container ports do not",
        ),
    ],
)
def test_host_ports(pod: JSON, want: list[tuple[str, str, int]]) -> None:
    assert host_ports(pod) == want


def test_specific_addresses_share_a_port_but_not_with_the_wildcard() -> None:
    first = mk(c(ports=[port(8080, "10.0.0.1")]), uid="a")
    second = mk(c(ports=[port(8080, "10.0.0.2")]), uid="b")
    third = mk(c(ports=[port(8080)]), uid="c")
    assert admit_pod(second, others=[first], node=NODE).admit
    assert admit_pod(third, others=[first, second], node=NODE).reason == "NodePorts"


# -- node affinity -------------------------------------------------------------------


def expr(key: str, op: str, *values: str) -> JSON:
    out: JSON = {"key": key, "operator": op}
    if values:
        out["values"] = list(values)
    return out


def affinity(*terms: JSON) -> JSON:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}
        }
    }


def term(*exprs: JSON, fields: tuple[JSON, ...] = ()) -> JSON:
    out: JSON = {}
    if exprs:
        out["matchExpressions"] = list(exprs)
    if fields:
        out["matchFields"] = list(fields)
    return out


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        pytest.param({}, True, id="nothing required"),
        pytest.param({"nodeSelector": {"zone": "a", "cores": "8"}}, True, id="selector all"),
        pytest.param({"nodeSelector": {"zone": "a", "ssd": "yes"}}, False, id="selector missing"),
        pytest.param({"affinity": affinity(term(expr("zone", "In", "a", "b")))}, True, id="In"),
        pytest.param({"affinity": affinity(term(expr("zone", "In", "b")))}, False, id="In no"),
        pytest.param({"affinity": affinity(term(expr("ssd", "In", "yes")))}, False, id="In abs"),
        pytest.param({"affinity": affinity(term(expr("zone", "NotIn", "b")))}, True, id="NotIn"),
        pytest.param({"affinity": affinity(term(expr("zone", "NotIn", "a")))}, False, id="NotIn2"),
        pytest.param(
            {"affinity": affinity(term(expr("ssd", "NotIn", "yes")))}, True, id="NotIn absent"
        ),
        pytest.param({"affinity": affinity(term(expr("zone", "Exists")))}, True, id="Exists"),
        pytest.param({"affinity": affinity(term(expr("ssd", "Exists")))}, False, id="Exists no"),
        pytest.param({"affinity": affinity(term(expr("ssd", "DoesNotExist")))}, True, id="DNE"),
        pytest.param({"affinity": affinity(term(expr("zone", "DoesNotExist")))}, False, id="DNE2"),
        pytest.param({"affinity": affinity(term(expr("cores", "Gt", "4")))}, True, id="Gt"),
        pytest.param({"affinity": affinity(term(expr("cores", "Gt", "8")))}, False, id="Gt eq"),
        pytest.param({"affinity": affinity(term(expr("cores", "Lt", "16")))}, True, id="Lt"),
        pytest.param({"affinity": affinity(term(expr("cores", "Lt", "8")))}, False, id="Lt eq"),
        pytest.param(
            {"affinity": affinity(term(expr("zone", "Gt", "1")))}, False, id="Gt non-int label"
        ),
        pytest.param(
            {"affinity": affinity(term(expr("cores", "Gt", "x")))}, False, id="Gt bad value"
        ),
        pytest.param(
            {"affinity": affinity(term(expr("cores", "Gt", "1", "2")))}, False, id="Gt 2 values"
        ),
        pytest.param({"affinity": affinity(term(expr("zone", "In")))}, False, id="In no values"),
        pytest.param(
            {"affinity": affinity(term(expr("zone", "Exists", "a")))}, False, id="Exists values"
        ),
        pytest.param(
            {"affinity": affinity(term(expr("zone", "Near", "a")))}, False, id="bad operator"
        ),
        pytest.param(
            {"affinity": affinity(term(expr("zone", "In", "a"), expr("cores", "Lt", "2")))},
            False,
            id="expressions are ANDed",
        ),
        pytest.param(
            {"affinity": affinity(term(expr("zone", "In", "b")), term(expr("cores", "Gt", "2")))},
            True,
            id="terms are ORed",
        ),
        pytest.param(
            {"affinity": affinity(term(expr("zone", "Gt", "x")), term(expr("zone", "In", "a")))},
            True,
            id="an unparsable term is skipped, the others still match",
        ),
        pytest.param({"affinity": affinity(term())}, False, id="an empty term matches nothing"),
        pytest.param({"affinity": affinity()}, False, id="no terms match nothing"),
        pytest.param(
            {"affinity": affinity(term(fields=(expr("metadata.name", "In", "node1"),)))},
            True,
            id="matchFields In",
        ),
        pytest.param(
            {"affinity": affinity(term(fields=(expr("metadata.name", "NotIn", "node1"),)))},
            False,
            id="matchFields NotIn",
        ),
        pytest.param(
            {"affinity": affinity(term(fields=(expr("metadata.name", "In", "node2"),)))},
            False,
            id="matchFields other node",
        ),
        pytest.param(
            {"affinity": affinity(term(fields=(expr("metadata.name", "In", "node1", "n2"),)))},
            False,
            id="matchFields takes exactly one value",
        ),
        pytest.param(
            {"affinity": affinity(term(fields=(expr("metadata.name", "Exists"),)))},
            False,
            id="matchFields only In/NotIn",
        ),
        pytest.param(
            {
                "affinity": affinity(
                    term(expr("zone", "In", "a"), fields=(expr("metadata.name", "In", "node1"),))
                )
            },
            True,
            id="expressions and fields together",
        ),
        pytest.param(
            {"nodeSelector": {"zone": "b"}, "affinity": affinity(term(expr("zone", "Exists")))},
            False,
            id="both nodeSelector and affinity must match",
        ),
    ],
)
def test_node_affinity(spec: JSON, match: bool) -> None:
    assert matches_node_affinity(mk(c(), **spec), NODE) is match


# -- counting and order --------------------------------------------------------------


def test_admission_order_is_creation_time_then_first_seen() -> None:
    pods = [
        ("new", mk(metadata={"creationTimestamp": "2026-01-01T00:00:10Z"}), 0.0),
        ("old", mk(metadata={"creationTimestamp": "2026-01-01T00:00:00Z"}), 99e9),
        ("static-late", mk(), 1_767_225_605.0),  # 00:00:05 by when it was seen
        ("static-early", mk(), 1_767_225_601.0),
    ]
    assert admission_order(pods) == ["old", "static-early", "static-late", "new"]


@pytest.mark.parametrize(
    ("admitted", "idle", "status", "terminal", "counts"),
    [
        pytest.param(True, False, None, False, True, id="admitted, not synced yet"),
        pytest.param(True, False, {"phase": "Running"}, False, True, id="running"),
        pytest.param(True, False, {"phase": "Pending"}, False, True, id="pending"),
        pytest.param(True, False, {"phase": "Succeeded"}, False, False, id="succeeded"),
        pytest.param(True, False, {"phase": "Failed"}, False, False, id="failed"),
        pytest.param(True, False, {"phase": "Running"}, True, False, id="made terminal"),
        pytest.param(True, True, None, False, False, id="idle at restart"),
        pytest.param(True, True, {"phase": "Running"}, False, True, id="idle, running again"),
        pytest.param(False, False, {"phase": "Running"}, False, False, id="never admitted"),
    ],
)
def test_only_admitted_pods_that_still_run_count(
    admitted: bool, idle: bool, status: JSON | None, terminal: bool, counts: bool
) -> None:
    ledger = AdmissionLedger(NODE)
    if admitted:
        ledger.admitted.add("u")
    if idle:
        ledger.idle.add("u")
    assert ledger.counts("u", status=status, terminal=terminal) is counts


def test_readmission_after_restart_is_oldest_first() -> None:
    node = NodeInfo(name="node1", labels={}, allocatable={"pods": 2, "cpu": 1000})

    def at(second: int, cpu: str) -> JSON:
        return mk(
            c(req={"cpu": cpu}), metadata={"creationTimestamp": f"2026-01-01T00:00:0{second}Z"}
        )

    ledger = AdmissionLedger(node)
    verdicts = ledger.readmit(
        {"b": (at(2, "400m"), 0.0), "c": (at(3, "400m"), 0.0), "a": (at(1, "400m"), 0.0)},
        idle=["done"],
    )
    assert {u: v.reason for u, v in verdicts.items()} == {"a": "", "b": "", "c": "OutOfpods"}
    assert ledger.admitted == {"a", "b", "done"} and ledger.idle == {"done"}
    assert ledger.restarted
    ledger.forget("a")
    assert ledger.verdict("a") is None and ledger.verdict("b") == ADMIT
    assert ledger.verdict("c") == verdicts["c"]


# -- through the controller ----------------------------------------------------------


READY = {"file": SourceState(source="file", ready=True, at=0.0)}


class World:
    def __init__(self, tmp_path: Path, *, max_pods: int = 2) -> None:
        self.t = 1_700_000_000.0
        self.cri = FakeRuntimeService(clock=lambda: int(self.t * 1e9))
        self.cri.add_image(IMAGE)
        self.events = UidEvents()
        self.tmp_path = tmp_path
        self.max_pods = max_pods
        self.controller = self.new_controller()

    def clock(self) -> float:
        return self.t

    def new_controller(self) -> PodController:
        """A fresh syncloop (as after a restart) over the same runtime."""
        node = NodeInfo(name="node1", labels={}, allocatable={"pods": self.max_pods})
        # No node name: admission's NodeName predicate, not the controller's refusal of
        # records naming another node, decides about a pod bound elsewhere.
        self.deps: Deps = wire(
            self.tmp_path, self.cri, events=self.events, clock=self.clock, node=node, node_name=""
        )
        self.syncer = self.deps.controller.syncer
        controller = self.deps.controller
        controller.workers = IdleWorkers()  # type: ignore[assignment]
        return controller

    def rejections(self, reason: str) -> float | None:
        return self.deps.registry.get_sample_value(
            "kubelet_admission_rejections_total", {"reason": reason}
        )

    def running(self) -> set[str]:
        return {
            s.config.labels["io.kubernetes.pod.uid"]
            for s in self.cri.sandboxes.values()
            if s.state.value == "SANDBOX_READY"
        }


def rec(uid: str, created_s: int, **spec: Any) -> DesiredPod:
    pod = mk(
        c(command=["sleep", "1000"]),
        uid=uid,
        metadata={"creationTimestamp": f"2026-01-01T00:00:{created_s:02d}Z"},
        **spec,
    )
    return DesiredPod(uid=PodUID(uid), pod=pod, source="file", hash=uid, seen_at=0.0)


@pytest.fixture
def w(tmp_path: Path) -> World:
    return World(tmp_path)


async def test_rejected_pod_fails_with_an_event_and_never_starts(w: World) -> None:
    table = {u: rec(u, i) for i, u in enumerate(("a", "b", "c"))}
    w.controller.apply_desired(table, READY, read_from=0)
    for uid in ("a", "b", "c"):
        await w.controller.sync_once(uid)
    assert w.running() == {"a", "b"}
    status = w.controller.publisher.get("c")
    assert status is not None
    assert (status["phase"], status["reason"]) == ("Failed", "OutOfpods")
    assert status["message"] == (
        "Pod was rejected: Node didn't have enough resource: pods, requested: 1, used: 2, "
        "capacity: 2"
    )
    assert [e for e in w.events.emitted if e[0] == "c"] == [
        ("c", "Warning", "OutOfpods", status["message"].removeprefix("Pod was rejected: "))
    ]
    await w.controller.sync_once("c")  # later syncs keep it failed, without a new Event
    assert w.running() == {"a", "b"}
    assert len([e for e in w.events.emitted if e[0] == "c"]) == 1
    assert not [
        s for s in w.cri.sandboxes.values() if s.config.labels["io.kubernetes.pod.uid"] == "c"
    ]


async def test_a_pod_is_admitted_once_and_finished_pods_free_their_slot(w: World) -> None:
    table = {"a": rec("a", 1), "b": rec("b", 2, restartPolicy="Never")}
    w.controller.apply_desired(table, READY, read_from=0)
    await w.controller.sync_once("a")
    await w.controller.sync_once("b")
    # b finishes: it no longer counts, so c fits; a is not re-checked on later syncs.
    for ctr in list(w.cri.containers.values()):
        if ctr.config.labels["io.kubernetes.pod.uid"] == "b":
            w.cri.exit_container(ctr.id, 0)
    await w.controller.sync_once("b")
    status_b = w.controller.publisher.get("b")
    assert status_b is not None and status_b["phase"] == "Succeeded"
    table["c"] = rec("c", 3)
    w.controller.apply_desired(table, READY, read_from=0)
    await w.controller.sync_once("c")
    await w.controller.sync_once("a")
    assert {"a", "c"} <= w.running()
    assert not [e for e in w.events.emitted if e[1] == "Warning"]


async def test_after_a_restart_running_pods_are_admitted_before_new_ones(w: World) -> None:
    table = {"a": rec("a", 1), "b": rec("b", 2)}
    w.controller.apply_desired(table, READY, read_from=0)
    await w.controller.sync_once("a")
    await w.controller.sync_once("b")
    before = set(w.cri.containers)
    # A restarted syncloop sees an older new pod first: it must not take a's or b's slot.
    w.controller = w.new_controller()
    table = {"new": rec("new", 0), **table}
    w.controller.apply_desired(table, READY, read_from=0)
    await w.controller.sync_once("new")
    await w.controller.sync_once("b")
    await w.controller.sync_once("a")
    assert w.running() == {"a", "b"}
    assert set(w.cri.containers) == before, "a running container was replaced"
    status = w.controller.publisher.get("new")
    assert status is not None and status["reason"] == "OutOfpods"


async def test_admission_waits_for_the_first_full_read_of_desired_pods(w: World) -> None:
    w.controller.set_desired("a", rec("a", 1))  # set by the stream before any table read
    outcome = await w.controller.sync_once("a")
    assert outcome.wake_at == pytest.approx(w.t + 1.0)
    assert w.running() == set() and w.controller.admission is not None
    assert w.controller.admission.verdict("a") is None
    w.controller.apply_desired({"a": rec("a", 1)}, READY, read_from=0)
    await w.controller.sync_once("a")
    assert w.running() == {"a"}


async def test_idle_pods_at_restart_stay_admitted_without_counting(w: World) -> None:
    done = rec("done", 1, restartPolicy="Never")
    await w.syncer.sync(done.pod, RuntimePod(uid="done"))
    for ctr in list(w.cri.containers.values()):
        w.cri.exit_container(ctr.id, 0)
    for s in list(w.cri.sandboxes):
        await w.cri.stop_pod_sandbox(s)
    table = {"done": done, "a": rec("a", 2), "b": rec("b", 3)}
    w.controller.apply_desired(table, READY, read_from=0)
    await w.controller.sync_once("a")
    await w.controller.sync_once("b")
    await w.controller.sync_once("done")
    assert w.running() == {"a", "b"}
    status = w.controller.publisher.get("done")
    assert status is not None and status["phase"] == "Succeeded"
    assert not [e for e in w.events.emitted if e[1] == "Warning"]


async def test_each_rejection_counts_once_by_reason(w: World) -> None:
    table = {
        "a": rec("a", 1),
        "d": rec("d", 2, nodeName="elsewhere"),
        "b": rec("b", 3),
        "c": rec("c", 4),
        "e": rec("e", 5),
    }
    w.controller.apply_desired(table, READY, read_from=0)
    assert w.rejections("OutOfpods") is None
    for uid in table:
        await w.controller.sync_once(uid)
    assert w.running() == {"a", "b"}
    assert w.rejections("OutOfpods") == 2  # c and e
    assert w.rejections("Other") == 1  # d: NodeName is not on upstream's list
    for uid in table:  # later syncs of rejected pods count nothing new
        await w.controller.sync_once(uid)
    assert w.rejections("OutOfpods") == 2 and w.rejections("Other") == 1


async def test_a_rejection_at_the_re_admission_counts(w: World) -> None:
    table = {"a": rec("a", 1), "b": rec("b", 2)}
    w.controller.apply_desired(table, READY, read_from=0)
    await w.controller.sync_once("a")
    await w.controller.sync_once("b")
    assert w.rejections("OutOfpods") is None
    w.max_pods = 1  # the node restarts smaller: only the oldest running pod fits
    w.controller = w.new_controller()
    w.controller.apply_desired(table, READY, read_from=0)
    await w.controller.sync_once("a")
    await w.controller.sync_once("b")
    assert w.rejections("OutOfpods") == 1
    status = w.controller.publisher.get("b")
    assert status is not None and status["reason"] == "OutOfpods"
