"""Mirror pods: the apiserver's copy of each static pod, as pure decisions.

Upstream (`pkg/kubelet/pod/mirror_client.go`, `tryReconcileMirrorPods`) restated:

- a mirror pod is the static pod's object (same name and namespace, spec bound to this
  node) with the annotation `kubernetes.io/config.mirror` = the static pod's
  `kubernetes.io/config.hash`, no UID or resourceVersion of its own (the apiserver
  assigns them), and one owner reference to the Node (`controller: true`), which the
  NodeRestriction admission plugin requires of a node creating a pod;
- a static pod without a mirror gets one; a mirror whose hash is not the static pod's
  (the manifest changed) or that is being deleted (someone ran `kubectl delete`) is
  deleted (grace 0, UID precondition) and created again;
- a mirror pod whose static pod is gone is deleted, but only once every pod source has
  delivered its first full snapshot: before that "gone" may only mean "not read yet"
  (STYLE rule 12).

The decision takes the desired static pods and the mirror pods the apiserver listed,
both keyed by (namespace, name), and returns the actions in the order to perform them.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from klet.model.pod import CONFIG_HASH, CONFIG_MIRROR, pod_annotations
from klet.model.types import JSON
from klet.status_reporter.cluster.podstatus import being_deleted, uid_of

FullName = tuple[str, str]


@dataclass(frozen=True)
class MirrorAction:
    """One apiserver write: create `pod`, or delete the mirror `uid` at namespace/name."""

    kind: Literal["create", "delete"]
    namespace: str
    name: str
    reason: str
    uid: str = ""
    pod: JSON | None = None


def config_hash(pod: JSON) -> str:
    """The static pod's hash (pod-source sets it; its UID is the same hash)."""
    return pod_annotations(pod).get(CONFIG_HASH) or uid_of(pod)


def mirror_hash(mirror: JSON) -> str:
    return pod_annotations(mirror).get(CONFIG_MIRROR, "")


def mirror_pod(static_pod: JSON, *, node_name: str, node_uid: str) -> JSON:
    """The mirror pod to create for `static_pod`."""
    pod = copy.deepcopy(static_pod)
    meta = pod.setdefault("metadata", {})
    for key in ("uid", "resourceVersion", "creationTimestamp", "managedFields", "generation"):
        meta.pop(key, None)
    notes = dict(meta.get("annotations") or {})
    notes[CONFIG_MIRROR] = config_hash(static_pod)
    meta["annotations"] = notes
    meta["ownerReferences"] = [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "name": node_name,
            "uid": node_uid,
            "controller": True,
        }
    ]
    pod["apiVersion"] = "v1"
    pod["kind"] = "Pod"
    pod.setdefault("spec", {})["nodeName"] = node_name
    pod.pop("status", None)
    return pod


def mirror_actions(
    static_pods: Mapping[FullName, JSON],
    mirrors: Mapping[FullName, JSON],
    *,
    node_name: str,
    node_uid: str | None,
    sources_ready: bool,
) -> list[MirrorAction]:
    """The writes that make the mirror pods match the static pods.

    Without the Node's UID (not registered yet) nothing is created: a mirror without
    its owner reference would be refused.
    """
    actions: list[MirrorAction] = []
    for full, static in sorted(static_pods.items()):
        namespace, name = full
        mirror = mirrors.get(full)
        if mirror is not None:
            if being_deleted(mirror):
                reason = "mirror pod is being deleted"
            elif mirror_hash(mirror) != config_hash(static):
                reason = "mirror pod is out of date"
            else:
                continue
            actions.append(MirrorAction("delete", namespace, name, reason, uid=uid_of(mirror)))
        if node_uid is not None:
            pod = mirror_pod(static, node_name=node_name, node_uid=node_uid)
            actions.append(
                MirrorAction("create", namespace, name, "static pod has no mirror", pod=pod)
            )
    if sources_ready:
        for full, mirror in sorted(mirrors.items()):
            if full not in static_pods:
                namespace, name = full
                actions.append(
                    MirrorAction(
                        "delete", namespace, name, "static pod is gone", uid=uid_of(mirror)
                    )
                )
    return actions
