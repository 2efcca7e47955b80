"""Which fields of a pod's containers klet implements, and which it ignores and why.

Rules are dotted JSON paths; the longest rule that is a prefix of a field's path
decides (`livenessProbe` covers the probe, `livenessProbe.grpc.mode` overrides it). A
unit test walks every field of the Kubernetes API model (tools/container_fields.py)
and fails when one is in neither table, so a new API field cannot be dropped silently.
A pod that sets an ignored field gets a Warning event naming it when its sandbox is
created (see syncpod.py), because a setting that has no effect should not look as if
it had one.
"""

from __future__ import annotations

from typing import Any

from klet.model.types import JSON

SUPPORTED = frozenset(
    {
        "name",
        "image",
        "imagePullPolicy",
        "command",
        "args",
        "workingDir",
        "env",
        "envFrom",
        "ports",
        "resources.limits",
        "resources.requests",
        "restartPolicy",
        "stdin",
        "stdinOnce",
        "tty",
        "terminationMessagePath",
        "terminationMessagePolicy",
        "lifecycle.postStart",
        "lifecycle.preStop",
        "lifecycle.stopSignal",
        "livenessProbe",
        "readinessProbe",
        "startupProbe",
        "securityContext",
    }
)

_NOT_IN_TARGET_API = "not part of the v1.34 API klet implements"

IGNORED: dict[str, str] = {
    "volumeMounts": "volumes are not mounted yet (the pod-environment issue adds them)",
    "volumeDevices": "raw block volumes are not supported",
    "resizePolicy": "in-place resize is not supported: a resources change is not applied",
    "restartPolicyRules": "container restart rules (alpha) are not supported",
    "resources.claims": "dynamic resource allocation is not supported",
    "livenessProbe.httpGet.protocol": _NOT_IN_TARGET_API,
    "readinessProbe.httpGet.protocol": _NOT_IN_TARGET_API,
    "startupProbe.httpGet.protocol": _NOT_IN_TARGET_API,
    "lifecycle.postStart.httpGet.protocol": _NOT_IN_TARGET_API,
    "lifecycle.preStop.httpGet.protocol": _NOT_IN_TARGET_API,
    "livenessProbe.grpc.mode": _NOT_IN_TARGET_API,
    "readinessProbe.grpc.mode": _NOT_IN_TARGET_API,
    "startupProbe.grpc.mode": _NOT_IN_TARGET_API,
    "securityContext.windowsOptions": "Windows only",
}


def classify(path: str) -> str | None:
    """The rule deciding `path` (a key of SUPPORTED or IGNORED), or None if none does."""
    parts = path.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in IGNORED or prefix in SUPPORTED:
            return prefix
    return None


def _set(value: Any) -> bool:
    if isinstance(value, dict):
        return any(_set(v) for v in value.values())
    return value not in (None, "", [], False, 0)


def ignored_in(container: JSON) -> list[str]:
    """The ignored fields a container sets (a false or empty value counts as unset)."""
    found = []
    for rule in IGNORED:
        value: Any = container
        for part in rule.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if _set(value):
            found.append(rule)
    return found
