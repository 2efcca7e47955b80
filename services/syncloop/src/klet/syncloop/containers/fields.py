"""Which fields of a pod's containers klet implements, and which it ignores and why.

Rules are dotted JSON paths; the longest rule that is a prefix of a field's path
decides (`livenessProbe` covers the probe, `livenessProbe.grpc.mode` overrides it). A
unit test walks every field of the Kubernetes API model (tools/container_fields.py)
and fails when one is in neither table, so a new API field cannot be dropped silently.
The same is done for the pod spec around the containers (`POD_*`) and for the volume
types. A container that sets an ignored field gets a Warning event naming it when the
pod's sandbox is created (see syncpod.py), because a setting that has no effect should
not look as if it had one.

A field that asks for more isolation or for a resource klet cannot give is not
ignored but refused (`REFUSED`, `POD_REFUSED`): a pod that sets it is rejected at
admission (`PodFeatureUnsupported`, as upstream rejects a pod that needs a feature its
node lacks), since running it with less than it asked for would be worse than not
running it. `hostUsers: false` (a user namespace) is such a field.
A `runtimeClassName` is honoured in cluster mode (the RuntimeClass's handler goes to
RunPodSandbox) and refused at admission without an apiserver to look it up in; so are
resource claims (`resourceClaims`, a container's `resources.claims`: DRA, prepared
through the claim manager, syncloop/dra/, whose claims are the apiserver's).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from klet.model.types import JSON

SUPPORTED = frozenset(
    {
        "name",
        "image",
        "volumeDevices",
        "imagePullPolicy",
        "command",
        "args",
        "workingDir",
        "env",
        "envFrom",
        "ports",
        "resources.limits",
        "resources.claims",
        "resources.requests",
        "resizePolicy",
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
        "volumeMounts",
    }
)

_NOT_IN_TARGET_API = "not part of the v1.34 API klet implements"

IGNORED: dict[str, str] = {
    "restartPolicyRules": "container restart rules (alpha) are not supported",
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


# The pod spec outside its containers. "containers"/"initContainers"/"ephemeralContainers"
# are decided by the container rules above and "volumes" by VOLUME_TYPES below.
POD_SUPPORTED = frozenset(
    {
        "containers",
        "initContainers",
        "ephemeralContainers",
        "volumes",
        "activeDeadlineSeconds",
        "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution",
        "dnsConfig",
        "dnsPolicy",
        "enableServiceLinks",
        "hostAliases",
        "hostIPC",
        "hostNetwork",
        "hostPID",
        "readinessGates",
        "hostname",
        "imagePullSecrets",
        "nodeName",
        "nodeSelector",
        "os",
        "overhead",
        "priority",
        "resourceClaims",
        "runtimeClassName",
        "resources",
        "restartPolicy",
        "securityContext",
        "serviceAccount",
        "serviceAccountName",
        "setHostnameAsFQDN",
        "shareProcessNamespace",
        "subdomain",
        "terminationGracePeriodSeconds",
        "tolerations",
    }
)

_SCHEDULING = "acted on by the scheduler and controllers; a kubelet does not read it"
POD_NOT_FOR_THE_NODE: dict[str, str] = {
    "affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution": _SCHEDULING,
    "affinity.podAffinity": _SCHEDULING,
    "affinity.podAntiAffinity": _SCHEDULING,
    "automountServiceAccountToken": "applied by the apiserver's ServiceAccount admission",
    "preemptionPolicy": _SCHEDULING,
    "priorityClassName": "resolved into `priority` by the apiserver",
    "schedulerName": _SCHEDULING,
    "schedulingGates": _SCHEDULING,
    "schedulingGroup": _SCHEDULING,
    "topologySpreadConstraints": _SCHEDULING,
}

POD_IGNORED: dict[str, str] = {
    "evictionResponders": _NOT_IN_TARGET_API,
    "hostnameOverride": "the alpha hostname override is not supported",
    "securityContext.windowsOptions": "Windows only",
    "securityContext.seLinuxChangePolicy": "SELinux relabelling policy is not supported",
}

REFUSED: dict[str, str] = {}

POD_REFUSED: dict[str, str] = {
    "hostUsers": "user namespaces (hostUsers: false) are not supported on this node",
}

VOLUME_TYPES = frozenset(
    {
        "emptyDir",
        "hostPath",
        "configMap",
        "secret",
        "downwardAPI",
        "projected",
        "persistentVolumeClaim",
        "ephemeral",
        "csi",
        "nfs",
    }
)
"""The volume sources klet sets up; every other one fails with FailedMount (unsupported)."""


def _longest_rule(path: str, *tables: Collection[str]) -> str | None:
    parts = path.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if any(prefix in table for table in tables):
            return prefix
    return None


def classify(path: str) -> str | None:
    """The rule deciding a container field `path` (a key of SUPPORTED or IGNORED)."""
    return _longest_rule(path, REFUSED, IGNORED, SUPPORTED)


def classify_pod(path: str) -> str | None:
    """The rule deciding a pod spec field `path` outside its containers and volumes."""
    return _longest_rule(path, POD_REFUSED, POD_IGNORED, POD_NOT_FOR_THE_NODE, POD_SUPPORTED)


def _set(value: Any) -> bool:
    if isinstance(value, dict):
        return any(_set(v) for v in value.values())
    return value not in (None, "", [], False, 0)


def ignored_in(container: JSON) -> list[str]:
    """The ignored fields a container sets (a false or empty value counts as unset)."""
    return [rule for rule in IGNORED if _set(_value(container, rule))]


def _value(obj: JSON, path: str) -> Any:
    """The value at a dotted path (None where a step is missing or not an object)."""
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _refused_value(path: str, value: Any) -> bool:
    """Whether `value` at `path` asks for what klet does not give: `hostUsers` only when
    false (true is the host's namespace, what klet gives anyway); the others when set."""
    if path == "hostUsers":
        return value is False
    return _set(value)


def refused_in(pod: JSON) -> list[tuple[str, str]]:
    """(field path, why) of every refused field the pod or one of its containers sets;
    container fields are named as `spec.containers[<name>].<field>`."""
    spec = pod.get("spec") or {}
    found = [
        (f"spec.{rule}", why)
        for rule, why in POD_REFUSED.items()
        if _refused_value(rule, _value(spec, rule))
    ]
    for kind in ("initContainers", "containers", "ephemeralContainers"):
        for c in spec.get(kind) or []:
            if not isinstance(c, dict):
                continue
            for rule, why in REFUSED.items():
                if _refused_value(rule, _value(c, rule)):
                    found.append((f"spec.{kind}[{c.get('name', '')}].{rule}", why))
    return found
