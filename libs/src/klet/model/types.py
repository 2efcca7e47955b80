"""Identifier types shared by every service.

NewTypes keep a pod UID from being passed where a container ID is expected; they cost
nothing at run time.
"""

from __future__ import annotations

from typing import Any, NewType

PodUID = NewType("PodUID", str)
ContainerID = NewType("ContainerID", str)
SandboxID = NewType("SandboxID", str)
ImageRef = NewType("ImageRef", str)

# A Kubernetes object as its JSON form (a v1 Pod, a PodStatus, ...). The agent passes
# pods around as their API JSON rather than a parallel class hierarchy: that is what
# the apiserver, the manifests and the HTTP API all speak.
JSON = dict[str, Any]


def pod_full_name(pod: JSON) -> str:
    """`namespace/name`, the key upstream uses in logs and duplicate detection."""
    meta = pod.get("metadata", {})
    return f"{meta.get('namespace', 'default')}/{meta.get('name', '')}"


def pod_uid(pod: JSON) -> PodUID:
    return PodUID(str(pod.get("metadata", {}).get("uid", "")))
