"""Validation of one static-pod manifest, as decoded from YAML or JSON.

Pure: takes the decoded document and returns every problem found, each naming the field
(`spec.containers[1].name`) so an operator can fix the file in one go. The pod rules
themselves live in `klet.model.podvalidation`, shared with syncloop, which checks every
desired pod again before acting on it; this module adds what only a manifest needs:
`apiVersion: v1`, `kind: Pod`, and a name that stays a valid subdomain once the node
suffix (`<name>-<node>`) is added.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from klet.model.podvalidation import (
    DNS1123_SUBDOMAIN_MAX,
    Problem,
    is_dns1123_label,
    is_dns1123_subdomain,
    pod_problems,
)

__all__ = [
    "MAX_MANIFEST_BYTES",
    "MAX_URL_BODY_BYTES",
    "Problem",
    "is_dns1123_label",
    "is_dns1123_subdomain",
    "validate_pod",
]

# Files larger than this are refused before parsing. A static pod is one object, and
# the apiserver cannot store (or mirror) an object over etcd's 1.5 MiB request limit;
# the YAML parser is pure Python (manifests.py), so a bigger file only costs seconds of
# CPU and its memory several times over.
MAX_MANIFEST_BYTES: Final = 1536 * 1024

# A URL body may be a PodList of many pods: upstream's limit for it (maxConfigLength).
MAX_URL_BODY_BYTES: Final = 10 * 1024 * 1024


def validate_pod(doc: Any, *, node_name: str) -> list[Problem]:
    """Every problem of one Pod manifest; empty when it can be normalised and run.

    `node_name` is needed because a static pod is renamed `<name>-<node>`: the name
    must still be a valid subdomain after the suffix is added.
    """
    if not isinstance(doc, Mapping):
        return pod_problems(doc)
    problems: list[Problem] = []
    api_version = doc.get("apiVersion")
    if api_version != "v1":
        problems.append(Problem("apiVersion", f"{_cut(api_version)} is not supported, want 'v1'"))
    kind = doc.get("kind")
    if kind != "Pod":
        problems.append(Problem("kind", f"{_cut(kind)} is not supported, want 'Pod'"))
    problems += pod_problems(doc)
    meta = doc.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if isinstance(name, str) and is_dns1123_subdomain(name):
        full = f"{name}-{node_name.lower()}"
        if len(full) > DNS1123_SUBDOMAIN_MAX:
            problems.append(
                Problem(
                    "metadata.name",
                    f"{name!r} is too long: with the node suffix it has {len(full)} "
                    f"characters, at most {DNS1123_SUBDOMAIN_MAX} are allowed",
                )
            )
    # Field order (kind before metadata before spec) reads like the file.
    order = {"apiVersion": 0, "kind": 1, "metadata": 2}
    return sorted(problems, key=lambda p: order.get(p.field.split(".")[0].split("[")[0], 3))


def _cut(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."
