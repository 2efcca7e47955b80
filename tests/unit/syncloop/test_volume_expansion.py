"""The node's part of a claim's resize as upstream's NodeExpander decides it
(klet.syncloop.volumes.expansion): when to expand and to which size (the allocated one
on the recovery path, the PV's without a resize status), which statuses stop it, and
the claim's status before, after and on failure (NodeResizeInProgress, capacity with
the resize conditions gone, NodeResizeError and NodeResizeInfeasible). The plugin's use
of it against a fake driver: tests/unit/syncloop/test_csi_volumes.py."""

from __future__ import annotations

from typing import Any

import pytest
from klet.model.types import JSON
from klet.syncloop.volumes import expansion
from klet.syncloop.volumes.expansion import Expansion


def claim(
    *,
    capacity: str = "1Gi",
    request: str = "9Gi",
    status: str | None = None,
    allocated: str | None = None,
    conditions: list[JSON] | None = None,
    version: str = "41",
) -> JSON:
    st: dict[str, Any] = {"phase": "Bound", "capacity": {"storage": capacity}}
    if status is not None:
        st["allocatedResourceStatuses"] = {"storage": status}
    if allocated is not None:
        st["allocatedResources"] = {"storage": allocated}
    if conditions is not None:
        st["conditions"] = conditions
    return {
        "metadata": {"name": "data", "namespace": "ns", "resourceVersion": version},
        "spec": {"resources": {"requests": {"storage": request}}},
        "status": st,
    }


def pv(size: str = "9Gi") -> JSON:
    return {"metadata": {"name": "pv1"}, "spec": {"capacity": {"storage": size}}}


GI = 1 << 30


def test_the_recovery_path_expands_to_the_allocated_size() -> None:
    # the user took 9Gi back to 5Gi: the PV stays at 9Gi, the resizer allocates 5Gi
    got = expansion.plan(
        claim(request="5Gi", status="NodeResizePending", allocated="5Gi"),
        pv("9Gi"),
        read_only=False,
        failed_before=False,
    )
    assert got == Expansion("5Gi", 5 * GI, recovery=True)


@pytest.mark.parametrize("status", ["NodeResizePending", "NodeResizeInProgress"])
def test_a_claim_waiting_for_the_node_is_expanded(status: str) -> None:
    got = expansion.plan(
        claim(status=status, allocated="9Gi"), pv(), read_only=False, failed_before=False
    )
    assert got == Expansion("9Gi", 9 * GI, recovery=True)


@pytest.mark.parametrize(
    "status", ["NodeResizeInfeasible", "ControllerResizeInProgress", "ControllerResizeInfeasible"]
)
def test_a_claim_in_another_state_is_left_alone(status: str) -> None:
    c = claim(status=status, allocated="9Gi")
    assert expansion.plan(c, pv(), read_only=False, failed_before=False) is None


def test_nothing_to_do_when_the_pv_is_no_larger_read_only_or_sizes_unknown() -> None:
    pending = claim(status="NodeResizePending", allocated="9Gi")
    assert expansion.plan(pending, pv("1Gi"), read_only=False, failed_before=False) is None
    assert expansion.plan(pending, pv(), read_only=True, failed_before=False) is None
    assert expansion.plan(pending, pv("lots"), read_only=False, failed_before=False) is None
    no_capacity = claim(status="NodeResizePending")
    del no_capacity["status"]["capacity"]
    assert expansion.plan(no_capacity, pv(), read_only=False, failed_before=False) is None


def test_a_claim_already_at_its_allocated_size_without_status_is_done() -> None:
    # node-only recovery finished at 5Gi while the PV stays 9Gi: no further call
    done = claim(capacity="5Gi", request="5Gi", allocated="5Gi")
    assert expansion.plan(done, pv("9Gi"), read_only=False, failed_before=False) is None
    # allocated but no status and not yet there: upstream waits for the resizer
    waiting = claim(capacity="1Gi", allocated="5Gi")
    assert expansion.plan(waiting, pv("9Gi"), read_only=False, failed_before=False) is None


def test_an_older_resizer_expands_to_the_pv_size_and_marks_nothing_before() -> None:
    got = expansion.plan(claim(), pv("2Gi"), read_only=False, failed_before=False)
    assert got == Expansion("2Gi", 2 * GI, recovery=False)


def test_a_failure_after_a_final_error_with_a_changed_request_is_infeasible() -> None:
    changed = claim(request="5Gi", status="NodeResizePending", allocated="9Gi")
    got = expansion.plan(changed, pv(), read_only=False, failed_before=True)
    assert got is not None and got.infeasible_on_failure
    assert expansion.is_infeasible("PERMISSION_DENIED", got)
    same = claim(request="9Gi", status="NodeResizeInProgress", allocated="9Gi")
    again = expansion.plan(same, pv(), read_only=False, failed_before=True)
    assert again is not None and not again.infeasible_on_failure
    assert not expansion.is_infeasible("PERMISSION_DENIED", again)


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
