"""The node's part of a claim's resize as upstream's NodeExpander decides it, per node
(klet.syncloop.volumes.expansion): when this node expands (the PV above the size it last
expanded its mount to) and to which size (the allocated one on the recovery path, the
PV's without a resize status), which statuses stop it, a ReadWriteMany claim another
node already updated expanded again here without a write while any other is settled,
the FailedPrecondition stop, the claim's status before, after and on failure
(NodeResizeInProgress, capacity with the resize conditions gone, NodeResizeError and
NodeResizeInfeasible), and the Events' texts and claim reference. The plugin's use of it
against a fake driver, two nodes sharing one claim: tests/unit/syncloop/test_csi_volumes.py."""

from __future__ import annotations

from typing import Any

import pytest
from klet.model.types import JSON
from klet.syncloop.volumes import expansion
from klet.syncloop.volumes.expansion import Expansion, Settled


def claim(
    *,
    capacity: str = "1Gi",
    request: str = "9Gi",
    status: str | None = None,
    allocated: str | None = None,
    conditions: list[JSON] | None = None,
    version: str = "41",
    modes: tuple[str, ...] = ("ReadWriteOnce",),
    annotations: JSON | None = None,
) -> JSON:
    st: dict[str, Any] = {"phase": "Bound", "capacity": {"storage": capacity}}
    if status is not None:
        st["allocatedResourceStatuses"] = {"storage": status}
    if allocated is not None:
        st["allocatedResources"] = {"storage": allocated}
    if conditions is not None:
        st["conditions"] = conditions
    meta: JSON = {"name": "data", "namespace": "ns", "uid": "c1", "resourceVersion": version}
    if annotations is not None:
        meta["annotations"] = annotations
    return {
        "metadata": meta,
        "spec": {"accessModes": list(modes), "resources": {"requests": {"storage": request}}},
        "status": st,
    }


def pv(size: str = "9Gi") -> JSON:
    return {"metadata": {"name": "pv1"}, "spec": {"capacity": {"storage": size}}}


GI = 1 << 30
RWX = ("ReadWriteMany",)
NOT_REQUIRED = {"volume.kubernetes.io/node-expansion-not-required": "true"}


CASES: list[tuple[str, JSON, str, int, object]] = [
    (
        "the user took 9Gi back to 5Gi: the PV stays at 9Gi, the resizer allocates 5Gi",
        claim(request="5Gi", status="NodeResizePending", allocated="5Gi"),
        "9Gi",
        1,
        Expansion("5Gi", 5 * GI, recovery=True),
    ),
    (
        "pending for the node",
        claim(status="NodeResizePending", allocated="9Gi"),
        "9Gi",
        1,
        Expansion("9Gi", 9 * GI, recovery=True),
    ),
    (
        "in progress (a retry)",
        claim(status="NodeResizeInProgress", allocated="9Gi"),
        "9Gi",
        1,
        Expansion("9Gi", 9 * GI, recovery=True),
    ),
    (
        "this node already expanded its mount to the PV's size",
        claim(status="NodeResizePending", allocated="9Gi"),
        "9Gi",
        9,
        None,
    ),
    (
        "the PV is no larger than the claim",
        claim(status="NodeResizePending", allocated="9Gi"),
        "1Gi",
        1,
        None,
    ),
    (
        "an unreadable PV size",
        claim(status="NodeResizePending", allocated="9Gi"),
        "lots",
        1,
        None,
    ),
    (
        "infeasible on the node",
        claim(status="NodeResizeInfeasible", allocated="9Gi"),
        "9Gi",
        1,
        None,
    ),
    (
        "the controller still resizes",
        claim(status="ControllerResizeInProgress", allocated="9Gi"),
        "9Gi",
        1,
        None,
    ),
    (
        "infeasible for the controller",
        claim(status="ControllerResizeInfeasible", allocated="9Gi"),
        "9Gi",
        1,
        None,
    ),
    (
        "allocated but not handed over, the claim not there yet: wait for the resizer",
        claim(capacity="1Gi", allocated="5Gi"),
        "9Gi",
        1,
        None,
    ),
    (
        "RWO, another node (or the controller alone) updated the claim: settled, no call",
        claim(capacity="9Gi", allocated="9Gi"),
        "9Gi",
        1,
        Settled(9 * GI),
    ),
    (
        "node-only recovery finished at 5Gi while the PV stays 9Gi: settled at 5Gi",
        claim(capacity="5Gi", request="5Gi", allocated="5Gi"),
        "9Gi",
        1,
        Settled(5 * GI),
    ),
    (
        "RWX another node updated: expanded on this node too, the claim left as it is",
        claim(capacity="9Gi", allocated="9Gi", modes=RWX),
        "9Gi",
        1,
        Expansion("9Gi", 9 * GI, recovery=True, claim_updated=True),
    ),
    (
        "RWX among other modes counts too",
        claim(capacity="9Gi", allocated="9Gi", modes=("ReadWriteOnce", "ReadWriteMany")),
        "9Gi",
        1,
        Expansion("9Gi", 9 * GI, recovery=True, claim_updated=True),
    ),
    (
        "RWX whose claim says node expansion is not required: settled",
        claim(capacity="9Gi", allocated="9Gi", modes=RWX, annotations=NOT_REQUIRED),
        "9Gi",
        1,
        Settled(9 * GI),
    ),
    (
        "RWX after this node expanded its own mount: nothing",
        claim(capacity="9Gi", allocated="9Gi", modes=RWX),
        "9Gi",
        9,
        None,
    ),
    (
        "RWX still pending (the first node): the claim is marked and updated",
        claim(status="NodeResizePending", allocated="9Gi", modes=RWX),
        "9Gi",
        1,
        Expansion("9Gi", 9 * GI, recovery=True),
    ),
    (
        "an older resizer: the PV's size, nothing marked before",
        claim(),
        "2Gi",
        1,
        Expansion("2Gi", 2 * GI, recovery=False),
    ),
    (
        "an older resizer, the claim already at the PV's size (another node): no write",
        claim(capacity="2Gi"),
        "2Gi",
        1,
        Expansion("2Gi", 2 * GI, recovery=False, claim_updated=True),
    ),
    ("an older resizer, this node already there", claim(capacity="2Gi"), "2Gi", 2, None),
]
"""What the case is, the claim, the PV's capacity, the size this node last expanded its
mount to (Gi), the decision."""


@pytest.mark.parametrize(
    ("case", "the_claim", "pv_size", "node_gi", "want"), CASES, ids=[c[0] for c in CASES]
)
def test_the_nodes_decision(
    case: str, the_claim: JSON, pv_size: str, node_gi: int, want: object
) -> None:
    got = expansion.plan(
        the_claim, pv(pv_size), node_bytes=node_gi * GI, read_only=False, failed_before=False
    )
    assert got == want, case


def test_nothing_when_read_only_refused_in_use_or_the_node_size_unknown() -> None:
    pending = claim(status="NodeResizePending", allocated="9Gi")
    args: dict[str, Any] = {"node_bytes": GI, "read_only": False, "failed_before": False}
    assert expansion.plan(pending, pv(), **args) is not None
    assert expansion.plan(pending, pv(), **{**args, "read_only": True}) is None
    assert expansion.plan(pending, pv(), **{**args, "in_use_error": True}) is None
    assert expansion.plan(pending, pv(), **{**args, "node_bytes": None}) is None


def test_the_node_starts_from_the_claims_capacity() -> None:
    assert expansion.claim_bytes(claim(capacity="1Gi")) == GI
    no_capacity = claim()
    del no_capacity["status"]["capacity"]
    assert expansion.claim_bytes(no_capacity) is None
    assert expansion.claim_bytes({}) is None


def test_a_read_only_claim_is_refused_when_the_pv_grew() -> None:
    assert expansion.read_only_refused(claim(capacity="1Gi"), pv("2Gi"))
    assert not expansion.read_only_refused(claim(capacity="2Gi"), pv("2Gi"))
    assert not expansion.read_only_refused(claim(capacity="1Gi"), pv("lots"))


def test_a_failure_after_a_final_error_with_a_changed_request_is_infeasible() -> None:
    args: dict[str, Any] = {"node_bytes": GI, "read_only": False, "failed_before": True}
    changed = claim(request="5Gi", status="NodeResizePending", allocated="9Gi")
    got = expansion.plan(changed, pv(), **args)
    assert isinstance(got, Expansion) and got.infeasible_on_failure
    assert expansion.is_infeasible("PERMISSION_DENIED", got)
    same = claim(request="9Gi", status="NodeResizeInProgress", allocated="9Gi")
    again = expansion.plan(same, pv(), **args)
    assert isinstance(again, Expansion) and not again.infeasible_on_failure
    assert not expansion.is_infeasible("PERMISSION_DENIED", again)
    rwx = claim(capacity="9Gi", request="5Gi", allocated="9Gi", modes=RWX)
    other_node = expansion.plan(rwx, pv(), **args)
    assert isinstance(other_node, Expansion) and other_node.infeasible_on_failure


@pytest.mark.parametrize(
    ("code", "infeasible"),
    [
        ("INVALID_ARGUMENT", True),
        ("OUT_OF_RANGE", True),
        ("NOT_FOUND", True),
        ("PERMISSION_DENIED", False),
        ("INTERNAL", False),
        ("FAILED_PRECONDITION", False),
    ],
)
def test_infeasible_codes_are_upstreams(code: str, infeasible: bool) -> None:
    assert expansion.is_infeasible(code, Expansion("9Gi", 9 * GI, recovery=True)) is infeasible


def test_the_events_texts_and_the_claims_reference() -> None:
    assert expansion.success_message("pv1", "node1") == (
        'MountVolume.NodeExpandVolume succeeded for volume "pv1" node1'
    )
    assert expansion.read_only_message("pv1") == (
        'MountVolume.NodeExpandVolume failed for volume "pv1" requested read-only file system'
    )
    assert expansion.failure_message("pv1", "NodeExpandVolume: INTERNAL: no") == (
        'NodeExpandVolume.NodeExpandVolume failed for volume "pv1" : NodeExpandVolume: INTERNAL: no'
    )
    assert expansion.claim_reference(claim()) == {
        "kind": "PersistentVolumeClaim",
        "namespace": "ns",
        "name": "data",
        "uid": "c1",
        "apiVersion": "v1",
    }


def test_in_progress_is_marked_once_with_the_resource_version() -> None:
    assert expansion.in_progress_patch(claim(status="NodeResizePending")) == {
        "status": {"allocatedResourceStatuses": {"storage": "NodeResizeInProgress"}},
        "metadata": {"resourceVersion": "41"},
    }
    assert expansion.in_progress_patch(claim(status="NodeResizeInProgress")) is None


def test_finished_sets_capacity_and_drops_the_status_and_every_resize_condition() -> None:
    c = claim(
        status="NodeResizeInProgress",
        conditions=[
            {"type": "FileSystemResizePending", "status": "True"},
            {"type": "Resizing", "status": "True"},
            {"type": "ControllerResizeError", "status": "True"},
            {"type": "NodeResizeError", "status": "True"},
            {"type": "ModifyingVolume", "status": "True"},
        ],
    )
    assert expansion.finished_patch(c, "5Gi") == {
        "status": {
            "capacity": {"storage": "5Gi"},
            "conditions": [{"type": "ModifyingVolume", "status": "True"}],
            "allocatedResourceStatuses": {"storage": None},
        },
        "metadata": {"resourceVersion": "41"},
    }
    bare = expansion.finished_patch(claim(), "2Gi")
    assert bare["status"]["conditions"] is None  # the list removed


def test_a_final_error_adds_node_resize_error_and_keeps_the_other_conditions() -> None:
    pending = {"type": "FileSystemResizePending", "status": "True"}
    c = claim(status="NodeResizeInProgress", conditions=[pending])
    patch = expansion.failed_patch(
        c, "NodeExpandVolume: PERMISSION_DENIED: no", infeasible=False, now="2026-11-29T04:00:00Z"
    )
    assert patch == {
        "status": {
            "conditions": [
                pending,
                {
                    "type": "NodeResizeError",
                    "status": "True",
                    "lastTransitionTime": "2026-11-29T04:00:00Z",
                    "message": "failed to expand pvc with NodeExpandVolume: PERMISSION_DENIED: no",
                },
            ]
        },
        "metadata": {"resourceVersion": "41"},
    }


def test_an_infeasible_error_marks_the_status_and_an_existing_error_stays_as_it_was() -> None:
    old = {"type": "NodeResizeError", "status": "True", "message": "first"}
    c = claim(status="NodeResizeInProgress", conditions=[old])
    patch = expansion.failed_patch(c, "again", infeasible=True, now="2026-11-29T04:00:00Z")
    assert patch is not None and patch["status"] == {
        "conditions": [old],
        "allocatedResourceStatuses": {"storage": "NodeResizeInfeasible"},
    }
    # a retry failing the same way writes nothing
    assert expansion.failed_patch(c, "again", infeasible=False, now="later") is None
    c["status"]["allocatedResourceStatuses"] = {"storage": "NodeResizeInfeasible"}
    assert expansion.failed_patch(c, "again", infeasible=True, now="later") is None
