"""Credential provider plugins given the pod's service account token (tokenAttributes,
KubeletServiceAccountTokenForCredentialProviders) against the real apiserver.

A node joined to the cluster harness runs a plugin of ours (a Python script speaking
credentialprovider.kubelet.k8s.io/v1) for the harness's authenticating registry, with
tokenAttributes: an audience, a required ServiceAccount annotation, cacheType
ServiceAccount. The pod names a ServiceAccount carrying that annotation. The plugin
decodes the JWT's payload: only a token for the provider's audience, bound to that pod
and issued for that ServiceAccount (its UID), gets the registry's credentials, so the
pod runs only if syncloop read the ServiceAccount (its UID and annotations) and asked
TokenRequest for the right token. The apiserver's Node authorizer lets the node get the
ServiceAccount of a pod bound to it, and its NodeRestriction admission
(ServiceAccountNodeAudienceRestriction, on by default in 1.34) lets it ask a token for
an audience no volume of the pod names only when RBAC grants the node the verb
`request-serviceaccounts-token-audience` on that audience, which the test grants, as an
operator using such a plugin must. A second pod of the same ServiceAccount reuses the
cached answer (one plugin run in all).
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from klet.devstack import DevStack
from klet.testbed.cluster import ControlPlane

from tests.harness.clusternode import cluster_node
from tests.harness.node import KletNode
from tests.harness.waiting import wait_for
from tests.integration.test_image_pull import PASSWORD, USER, Private, private_registry

NODE = "kletcredtok1"
AUDIENCE = "registry.klet.test"
ROLE_KEY = "klet.test/registry-role"
PLUGIN_NAME = "token-credential-provider"

# Credentials only for a token of AUDIENCE: the registry would take no other.
PLUGIN = f"""#!{sys.executable}
import base64, json, os, sys

request = json.load(sys.stdin)
token = request.get("serviceAccountToken", "")
claims = {{}}
if token:
    payload = token.split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
with open(sys.argv[1], "a") as f:
    f.write(json.dumps({{"image": request["image"], "claims": claims,
                         "annotations": request.get("serviceAccountAnnotations"),
                         "fields": sorted(request)}}) + "\\n")
if os.environ["PLUGIN_AUDIENCE"] not in claims.get("aud", []):
    sys.stderr.write("no token for the registry's audience")
    sys.exit(1)
print(json.dumps({{
    "apiVersion": request["apiVersion"],
    "kind": "CredentialProviderResponse",
    "cacheKeyType": "Registry",
    "auth": {{os.environ["PLUGIN_REGISTRY"]: {{
        "username": os.environ["PLUGIN_USER"], "password": os.environ["PLUGIN_PASSWORD"]}}}},
}}))
"""


@pytest.fixture(scope="module")
def private(devstack: DevStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Private]:
    with private_registry(devstack, tmp_path_factory.mktemp("token-registry")) as found:
        yield found


@pytest.fixture(scope="module")
def plugin_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("plugin-log") / "requests.log"


@pytest.fixture(scope="module")
def node(
    control_plane: ControlPlane,
    devstack: DevStack,
    private: Private,
    plugin_log: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[KletNode]:
    base = tmp_path_factory.mktemp("credtoknode")
    bin_dir = base / "plugins"
    bin_dir.mkdir()
    exe = bin_dir / PLUGIN_NAME
    exe.write_text(PLUGIN)
    exe.chmod(0o755)
    address = private.registry.address
    config = base / "credential-providers.yaml"
    config.write_text(
        f"""\
apiVersion: kubelet.config.k8s.io/v1
kind: CredentialProviderConfig
providers:
  - name: {PLUGIN_NAME}
    matchImages: ["{address}"]
    defaultCacheDuration: 1h
    apiVersion: credentialprovider.kubelet.k8s.io/v1
    args: ["{plugin_log}"]
    env:
      - {{name: PLUGIN_AUDIENCE, value: "{AUDIENCE}"}}
      - {{name: PLUGIN_REGISTRY, value: "{address}"}}
      - {{name: PLUGIN_USER, value: {USER}}}
      - {{name: PLUGIN_PASSWORD, value: {PASSWORD}}}
    tokenAttributes:
      serviceAccountTokenAudience: {AUDIENCE}
      cacheType: ServiceAccount
      requireServiceAccount: true
      requiredServiceAccountAnnotationKeys: ["{ROLE_KEY}"]
"""
    )
    grant = f"{NODE}-token-audience"
    control_plane.apply(
        [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": grant},
                "rules": [
                    {
                        "apiGroups": [""],
                        "resources": [AUDIENCE],
                        "verbs": ["request-serviceaccounts-token-audience"],
                    }
                ],
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": grant},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": grant,
                },
                "subjects": [
                    {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "User",
                        "name": f"system:node:{NODE}",
                    }
                ],
            },
        ]
    )
    try:
        with cluster_node(
            control_plane,
            devstack,
            base,
            name=NODE,
            extra_flags=[
                f"--image-credential-provider-config={config}",
                f"--image-credential-provider-bin-dir={bin_dir}",
            ],
        ) as kletnode:
            yield kletnode
    finally:
        control_plane.kubectl("delete", "clusterrolebinding,clusterrole", grant)


def pod(namespace: str, name: str, image: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeName": NODE,
            "serviceAccountName": "puller",
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["sleep", "100000"],
                }
            ],
        },
    }


def get(cp: ControlPlane, *args: str) -> dict[str, Any] | None:
    r = cp.kubectl("get", *args, "-o", "json")
    return json.loads(r.stdout) if r.returncode == 0 else None


def running(cp: ControlPlane, namespace: str, name: str) -> bool:
    found = get(cp, "-n", namespace, "pod", name)
    return bool(found and found.get("status", {}).get("phase") == "Running")


def requests(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_plugin_gets_the_pods_service_account_token(
    control_plane: ControlPlane, node: KletNode, private: Private, plugin_log: Path
) -> None:
    namespace = f"klet-credtok-{uuid.uuid4().hex[:6]}"
    control_plane.prepare_namespace(namespace)
    try:
        control_plane.apply(
            [
                {
                    "apiVersion": "v1",
                    "kind": "ServiceAccount",
                    "metadata": {
                        "name": "puller",
                        "namespace": namespace,
                        "annotations": {ROLE_KEY: "reader", "ignored": "x"},
                    },
                }
            ]
        )
        account = get(control_plane, "-n", namespace, "serviceaccount", "puller")
        assert account is not None
        first, second = private.fresh_tag(), private.fresh_tag()
        control_plane.apply([pod(namespace, "first", first)])
        wait_for(
            lambda: running(control_plane, namespace, "first"),
            timeout_s=60,
            what="first Running (pulled with the plugin's credentials)",
        )
        created = get(control_plane, "-n", namespace, "pod", "first")
        assert created is not None
        (seen,) = requests(plugin_log)
        assert seen["image"] == f"{private.registry.address}/private/app"
        assert seen["fields"] == [
            "apiVersion",
            "image",
            "kind",
            "serviceAccountAnnotations",
            "serviceAccountToken",
        ]
        assert seen["annotations"] == {ROLE_KEY: "reader"}  # only the keys the provider names
        claims = seen["claims"]
        assert claims["aud"] == [AUDIENCE]
        assert claims["sub"] == f"system:serviceaccount:{namespace}:puller"
        bound = claims["kubernetes.io"]
        assert bound["pod"] == {"name": "first", "uid": created["metadata"]["uid"]}
        assert bound["serviceaccount"] == {
            "name": "puller",
            "uid": account["metadata"]["uid"],
        }
        assert private.served(first) == 1

        # Another pod of that ServiceAccount: the answer cached for the account serves it.
        control_plane.apply([pod(namespace, "second", second)])
        wait_for(
            lambda: running(control_plane, namespace, "second"),
            timeout_s=60,
            what="second Running",
        )
        assert len(requests(plugin_log)) == 1 and private.served(second) == 1
    finally:
        control_plane.kubectl("delete", "namespace", namespace, "--wait=false")
