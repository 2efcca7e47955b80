"""Node expansion of a claim's volume: whether to call NodeExpandVolume, with which size,
and what the claim's status says before and after, as pure functions.

Upstream's kubelet (RecoverVolumeExpansionFailure, GA and locked on in 1.34) writes the
node's part of a resize into the claim so that a user can take back a request the
storage could not meet: the external-resizer then lowers `allocatedResources` and the
node expands to that smaller size. The rules here are upstream's NodeExpander
(operationexecutor/node_expander.go) and its resize_util.go marks:

- the node acts when the PV's capacity is above the claim's `status.capacity` and the
  pod's claim is not read-only;
- with a resize status or `allocatedResources` on the claim (a resizer that records
  them), the size asked of the driver is `allocatedResources.storage`, and only a
  `NodeResizePending` or `NodeResizeInProgress` claim is expanded; one whose status
  capacity already covers that size and has no status is done;
  `allocatedResourceStatuses.storage` becomes `NodeResizeInProgress` before the call;
- without either (an older resizer), the size is the PV's and nothing is marked before;
- success: `status.capacity` the new size, the storage resize status gone, and every
  resize condition (`FileSystemResizePending`, `Resizing`, `ControllerResizeError`,
  `NodeResizeError`) removed;
- failure (recovery path): a `NodeResizeError` condition ("failed to expand pvc with
  ..."), the other resize conditions kept; the status becomes `NodeResizeInfeasible`
  when the driver answered InvalidArgument, OutOfRange or NotFound, or when the volume
  already failed with a final error on this node and the user has since changed the
  request (upstream's markExpansionInfeasibleOnFailure), so the resizer can reconcile;
  otherwise it stays `NodeResizeInProgress` and the next sync tries again. A driver
  that did not answer (Unavailable, DeadlineExceeded) marks nothing: the next sync
  tries again.

Every patch carries the claim's resourceVersion (upstream adds it for the in-progress
and finished marks; klet adds it to the failure mark too, since a merge patch writes the
whole conditions list): a claim changed meanwhile makes the patch fail, and the next sync
decides again from a fresh read.

Not done (README Limits): upstream expands a ReadWriteMany volume again on each further
node that mounts it after the claim was updated; klet decides from the claim alone, so a
second node does not expand its mount.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from klet.model.types import JSON
from klet.model.units import parse_quantity_int

PENDING = "NodeResizePending"
IN_PROGRESS = "NodeResizeInProgress"
INFEASIBLE = "NodeResizeInfeasible"
NODE_RESIZE_ERROR = "NodeResizeError"
FS_RESIZE_PENDING = "FileSystemResizePending"
RESIZE_CONDITIONS = frozenset(
    {FS_RESIZE_PENDING, "Resizing", "ControllerResizeError", NODE_RESIZE_ERROR}
)
"""Upstream's knownResizeConditions: the ones a node's mark may drop or keep."""

INFEASIBLE_CODES = frozenset({"INVALID_ARGUMENT", "OUT_OF_RANGE", "NOT_FOUND"})
"""gRPC codes of NodeExpandVolume that upstream's csi expander calls infeasible."""


@dataclass(frozen=True)
class Expansion:
    """One NodeExpandVolume to make: the size as written and in bytes, whether the
    claim's resize status is kept (upstream's recovery path), and whether a failure
    marks the claim infeasible whatever the driver's code."""

    size: str
    size_bytes: int
    recovery: bool
    infeasible_on_failure: bool = False


def _storage(mapping: Any) -> str:
    return str((mapping or {}).get("storage") or "")


def _bytes(quantity: str) -> int | None:
    if not quantity:
        return None
    try:
        return parse_quantity_int(quantity)
    except ValueError:
        return None


def plan(claim: JSON, pv: JSON, *, read_only: bool, failed_before: bool) -> Expansion | None:
    """The expansion the node owes this claim's volume now, or None. `failed_before`:
    an expansion of this volume failed with a final error on this node already."""
    if read_only:
        return None
    status = claim.get("status") or {}
    pv_size = _storage((pv.get("spec") or {}).get("capacity"))
    pv_bytes, have_bytes = _bytes(pv_size), _bytes(_storage(status.get("capacity")))
    if pv_bytes is None or have_bytes is None or pv_bytes <= have_bytes:
        return None
    resize_status = _storage(status.get("allocatedResourceStatuses"))
    allocated = _storage(status.get("allocatedResources"))
    if not resize_status and "allocatedResources" not in status:
        return Expansion(pv_size, pv_bytes, recovery=False)
    size, size_bytes = pv_size, pv_bytes
    allocated_bytes = _bytes(allocated)
    if allocated_bytes is not None:
        size, size_bytes = allocated, allocated_bytes
    if not resize_status and have_bytes >= size_bytes:
        return None  # the claim already has the size (upstream's pvcAlreadyUpdated)
    if resize_status not in (PENDING, IN_PROGRESS):
        return None
    requested = _bytes(_storage(((claim.get("spec") or {}).get("resources") or {}).get("requests")))
    return Expansion(
        size,
        size_bytes,
        recovery=True,
        infeasible_on_failure=failed_before and requested != size_bytes,
    )


def _versioned(claim: JSON, status: JSON) -> JSON:
    patch: JSON = {"status": status}
    version = (claim.get("metadata") or {}).get("resourceVersion")
    if version:
        patch["metadata"] = {"resourceVersion": str(version)}
    return patch


def in_progress_patch(claim: JSON) -> JSON | None:
    """The claim marked NodeResizeInProgress before NodeExpandVolume (None: it is)."""
    current = _storage((claim.get("status") or {}).get("allocatedResourceStatuses"))
    if current == IN_PROGRESS:
        return None
    return _versioned(claim, {"allocatedResourceStatuses": {"storage": IN_PROGRESS}})


def finished_patch(claim: JSON, size: str) -> JSON:
    """The claim once the node has expanded its volume to `size`: the new capacity, no
    storage resize status, no resize condition (others stay)."""
    conditions = [
        c
        for c in (claim.get("status") or {}).get("conditions") or []
        if c.get("type") not in RESIZE_CONDITIONS
    ]
    return _versioned(
        claim,
        {
            "capacity": {"storage": size},
            "conditions": conditions or None,
            "allocatedResourceStatuses": {"storage": None},
        },
    )


def is_infeasible(code: str, expansion: Expansion) -> bool:
    """Whether a failed NodeExpandVolume (its gRPC code name) marks the claim
    NodeResizeInfeasible rather than leaving it in progress."""
    return code in INFEASIBLE_CODES or expansion.infeasible_on_failure


def failed_patch(claim: JSON, message: str, *, infeasible: bool, now: str) -> JSON | None:
    """The claim after a NodeExpandVolume failed with a final error (recovery path):
    a NodeResizeError condition (an existing True one is kept as it is, as upstream's
    MergeResizeConditionOnPVC does), other conditions kept; `NodeResizeInfeasible` when
    `infeasible`. `now`: the transition time, RFC 3339. None when the claim already
    says all that (a retry failing the same way writes nothing)."""
    current = (claim.get("status") or {}).get("conditions") or []
    conditions = list(current)
    if not any(
        c.get("type") == NODE_RESIZE_ERROR and c.get("status") == "True" for c in conditions
    ):
        conditions = [c for c in conditions if c.get("type") != NODE_RESIZE_ERROR]
        conditions.append(
            {
                "type": NODE_RESIZE_ERROR,
                "status": "True",
                "lastTransitionTime": now,
                "message": f"failed to expand pvc with {message}",
            }
        )
    status: JSON = {"conditions": conditions}
    if infeasible:
        status["allocatedResourceStatuses"] = {"storage": INFEASIBLE}
    marked = _storage((claim.get("status") or {}).get("allocatedResourceStatuses"))
    if conditions == current and (not infeasible or marked == INFEASIBLE):
        return None
    return _versioned(claim, status)
