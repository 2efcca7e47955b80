"""Pure rules of the pod status manager: what to send, what to refuse, when to delete.

Restated from the upstream status manager (`pkg/kubelet/status/status_manager.go`):

- **Ordering.** A status record is sent only if its `(epoch, version)` is newer than
  the last one sent for that pod (see `listing.py` for the pair); a newer version with
  the same content is noted as sent without an API call.
- **Container state transitions** (`checkContainerStateTransition`): unless the pod's
  restartPolicy is Always, a container that was last reported terminated may not be
  reported non-terminated again; under OnFailure a container that failed (non-zero
  exit) may restart. Restartable init containers (sidecars, `restartPolicy: Always` on
  the init container) are exempt. A status that breaks the rule is refused, with the
  reason, and never sent.
- **Merge** (`mergePodStatus`): conditions the kubelet owns come from the new status;
  conditions others own (readiness gates, DisruptionTarget from the eviction API, ...)
  are kept from the apiserver's copy unless the new status sets them too.
- **Patch**: a JSON merge patch carrying the full merged status and `metadata.uid` as a
  precondition, so a pod deleted and recreated under the same name is never given the
  old pod's status (the apiserver refuses the changed UID).
- **Order**: a pass sends the pods whose readiness changed first (`send_order`); upstream's
  syncBatch takes the changed pods in no set order (a Go map's).
- **Final deletion**: an apiserver pod that has a deletionTimestamp and whose record
  says `terminated` (syncloop stopped every container and the sandbox) is deleted with
  grace 0 and a UID precondition, once its last status is on the server.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from klet.model.records import PodStatusRecord
from klet.model.types import JSON, PodUID

# Conditions the kubelet owns outright (upstream PodConditionByKubelet).
KUBELET_CONDITIONS = frozenset(
    {
        "PodScheduled",
        "Ready",
        "Initialized",
        "ContainersReady",
        "PodReadyToStartContainers",
        "PodResizePending",
        "PodResizeInProgress",
    }
)


@dataclass(frozen=True)
class Sent:
    """What was last sent (or deliberately not sent) for one pod."""

    epoch: float
    version: int
    status: JSON
    target_uid: str
    """The UID of the API object it went to (a static pod's is its mirror's)."""


Verdict = Literal["skip", "same", "illegal", "send"]


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    reason: str = ""


def full_name(pod: JSON) -> tuple[str, str]:
    meta = pod.get("metadata") or {}
    return (str(meta.get("namespace") or "default"), str(meta.get("name") or ""))


def _terminated(cs: JSON) -> JSON | None:
    term = (cs.get("state") or {}).get("terminated")
    return term if isinstance(term, dict) else None


def _check(old: list[JSON], new: list[JSON], *, policy: str, exempt: frozenset[str]) -> str | None:
    new_by_name = {cs.get("name"): cs for cs in new}
    for cs in old:
        name = cs.get("name")
        term = _terminated(cs)
        if term is None or name in exempt:
            continue
        if policy == "OnFailure" and term.get("exitCode", 0) != 0:
            continue
        after = new_by_name.get(name)
        if after is not None and _terminated(after) is None:
            return (
                f"terminated container {name} attempted illegal transition to non-terminated state"
            )
    return None


def illegal_transition(old: JSON | None, new: JSON, spec: JSON) -> str | None:
    """Why `new` may not follow `old` (upstream's container state rule), or None."""
    if old is None:
        return None
    policy = spec.get("restartPolicy") or "Always"
    if policy == "Always":
        return None
    sidecars = frozenset(
        c.get("name", "")
        for c in spec.get("initContainers") or []
        if c.get("restartPolicy") == "Always"
    )
    return _check(
        old.get("containerStatuses") or [],
        new.get("containerStatuses") or [],
        policy=policy,
        exempt=frozenset(),
    ) or _check(
        old.get("initContainerStatuses") or [],
        new.get("initContainerStatuses") or [],
        policy=policy,
        exempt=sidecars,
    )


def decide(record: PodStatusRecord, sent: Sent | None, spec: JSON, *, target_uid: str) -> Decision:
    """What to do with the latest record of a pod, given what was last sent."""
    if sent is not None and sent.target_uid == target_uid:
        if (record.epoch, record.version) <= (sent.epoch, sent.version):
            return Decision("skip")
        if record.status == sent.status:
            return Decision("same")
    previous = sent.status if sent is not None and sent.target_uid == target_uid else None
    reason = illegal_transition(previous, record.status, spec)
    if reason is not None:
        return Decision("illegal", reason)
    return Decision("send")


READINESS_CONDITIONS = ("Ready", "ContainersReady")


def _readiness(status: JSON) -> tuple[object, ...]:
    conditions = {
        c.get("type"): c.get("status")
        for c in status.get("conditions") or []
        if isinstance(c, dict) and c.get("type") in READINESS_CONDITIONS
    }
    ready = sorted(
        (str(cs.get("name")), bool(cs.get("ready")))
        for key in ("initContainerStatuses", "containerStatuses")
        for cs in status.get(key) or []
        if isinstance(cs, dict)
    )
    return (sorted(conditions.items(), key=str), ready)


def readiness_changed(new: JSON, sent: JSON | None) -> bool:
    """Whether `new` changes what was sent of the pod's readiness: its Ready or
    ContainersReady condition or a container's `ready`. Nothing sent yet: unknown, no."""
    return sent is not None and _readiness(new) != _readiness(sent)


def send_order(
    records: Mapping[PodUID, PodStatusRecord], sent: Mapping[PodUID, Sent]
) -> list[PodUID]:
    """The order a pass visits the pods in: those whose readiness changed since it was
    last sent first, then the others, each group in view order. A readiness change is
    what a Service's endpoints wait for; a pass over a node whose pods all changed (a
    restart, an outage) sends one after the other, a GET and a PATCH each, and the pod
    whose readiness flipped waited behind every one before it."""
    urgent: list[PodUID] = []
    rest: list[PodUID] = []
    for uid, record in records.items():
        before = sent.get(uid)
        newer = before is None or (record.epoch, record.version) > (before.epoch, before.version)
        changed = newer and readiness_changed(record.status, before.status if before else None)
        (urgent if changed else rest).append(uid)
    return urgent + rest


def merge_status(api_status: JSON, new: JSON) -> JSON:
    """`new` with the conditions the kubelet does not own kept from `api_status`."""
    new_conditions = [c for c in new.get("conditions") or [] if isinstance(c, dict)]
    new_types = {c.get("type") for c in new_conditions}
    kept = [
        c
        for c in api_status.get("conditions") or []
        if isinstance(c, dict)
        and c.get("type") not in KUBELET_CONDITIONS
        and c.get("type") not in new_types
    ]
    merged = dict(new)
    if kept or new_conditions:
        merged["conditions"] = kept + new_conditions
    return merged


def on_server(api_status: JSON, new: JSON) -> bool:
    """Whether sending `new` would change nothing on the apiserver: the merge patch of
    the merged status is a no-op on `api_status` (the conditions compared whatever their
    order). A status-reporter that has sent nothing yet (just started, or a new leader)
    checks this against the node's pods it listed before sending, so a restart patches
    only the pods whose status changed meanwhile."""
    merged = merge_status(api_status, new)
    if "conditions" in merged:
        merged = {**merged, "conditions": _by_type(merged["conditions"])}
        api_status = {**api_status, "conditions": _by_type(api_status.get("conditions") or [])}
    return _noop_patch(api_status, merged)


def _by_type(conditions: object) -> list[JSON]:
    items = [c for c in conditions if isinstance(c, dict)] if isinstance(conditions, list) else []
    return sorted(items, key=lambda c: str(c.get("type")))


def _noop_patch(target: JSON, patch: JSON) -> bool:
    """Whether JSON merge patch `patch` leaves `target` as it is (RFC 7386: objects
    merge key by key, null removes, anything else replaces)."""
    for key, value in patch.items():
        if value is None:
            if key in target:
                return False
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            if not _noop_patch(target[key], value):
                return False
        elif key not in target or target[key] != value:
            return False
    return True


def status_patch(uid: str, status: JSON) -> JSON:
    """The merge patch of pods/<name>/status: full status, UID as precondition."""
    return {"metadata": {"uid": uid}, "status": status}


def being_deleted(api_pod: JSON | None) -> bool:
    return bool(api_pod and (api_pod.get("metadata") or {}).get("deletionTimestamp"))


def uid_of(api_pod: JSON | None) -> str:
    return str(((api_pod or {}).get("metadata") or {}).get("uid") or "")


def should_delete(record: PodStatusRecord, sent: Sent | None, api_pod: JSON | None) -> bool:
    """Whether to DELETE the API pod now: it is being deleted, syncloop says it is
    terminated, it is the same object, and its latest status has been sent."""
    return (
        record.terminated
        and being_deleted(api_pod)
        and uid_of(api_pod) == record.uid
        and sent is not None
        and (sent.epoch, sent.version) >= (record.epoch, record.version)
    )
