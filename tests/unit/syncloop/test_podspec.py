"""Pod spec helpers: stable container hash, grace periods with the 2 s floor,
image pull policy defaults, QoS class and the pod cgroup parent."""

from __future__ import annotations

import pytest
from klet.syncloop.model import podspec


def test_hash_stable_and_sensitive() -> None:
    c = {"name": "a", "image": "x:1", "command": ["sh"]}
    assert podspec.container_hash(c) == podspec.container_hash(dict(c))
    assert podspec.container_hash(c) != podspec.container_hash({**c, "command": ["sleep"]})
    assert podspec.container_hash(c) == podspec.container_hash(
        {**c, "resources": {"limits": {"cpu": "1"}}}
    )
    assert podspec.container_hash(c).startswith("v1:")


@pytest.mark.parametrize(
    ("meta", "spec", "override", "grace"),
    [
        ({}, {}, None, 30),
        ({}, {"terminationGracePeriodSeconds": 5}, None, 5),
        ({"deletionGracePeriodSeconds": 3}, {"terminationGracePeriodSeconds": 5}, None, 3),
        ({}, {"terminationGracePeriodSeconds": 0}, None, 2),
        ({}, {}, 0, 2),
        ({}, {}, 7, 7),
    ],
)
def test_grace_period(meta: dict, spec: dict, override: int | None, grace: int) -> None:  # type: ignore[type-arg]
    assert podspec.grace_period_s({"metadata": meta, "spec": spec}, override) == grace


@pytest.mark.parametrize(
    ("image", "policy"),
    [
        ("busybox", "Always"),
        ("busybox:latest", "Always"),
        ("busybox:1.36", "IfNotPresent"),
        ("reg:5000/busybox", "Always"),
        ("reg:5000/busybox:1", "IfNotPresent"),
        ("busybox@sha256:ab", "IfNotPresent"),
    ],
)
def test_image_pull_policy_default(image: str, policy: str) -> None:
    assert podspec.image_pull_policy({"image": image}) == policy


@pytest.mark.parametrize(
    ("resources", "qos"),
    [
        ([{}], "BestEffort"),
        ([{"limits": {"cpu": "1", "memory": "1Gi"}}], "Guaranteed"),
        (
            [{"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}],
            "Guaranteed",
        ),
        ([{"requests": {"cpu": "1"}}], "Burstable"),
        ([{"limits": {"cpu": "1", "memory": "1Gi"}}, {}], "Burstable"),
    ],
)
def test_qos(resources: list[dict], qos: str) -> None:  # type: ignore[type-arg]
    p = {
        "metadata": {"uid": "u"},
        "spec": {
            "containers": [{"name": f"c{i}", "resources": r} for i, r in enumerate(resources)]
        },
    }
    assert podspec.qos_class(p) == qos
    parent = podspec.pod_cgroup_parent(p, "/")
    assert parent == ("/kubepods/podu" if qos == "Guaranteed" else f"/kubepods/{qos.lower()}/podu")
    assert podspec.pod_cgroup_parent(p, "/n1") == "/n1" + parent


@pytest.mark.parametrize(
    ("deletion", "spec", "grace"),
    [(None, 30, 30), (10, 30, 10), (60, 30, 60), (0, 30, 2), (None, None, 30)],
)
def test_deletion_grace_comes_from_the_deletion(
    deletion: int | None, spec: int | None, grace: int
) -> None:
    meta = {} if deletion is None else {"deletionGracePeriodSeconds": deletion}
    pod_spec = {} if spec is None else {"terminationGracePeriodSeconds": spec}
    assert podspec.deletion_grace_s({"metadata": meta, "spec": pod_spec}) == grace
