"""Static pods may not reference API objects (upstream's PreventStaticPodAPIReferences):
each kind of reference is refused with upstream's message naming the field that holds
it, in upstream's order (service account, Secrets, ConfigMaps, claims, volume types);
pods referencing nothing run, and a refused manifest is a ManifestError of the file."""

from __future__ import annotations

import json
from typing import Any

import pytest
from klet.pod_source.manifests import ManifestError, pod_from_file
from klet.pod_source.validation import Problem, api_reference, validate_pod

NODE = "node1"


def pod(spec: dict[str, Any] | None = None, **container: Any) -> dict[str, Any]:
    c = {"name": "app", "image": "busybox:1.36", **container}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web", "namespace": "kube-system"},
        "spec": {"containers": [c], **(spec or {})},
    }


def vol(**source: Any) -> dict[str, Any]:
    return {"volumes": [{"name": "v", **source}]}


def projected(*sources: dict[str, Any]) -> dict[str, Any]:
    return vol(projected={"sources": list(sources)})


SECRET_KEY = {"valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}
CM_KEY = {"valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}

REFUSED = [
    (pod({"serviceAccountName": "sa"}), "spec.serviceAccountName", "serviceaccounts"),
    (pod({"serviceAccount": "sa"}), "spec.serviceAccount", "serviceaccounts"),
    (pod({"imagePullSecrets": [{"name": "r"}]}), "spec.imagePullSecrets[0]", "secrets"),
    (
        pod(env=[{"name": "A", "value": "1"}, {"name": "B", **SECRET_KEY}]),
        "spec.containers[0].env[1].valueFrom.secretKeyRef",
        "secrets",
    ),
    (
        pod(envFrom=[{"secretRef": {"name": "s"}}]),
        "spec.containers[0].envFrom[0].secretRef",
        "secrets",
    ),
    (
        pod(
            {"initContainers": [{"name": "i", "image": "b", "env": [{"name": "B", **SECRET_KEY}]}]}
        ),
        "spec.initContainers[0].env[0].valueFrom.secretKeyRef",
        "secrets",
    ),
    (pod(vol(secret={"secretName": "s"})), "spec.volumes[0].secret", "secrets"),
    (
        pod(projected({"secret": {"name": "s"}})),
        "spec.volumes[0].projected.sources[0].secret",
        "secrets",
    ),
    (
        pod(vol(csi={"driver": "d", "nodePublishSecretRef": {"name": "s"}})),
        "spec.volumes[0].csi.nodePublishSecretRef",
        "secrets",
    ),
    (
        pod(vol(rbd={"monitors": ["m"], "image": "i", "secretRef": {"name": "s"}})),
        "spec.volumes[0].rbd.secretRef",
        "secrets",
    ),
    (
        pod(vol(azureFile={"secretName": "s", "shareName": "x"})),
        "spec.volumes[0].azureFile",
        "secrets",
    ),
    (
        pod(env=[{"name": "C", **CM_KEY}]),
        "spec.containers[0].env[0].valueFrom.configMapKeyRef",
        "configmaps",
    ),
    (
        pod(envFrom=[{"configMapRef": {"name": "c"}}]),
        "spec.containers[0].envFrom[0].configMapRef",
        "configmaps",
    ),
    (pod(vol(configMap={"name": "c"})), "spec.volumes[0].configMap", "configmaps"),
    (
        pod(projected({"downwardAPI": {"items": []}}, {"configMap": {"name": "c"}})),
        "spec.volumes[0].projected.sources[1].configMap",
        "configmaps",
    ),
    (pod({"resourceClaims": [{"name": "gpu"}]}), "spec.resourceClaims", "resourceclaims"),
    (
        pod(vol(persistentVolumeClaim={"claimName": "c"})),
        "spec.volumes[0].persistentVolumeClaim",
        "persistentvolumeclaims",
    ),
    (
        pod(vol(ephemeral={"volumeClaimTemplate": {"spec": {}}})),
        "spec.volumes[0].ephemeral",
        "persistentvolumeclaims (via ephemeral volumes)",
    ),
    (pod(vol(csi={"driver": "d"})), "spec.volumes[0].csi", "csidrivers (via CSI volumes)"),
    (
        pod(vol(glusterfs={"endpoints": "e", "path": "p"})),
        "spec.volumes[0].glusterfs",
        "endpoints (via glusterFS volumes)",
    ),
    (
        pod(projected({"serviceAccountToken": {"path": "t"}})),
        "spec.volumes[0].projected.sources[0].serviceAccountToken",
        "serviceaccounts (via projected volumes)",
    ),
    (
        pod(projected({"clusterTrustBundle": {"path": "b", "name": "n"}})),
        "spec.volumes[0].projected.sources[0].clusterTrustBundle",
        "clustertrustbundles",
    ),
    (
        pod(projected({"podCertificate": {"signerName": "x/y", "keyType": "ED25519"}})),
        "spec.volumes[0].projected.sources[0].podCertificate",
        "podcertificates",
    ),
]


@pytest.mark.parametrize(("doc", "field", "resource"), REFUSED)
def test_each_reference_is_refused_naming_its_field(
    doc: dict[str, Any], field: str, resource: str
) -> None:
    want = Problem(field, f"static pods may not reference {resource}")
    assert api_reference(doc) == want
    assert validate_pod(doc, node_name=NODE) == [want]


@pytest.mark.parametrize(
    "doc",
    [
        pod(),
        pod(
            env=[
                {"name": "A", "value": "1"},
                {"name": "N", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            ]
        ),
        pod(vol(emptyDir={})),
        pod(vol(hostPath={"path": "/tmp"})),
        pod(
            vol(downwardAPI={"items": [{"path": "n", "fieldRef": {"fieldPath": "metadata.name"}}]})
        ),
        pod(projected({"downwardAPI": {"items": []}})),
        pod(vol(nfs={"server": "s", "path": "/"})),
        pod(vol(rbd={"monitors": ["m"], "image": "i"})),  # no secretRef
        pod({"serviceAccountName": ""}),
    ],
)
def test_pods_without_references_pass(doc: dict[str, Any]) -> None:
    assert api_reference(doc) is None
    assert validate_pod(doc, node_name=NODE) == []


def test_upstream_order_service_account_then_secrets_then_config_maps() -> None:
    """The first kind found in upstream's order is the one reported, whatever the order
    of the fields in the manifest."""
    both = pod(vol(configMap={"name": "c"}), env=[{"name": "B", **SECRET_KEY}])
    assert api_reference(both) == Problem(
        "spec.containers[0].env[0].valueFrom.secretKeyRef", "static pods may not reference secrets"
    )
    with_sa = pod({"serviceAccountName": "sa", "imagePullSecrets": [{"name": "r"}]})
    assert api_reference(with_sa) == Problem(
        "spec.serviceAccountName", "static pods may not reference serviceaccounts"
    )
    claims_then_pvc = pod(
        {"resourceClaims": [{"name": "g"}], **vol(persistentVolumeClaim={"claimName": "c"})}
    )
    assert api_reference(claims_then_pvc) == Problem(
        "spec.resourceClaims", "static pods may not reference resourceclaims"
    )


def test_unknown_volume_types_and_projections_are_refused_as_upstream() -> None:
    assert api_reference(pod(vol(someFutureVolume={"x": 1}))) == Problem(
        "spec.volumes[0].someFutureVolume", "unknown volume type for volume 'v'"
    )
    assert api_reference(pod(projected({"someFutureSource": {}}))) == Problem(
        "spec.volumes[0].projected.sources[0]", "unknown source for projected volume 'v'"
    )


def test_other_problems_come_first() -> None:
    """A manifest with validation problems reports those; the reference check runs on a
    pod that is otherwise valid."""
    doc = pod(vol(secret={"secretName": "s"}))
    doc["kind"] = "Deployment"
    assert [p.field for p in validate_pod(doc, node_name=NODE)] == ["kind"]


def test_a_referring_manifest_file_is_refused() -> None:
    data = json.dumps(pod(vol(configMap={"name": "c"}))).encode()
    with pytest.raises(ManifestError) as info:
        pod_from_file(data, path="/etc/kubernetes/manifests/web.json", node_name=NODE)
    assert info.value.reason == "invalid"
    assert (
        info.value.message == "spec.volumes[0].configMap: static pods may not reference configmaps"
    )
