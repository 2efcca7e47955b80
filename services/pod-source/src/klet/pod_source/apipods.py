"""The apiserver source's pod set: which API pods to run, and how watch events change it.

Pure. The source (sources/api.py) lists this node's pods and then watches them; this
module decides what each object means for the set it hands to the merge:

- An API pod is taken as the apiserver stored it: it was validated there, its UID and
  name are the cluster's, and nothing is defaulted (static pods are normalised, API
  pods are not). The merge adds the local `kubernetes.io/config.*` annotations, as for
  every source.
- Mirror pods (annotation `kubernetes.io/config.mirror`) are skipped: they are the
  apiserver's copy of a static pod that the file or URL source already delivers, and
  running them would run that pod twice. Upstream's kubelet receives them too but
  hands them to its mirror-pod bookkeeping instead of a pod worker; here
  status-reporter keeps mirror pods, so pod-source never publishes them.
- A pod whose `spec.nodeName` is not this node, or without the identity fields the
  bus keys on (uid, name, namespace), is skipped (the field selector makes the first
  impossible; it is checked because running another node's pod is the worst outcome).
- `metadata.managedFields` is dropped: nothing on the node reads it and it is often the
  largest part of the object, written to Redis at every change.
- A pod being deleted gracefully (`metadata.deletionTimestamp`) stays in the set with
  its deletion fields, so the merge reports it (DELETE/UPDATE) and syncloop stops it
  with the grace period; it leaves the set only when the object disappears (a DELETED
  event, or absent from a relist).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from klet.model.pod import CONFIG_MIRROR
from klet.model.types import JSON

# Watch event types (the apiserver's); ERROR is turned into an exception by klet.kube.
ADDED, MODIFIED, DELETED, BOOKMARK = "ADDED", "MODIFIED", "DELETED", "BOOKMARK"

SKIP_MIRROR = "mirror pod"


@dataclass(frozen=True)
class Skipped:
    """An API object left out of the set, and why (logged once by the source)."""

    uid: str
    full_name: str
    reason: str


def skip_reason(obj: Any, *, node_name: str) -> str | None:
    """Why `obj` is not a pod for this node to run; None when it is."""
    if not isinstance(obj, Mapping):
        return f"not an object: {type(obj).__name__}"
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        return "no metadata"
    for key in ("uid", "name", "namespace"):
        if not isinstance(meta.get(key), str) or not meta[key]:
            return f"no metadata.{key}"
    annotations = meta.get("annotations")
    if isinstance(annotations, Mapping) and CONFIG_MIRROR in annotations:
        return SKIP_MIRROR
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        return "no spec"
    if spec.get("nodeName") != node_name:
        return f"spec.nodeName is {spec.get('nodeName')!r}, not this node ({node_name})"
    return None


def as_desired(obj: JSON) -> JSON:
    """The pod as the merge gets it: kind and apiVersion set, managedFields dropped.

    List items come without kind/apiVersion and watch objects with them; setting both
    makes the two forms equal. The input is not modified.
    """
    meta = {k: v for k, v in obj["metadata"].items() if k != "managedFields"}
    return {**obj, "apiVersion": "v1", "kind": "Pod", "metadata": meta}


def resource_version(obj: Any) -> str | None:
    """`metadata.resourceVersion` of a list, an object or a bookmark; None if absent."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    rv = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
    return str(rv) if rv else None


def full_name(obj: Any) -> str:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    if not isinstance(meta, Mapping):
        return "?"
    return f"{meta.get('namespace', '?')}/{meta.get('name', '?')}"


def uid_of(obj: Any) -> str:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    return str(meta.get("uid", "")) if isinstance(meta, Mapping) else ""


def from_list(items: Iterable[Any], *, node_name: str) -> tuple[dict[str, JSON], list[Skipped]]:
    """The set a full list yields (keyed by UID), and the objects left out."""
    pods: dict[str, JSON] = {}
    skipped: list[Skipped] = []
    for obj in items:
        reason = skip_reason(obj, node_name=node_name)
        if reason is None:
            pods[obj["metadata"]["uid"]] = as_desired(obj)
        else:
            skipped.append(Skipped(uid_of(obj), full_name(obj), reason))
    return pods, skipped


def apply_event(
    pods: Mapping[str, JSON], event_type: str, obj: Any, *, node_name: str
) -> tuple[dict[str, JSON] | None, Skipped | None]:
    """The set after one ADDED/MODIFIED/DELETED event; None when it did not change.

    An object that stops qualifying (it cannot, for a pod, but the rule is cheap) leaves
    the set. Other event types (BOOKMARK) never change it.
    """
    if event_type not in (ADDED, MODIFIED, DELETED):
        return None, None
    uid = uid_of(obj)
    if event_type == DELETED:
        if uid not in pods:
            return None, None
        return {k: v for k, v in pods.items() if k != uid}, None
    reason = skip_reason(obj, node_name=node_name)
    if reason is not None:
        skipped = Skipped(uid, full_name(obj), reason)
        if uid not in pods:
            return None, skipped
        return {k: v for k, v in pods.items() if k != uid}, skipped
    pod = as_desired(obj)
    if pods.get(uid) == pod:
        return None, None
    return {**pods, uid: pod}, None
