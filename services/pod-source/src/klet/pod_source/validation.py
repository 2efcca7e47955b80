"""Validation of one static-pod manifest, as decoded from YAML or JSON.

Pure: takes the decoded document and returns every problem found, each naming the field
(`spec.containers[1].name`) so an operator can fix the file in one go. The pod rules
themselves live in `klet.model.podvalidation`, shared with syncloop, which checks every
desired pod again before acting on it; this module adds what only a manifest needs:
`apiVersion: v1`, `kind: Pod`, a name that stays a valid subdomain once the node
suffix (`<name>-<node>`) is added, and no reference to an API object.

A static pod may not reference API objects (upstream's PreventStaticPodAPIReferences,
beta and on by default in v1.34, checked where its file and URL sources decode a
manifest, `tryDecodeSinglePod`): the node runs it before, or without, any apiserver,
and the Node authorizer grants a node only the objects of API pods bound to it.
`api_reference` restates upstream's `HasAPIObjectReference` in its order, the first
reference found being the one reported: a service account (`serviceAccountName`, or
the deprecated `serviceAccount` the API copies into it), any Secret (image pull
secrets, env and envFrom of every container, secret, projected, CSI publish and the
in-tree volumes' secretRefs), any ConfigMap (env, envFrom, configMap and projected
volumes), resource claims, then the volume types that name API objects
(persistentVolumeClaim, ephemeral, csi, glusterfs, and the projected serviceAccountToken,
clusterTrustBundle and podCertificate sources). The message is upstream's
("static pods may not reference secrets"), the field that holds the reference added.
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
    "api_reference",
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
    if not problems:
        reference = api_reference(doc)
        if reference is not None:
            problems.append(reference)
    # Field order (kind before metadata before spec) reads like the file.
    order = {"apiVersion": 0, "kind": 1, "metadata": 2}
    return sorted(problems, key=lambda p: order.get(p.field.split(".")[0].split("[")[0], 3))


# Volume types that reference no API object (upstream's list, in-tree plugins included).
_PLAIN_VOLUMES: Final = frozenset(
    {
        "awsElasticBlockStore", "azureDisk", "cephfs", "cinder", "downwardAPI", "emptyDir",
        "fc", "flexVolume", "flocker", "gcePersistentDisk", "gitRepo", "hostPath", "image",
        "iscsi", "nfs", "photonPersistentDisk", "portworxVolume", "quobyte", "rbd",
        "scaleIO", "storageos", "vsphereVolume",
    }
)  # fmt: skip
# Volume types that name an API object, and what upstream calls the reference.
_REFERRING_VOLUMES: Final = {
    "configMap": "configmaps (via configmap volumes)",
    "secret": "secrets (via secret volumes)",
    "csi": "csidrivers (via CSI volumes)",
    "glusterfs": "endpoints (via glusterFS volumes)",
    "persistentVolumeClaim": "persistentvolumeclaims",
    "ephemeral": "persistentvolumeclaims (via ephemeral volumes)",
    "azureFile": "secrets (via azureFile volumes)",
}
_REFERRING_PROJECTIONS: Final = {
    "configMap": "configmaps (via projected volumes)",
    "secret": "secrets (via projected volumes)",
    "serviceAccountToken": "serviceaccounts (via projected volumes)",
    "clusterTrustBundle": "clustertrustbundles",
    "podCertificate": "podcertificates",
}
# In-tree volume types whose `secretRef` names a Secret (upstream's VisitPodSecretNames).
_SECRET_REF_VOLUMES: Final = (
    "cephfs",
    "cinder",
    "flexVolume",
    "rbd",
    "scaleIO",
    "iscsi",
    "storageos",
)
_CONTAINER_LISTS: Final = ("initContainers", "containers", "ephemeralContainers")


def _refused(field: str, resource: str) -> Problem:
    return Problem(field, f"static pods may not reference {resource}")


def _maps(value: Any) -> list[tuple[int, Mapping[str, Any]]]:
    """The mappings of a list field with their indexes (anything else: none)."""
    if not isinstance(value, list):
        return []
    return [(i, v) for i, v in enumerate(value) if isinstance(v, Mapping)]


def _env_refs(spec: Mapping[str, Any], *, key_ref: str, from_ref: str) -> str | None:
    """The first container field referencing a Secret or ConfigMap through env/envFrom."""
    for group in _CONTAINER_LISTS:
        for i, c in _maps(spec.get(group)):
            where = f"spec.{group}[{i}]"
            for j, source in _maps(c.get("envFrom")):
                if source.get(from_ref) is not None:
                    return f"{where}.envFrom[{j}].{from_ref}"
            for j, env in _maps(c.get("env")):
                value_from = env.get("valueFrom")
                if isinstance(value_from, Mapping) and value_from.get(key_ref) is not None:
                    return f"{where}.env[{j}].valueFrom.{key_ref}"
    return None


def _volume_secret(volume: Mapping[str, Any], where: str) -> str | None:
    """The field of one volume that names a Secret, if any."""
    for kind in ("secret", "azureFile"):
        if volume.get(kind) is not None:
            return f"{where}.{kind}"
    for kind in _SECRET_REF_VOLUMES:
        body = volume.get(kind)
        if isinstance(body, Mapping) and body.get("secretRef") is not None:
            return f"{where}.{kind}.secretRef"
    csi = volume.get("csi")
    if isinstance(csi, Mapping) and csi.get("nodePublishSecretRef") is not None:
        return f"{where}.csi.nodePublishSecretRef"
    return _projected_source(volume, where, "secret")


def _projected_source(volume: Mapping[str, Any], where: str, kind: str) -> str | None:
    projected = volume.get("projected")
    if not isinstance(projected, Mapping):
        return None
    for k, source in _maps(projected.get("sources")):
        if source.get(kind) is not None:
            return f"{where}.projected.sources[{k}].{kind}"
    return None


def api_reference(doc: Mapping[str, Any]) -> Problem | None:
    """The first reference to an API object in a static pod, as upstream finds it (the
    module docstring), or None. Fields of the wrong type are validate_pod's to report."""
    spec = doc.get("spec")
    if not isinstance(spec, Mapping):
        return None
    for field in ("serviceAccountName", "serviceAccount"):
        if spec.get(field):
            return _refused(f"spec.{field}", "serviceaccounts")
    volumes = _maps(spec.get("volumes"))
    secret = next(
        (f"spec.imagePullSecrets[{i}]" for i, _ in _maps(spec.get("imagePullSecrets"))), None
    )
    secret = secret or _env_refs(spec, key_ref="secretKeyRef", from_ref="secretRef")
    for i, volume in volumes:
        secret = secret or _volume_secret(volume, f"spec.volumes[{i}]")
    if secret is not None:
        return _refused(secret, "secrets")
    config_map = _env_refs(spec, key_ref="configMapKeyRef", from_ref="configMapRef")
    for i, volume in volumes:
        where = f"spec.volumes[{i}]"
        if volume.get("configMap") is not None:
            config_map = config_map or f"{where}.configMap"
        config_map = config_map or _projected_source(volume, where, "configMap")
    if config_map is not None:
        return _refused(config_map, "configmaps")
    if spec.get("resourceClaims"):
        return _refused("spec.resourceClaims", "resourceclaims")
    for i, volume in volumes:
        problem = _volume_reference(volume, f"spec.volumes[{i}]")
        if problem is not None:
            return problem
    return None


def _volume_reference(volume: Mapping[str, Any], where: str) -> Problem | None:
    """A volume whose type names an API object, or that klet cannot tell does not."""
    kinds = [k for k in volume if k != "name" and volume[k] is not None]
    if not kinds:
        return None  # "must specify a volume type" is validate_pod's
    kind = kinds[0]
    if kind in _PLAIN_VOLUMES:
        return None
    if kind in _REFERRING_VOLUMES:
        return _refused(f"{where}.{kind}", _REFERRING_VOLUMES[kind])
    name = volume.get("name")
    if kind != "projected":
        return Problem(f"{where}.{kind}", f"unknown volume type for volume {name!r}")
    projected = volume.get("projected")
    sources = _maps(projected.get("sources")) if isinstance(projected, Mapping) else []
    for k, source in sources:
        field = f"{where}.projected.sources[{k}]"
        present = [s for s in source if source[s] is not None]
        for s in present:
            if s in _REFERRING_PROJECTIONS:
                return _refused(f"{field}.{s}", _REFERRING_PROJECTIONS[s])
        if any(s != "downwardAPI" for s in present):
            return Problem(field, f"unknown source for projected volume {name!r}")
    return None


def _cut(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."
