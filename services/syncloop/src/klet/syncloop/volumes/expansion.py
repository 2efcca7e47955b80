"""Node expansion of a claim's volume: whether this node calls NodeExpandVolume, with
which size, what the claim's status says before and after, and the Events, as pure
functions.

Upstream's kubelet decides per node, from the actual state of its own mount: the volume
manager keeps, per volume, the size this node last expanded it to (its actual state of
world's `persistentVolumeSize`, first the claim's `status.capacity` when the volume came
to the node) and acts when the PV's capacity is above it (`volumeNeedsExpansion`); the
caller keeps that size (`node_bytes`) and forgets it when the volume leaves the node.
The rest is upstream's NodeExpander (operationexecutor/node_expander.go, operation_
generator.go's nodeExpandVolume) and its resize_util.go marks, RecoverVolumeExpansionFailure
being GA and locked on in 1.34:

- a pod's read-only claim is not expanded: a `FileSystemResizeFailed` Warning ("requested
  read-only file system") on the pod and the claim when the PV is above the claim;
- with a resize status or `allocatedResources` on the claim (a resizer that records
  them), the size asked of the driver is `allocatedResources.storage`, and only a
  `NodeResizePending` or `NodeResizeInProgress` claim is expanded (marked
  `NodeResizeInProgress` first);
- a claim whose `status.capacity` already covers that size and has no resize status was
  expanded elsewhere (upstream's pvcAlreadyUpdated): a ReadWriteMany claim without the
  `volume.kubernetes.io/node-expansion-not-required` annotation is expanded on this
  node's mount too, without writing the claim; any other is settled, the node counting
  its volume at that size without a call;
- without either (an older resizer), the size is the PV's, nothing is marked before and
  the capacity is written after only when the claim's is smaller;
- success: `FileSystemResizeSuccessful` (Normal) on the pod and the claim; `status.capacity`
  the new size, the storage resize status gone, and every resize condition
  (`FileSystemResizePending`, `Resizing`, `ControllerResizeError`, `NodeResizeError`)
  removed;
- failure (recovery path): a `NodeResizeError` condition ("failed to expand pvc with
  ..."), the other resize conditions kept; the status becomes `NodeResizeInfeasible`
  when the driver answered InvalidArgument, OutOfRange or NotFound, or when the volume
  already failed with a final error on this node and the user has since changed the
  request (upstream's markExpansionInfeasibleOnFailure), so the resizer can reconcile;
  otherwise it stays `NodeResizeInProgress` and the next sync tries again. A driver
  that did not answer (Unavailable, DeadlineExceeded) marks nothing: the next sync
  tries again. FailedPrecondition (the driver cannot expand a volume in use) stops
  expansion of that volume on this node until it leaves the node (upstream's
  MarkForInUseExpansionError). Every other failure is a `VolumeResizeFailed` Warning on
  the pod.

Every patch carries the claim's resourceVersion (upstream adds it for the in-progress
and finished marks; klet adds it to the failure mark too, since a merge patch writes the
whole conditions list): a claim changed meanwhile makes the patch fail, and the next sync
decides again from a fresh read.
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

IN_USE_CODE = "FAILED_PRECONDITION"
"""The gRPC code of NodeExpandVolume for a volume the driver cannot expand while in use."""

NOT_REQUIRED_ANNOTATION = "volume.kubernetes.io/node-expansion-not-required"
"""A claim's annotation saying its ReadWriteMany volume needs no expansion on each node."""

RESIZE_SUCCESS = "FileSystemResizeSuccessful"
RESIZE_FAILED = "FileSystemResizeFailed"
VOLUME_RESIZE_FAILED = "VolumeResizeFailed"
"""Upstream's Event reasons (pkg/kubelet/events)."""


@dataclass(frozen=True)
class Expansion:
    """One NodeExpandVolume to make: the size as written and in bytes, whether the
    claim's resize status is kept (upstream's recovery path), whether a failure marks
    the claim infeasible whatever the driver's code, and whether the claim already has
    the size (another node expanded a ReadWriteMany volume, or an older resizer's claim
    says so): then nothing is written to it before or after."""

    size: str
    size_bytes: int
    recovery: bool
    infeasible_on_failure: bool = False
    claim_updated: bool = False


@dataclass(frozen=True)
class Settled:
    """No call: the claim already has `size_bytes`, which the node now counts its
    volume at (upstream's resize assumed finished without calling the plugin)."""

    size_bytes: int


def _storage(mapping: Any) -> str:
    return str((mapping or {}).get("storage") or "")


def _bytes(quantity: str) -> int | None:
    if not quantity:
        return None
    try:
        return parse_quantity_int(quantity)
    except ValueError:
        return None


def claim_bytes(claim: JSON) -> int | None:
    """The claim's `status.capacity.storage` in bytes: what a node counts a volume at
    when it first comes to the node (None: unknown, so never expanded)."""
    return _bytes(_storage((claim.get("status") or {}).get("capacity")))


def expands_on_every_node(claim: JSON) -> bool:
    """Whether the claim's volume is expanded on each node that mounts it even after
    another node updated the claim: ReadWriteMany in the claim's access modes and no
    node-expansion-not-required annotation."""
    modes = (claim.get("spec") or {}).get("accessModes") or []
    annotations = (claim.get("metadata") or {}).get("annotations") or {}
    return "ReadWriteMany" in modes and NOT_REQUIRED_ANNOTATION not in annotations


def plan(
    claim: JSON,
    pv: JSON,
    *,
    node_bytes: int | None,
    read_only: bool,
    failed_before: bool,
    in_use_error: bool = False,
) -> Expansion | Settled | None:
    """What this node owes the claim's volume now: an expansion, a size to count it at
    without a call, or None (nothing, or wait for the resizer). `node_bytes`: the size
    this node last expanded the volume to (or the claim's capacity when it came to the
    node; None unknown). `failed_before`: an expansion of this volume failed with a
    final error on this node already; `in_use_error`: the driver refused to expand it
    in use here (FailedPrecondition)."""
    if read_only or in_use_error or node_bytes is None:
        return None
    status = claim.get("status") or {}
    pv_size = _storage((pv.get("spec") or {}).get("capacity"))
    pv_bytes = _bytes(pv_size)
    if pv_bytes is None or pv_bytes <= node_bytes:
        return None
    have_bytes = claim_bytes(claim) or 0
    resize_status = _storage(status.get("allocatedResourceStatuses"))
    if not resize_status and "allocatedResources" not in status:
        return Expansion(pv_size, pv_bytes, recovery=False, claim_updated=have_bytes >= pv_bytes)
    size, size_bytes = pv_size, pv_bytes
    allocated_bytes = _bytes(_storage(status.get("allocatedResources")))
    if allocated_bytes is not None:
        size, size_bytes = _storage(status.get("allocatedResources")), allocated_bytes
    requested = _bytes(_storage(((claim.get("spec") or {}).get("resources") or {}).get("requests")))
    infeasible_on_failure = failed_before and requested != size_bytes
    if not resize_status and have_bytes >= size_bytes:  # upstream's pvcAlreadyUpdated
        if expands_on_every_node(claim):
            return Expansion(
                size,
                size_bytes,
                recovery=True,
                infeasible_on_failure=infeasible_on_failure,
                claim_updated=True,
            )
        return Settled(size_bytes)
    if resize_status not in (PENDING, IN_PROGRESS):
        return None
    return Expansion(size, size_bytes, recovery=True, infeasible_on_failure=infeasible_on_failure)


def read_only_refused(claim: JSON, pv: JSON) -> bool:
    """Whether a pod's read-only use of the claim leaves a grown volume unexpanded (the
    PV above the claim's capacity): upstream then records FileSystemResizeFailed."""
    pv_bytes = _bytes(_storage((pv.get("spec") or {}).get("capacity")))
    have = claim_bytes(claim)
    return pv_bytes is not None and have is not None and pv_bytes > have


def success_message(pv_name: str, node_name: str) -> str:
    """FileSystemResizeSuccessful's message, upstream's text."""
    return f'MountVolume.NodeExpandVolume succeeded for volume "{pv_name}" {node_name}'


def read_only_message(pv_name: str) -> str:
    """FileSystemResizeFailed's message for a read-only claim, upstream's text."""
    return f'MountVolume.NodeExpandVolume failed for volume "{pv_name}" ' + (
        "requested read-only file system"
    )


def failure_message(pv_name: str, cause: str) -> str:
    """VolumeResizeFailed's message (upstream's online expansion error)."""
    return f'NodeExpandVolume.NodeExpandVolume failed for volume "{pv_name}" : {cause}'


def claim_reference(claim: JSON) -> JSON:
    """The involved object of an Event about the claim."""
    meta = claim.get("metadata") or {}
    return {
        "kind": "PersistentVolumeClaim",
        "namespace": str(meta.get("namespace") or ""),
        "name": str(meta.get("name") or ""),
        "uid": str(meta.get("uid") or ""),
        "apiVersion": "v1",
    }


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
