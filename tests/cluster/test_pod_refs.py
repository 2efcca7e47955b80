"""Pods that refer to Secrets and ConfigMaps on a real apiserver: a
`kubernetes.io/dockerconfigjson` imagePullSecret lets the pod pull from the private
registry that requires basic authentication (the node has no credentials of its own);
env from configMapKeyRef, secretKeyRef (optional keys left out) and envFrom with a
prefix shows up inside the container; a missing ConfigMap gives
CreateContainerConfigError with upstream's message in the pod's status on the
apiserver, and the pod starts once the ConfigMap is created."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import pytest
from klet.devstack import DevStack
from klet.testbed.cluster import ControlPlane

from tests.harness.clusternode import cluster_node
from tests.harness.node import KletNode
from tests.harness.waiting import wait_for
from tests.integration.test_image_pull import PASSWORD, USER, Private, private_registry

NODE = "kletrefs1"
OBJECTS = (
    ("secret", "regcred"),
    ("secret", "creds"),
    ("configmap", "settings"),
    ("configmap", "late"),
)


@pytest.fixture(scope="module")
def private(devstack: DevStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Private]:
    with private_registry(devstack, tmp_path_factory.mktemp("refs-registry")) as found:
        yield found


@pytest.fixture(scope="module")
def node(
    control_plane: ControlPlane, devstack: DevStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KletNode]:
    base = tmp_path_factory.mktemp("refsnode")
    try:
        with cluster_node(control_plane, devstack, base, name=NODE) as kletnode:
            yield kletnode
    finally:
        for kind, name in OBJECTS:
            control_plane.kubectl("delete", kind, name, "--ignore-not-found")


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def pod(name: str, container: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": NODE,
            "terminationGracePeriodSeconds": 2,
            "containers": [{"name": "main", **container}],
            **spec,
        },
    }


def get_pod(cp: ControlPlane, name: str) -> dict[str, Any] | None:
    r = cp.kubectl("get", "pod", name, "-o", "json")
    return json.loads(r.stdout) if r.returncode == 0 else None


def running(cp: ControlPlane, name: str) -> dict[str, Any] | None:
    p = get_pod(cp, name)
    statuses = (p or {}).get("status", {}).get("containerStatuses", [])
    return p if statuses and all("running" in c["state"] for c in statuses) else None


def log_lines(node: KletNode, name: str) -> list[str]:
    """What the container printed, from its CRI log file on the node."""
    log_file = next(node.logs_dir.glob(f"default_{name}_*")) / "main" / "0.log"
    return [line.split(" ", 3)[3] for line in log_file.read_text().splitlines()]


def test_pull_secret_from_the_apiserver(
    node: KletNode, control_plane: ControlPlane, private: Private
) -> None:
    cp = control_plane
    image = private.fresh_tag()
    config = {"auths": {private.registry.address: {"auth": b64(f"{USER}:{PASSWORD}")}}}
    cp.apply(
        [
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "regcred", "namespace": "default"},
                "type": "kubernetes.io/dockerconfigjson",
                "data": {".dockerconfigjson": b64(json.dumps(config))},
            },
            pod(
                "pulls-private",
                {"image": image, "command": ["sleep", "100000"]},
                imagePullSecrets=[{"name": "regcred"}],
            ),
        ]
    )
    wait_for(lambda: running(cp, "pulls-private"), timeout_s=40, what="pulls-private Running")
    assert private.served(image) == 1
    # The node itself has no credentials: the secret's were the ones used.
    assert not (node.root_dir / "config.json").exists()


def test_env_from_configmaps_and_secrets_inside_the_container(
    node: KletNode, control_plane: ControlPlane
) -> None:
    cp = control_plane
    script = (
        "echo LEVEL=$LEVEL; echo USER=$APP_USER; echo OPT=${OPT-unset}; "
        "echo CFG_level=$CFG_level; echo CFG_mode=$CFG_mode; echo MIXED=$MIXED; "
        "sleep 100000"
    )
    cp.apply(
        [
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "settings", "namespace": "default"},
                "data": {"level": "debug", "mode": "fast"},
            },
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "creds", "namespace": "default"},
                "type": "Opaque",
                "data": {"user": b64("admin")},
            },
            pod(
                "env-refs",
                {
                    "image": "registry.klet.test/busybox:1.36",
                    "command": ["sh", "-c", script],
                    "envFrom": [{"configMapRef": {"name": "settings"}, "prefix": "CFG_"}],
                    "env": [
                        {
                            "name": "LEVEL",
                            "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "level"}},
                        },
                        {
                            "name": "APP_USER",
                            "valueFrom": {"secretKeyRef": {"name": "creds", "key": "user"}},
                        },
                        {
                            "name": "OPT",
                            "valueFrom": {
                                "secretKeyRef": {"name": "creds", "key": "nope", "optional": True}
                            },
                        },
                        {"name": "MIXED", "value": "$(CFG_mode)-$(APP_USER)"},
                    ],
                },
            ),
        ]
    )
    wait_for(lambda: running(cp, "env-refs"), timeout_s=40, what="env-refs Running")
    lines = wait_for(
        lambda: (lines := log_lines(node, "env-refs"))[5:] and lines,
        timeout_s=15,
        what="the container's output",
    )
    assert lines == [
        "LEVEL=debug",
        "USER=admin",
        "OPT=unset",
        "CFG_level=debug",
        "CFG_mode=fast",
        "MIXED=fast-admin",
    ]


def test_missing_configmap_then_created(node: KletNode, control_plane: ControlPlane) -> None:
    cp = control_plane
    cp.apply(
        [
            pod(
                "late-cm",
                {
                    "image": "registry.klet.test/busybox:1.36",
                    "command": ["sh", "-c", "echo GOT=$GOT; sleep 100000"],
                    "env": [
                        {
                            "name": "GOT",
                            "valueFrom": {"configMapKeyRef": {"name": "late", "key": "k"}},
                        }
                    ],
                },
            )
        ]
    )

    def config_error() -> dict[str, Any] | None:
        p = get_pod(cp, "late-cm")
        statuses = (p or {}).get("status", {}).get("containerStatuses", [])
        waiting = statuses[0]["state"].get("waiting", {}) if statuses else {}
        return waiting if waiting.get("reason") == "CreateContainerConfigError" else None

    waiting = wait_for(
        config_error, timeout_s=40, what="CreateContainerConfigError on the apiserver"
    )
    assert waiting["message"] == 'configmap "late" not found'
    assert get_pod(cp, "late-cm")["status"]["phase"] == "Pending"  # type: ignore[index]

    cp.apply(
        [
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "late", "namespace": "default"},
                "data": {"k": "arrived"},
            }
        ]
    )
    wait_for(lambda: running(cp, "late-cm"), timeout_s=40, what="late-cm Running")
    assert wait_for(
        lambda: log_lines(node, "late-cm"), timeout_s=15, what="the container's output"
    ) == ["GOT=arrived"]
