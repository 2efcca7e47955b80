"""Static-pod defaulting: turn a validated manifest into the pod the node runs.

Pure. Follows the upstream kubelet's static-pod rules so mirror pods and tooling see
the same identity: the UID is an md5 over the node, the origin (file path or URL) and
the manifest, the name gets the node as suffix, the namespace defaults to `default`,
and the `kubernetes.io/config.*` annotations are set. A manifest that carries its own
`metadata.uid` keeps it, as upstream does, but only a UID that is safe as a
directory name reaches this point (upstream does not check it; validation does here,
since the UID names the pod's directories under the root dir and the log dir).

Trade-off, documented in KUBELET_BEHAVIOUR.md §13: because the UID hashes the whole
manifest, editing a manifest yields a new UID (REMOVE of the old pod, ADD of the new
one) rather than an in-place UPDATE. That is what upstream does and what mirror pods
expect, so it is kept.

The hash input is a canonical JSON of the document as read (sorted keys, no spaces), so
the same pod written as YAML or as JSON, or re-indented, keeps its UID; any change of
content, path or node gives a new one.

The API defaults that the runtime side relies on (restart policy, grace period, pull
policy, ...) are applied here too, since no apiserver defaults a static pod.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any, Literal

from klet.model.pod import CONFIG_HASH, CONFIG_SOURCE
from klet.model.types import JSON

StaticSource = Literal["file", "http"]

DEFAULT_NAMESPACE = "default"
DEFAULT_GRACE_PERIOD_S = 30
TERMINATION_MESSAGE_PATH = "/dev/termination-log"

# Static pods from files tolerate every NoExecute taint so node problems (not-ready,
# unreachable) never evict the control-plane pods that usually live there.
FILE_TOLERATION: JSON = {"operator": "Exists", "effect": "NoExecute"}


def canonical_json(doc: Any) -> str:
    """The byte-stable JSON form used for hashing (raises ValueError on NaN/inf)."""
    return json.dumps(
        doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def static_pod_uid(doc: JSON, *, node_name: str, source: StaticSource, origin: str) -> str:
    """md5 hex of the node (file source only), the origin and the canonical manifest.

    The URL source leaves the node out, as upstream: the same URL serves the same pod
    identity to whichever node reads it.
    """
    hasher = hashlib.md5(usedforsecurity=False)
    if source == "file":
        hasher.update(f"host:{node_name}".encode())
        hasher.update(f"file:{origin}".encode())
    else:
        hasher.update(f"url:{origin}".encode())
    hasher.update(canonical_json(doc).encode())
    return hasher.hexdigest()


def static_pod_name(name: str, node_name: str) -> str:
    return f"{name}-{node_name.lower()}"


def normalize_static_pod(doc: JSON, *, node_name: str, source: StaticSource, origin: str) -> JSON:
    """A defaulted deep copy of a validated manifest, ready for the merge.

    `origin` is the file path (file source) or the URL (http source).
    """
    pod = copy.deepcopy(doc)
    meta: JSON = pod.setdefault("metadata", {})
    uid = meta.get("uid") or static_pod_uid(doc, node_name=node_name, source=source, origin=origin)
    meta["uid"] = uid
    meta["name"] = static_pod_name(str(meta.get("name", "")), node_name)
    if not meta.get("namespace"):
        meta["namespace"] = DEFAULT_NAMESPACE
    annotations: JSON = dict(meta.get("annotations") or {})
    annotations[CONFIG_HASH] = uid
    annotations[CONFIG_SOURCE] = source
    meta["annotations"] = annotations

    spec: JSON = pod.setdefault("spec", {})
    spec["nodeName"] = node_name
    apply_pod_spec_defaults(spec)
    if source == "file":
        tolerations: list[JSON] = list(spec.get("tolerations") or [])
        if FILE_TOLERATION not in tolerations:
            tolerations.append(dict(FILE_TOLERATION))
        spec["tolerations"] = tolerations

    status: JSON = dict(pod.get("status") or {})
    status["phase"] = "Pending"
    pod["status"] = status
    return pod


def apply_pod_spec_defaults(spec: JSON) -> None:
    """The apiserver's defaults for the fields the runtime side reads (in place)."""
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", DEFAULT_GRACE_PERIOD_S)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("enableServiceLinks", True)
    for list_name in ("initContainers", "containers"):
        for container in spec.get(list_name) or []:
            _apply_container_defaults(container)


def _apply_container_defaults(container: JSON) -> None:
    container.setdefault("imagePullPolicy", default_pull_policy(str(container.get("image", ""))))
    container.setdefault("terminationMessagePath", TERMINATION_MESSAGE_PATH)
    container.setdefault("terminationMessagePolicy", "File")
    for port in container.get("ports") or []:
        port.setdefault("protocol", "TCP")


def default_pull_policy(image: str) -> str:
    """Always for `:latest` or an untagged reference without digest, else IfNotPresent."""
    if "@" in image:
        return "IfNotPresent"
    # A ':' before the last '/' belongs to a registry port (`host:5000/app`), not a tag.
    last = image.rsplit("/", 1)[-1]
    tag = last.partition(":")[2]
    return "Always" if tag in ("", "latest") else "IfNotPresent"
